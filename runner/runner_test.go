package runner

import (
	"context"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/fleetgate/fleetgate/gateway"
	"github.com/fleetgate/fleetgate/gateway/clocktest"
	"github.com/fleetgate/fleetgate/store/embedded"
)

// metric returns a counter's or gauge's value, or a histogram's sample
// count and sum, from reg.
func metric(t *testing.T, reg *prometheus.Registry, name string) (value, sum float64) {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatalf("gather: %v", err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		m := mf.GetMetric()[0]
		switch {
		case m.GetCounter() != nil:
			return m.GetCounter().GetValue(), 0
		case m.GetGauge() != nil:
			return m.GetGauge().GetValue(), 0
		case m.GetHistogram() != nil:
			return float64(m.GetHistogram().GetSampleCount()), m.GetHistogram().GetSampleSum()
		}
	}
	t.Fatalf("metric %s not registered", name)
	return 0, 0
}

func TestReapsExpiredDevicesWithEventsAndLag(t *testing.T) {
	clk := clocktest.New(t0)
	s := openEmbedded(t, openBolt(t), 16, clk)
	ids := deviceIDs("dev", 300)
	const lease = 90 * time.Second
	connect(t, s, ids, lease)

	var got events
	reg := prometheus.NewRegistry()
	r := New(s, Options{Owner: "runner-a", Clock: clk, Registerer: reg, OnEvent: got.add})
	start(t, r)
	asleep(t, clk, 1)
	if n := got.len(); n != 0 {
		t.Fatalf("%d offline events before any lease ran out", n)
	}

	// One jump a second past every lease: each event's lag is exactly 1s.
	step(t, clk, lease+time.Second, 1)
	byDev := got.byDevice()
	if len(byDev) != len(ids) || got.len() != len(ids) {
		t.Fatalf("got %d events for %d devices, want one for each of %d", got.len(), len(byDev), len(ids))
	}
	for _, id := range ids {
		evs := byDev[id]
		if len(evs) != 1 {
			t.Fatalf("device %s: %d events, want 1", id, len(evs))
		}
		ev := evs[0]
		want := gateway.Event{
			ID: ev.ID, Shard: gateway.ShardOf(id, 16), Device: id, State: gateway.Offline, Ver: uint64(t0.UnixMilli()) + 1,
			At: t0.Add(lease + time.Second), Reason: gateway.ReasonExpired, Gateway: ev.Gateway,
			Session: ev.Session, Deadline: t0.Add(lease),
		}
		if !ev.At.Equal(want.At) || !ev.Deadline.Equal(want.Deadline) {
			t.Fatalf("device %s: at %v deadline %v, want %v and %v", id, ev.At, ev.Deadline, want.At, want.Deadline)
		}
		ev.At, ev.Deadline = want.At, want.Deadline
		if ev != want {
			t.Fatalf("device %s: event %+v, want %+v", id, ev, want)
		}
		info, err := s.Device(context.Background(), id)
		if err != nil || info.State != gateway.Offline {
			t.Fatalf("device %s after reap: %+v, %v; want offline", id, info, err)
		}
	}

	st := r.Status()
	if st.Reaped != uint64(len(ids)) || st.ReapErrors != 0 || st.LastLag != time.Second || !st.LastEvent.Equal(t0.Add(lease+time.Second)) {
		t.Fatalf("status %+v: want %d reaped, no error, last lag 1s", st, len(ids))
	}
	if len(st.Shards) != 16 {
		t.Fatalf("status shards %v, want all 16 (no other runner)", st.Shards)
	}
	if v, _ := metric(t, reg, "fleetgate_runner_reaped_total"); v != float64(len(ids)) {
		t.Errorf("reaped_total %v, want %d", v, len(ids))
	}
	if n, sum := metric(t, reg, "fleetgate_runner_reap_lag_seconds"); n != float64(len(ids)) || sum != float64(len(ids)) {
		t.Errorf("reap_lag_seconds count %v sum %v, want %d samples of 1s", n, sum, len(ids))
	}
	if v, _ := metric(t, reg, "fleetgate_runner_reap_calls_total"); v != float64(st.ReapCalls) {
		t.Errorf("reap_calls_total %v, status says %d", v, st.ReapCalls)
	}
	if n, _ := metric(t, reg, "fleetgate_runner_reap_duration_seconds"); n != float64(st.ReapCalls) {
		t.Errorf("reap_duration_seconds count %v, want one per call (%d)", n, st.ReapCalls)
	}
	if v, _ := metric(t, reg, "fleetgate_runner_shards_owned"); v != 16 {
		t.Errorf("shards_owned %v, want 16", v)
	}
	if v, _ := metric(t, reg, "fleetgate_runner_reap_errors_total"); v != 0 {
		t.Errorf("reap_errors_total %v, want 0", v)
	}
}

