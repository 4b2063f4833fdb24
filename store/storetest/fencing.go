package storetest

import (
	"testing"
	"time"

	"github.com/fleetgate/fleetgate/gateway"
)

// testFencing: invariant 3, a batch from an older epoch changes nothing.
func testFencing(t *testing.T, open Opener) {
	e := newEnv(t, open, 4)
	devs := devicesIn(t, 4, 0, 3, "fence")
	d1, d2, d3 := devs[0], devs[1], devs[2]
	t0 := e.now()
	e.apply(batch(gwA, 2, wr(d1, "s1", gateway.Connect, 0)))
	e.clock.Advance(time.Second)

	e.checkFenced("older epoch", batch(gwA, 1,
		wr(d1, "s1", gateway.Renew, 0), wr(d2, "s2", gateway.Connect, 0), wr(d1, "s3", gateway.Connect, 0)))
	e.checkFenced("older epoch leave", batch(gwA, 1, wr(d1, "s1", gateway.Leave, 0)))
	e.checkDevice(d1, onlineInfo(d1, 1, t0, sessBy("s1", t0.Add(lease), gwA, 2)))
	e.checkAbsent(d2)

	res := e.apply(batch(gwB, 1, wr(d2, "s2", gateway.Connect, 0)))
	e.checkEvents("other gateway's epoch 1", res.Events, 0, online(d2, 1, gateway.ReasonConnect, e.now(), gwB, "s2"))

	res = e.apply(batch(gwA, 2, wr(d1, "s1", gateway.Renew, 0)))
	e.checkEvents("same epoch again", res.Events, 0)
	e.checkDevice(d1, onlineInfo(d1, 1, t0, sessBy("s1", e.now().Add(lease), gwA, 2)))

	e.clock.Advance(time.Second)
	res = e.apply(batch(gwA, 3, wr(d3, "s3", gateway.Connect, 0)))
	e.checkEvents("newer epoch", res.Events, 0, online(d3, 1, gateway.ReasonConnect, e.now(), gwA, "s3"))
	e.checkFenced("epoch older than the newest", batch(gwA, 2, wr(d1, "s1", gateway.Renew, 0)))
	e.checkDevice(d1, onlineInfo(d1, 1, t0, sess("s1", t0.Add(time.Second+lease))))

	res = e.apply(batch(gwA, 3, wr(d1, "s1", gateway.Renew, 0)))
	e.checkEvents("newest epoch renewing an older epoch's session", res.Events, 0)
	e.checkDevice(d1, onlineInfo(d1, 1, t0, sess("s1", e.now().Add(lease))))
	res = e.apply(batch(gwB, 1, wr(d2, "s2", gateway.Leave, 0)))
	e.checkEvents("other gateway still on epoch 1", res.Events, 0, leaveEvent(d2, 2, e.now(), gwB, "s2"))
}

// testFencedNoExpiry: a fenced batch is refused whole, including the
// expiry of the sessions it would have touched.
func testFencedNoExpiry(t *testing.T, open Opener) {
	e := newEnv(t, open, 2)
	d := gateway.DeviceID("dev-1")
	shard := gateway.ShardOf(d, 2)
	t0 := e.now()
	e.apply(batch(gwA, 2, wr(d, "s1", gateway.Connect, 0)))
	e.clock.Advance(lease + time.Second)
	e.checkFenced("older epoch", batch(gwA, 1, wr(d, "s1", gateway.Renew, 0)))
	info := e.device(d)
	if info.State != gateway.Online || info.Ver != e.ver(d, 1) || !info.Deadline.Equal(t0.Add(lease)) {
		t.Errorf("Device after a fenced batch: state %s ver %d deadline %v; want online 1 %v (the runner's to reap)",
			info.State, info.Ver, info.Deadline, t0.Add(lease))
	}
	r := e.reap(shard, 10)
	e.checkEvents("Reap after a fenced batch", r.Offline, shard, expired(d, 2, e.now(), t0.Add(lease)))
}

// testEmptyBatchRecordsEpoch: a batch without writes (the uplink's
// announcement of a new process) changes nothing but the epoch: an older
// epoch of that gateway is fenced on that shard afterwards.
func testEmptyBatchRecordsEpoch(t *testing.T, open Opener) {
	e := newEnv(t, open, 2)
	d := gateway.DeviceID("dev-1")
	shard := gateway.ShardOf(d, 2)
	for sh := range 2 {
		res, err := e.store.Apply(e.ctx, sh, batch(gwA, 5))
		if err != nil || len(res.Events) != 0 {
			t.Fatalf("empty batch on shard %d: %+v %v, want no events and no error", sh, res, err)
		}
	}
	e.checkFenced("epoch 4 after an empty epoch-5 batch", batch(gwA, 4, wr(d, "s1", gateway.Connect, 0)))
	e.checkLogLen("after an empty batch and a fenced one", shard, 0)
	e.checkAbsent(d)
	e.apply(batch(gwA, 5, wr(d, "s1", gateway.Connect, 0)))
}

