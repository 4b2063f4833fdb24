package storetest

import (
	"testing"
	"time"

	"github.com/fleetgate/fleetgate/gateway"
)

// testCounts: Counts follows every kind of transition (connect, leave,
// expiry by a reap, expiry dropped by a write, a restore that brings a
// record back without an event), on several shards, and writes that
// change no state (renewals, replays, fenced batches) move nothing.
func testCounts(t *testing.T, open Opener) {
	e := newEnv(t, open, 4)
	want := func(what string, online, offline int64) {
		t.Helper()
		got, err := e.store.Counts(e.ctx, 0)
		if err != nil {
			t.Fatalf("%s: Counts: %v", what, err)
		}
		if w := (gateway.Counts{Online: online, Offline: offline}); got != w {
			t.Fatalf("%s: Counts = %+v, want %+v", what, got, w)
		}
		if err := checkScans(e.ctx, e.store); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	}
	want("empty store", 0, 0)
	var devs []gateway.DeviceID
	for s := range 4 {
		devs = append(devs, devicesIn(t, 4, s, 2, "count")...)
	}
	for _, d := range devs {
		e.apply(batch(gwA, 1, wr(d, "s1", gateway.Connect, 0)))
	}
	want("8 connects on 4 shards", 8, 0)
	for _, d := range devs {
		e.apply(batch(gwA, 1, wr(d, "s1", gateway.Renew, 0)))
		e.apply(replayed(batch(gwA, 1, wr(d, "s1", gateway.Renew, 0))))
	}
	want("renewals and replays", 8, 0)
	e.apply(batch(gwA, 1, wr(devs[0], "s1", gateway.Leave, 0), wr(devs[1], "s2", gateway.Connect, 0)))
	e.apply(batch(gwA, 1, wr(devs[1], "s1", gateway.Leave, 0)))
	want("a leave of the last session and one of two", 7, 1)
	e.apply(batch(gwA, 2, wr(devs[2], "s1", gateway.Leave, 0)))
	if err := e.applyErr(batch(gwA, 1, wr(devs[3], "s1", gateway.Leave, 0))); err == nil {
		t.Fatal("a batch of an older epoch was applied")
	}
	want("a leave, then a fenced leave", 6, 2)

	// devs[4] renews, the others run out: one is dropped by a write of
	// its own (a connect after its deadline: offline, then online), the
	// others by the reap
	e.clock.Advance(lease - time.Second)
	e.apply(batch(gwA, 2, wr(devs[4], "s1", gateway.Renew, 0)))
	e.clock.Advance(2 * time.Second)
	e.apply(batch(gwA, 2, wr(devs[5], "s9", gateway.Connect, 0)))
	want("due, not reaped yet", 6, 2)
	for s := range 4 {
		for i := 0; ; i++ {
			if i > 8 {
				t.Fatalf("Reap(%d) still reports More", s)
			}
			if !e.reap(s, 1).More {
				break
			}
		}
	}
	want("reaped", 2, 6)

	// a restore brings a record back online without an event, and creates
	// one the store never had
	fresh := gateway.DeviceID("count-restored")
	e.apply(restored(batch(gwA, 2, wr(devs[0], "s1", gateway.Renew, 0))))
	e.apply(restored(batch(gwA, 2, wr(fresh, "s1", gateway.Renew, 0))))
	want("restores", 4, 5)
}

// testGateways: Gateways lists every gateway a shard accepted a batch of
// (an empty batch too), by ID, with its newest epoch and its latest call
// over the shards; a fenced batch changes nothing.
func testGateways(t *testing.T, open Opener) {
	e := newEnv(t, open, 2)
	list := func() []gateway.GatewayInfo {
		t.Helper()
		gws, err := e.store.Gateways(e.ctx)
		if err != nil {
			t.Fatalf("Gateways: %v", err)
		}
		return gws
	}
	if gws := list(); len(gws) != 0 {
		t.Fatalf("Gateways of an empty store: %+v", gws)
	}
	d0, d1 := devicesIn(t, 2, 0, 1, "gws")[0], devicesIn(t, 2, 1, 1, "gws")[0]
	t0 := e.now()
	e.apply(batch(gwB, 5, wr(d0, "s1", gateway.Connect, 0)))
	e.clock.Advance(time.Second)
	e.apply(batch(gwA, 1, wr(d1, "s1", gateway.Connect, 0)))
	e.clock.Advance(time.Second)
	if _, err := e.store.Apply(e.ctx, 0, gateway.Batch{Gateway: gwA, Epoch: 2, Lease: lease}); err != nil {
		t.Fatalf("empty batch: %v", err)
	}
	e.clock.Advance(time.Second)
	if err := e.applyErr(batch(gwB, 4, wr(d0, "s1", gateway.Renew, 0))); err == nil {
		t.Fatal("a batch of an older epoch was applied")
	}
	want := []gateway.GatewayInfo{
		{ID: gwA, Epoch: 2, Contact: t0.Add(2 * time.Second)},
		{ID: gwB, Epoch: 5, Contact: t0},
	}
	got := list()
	if len(got) != len(want) {
		t.Fatalf("Gateways = %+v, want %+v", got, want)
	}
	for i := range want {
		if got[i].ID != want[i].ID || got[i].Epoch != want[i].Epoch || !got[i].Contact.Equal(want[i].Contact) || got[i].Behind || got[i].Lost {
			t.Fatalf("Gateways = %+v, want %+v", got, want)
		}
	}
}