func TestCountsGapsInTheReaps(t *testing.T) {
	const shards = 4
	clk := clocktest.New(t0)
	s, err := embedded.Open(openBolt(t), embedded.Options{Shards: shards, Now: clk.Now, GatewayGrace: 20 * time.Second, ReapGap: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	reg := prometheus.NewRegistry()
	r := New(s, Options{Owner: "runner-a", Clock: clk, Registerer: reg})
	start(t, r)
	asleep(t, clk, 1)
	gaps := func(want uint64, when string) {
		t.Helper()
		if v, _ := metric(t, reg, "fleetgate_runner_reap_gaps_total"); v != float64(want) {
			t.Fatalf("%s: reap_gaps_total %v, want %d", when, v, want)
		}
		if got := r.Status().ReapGaps; got != want {
			t.Fatalf("%s: status reap_gaps %d, want %d", when, got, want)
		}
	}
	// the runner takes the shards over its first rounds, reaping each a
	// second apart
	for i := 0; i < 10 && len(r.Status().Shards) < shards; i++ {
		step(t, clk, time.Second, 1)
	}
	step(t, clk, time.Second, 1)
	if n := len(r.Status().Shards); n != shards {
		t.Fatalf("runner holds %d shards, want all %d", n, shards)
	}
	gaps(0, "reaps a second apart")
	// the process (or its host) stopped for 10 s: each shard's next reap
	// ends a gap, once
	step(t, clk, 10*time.Second, 1)
	gaps(shards, "the first reaps after 10 s")
	step(t, clk, time.Second, 1)
	gaps(shards, "a second later")
}

func TestDrainsABacklogInBoundedCalls(t *testing.T) {
	clk := clocktest.New(t0)
	s := openEmbedded(t, openBolt(t), 1, clk)
	ids := deviceIDs("dev", 1200)
	connect(t, s, ids, time.Minute)

	var got events
	r := New(s, Options{Owner: "runner-a", Clock: clk, Batch: 100, OnEvent: got.add})
	start(t, r)
	asleep(t, clk, 1)
	before := r.Status()
	step(t, clk, time.Minute+time.Second, 1)
	after := r.Status()

	if got.len() != len(ids) || after.Reaped != uint64(len(ids)) {
		t.Fatalf("reaped %d (%d events), want %d", after.Reaped, got.len(), len(ids))
	}
	// 1200 entries at 100 a call: 12 calls, the last one reporting no
	// more; 4 calls a cycle: 3 cycles, the first two without a sleep.
	if calls := after.ReapCalls - before.ReapCalls; calls != 12 {
		t.Errorf("%d reap calls for 1200 entries at batch 100, want 12", calls)
	}
	if c := after.Cycles - before.Cycles; c != 3 {
		t.Errorf("%d cycles, want 3 (reapsPerCycle = %d calls each)", c, reapsPerCycle)
	}
}

// sleeps checks that the runner, asleep, wakes exactly d later: not
// after d−1ms, and after d.
func sleeps(t *testing.T, clk *clocktest.Clock, r *Runner, d time.Duration) {
	t.Helper()
	c := r.Status().Cycles
	clk.Advance(d - time.Millisecond)
	// Advance fires due timers before it returns, and a woken runner
	// counts its cycle before it sleeps again: one of the two shows.
	if clk.Timers() != 1 || r.Status().Cycles != c {
		t.Fatalf("runner woke before %v", d)
	}
	step(t, clk, time.Millisecond, 1)
	if got := r.Status().Cycles; got != c+1 {
		t.Fatalf("runner did %d cycles at %v, want 1", got-c, d)
	}
}

func TestSleepsUntilEarliestDeadlineLeaseRoundOrInterval(t *testing.T) {
	clk := clocktest.New(t0)
	s := &nowCounter{Store: openEmbedded(t, openBolt(t), 1, clk)}
	connect(t, s, []gateway.DeviceID{"soon"}, 10*time.Second)
	connect(t, s, []gateway.DeviceID{"later"}, 30*time.Second)

	var got events
	// Lease rounds every 100s, at t0, t0+100s, ...
	r := New(s, Options{Owner: "runner-a", Clock: clk, Interval: time.Minute, LockTTL: 300 * time.Second, OnEvent: got.add})
	start(t, r)
	asleep(t, clk, 1)

	sleeps(t, clk, r, 10*time.Second) // t0+10s: the earliest deadline
	if evs := got.list(); len(evs) != 1 || evs[0].Device != "soon" {
		t.Fatalf("events at t0+10s: %+v, want soon's", evs)
	}
	sleeps(t, clk, r, 20*time.Second) // t0+30s: the next deadline
	if evs := got.list(); len(evs) != 2 || evs[1].Device != "later" {
		t.Fatalf("events at t0+30s: %+v, want later's", evs)
	}
	sleeps(t, clk, r, time.Minute)    // t0+90s: nothing due, Interval
	sleeps(t, clk, r, 10*time.Second) // t0+100s: the lease round, no reap
	sleeps(t, clk, r, 50*time.Second) // t0+150s: Interval after the last reap
	sleeps(t, clk, r, 50*time.Second) // t0+200s: the lease round
	// reaps at t0, +10 s, +30 s, +90 s and +150 s: a lease round reaps
	// no shard that is not due
	if st := r.Status(); st.Reaped != 2 || len(st.Shards) != 1 || st.ReapCalls != 5 {
		t.Fatalf("status %+v, want 2 reaped in 5 calls", st)
	}
	// the sleeps are timed with the store time each reap returned
	if n := s.nows.Load(); n != 0 {
		t.Fatalf("the runner read the store's clock %d times, want 0 (ReapResult.Now)", n)
	}
}

// A shard is reaped when it is due, not whenever another shard is: with
// many devices some shard's deadline is always near, and reaping every
// shard at each of them multiplied the store's reaps by the shards.
func TestReapsOnlyTheShardThatIsDue(t *testing.T) {
	clk := clocktest.New(t0)
	s := openEmbedded(t, openBolt(t), 4, clk)
	var dev gateway.DeviceID
	for _, d := range deviceIDs("dev", 100) {
		if gateway.ShardOf(d, 4) == 2 {
			dev = d
			break
		}
	}
	connect(t, s, []gateway.DeviceID{dev}, 10*time.Second)
	var got events
	// lease rounds every second: two shards at t0, all four at t0+1s
	r := New(s, Options{Owner: "runner-a", Clock: clk, Interval: time.Minute, LockTTL: 3 * time.Second, OnEvent: got.add})
	start(t, r)
	asleep(t, clk, 1)
	for range 9 {
		step(t, clk, time.Second, 1)
	}
	if st := r.Status(); len(st.Shards) != 4 || st.ReapCalls != 4 {
		t.Fatalf("at t0+9s: %+v, want 4 shards held, each reaped once", st)
	}
	step(t, clk, time.Second, 1)
	if st := r.Status(); st.ReapCalls != 5 || got.len() != 1 {
		t.Fatalf("after shard 2's deadline: %+v and %d events, want shard 2 alone reaped (5 calls) and 1 event", st, got.len())
	}
}

// nowCounter counts the calls of a real store's Now.
type nowCounter struct {
	gateway.Store
	nows atomic.Int64
}

var _ gateway.Store = (*nowCounter)(nil)

func (c *nowCounter) Now(ctx context.Context) (time.Time, error) {
	c.nows.Add(1)
	return c.Store.Now(ctx)
}

func TestRunnersShareShardsAndTakeOverADeadOne(t *testing.T) {
	const shards = 16
	clk := clocktest.New(t0)
	db := openBolt(t)
	sa := openEmbedded(t, db, shards, clk)
	sb := openEmbedded(t, db, shards, clk) // B's own handle, closed to kill B
	if rotation("runner-a", shards) == rotation("runner-b", shards) {
		t.Fatalf("test owners start their walks on the same shard")
	}

	var gotA, gotB events
	const ttl = 6 * time.Second // lease rounds every 2s
	opts := func(owner string, on *events) Options {
		return Options{Owner: owner, Clock: clk, Interval: time.Second, LockTTL: ttl, OnEvent: on.add}
	}
	a := New(sa, opts("runner-a", &gotA))
	b := New(sb, opts("runner-b", &gotB))
	stopA := start(t, a)
	stopB := start(t, b)
	asleep(t, clk, 2)
	for range 3 { // past one even lease round of each
		step(t, clk, time.Second, 2)
	}
	ha, hb := a.Status().Shards, b.Status().Shards
	all := slices.Sorted(slices.Values(append(slices.Clone(ha), hb...)))
	if len(ha) != shards/2 || len(hb) != shards/2 || len(slices.Compact(all)) != shards {
		t.Fatalf("shards held: a %v, b %v; want 8 each, disjoint", ha, hb)
	}

	// Both reap, each its own shards, every device once.
	first := deviceIDs("first", 400)
	connect(t, sa, first, 30*time.Second)
	for range 31 {
		step(t, clk, time.Second, 2)
	}
	checkOnce(t, first, &gotA, &gotB)
	for _, ev := range gotA.list() {
		if !slices.Contains(ha, ev.Shard) {
			t.Fatalf("runner a reaped %s of shard %d, not one of its %v", ev.Device, ev.Shard, ha)
		}
	}

	// B dies: its store is gone, so its leases are never released nor
	// renewed. Devices of every shard expire during the takeover.
	second := deviceIDs("second", 400)
	connect(t, sa, second, 20*time.Second)
	sb.Close()
	stopB()
	killed := clk.Now()
	var took time.Duration
	for i := range 20 {
		step(t, clk, time.Second, 1)
		if len(a.Status().Shards) == shards {
			took = time.Duration(i+1) * time.Second
			break
		}
	}
	// B renewed within the last 3s (rounds every 2s, cycles every 1s),
	// so its leases outlive the kill by more than 3s; A takes them when
	// they run out, within two of its lease rounds and one cycle.
	if took <= 3*time.Second || took > ttl+2*ttl/3+time.Second {
		t.Fatalf("runner a held all shards %v after b died, want in (3s, %v]", took, ttl+2*ttl/3+time.Second)
	}
	for clk.Now().Before(killed.Add(21 * time.Second)) {
		step(t, clk, time.Second, 1)
	}
	checkOnce(t, append(first, second...), &gotA, &gotB)

	// A stops cleanly: it releases its leases, so C takes every shard in
	// two lease rounds, well before A's leases would have run out.
	stopA()
	var gotC events
	c := New(sa, opts("runner-c", &gotC))
	start(t, c)
	asleep(t, clk, 1)
	if n := len(c.Status().Shards); n != shards/2 {
		t.Fatalf("runner c took %d shards in its first lease round, want half (%d)", n, shards/2)
	}
	step(t, clk, time.Second, 1)
	step(t, clk, time.Second, 1)
	if n := len(c.Status().Shards); n != shards {
		t.Fatalf("runner c holds %d shards 2s after a stopped, want all %d (a released them)", n, shards)
	}
}

// checkOnce checks that the runners together wrote exactly one offline
// event (its second: ver one more than the store time of its first, ms)
// for each of ids and none for any other device.
func checkOnce(t *testing.T, ids []gateway.DeviceID, runners ...*events) {
	t.Helper()
	seen := make(map[gateway.DeviceID]int)
	for _, e := range runners {
		for dev, evs := range e.byDevice() {
			for _, ev := range evs {
				if ev.Ver < 1<<40 || ev.State != gateway.Offline {
					t.Fatalf("device %s: event %+v, want offline at a ver above the store time", dev, ev)
				}
			}
			seen[dev] += len(evs)
		}
	}
	for _, id := range ids {
		if seen[id] != 1 {
			t.Fatalf("device %s: %d offline events, want 1", id, seen[id])
		}
	}
	if len(seen) != len(ids) {
		t.Fatalf("events for %d devices, want %d", len(seen), len(ids))
	}
}

func TestRunTwiceAtOnceFails(t *testing.T) {
	clk := clocktest.New(t0)
	s := openEmbedded(t, openBolt(t), 2, clk)
	r := New(s, Options{Owner: "runner-a", Clock: clk})
	start(t, r)
	asleep(t, clk, 1)
	if err := r.Run(context.Background()); err == nil {
		t.Fatalf("second Run while running: nil error")
	}
}
