package storetest

import (
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/fleetgate/fleetgate/gateway"
)

// testDuplicateWrites: the writes of one batch apply in order, each
// seeing the ones before it: a device may come online and go offline
// within one batch, a session keeps its newest evidence, and a second
// leave finds no session.
func testDuplicateWrites(t *testing.T, open Opener) {
	e := newEnv(t, open, 1)
	a, b, c := gateway.DeviceID("dev-a"), gateway.DeviceID("dev-b"), gateway.DeviceID("dev-c")
	now := e.now()
	first := batch(gwA, 1,
		wr(a, "s1", gateway.Connect, 3*time.Second),
		wr(b, "s1", gateway.Renew, 0),
		wr(a, "s1", gateway.Renew, time.Second),
		wr(b, "s1", gateway.Leave, 0),
		wr(a, "s1", gateway.Renew, 2*time.Second),
		wr(c, "s1", gateway.Connect, 0),
		wr(c, "s1", gateway.Leave, 0),
		wr(c, "s1", gateway.Leave, 0),
	)
	res := e.apply(first)
	e.checkEvents("batch with duplicate writes", res.Events, 0,
		online(a, 1, gateway.ReasonConnect, now, gwA, "s1"),
		online(b, 1, gateway.ReasonRenew, now, gwA, "s1"),
		leaveEvent(b, 2, now, gwA, "s1"),
		online(c, 1, gateway.ReasonConnect, now, gwA, "s1"),
		leaveEvent(c, 2, now, gwA, "s1"))
	e.checkLogged(0, res.Events)
	e.checkDevice(a, onlineInfo(a, 1, now, sess("s1", now.Add(lease-time.Second))))
	e.checkDevice(b, offlineInfo(b, 2, now))
	e.checkDevice(c, offlineInfo(c, 2, now))
}

// testReplayedBatch: invariant 4, a batch applied twice (as is, or later
// from the outbox with ages recomputed) writes no new event.
func testReplayedBatch(t *testing.T, open Opener) {
	e := newEnv(t, open, 1)
	a, b, c := gateway.DeviceID("dev-a"), gateway.DeviceID("dev-b"), gateway.DeviceID("dev-c")
	t0 := e.now()
	e.apply(batch(gwA, 1, wr(c, "s1", gateway.Connect, 0), wr(b, "s9", gateway.Connect, 0)))
	e.clock.Advance(time.Second)
	t1 := e.now()
	b1 := batch(gwA, 1,
		wr(a, "s1", gateway.Connect, 0),
		wr(b, "s1", gateway.Renew, 500*time.Millisecond),
		wr(c, "s1", gateway.Leave, 0),
		wr(b, "s9", gateway.Leave, 0),
		wr(a, "s2", gateway.Renew, 0))
	res := e.apply(b1)
	e.checkEvents("first apply", res.Events, 0,
		online(a, 1, gateway.ReasonConnect, t1, gwA, "s1"),
		leaveEvent(c, 2, t1, gwA, "s1"))
	want := func() {
		t.Helper()
		e.checkDevice(a, onlineInfo(a, 1, t1, sess("s1", t1.Add(lease)), sess("s2", t1.Add(lease))))
		e.checkDevice(b, onlineInfo(b, 1, t0, sess("s1", t1.Add(lease-500*time.Millisecond))))
		e.checkDevice(c, offlineInfo(c, 2, t1))
	}
	want()
	logLen := len(e.log(0))

	res = e.apply(b1)
	e.checkEvents("the same batch again", res.Events, 0)
	want()

	e.clock.Advance(2 * time.Second)
	later := replayed(b1)
	later.Writes = slices.Clone(b1.Writes)
	for i := range later.Writes {
		later.Writes[i].Age += 2 * time.Second
	}
	res = e.apply(later)
	e.checkEvents("the batch replayed 2s later with ages recomputed", res.Events, 0)
	want()
	if n := len(e.log(0)); n != logLen {
		t.Errorf("replays grew the log from %d to %d events", logLen, n)
	}
}

// testShardErrors: a batch with a device of another shard is refused
// whole (ErrWrongShard), and every call given a shard outside
// [0, Shards()) fails with ErrBadShard, writing nothing.
func testShardErrors(t *testing.T, open Opener) {
	e := newEnv(t, open, 4)
	in0 := devicesIn(t, 4, 0, 1, "good")[0]
	in1 := devicesIn(t, 4, 1, 1, "bad")[0]
	for _, b := range []gateway.Batch{
		batch(gwA, 1, wr(in1, "s1", gateway.Connect, 0)),
		batch(gwA, 1, wr(in0, "s1", gateway.Connect, 0), wr(in1, "s1", gateway.Connect, 0)),
	} {
		if _, err := e.store.Apply(e.ctx, 0, b); !errors.Is(err, gateway.ErrWrongShard) {
			t.Errorf("Apply(shard 0, %s) = %v, want ErrWrongShard", describeBatch(b), err)
		}
	}
	e.checkAbsent(in0)
	e.checkAbsent(in1)
	for s := range 4 {
		e.checkLogLen("after refused batches", s, 0)
	}

	good := batch(gwA, 1, wr(in0, "s1", gateway.Connect, 0))
	for _, shard := range []int{-1, 4, 1 << 20} {
		calls := map[string]error{}
		_, calls["Apply"] = e.store.Apply(e.ctx, shard, good)
		_, calls["Reap"] = e.store.Reap(e.ctx, shard, 10)
		_, calls["Events"] = e.store.Events(e.ctx, shard, "", 10)
		_, calls["AcquireShard"] = e.store.AcquireShard(e.ctx, shard, "runner-1", time.Minute)
		calls["ReleaseShard"] = e.store.ReleaseShard(e.ctx, shard, "runner-1")
		calls["Probe"] = e.store.Probe(e.ctx, []int{shard})[0]
		for name, err := range calls {
			if !errors.Is(err, gateway.ErrBadShard) {
				t.Errorf("%s(shard %d) = %v, want ErrBadShard", name, shard, err)
			}
		}
	}
	e.checkAbsent(in0)
}

