package uplink

import (
	"context"
	"math"
	"path/filepath"
	"testing"
	"time"

	"github.com/fleetgate/fleetgate/gateway"
)

// flushCovers flushes once and checks every shard's coverage is want.
func flushCovers(t *testing.T, e *env, what string, want time.Time) {
	t.Helper()
	if err := e.u.flushOnce(context.Background(), false); err != nil {
		t.Fatal(err)
	}
	for shard := range testShards {
		if got := e.store.Covered(shard); !got.Equal(want) {
			t.Errorf("%s, shard %d: coverage %v, want %v", what, shard, got, want)
		}
	}
}

// A flush reports, on every shard, idle or not, a coverage a flush
// interval before now; a shard whose queue keeps evidence (over
// MaxBatch) reports a coverage before the oldest of it.
func TestFlushCoverage(t *testing.T) {
	const interval = time.Second
	u, e := newEmbeddedUplink(t, Options{FlushInterval: interval, MaxBatch: 2})
	ctx := context.Background()
	devs := devicesIn(1, 3, "cov")
	mustEnqueue(t, u, evidence(devs[0], gateway.Connect, e.clock.Now()))
	e.clock.Advance(300 * time.Millisecond)
	mustEnqueue(t, u, evidence(devs[1], gateway.Connect, e.clock.Now()))
	left := e.clock.Now()
	mustEnqueue(t, u, evidence(devs[2], gateway.Connect, left))
	e.clock.Advance(2 * time.Second)
	if err := u.flushOnce(ctx, false); err != nil {
		t.Fatal(err)
	}
	now := e.clock.Now()
	for shard := range testShards {
		want := now.Add(-interval)
		if shard == 1 {
			want = left.Add(-interval) // devs[2] is still queued
		}
		if got := e.store.Covered(shard); !got.Equal(want) {
			t.Errorf("shard %d: coverage %v, want %v", shard, got, want)
		}
	}
	e.clock.Advance(interval)
	if err := u.flushOnce(ctx, false); err != nil {
		t.Fatal(err)
	}
	if got, want := e.store.Covered(1), e.clock.Now().Add(-interval); !got.Equal(want) {
		t.Errorf("shard 1 once its queue is empty: coverage %v, want %v", got, want)
	}
	// an idle gateway still moves every shard's coverage on
	e.clock.Advance(interval)
	flushCovers(t, e, "idle flush", e.clock.Now().Add(-interval))
}