// testRestore: a restore (a gateway re-sending its live sessions after
// the store lost its state, gateway.Batch.Restore) creates a record it
// finds missing online without an event, with a ver that the next event
// counts on from; where the record exists it is a renewal.
func testRestore(t *testing.T, open Opener) {
	e := newEnv(t, open, 1)
	lost, known := gateway.DeviceID("dev-lost"), gateway.DeviceID("dev-known")
	e.apply(batch(gwA, 1, wr(known, "s1", gateway.Connect, 0)))
	e.apply(batch(gwA, 1, wr(known, "s1", gateway.Leave, 0)))
	e.clock.Advance(time.Second)
	at := e.now()
	res := e.apply(restored(batch(gwA, 1,
		wr(lost, "s1", gateway.Renew, 400*time.Millisecond), wr(known, "s1", gateway.Renew, 0))))
	e.checkEvents("restore", res.Events, 0, online(known, 3, gateway.ReasonRenew, at, gwA, "s1"))
	info := e.device(lost)
	if info.State != gateway.Online || info.Ver != uint64(at.UnixMilli()) || !info.Deadline.Equal(at.Add(lease-400*time.Millisecond)) {
		t.Fatalf("restored device %+v, want online at ver %d until %v", info, at.UnixMilli(), at.Add(lease-400*time.Millisecond))
	}
	// a restore of a session whose deadline passed (the renewals that
	// bridged it were lost with the old state) extends it silently
	e.clock.Advance(lease)
	if res = e.apply(restored(batch(gwA, 1, wr(lost, "s1", gateway.Renew, 0)))); len(res.Events) != 0 {
		t.Fatalf("restore of an expired session wrote %s, want nothing", describeEvents(res.Events))
	}
	res = e.apply(batch(gwA, 1, wr(lost, "s1", gateway.Leave, 0)))
	if len(res.Events) != 1 || res.Events[0].State != gateway.Offline || res.Events[0].Ver != uint64(at.UnixMilli())+1 {
		t.Fatalf("leave of the restored device wrote %s, want offline at ver %d", describeEvents(res.Events), at.UnixMilli()+1)
	}
}

// testRestoredLeave: a restore re-sends a leave the store accepted
// before it lost or replaced its state (gateway.Batch.Restore). Where
// the record is gone, or offline since before the leave (an older
// state's record of an earlier visit), the leave's offline is written;
// where the record is online (the state kept the session) or offline
// since the leave, nothing changes.
func testRestoredLeave(t *testing.T, open Opener) {
	e := newEnv(t, open, 1)
	gone, kept, ended, earlier := gateway.DeviceID("left-gone"), gateway.DeviceID("left-kept"), gateway.DeviceID("left-ended"), gateway.DeviceID("left-earlier")
	t0 := e.now()
	e.apply(batch(gwA, 1, wr(kept, "s1", gateway.Connect, 0), wr(ended, "s1", gateway.Connect, 0), wr(earlier, "s1", gateway.Connect, 0)))
	e.apply(batch(gwA, 1, wr(earlier, "s1", gateway.Leave, 0)))
	e.clock.Advance(4 * time.Second)
	e.apply(batch(gwA, 1, wr(ended, "s1", gateway.Leave, 0)))
	e.clock.Advance(time.Second)
	at := e.now()
	// gone and earlier left 1 s ago, ended 2 s ago (before its offline
	// at t0 + 4 s), kept's leave is one its state never got
	res := e.apply(restored(batch(gwA, 1, wr(gone, "s1", gateway.Leave, time.Second), wr(kept, "s1", gateway.Leave, time.Second),
		wr(ended, "s1", gateway.Leave, 2*time.Second), wr(earlier, "s1", gateway.Leave, time.Second))))
	e.checkEvents("restored leaves", res.Events, 0,
		leaveEvent(gone, 1, at, gwA, "s1"), leaveEvent(earlier, 3, at, gwA, "s1"))
	if info := e.device(kept); info.State != gateway.Online || !info.Deadline.Equal(t0.Add(lease)) {
		t.Errorf("kept after a restored leave: %+v, want online until %v (its session ends by its deadline)", info, t0.Add(lease))
	}
	if info := e.device(ended); info.State != gateway.Offline || !info.Since.Equal(t0.Add(4*time.Second)) {
		t.Errorf("ended after a restored leave: %+v, want offline since %v, unchanged", info, t0.Add(4*time.Second))
	}
	// the re-sent leave is a leave: evidence observed before it never
	// brings the session back
	if res = e.apply(batch(gwA, 1, wr(gone, "s1", gateway.Renew, 2*time.Second))); len(res.Events) != 0 {
		t.Errorf("a renewal observed before the restored leave wrote %s, want nothing", describeEvents(res.Events))
	}
}