// testProbe: Probe answers nil for every shard of a store that answers,
// one result per shard asked for, in order (ErrBadShard for one out of
// range), and writes nothing.
func testProbe(t *testing.T, open Opener) {
	e := newEnv(t, open, 4)
	errs := e.store.Probe(e.ctx, []int{3, 0, 4, 1, 2})
	if len(errs) != 5 {
		t.Fatalf("Probe of 5 shards: %d results", len(errs))
	}
	for i, err := range errs {
		if i == 2 {
			if !errors.Is(err, gateway.ErrBadShard) {
				t.Errorf("Probe(shard 4 of 4) = %v, want ErrBadShard", err)
			}
		} else if err != nil {
			t.Errorf("Probe, result %d: %v", i, err)
		}
	}
	for s := range 4 {
		e.checkLogLen("after probes", s, 0)
	}
	if page, err := e.store.List(e.ctx, gateway.ListQuery{Limit: 10}); err != nil || len(page.Devices) != 0 {
		t.Errorf("devices after probes: %+v, %v; want none", page, err)
	}
}

// testIncarnationNamed: every applied batch names its shard's
// incarnation, the same from call to call while the state stands, for
// writes and for an empty batch alike.
func testIncarnationNamed(t *testing.T, open Opener) {
	e := newEnv(t, open, 2)
	d := gateway.DeviceID("dev-1")
	first := e.apply(batch(gwA, 1, wr(d, "s1", gateway.Connect, 0))).Incarnation
	if first == "" {
		t.Fatal("Apply named no incarnation")
	}
	again := e.apply(batch(gwA, 1, wr(d, "s1", gateway.Renew, 0))).Incarnation
	res, err := e.store.Apply(e.ctx, 1-gateway.ShardOf(d, 2), batch(gwA, 1))
	if err != nil {
		t.Fatal(err)
	}
	if again != first || res.Incarnation == "" {
		t.Errorf("incarnations %q, %q (empty batch of the other shard %q): want the same, named", first, again, res.Incarnation)
	}
}

// testVerContinues: invariant 5 over connect, leave, renew, expiry and
// replay.
func testVerContinues(t *testing.T, open Opener) {
	e := newEnv(t, open, 2)
	d := gateway.DeviceID("dev-1")
	shard := gateway.ShardOf(d, 2)
	var got []gateway.Event
	var want []wantEvent
	step := func(evs []gateway.Event, w wantEvent) {
		got = append(got, evs...)
		want = append(want, w)
		e.clock.Advance(time.Second)
	}
	step(e.apply(batch(gwA, 1, wr(d, "s1", gateway.Connect, 0))).Events, online(d, 1, gateway.ReasonConnect, e.now(), gwA, "s1"))
	step(e.apply(batch(gwA, 1, wr(d, "s1", gateway.Leave, 0))).Events, leaveEvent(d, 2, e.now(), gwA, "s1"))
	step(e.apply(batch(gwA, 1, wr(d, "s2", gateway.Renew, 0))).Events, online(d, 3, gateway.ReasonRenew, e.now(), gwA, "s2"))
	deadline := e.now().Add(lease - time.Second)
	e.clock.Advance(lease)
	step(e.reap(shard, 10).Offline, expired(d, 4, e.now(), deadline))
	now := e.now()
	step(e.apply(replayed(batch(gwB, 1, wr(d, "s3", gateway.Connect, 0)))).Events, online(d, 5, gateway.ReasonReplay, now, gwB, "s3"))
	e.checkEvents("events of five transitions", got, shard, want...)
	e.checkEvents("log of five transitions", e.log(shard), shard, want...)
	e.checkDevice(d, onlineInfo(d, 5, now, sess("s3", now.Add(lease))))
}

// testVerStartsAtStoreTime: a device's first ver is the store time in ms
// it was written at, so that a store that loses the record (a restart
// without persistence, FLUSHALL) starts above every ver it handed out;
// later transitions count up by one.
func testVerStartsAtStoreTime(t *testing.T, open Opener) {
	e := newEnv(t, open, 1)
	d := gateway.DeviceID("dev-1")
	e.clock.Advance(5*time.Second + 7*time.Millisecond)
	at := e.now()
	res := e.apply(batch(gwA, 1, wr(d, "s1", gateway.Connect, 0)))
	if len(res.Events) != 1 || res.Events[0].Ver != uint64(at.UnixMilli()) {
		t.Fatalf("first event %s, want ver %d (the store time)", describeEvents(res.Events), at.UnixMilli())
	}
	e.clock.Advance(time.Hour)
	res = e.apply(batch(gwA, 1, wr(d, "s1", gateway.Leave, 0)))
	if len(res.Events) != 1 || res.Events[0].Ver != uint64(at.UnixMilli())+1 {
		t.Fatalf("second event %s, want ver %d", describeEvents(res.Events), at.UnixMilli()+1)
	}
}