// Evidence in the outbox holds the coverage of its shard before it, and
// not another shard's; evidence whose Enqueue waits for room holds every
// shard's.
func TestCoverageStopsBeforeOutboxAndBlocked(t *testing.T) {
	const interval = time.Second
	u, e := newEmbeddedUplink(t, Options{FlushInterval: interval, MaxBatch: 2, QueueLimit: 2})
	ctx := context.Background()
	buffered := e.clock.Now()
	d := devicesIn(2, 1, "ob")[0]
	if err := u.buffer([]item{{key{d, "coap/default"}, slot{kind: gateway.Renew, at: buffered}}}); err != nil {
		t.Fatal(err)
	}
	e.clock.Advance(5 * time.Second)
	// the outbox is replayed first: a flush while it holds anything of
	// shard 2 moves shard 2's queue there, so ask the replay call for
	// its coverage
	rp := &replayer{u: u}
	if err := rp.round(ctx); err != nil {
		t.Fatal(err)
	}
	rp.wait()
	if got, want := e.store.Covered(2), buffered.Add(-interval); got.After(want) {
		t.Errorf("replay while the outbox held evidence of %v: coverage %v, want at most %v", buffered, got, want)
	}
	if got, want := e.store.Covered(0), e.clock.Now().Add(-interval); !got.Equal(want) {
		t.Errorf("shard 0 while the outbox held shard 2's evidence: coverage %v, want %v", got, want)
	}
	// a full queue of shard 0 and an Enqueue waiting for room
	devs := devicesIn(0, 3, "full")
	mustEnqueue(t, u, evidence(devs[0], gateway.Renew, e.clock.Now()), evidence(devs[1], gateway.Renew, e.clock.Now()))
	waiting := e.clock.Now().Add(-3 * time.Second)
	done := make(chan error, 1)
	go func() { done <- u.Enqueue(ctx, evidence(devs[2], gateway.Renew, waiting)) }()
	waitFor(t, "the Enqueue to wait", 10*time.Second, func() { time.Sleep(time.Millisecond) }, func() bool {
		return !u.blocked.oldest().IsZero()
	})
	e.clock.Advance(interval)
	for shard := range testShards {
		if got, want := u.coverage(shard, e.clock.Now(), interval), waiting.Add(-interval); got.After(want) {
			t.Errorf("shard %d while an Enqueue of evidence of %v waits: coverage %v, want at most %v", shard, waiting, got, want)
		}
	}
	if err := u.flushOnce(ctx, false); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// A session's evidence merged in the queue or the outbox keeps only the
// newest observation; until it is written the coverage stops before the
// oldest one it stands for, which may have renewed the session before a
// deadline the newest one is past (a reap between would expire it).
func TestCoverageStopsAtMergedEvidence(t *testing.T) {
	u, e := newEmbeddedUplink(t, Options{FlushInterval: time.Second})
	d := devicesIn(0, 1, "merged")[0]
	first := e.clock.Now()
	mustEnqueue(t, u, evidence(d, gateway.Renew, first))
	e.clock.Advance(3 * time.Second)
	mustEnqueue(t, u, evidence(d, gateway.Renew, e.clock.Now()))
	if c := u.coverage(0, e.clock.Now(), 0); c.After(first) {
		t.Fatalf("queue: coverage %v, past the first merged observation %v", c, first)
	}
	// the same in the outbox: buffered, then newer evidence merged in
	its, _ := u.queues[0].take(math.MaxInt, e.clock.Now(), 0)
	if err := u.bufferOrRequeue(its); err != nil {
		t.Fatal(err)
	}
	e.clock.Advance(3 * time.Second)
	mustEnqueue(t, u, evidence(d, gateway.Renew, e.clock.Now()))
	if its, _ = u.queues[0].take(math.MaxInt, e.clock.Now(), 0); len(its) != 1 {
		t.Fatalf("queue took %d items, want 1", len(its))
	}
	if err := u.bufferOrRequeue(its); err != nil {
		t.Fatal(err)
	}
	if c := u.coverage(0, e.clock.Now(), 0); c.After(first) {
		t.Fatalf("outbox: coverage %v, past the first merged observation %v", c, first)
	}
}

// stallHold: a flush timer that fires more than half an interval late
// marks a stall; the coverage is held at the timer's start for as long
// after it fired as it was late, at least an interval. A gateway stopped
// for 3.6 s with a flush interval of 100 ms reads its sockets' backlog
// for longer than 100 ms when it shares its CPU: held for 100 ms only,
// its next call covered renewals still unread and the store expired
// devices that had kept sending.
//
// The hold never ends past the gateway horizon (lease + gateway_grace,
// here 9 s) from the stall's start, so that a device that stopped before
// the stall is reported within the bound of a lost gateway; but it lasts
// at least an interval after the wake-up.
func TestStallHold(t *testing.T) {
	t0 := time.UnixMilli(1_000_000)
	const horizon = 9 * time.Second
	for _, tc := range []struct {
		interval, fired time.Duration
		stalled         bool
		hold            time.Duration // after fired
	}{
		{time.Second, time.Second, false, 0},
		{time.Second, 1500 * time.Millisecond, false, 0},
		{time.Second, 1501 * time.Millisecond, true, time.Second},
		{time.Second, 5 * time.Second, true, 4 * time.Second},
		{100 * time.Millisecond, 3700 * time.Millisecond, true, 3600 * time.Millisecond},
		{time.Second, 6 * time.Second, true, 3 * time.Second},     // the horizon: until 9 s
		{time.Second, 8500 * time.Millisecond, true, time.Second}, // at least an interval
	} {
		from, until, stalled := stallHold(t0, t0.Add(tc.fired), tc.interval, horizon)
		if stalled != tc.stalled || stalled && (!from.Equal(t0) || !until.Equal(t0.Add(tc.fired+tc.hold))) {
			t.Errorf("interval %v, fired after %v: %v, %v, %v; want stalled %v, held until %v after",
				tc.interval, tc.fired, from, until, stalled, tc.stalled, tc.hold)
		}
	}
}

func TestRestartHold(t *testing.T) {
	t0 := time.UnixMilli(1_000_000)
	const lease, horizon = 4 * time.Second, 8 * time.Second
	for _, tc := range []struct {
		last, started time.Duration // from t0; last -1: none
		held          bool
		until         time.Duration
	}{
		{-1, 5 * time.Second, false, 0},
		{0, 5 * time.Second, true, 8 * time.Second},  // the horizon from last
		{0, 2 * time.Second, true, 6 * time.Second},  // a lease after the start
		{0, 9 * time.Second, false, 0},               // past the horizon: gateway_lost's
		{5 * time.Second, 5 * time.Second, false, 0}, // no gap
		{3 * time.Second, 4 * time.Second, true, 8 * time.Second},
	} {
		last := t0.Add(tc.last)
		if tc.last < 0 {
			last = time.Time{}
		}
		from, until, held := restartHold(last, t0.Add(tc.started), lease, horizon)
		if held != tc.held || held && (!from.Equal(last) || !until.Equal(t0.Add(tc.until))) {
			t.Errorf("last %v, started %v: %v, %v, %v; want held %v until %v", tc.last, tc.started, from, until, held, tc.held, tc.until)
		}
	}
}

// A process that follows a killed one (its predecessor's ledger last
// written 5 s before it starts) holds the coverage of every shard where
// the predecessor last ran for a lease after its start: its devices'
// deadlines that passed while nobody listened are not judged before they
// could have been heard again. A ledger without records holds nothing.
func TestCoverageHeldAfterARestart(t *testing.T) {
	const interval, lease = time.Second, 4 * time.Second
	last := t0.Add(-5 * time.Second)
	path := filepath.Join(t.TempDir(), LedgerFile)
	prev, _, err := OpenLedger(path, last, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	prev.add([]heldSession{{view: gateway.SessionView{Device: "d", Session: "s"}, keep: t0.Add(time.Hour),
		rec: ledgerRecord{LastSeen: last, Deadline: last.Add(lease), RecordedAt: last, StaleBy: time.Second}}}, nil)
	if n, _, err := prev.writeAdds(); n != 1 || err != nil {
		t.Fatalf("predecessor's ledger: %d %v", n, err)
	}
	next, _, err := OpenLedger(path, t0, time.Minute)
	if err != nil || !next.Last().Equal(last) {
		t.Fatalf("Last %v %v, want %v", next.Last(), err, last)
	}
	_, e := newEmbeddedUplink(t, Options{FlushInterval: interval, Lease: lease, GatewayGrace: 10 * time.Second, Ledger: next})
	flushCovers(t, e, "at the start", last.Add(-interval))
	e.clock.Advance(lease - time.Millisecond)
	flushCovers(t, e, "until a lease after the start", last.Add(-interval))
	e.clock.Advance(interval + time.Millisecond) // the next call (a keep-alive)
	flushCovers(t, e, "a lease after the start", e.clock.Now().Add(-interval))

	empty, _, err := OpenLedger(filepath.Join(t.TempDir(), LedgerFile), t0, time.Minute)
	if err != nil || !empty.Last().IsZero() {
		t.Fatalf("empty ledger: Last %v %v", empty.Last(), err)
	}
	_, e = newEmbeddedUplink(t, Options{FlushInterval: interval, Lease: lease, Ledger: empty})
	flushCovers(t, e, "after a start without a predecessor", t0.Add(-interval))
}

// After a stall the coverage of every shard stays at the stall's start
// (what devices sent meanwhile is still in the sockets and the adapters'
// streams) for as long after the process woke as it was stalled, then
// moves on.
func TestCoverageHeldAfterAStall(t *testing.T) {
	const interval = time.Second
	u, e := newEmbeddedUplink(t, Options{FlushInterval: interval})
	before := e.clock.Now()
	e.clock.Advance(5 * time.Second) // stopped
	woke := e.clock.Now()
	from, until, stalled := stallHold(before, woke, interval, time.Minute)
	if !stalled {
		t.Fatal("a timer 4 s late is not a stall")
	}
	u.stall.note(from, until)
	flushCovers(t, e, "right after the stall (held at its start)", before.Add(-interval))
	e.clock.Advance(interval)
	flushCovers(t, e, "an interval after the stall (still held)", before.Add(-interval))
	e.clock.Advance(3 * time.Second)
	flushCovers(t, e, "as long after the stall as it lasted", e.clock.Now().Add(-interval))
}

// The flush loop marks the stall itself: its timer, started before the
// process stopped, fires 4 s late, and the flush that follows covers
// nothing past the timer's start.
func TestFlushLoopHoldsCoverageAfterAStall(t *testing.T) {
	const interval = time.Second
	u, e := newEmbeddedUplink(t, Options{FlushInterval: interval})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		u.flushLoop(ctx)
	}()
	defer func() {
		cancel()
		<-done
	}()
	await := func(what string, cond func() bool) {
		t.Helper()
		deadline := time.Now().Add(5 * time.Second)
		for !cond() {
			if time.Now().After(deadline) {
				t.Fatalf("after 5 s: %s", what)
			}
			time.Sleep(time.Millisecond)
		}
	}
	await("the loop's timer", func() bool { return e.clock.Timers() == 1 })
	started := e.clock.Now()
	e.clock.Advance(5 * time.Second)
	await("a flush", func() bool { return !e.store.Covered(0).IsZero() })
	for shard := range testShards {
		if got, want := e.store.Covered(shard), started.Add(-interval); !got.Equal(want) {
			t.Errorf("shard %d after the stall: coverage %v, want %v (the timer's start)", shard, got, want)
		}
	}
}

// Evidence an adapter observed after the last frame the host read may be
// in its stream: the coverage stops before that frame's made time (and
// the margin), but at most two flush intervals before the margin, so an
// adapter whose stream stopped delays the gateway's other devices by
// that much at most. An adapter that says nothing (zero) holds nothing.
func TestCoverageStopsBeforeUnreadFrames(t *testing.T) {
	const interval = time.Second
	var read time.Time
	_, e := newEmbeddedUplink(t, Options{FlushInterval: interval, Unread: func() time.Time { return read }})
	read = e.clock.Now().Add(-300 * time.Millisecond)
	flushCovers(t, e, "a frame read 300 ms after it was made", read.Add(-interval))
	e.clock.Advance(1500 * time.Millisecond)
	flushCovers(t, e, "no frame read for 1.8 s", read.Add(-interval))
	e.clock.Advance(time.Second)
	flushCovers(t, e, "no frame read for 2.8 s (two intervals at most)", e.clock.Now().Add(-3*interval))
	e.clock.Advance(interval)
	read = e.clock.Now()
	flushCovers(t, e, "a frame read as it was made", e.clock.Now().Add(-interval))
	e.clock.Advance(interval)
	read = time.Time{}
	flushCovers(t, e, "no adapter ticks", e.clock.Now().Add(-interval))
}
