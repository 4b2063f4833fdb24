package uplink

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/fleetgate/fleetgate/gateway"
	"github.com/fleetgate/fleetgate/gateway/clocktest"
	"github.com/fleetgate/fleetgate/internal/redistest"
)

// After Redis loses its data (FLUSHALL here; a restart without
// persistence is the same), the gateway's next call learns it
// (ApplyResult.Reset) and restores every live session of its table on
// the shards concerned: a device that keeps renewing is not reported
// online a second time, and one that stopped just before the loss is
// known again, so its offline still comes.
func TestRestoreAfterStoreLostItsData(t *testing.T) {
	srv, e, table := restoreEnv(t, nil)
	ctx := t.Context()
	devs := []gateway.DeviceID{"keeps-1", "keeps-2", "stopped-1", "stopped-2", "stopped-3", "leaves"}
	for _, d := range devs {
		if err := table.Observe(ctx, gateway.Evidence{Device: d, Session: "coap/default", Kind: gateway.Renew, ObservedAt: e.clock.Now()}); err != nil {
			t.Fatal(err)
		}
	}
	if err := e.u.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	if evs := allEvents(t, e.store); len(evs) != len(devs) {
		t.Fatalf("before the loss: %d events, want %d", len(evs), len(devs))
	}
	if err := srv.Client(t).FlushAll(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	// the devices that keep sending renew (past renew_every, so the table
	// forwards it); the others have stopped
	e.clock.Advance(6 * time.Second)
	for _, d := range devs[:2] {
		if err := table.Observe(ctx, gateway.Evidence{Device: d, Session: "coap/default", Kind: gateway.Renew, ObservedAt: e.clock.Now()}); err != nil {
			t.Fatal(err)
		}
	}
	// one leaves; its leave waits in the queue (the leave grace, which a
	// timed flush keeps) when the loss is found, and is gone from the
	// table
	if err := table.Observe(ctx, gateway.Evidence{Device: "leaves", Session: "coap/default", Kind: gateway.Leave, ObservedAt: e.clock.Now()}); err != nil {
		t.Fatal(err)
	}
	if err := e.u.flushOnce(ctx, false); err != nil {
		t.Fatal(err)
	}
	if p := e.u.Status().Pending; p != 1 {
		t.Fatalf("pending %d after the timed flush, want the leave", p)
	}
	// the keep-alive reaches the shards without renewals
	e.clock.Advance(2 * time.Second)
	if err := e.u.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	// past the leave grace the leave finds its restored session: its
	// offline, the only event after the loss
	e.clock.Advance(3 * time.Second)
	if err := e.u.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	evs := allEvents(t, e.store)
	if len(evs) != 1 || evs[0].Device != "leaves" || evs[0].Reason != gateway.ReasonLeave {
		t.Fatalf("after the loss: events %+v, want the leave's offline only", evs)
	}
	devs = devs[:5]
	// each restored from its own newest evidence: the stopped ones' 6 s
	// older than the others'
	deadline := map[gateway.DeviceID]time.Time{}
	for _, d := range devs {
		info, err := e.store.Device(ctx, d)
		if err != nil || info.State != gateway.Online {
			t.Fatalf("%s after the loss: %+v %v, want online again", d, info, err)
		}
		deadline[d] = info.Deadline
	}
	for _, d := range devs[2:] {
		if gap := deadline["keeps-1"].Sub(deadline[d]); gap != 6*time.Second {
			t.Errorf("%s deadline %v, %v before keeps-1's; want 6 s (its own newest evidence)", d, deadline[d], gap)
		}
	}
}

// A restore goes through the uplink's one write path: the lost shards'
// sessions go in one store call per round (here one: two sessions on
// each of the testShards shards), counted by the same metrics as a
// flush (store calls, batches, writes by kind).
func TestRestoreIsOneCallPerRound(t *testing.T) {
	srv, e, table := restoreEnv(t, nil)
	ctx := t.Context()
	const perShard = 2
	count := make([]int, testShards)
	for i := 0; i < 1000 && slices.Min(count) < perShard; i++ {
		d := gateway.DeviceID(fmt.Sprintf("dev-%d", i))
		if s := gateway.ShardOf(d, testShards); count[s] < perShard {
			count[s]++
			if err := table.Observe(ctx, gateway.Evidence{Device: d, Session: "coap/default", Kind: gateway.Renew, ObservedAt: e.clock.Now()}); err != nil {
				t.Fatal(err)
			}
		}
	}
	if slices.Min(count) < perShard {
		t.Fatalf("devices per shard %v", count)
	}
	if err := e.u.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	if err := srv.Client(t).FlushAll(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	metric := func(name, label, value string) float64 { return metricValue(t, e.reg, name, label, value) }
	calls0, batches0 := metric("fleetgate_store_calls_total", "", ""), metric("fleetgate_flushes_total", "", "")
	renews0, trips0 := metric("fleetgate_renewals_written_total", "kind", "renew"), e.store.RoundTrips()
	// nothing queued: the keep-alive learns the loss on every shard
	e.clock.Advance(2 * time.Second)
	if err := e.u.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	want := float64(perShard * testShards)
	if got := metric("fleetgate_uplink_restored_sessions_total", "", ""); got != want {
		t.Fatalf("restored %v sessions, want %v", got, want)
	}
	if trips := e.store.RoundTrips() - trips0; trips != 2 {
		t.Errorf("%d store calls for the keep-alive and the restore, want 2 (the restore of %d shards in one)", trips, testShards)
	}
	if calls := metric("fleetgate_store_calls_total", "", "") - calls0; calls != 2 {
		t.Errorf("fleetgate_store_calls_total +%v, want +2", calls)
	}
	if b := metric("fleetgate_flushes_total", "", "") - batches0; b != 2*testShards {
		t.Errorf("fleetgate_flushes_total +%v, want +%d (a keep-alive and a restore batch per shard)", b, 2*testShards)
	}
	if r := metric("fleetgate_renewals_written_total", "kind", "renew") - renews0; r != want {
		t.Errorf("renewals written +%v, want the %v restored", r, want)
	}
	var devs []gateway.DeviceID
	table.Range(func(v gateway.SessionView) bool { devs = append(devs, v.Device); return true })
	for _, d := range devs {
		if info, err := e.store.Device(ctx, d); err != nil || info.State != gateway.Online {
			t.Errorf("%s after the restore: %+v %v, want online", d, info, err)
		}
	}
}

// restoreKeepLapsed is the restore tests' lease + gateway grace.
const restoreKeepLapsed = 40 * time.Second

// A session that ran out before the store lost its state may have lost
// its offline with it (the runner had not reaped it yet): the restore
// re-sends it with its passed deadline, whether the table has swept it
// or not, and the store's next reap writes its offline. A session that
// ran out longer than lease + grace before is not re-sent.
func TestRestoreEndsSessionsThatRanOut(t *testing.T) {
	srv, e, table := restoreEnv(t, nil)
	ctx := t.Context()
	observe := func(devs ...gateway.DeviceID) {
		t.Helper()
		for _, d := range devs {
			if err := table.Observe(ctx, gateway.Evidence{Device: d, Session: "coap/default", Kind: gateway.Renew, ObservedAt: e.clock.Now()}); err != nil {
				t.Fatal(err)
			}
		}
	}
	observe("long-gone")
	if err := e.u.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	e.clock.Advance(31 * time.Second)
	table.Sweep(e.clock.Now()) // long-gone ran out 1 s ago
	e.clock.Advance(restoreKeepLapsed)
	observe("swept", "unswept")
	if err := e.u.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	e.clock.Advance(31 * time.Second)
	table.Sweep(e.clock.Now()) // swept ran out 1 s ago; long-gone's keep has passed
	if err := srv.Client(t).FlushAll(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	e.clock.Advance(2 * time.Second)
	if err := e.u.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	if got := metricValue(t, e.reg, "fleetgate_uplink_restored_sessions_total", "", ""); got != 2 {
		t.Fatalf("restored %v sessions, want 2 (swept and unswept)", got)
	}
	var offline []gateway.DeviceID
	for shard := range testShards {
		r, err := e.store.Reap(ctx, shard, 100)
		if err != nil {
			t.Fatal(err)
		}
		for _, ev := range r.Offline {
			if ev.Reason != gateway.ReasonExpired {
				t.Errorf("offline %+v, want reason expired", ev)
			}
			offline = append(offline, ev.Device)
		}
	}
	slices.Sort(offline)
	if !slices.Equal(offline, []gateway.DeviceID{"swept", "unswept"}) {
		t.Fatalf("offline after the restore: %v, want swept and unswept", offline)
	}
	if info, err := e.store.Device(ctx, "long-gone"); err == nil && info.State == gateway.Online {
		t.Errorf("long-gone after the restore: %+v, want unknown", info)
	}
}

// A device that left, whose leave the store had accepted but whose
// offline it had not written yet (the leave's grace, then the wait for
// the gateway's coverage) when it lost its state: the table forgot the
// session at the leave, so only the accepted leave can bring it back. The
// restore re-sends it (after the live sessions), and the store writes the
// offline with reason leave; a device that left and came back (a new
// session here) is left to that session. Without the leave in the
// restore the device's record is simply gone: no offline is ever
// written.
func TestRestoreWritesTheOfflineOfAnAcceptedLeave(t *testing.T) {
	srv, e, table := restoreEnv(t, nil)
	ctx := t.Context()
	observe := func(d gateway.DeviceID, sess gateway.SessionID, k gateway.Kind) {
		t.Helper()
		if err := table.Observe(ctx, gateway.Evidence{Device: d, Session: sess, Kind: k, ObservedAt: e.clock.Now()}); err != nil {
			t.Fatal(err)
		}
	}
	for _, d := range []gateway.DeviceID{"stays", "left", "back"} {
		observe(d, "coap/a", gateway.Connect)
	}
	if err := e.u.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	e.clock.Advance(time.Second)
	observe("left", "coap/a", gateway.Leave)
	observe("back", "coap/a", gateway.Leave)
	if err := e.u.Flush(ctx); err != nil { // the leaves are accepted
		t.Fatal(err)
	}
	observe("back", "coap/b", gateway.Connect)
	if err := e.u.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	before := len(allEvents(t, e.store))
	if err := srv.Client(t).FlushAll(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	e.clock.Advance(2 * time.Second)
	if err := e.u.Flush(ctx); err != nil { // finds the loss, restores
		t.Fatal(err)
	}
	if got := metricValue(t, e.reg, "fleetgate_uplink_restored_sessions_total", "", ""); got != 3 {
		t.Errorf("restored %v writes, want 3 (stays, back's new session, left's leave)", got)
	}
	var offline []gateway.Event
	for _, ev := range allEvents(t, e.store) {
		if ev.State == gateway.Offline {
			offline = append(offline, ev)
		}
	}
	for shard := range testShards {
		r, err := e.store.Reap(ctx, shard, 100)
		if err != nil {
			t.Fatal(err)
		}
		offline = append(offline, r.Offline...)
	}
	if len(offline) != 1 || offline[0].Device != "left" || offline[0].Reason != gateway.ReasonLeave {
		t.Fatalf("offline after the restore: %+v (%d events before the loss), want left's, reason leave", offline, before)
	}
	for _, d := range []gateway.DeviceID{"stays", "back"} {
		if info, err := e.store.Device(ctx, d); err != nil || info.State != gateway.Online {
			t.Errorf("%s after the restore: %+v %v, want online", d, info, err)
		}
	}
}

// restoreEnv is an uplink on a fresh redis-server (on the test clock, as
// the ages are), wrapped by wrap unless nil, with a session table whose
// sessions it restores.
func restoreEnv(t *testing.T, wrap func(gateway.Store) gateway.Store) (*redistest.Server, *env, *gateway.Table) {
	srv := redistest.Start(t)
	var table *gateway.Table
	open := redisStoreOnClock(t, srv)
	e := newEnv(t, Options{Lease: 30 * time.Second, FlushInterval: time.Second, KeepAlive: time.Second,
		Sessions: func(fn func(gateway.SessionView) bool) { table.Restorable(fn) }}, OutboxOptions{},
		func(db *bolt.DB, c *clocktest.Clock) gateway.Store {
			s := open(db, c)
			if wrap != nil {
				s = wrap(s)
			}
			return s
		})
	table = gateway.NewTable(e.u, gateway.TableOptions{Lease: 30 * time.Second, RenewEvery: 5 * time.Second,
		KeepLapsed: restoreKeepLapsed, Clock: e.clock})
	return srv, e, table
}

// A restore that fails (here the store refuses it once, as a call that
// times out or whose replicas do not acknowledge it would) is tried
// again with the next call its shard answers: a device that stopped
// before the loss would otherwise never get its offline. Until it has
// gone through, the gateway reports no coverage of that shard.
func TestRestoreRetriedAfterItFailed(t *testing.T) {
	var st *failFirstRestore
	srv, e, table := restoreEnv(t, func(s gateway.Store) gateway.Store {
		st = &failFirstRestore{Store: s}
		return st
	})
	ctx := t.Context()
	if err := table.Observe(ctx, gateway.Evidence{Device: "stopped", Session: "coap/default", Kind: gateway.Renew, ObservedAt: e.clock.Now()}); err != nil {
		t.Fatal(err)
	}
	if err := e.u.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	if err := srv.Client(t).FlushAll(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	e.run()
	waitFor(t, "a second restore", 20*time.Second, func() { e.clock.Advance(100 * time.Millisecond) },
		func() bool { return st.restores.Load() >= 2 })
	if n := st.restores.Load(); n != 2 {
		t.Fatalf("%d restore calls, want 2 (the one refused, then the one that went through)", n)
	}
	if info, err := e.store.Device(ctx, "stopped"); err != nil || info.State != gateway.Online {
		t.Fatalf("stopped after the restore: %+v, %v; want online again (its offline to come)", info, err)
	}
	// no coverage until the restore went through (the reap would count
	// it against sessions the store does not have yet), then again
	waitFor(t, "coverage after the restore", 20*time.Second, func() { e.clock.Advance(100 * time.Millisecond) },
		func() bool { _, after := st.coverageWhileRestoring(); return after })
	if during, _ := st.coverageWhileRestoring(); during != 0 {
		t.Fatalf("%d calls reported coverage while the restore was due", during)
	}
}

// failFirstRestore is a store that refuses the first call carrying a
// restore batch, and logs every batch.
type failFirstRestore struct {
	gateway.Store
	restores atomic.Int32
	mu       sync.Mutex
	batches  []restoreBatch
}

// restoreBatch is what failFirstRestore logs of a batch: its shard,
// whether it was a restore, whether it reported coverage, whether it was
// applied, and whether the store said the shard's state was replaced.
type restoreBatch struct {
	shard                      int
	restore, covers, ok, reset bool
}

var _ gateway.Store = (*failFirstRestore)(nil)

func (f *failFirstRestore) ApplyShards(ctx context.Context, batches []gateway.ShardBatch) []gateway.ShardResult {
	restore := slices.ContainsFunc(batches, func(sb gateway.ShardBatch) bool { return sb.Batch.Restore })
	var out []gateway.ShardResult
	if restore && f.restores.Add(1) == 1 {
		out = make([]gateway.ShardResult, len(batches))
		for i := range out {
			out[i].Err = gateway.ErrUnavailable
		}
	} else {
		out = f.Store.ApplyShards(ctx, batches)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	for i, sb := range batches {
		ok := i < len(out) && out[i].Err == nil
		f.batches = append(f.batches, restoreBatch{shard: sb.Shard, restore: sb.Batch.Restore, covers: sb.Batch.Covers,
			ok: ok, reset: ok && out[i].Result.Reset})
	}
	return out
}

// coverageWhileRestoring returns the batches of the first shard
// restored, from the first that found its state replaced to its restore
// that went through, that
// reported coverage (the store does not hold what that coverage stands
// for), and whether a batch of that shard after the restore did.
func (f *failFirstRestore) coverageWhileRestoring() (during int, after bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	shard := -1
	for _, b := range f.batches {
		if b.restore {
			shard = b.shard
			break
		}
	}
	restoring, restored := false, false
	for _, b := range f.batches {
		switch {
		case b.shard != shard:
		case !restoring:
			restoring = b.reset
		case restored:
			after = after || b.covers
		default:
			if b.covers {
				during++
			}
			restored = b.restore && b.ok
		}
	}
	return during, after
}

// A restore call also carries the keep-alives of the idle shards, and
// the store answers Reset for each shard it finds replaced: a shard that
// learns of the loss in a restore of others is restored too (at the
// next call that shard answers), not left out because the call that
// told it was itself a restore.
func TestResetSeenInARestoreRestoresThatShardToo(t *testing.T) {
	srv, e, table := restoreEnv(t, nil)
	ctx := t.Context()
	var devs []gateway.DeviceID
	for shard := range testShards {
		devs = append(devs, devicesIn(shard, 1, "shard")...)
	}
	for _, d := range devs {
		if err := table.Observe(ctx, gateway.Evidence{Device: d, Session: "coap/default", Kind: gateway.Renew, ObservedAt: e.clock.Now()}); err != nil {
			t.Fatal(err)
		}
	}
	if err := e.u.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	if err := srv.Client(t).FlushAll(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	// shard 0 learns of the loss first (as from its outbox's replay); the
	// others are idle, so its restore carries their keep-alives
	e.clock.Advance(2 * time.Second)
	e.u.sendMu.Lock()
	e.u.restoreShards(ctx, e.u.timing(), []int{0})
	e.u.sendMu.Unlock()
	e.clock.Advance(time.Second)
	if err := e.u.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	for _, d := range devs {
		if info, err := e.store.Device(ctx, d); err != nil || info.State != gateway.Online {
			t.Errorf("%s (shard %d) after the loss: %+v, %v; want it restored, online", d, gateway.ShardOf(d, testShards), info, err)
		}
	}
}
