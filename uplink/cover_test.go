package uplink

import (
	"context"
	"math"
	"testing"
	"time"

	"github.com/fleetgate/fleetgate/gateway"
)

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
	if err := u.flushOnce(ctx, false); err != nil {
		t.Fatal(err)
	}
	for shard := range testShards {
		if got, want := e.store.Covered(shard), e.clock.Now().Add(-interval); !got.Equal(want) {
			t.Errorf("idle flush, shard %d: coverage %v, want %v", shard, got, want)
		}
	}
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
