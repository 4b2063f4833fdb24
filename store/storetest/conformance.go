package storetest

import (
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/fleetgate/fleetgate/gateway"
)

// lease is the lease of the conformance batches.
const lease = 30 * time.Second

const (
	gwA = "gw-a"
	gwB = "gw-b"
)

// Run runs the conformance subtests against stores made by open.
func Run(t *testing.T, open Opener) {
	tests := []struct {
		name string
		fn   func(*testing.T, Opener)
	}{
		{"ShardsAndNow", testShardsAndNow},
		{"ConnectCreatesOnline", testConnectCreatesOnline},
		{"RenewLiveSession", testRenewLiveSession},
		{"SecondSessionKeepsDeviceOnline", testSecondSession},
		{"LeaveLastSession", testLeaveLastSession},
		{"LeaveIgnoredForNewerEvidence", testLeaveNewerEvidence},
		{"LapsedEvidenceIgnored", testLapsedEvidence},
		{"RenewAfterDeadlineBeforeReap", testRenewAfterDeadline},
		{"LeaveAfterDeadlineBeforeReap", testLeaveAfterDeadline},
		{"LateButValidRenewal", testLateButValidRenewal},
		{"PerWriteLease", testPerWriteLease},
		{"ExpiryOfOneSessionKeepsAnother", testExpiryKeepsOther},
		{"Reap", testReap},
		{"ReapKeepsDeviceWithLiveSession", testReapKeepsLive},
		{"Fencing", testFencing},
		{"FencedBatchWritesNoExpiry", testFencedNoExpiry},
		{"EmptyBatchRecordsEpoch", testEmptyBatchRecordsEpoch},
		{"ShardErrors", testShardErrors},
		{"DeviceNotFound", testDeviceNotFound},
		{"VerContinues", testVerContinues},
		{"DuplicateWritesInBatch", testDuplicateWrites},
		{"ReplayedBatchWritesNoEvent", testReplayedBatch},
		{"SessionMovesBetweenGateways", testSessionMoves},
		{"EventsPaging", testEventsPaging},
		{"ListPaging", testListPaging},
		{"ShardLock", testShardLock},
		{"VerStartsAtStoreTime", testVerStartsAtStoreTime},
		{"LeaveTombstone", testLeaveTombstone},
		{"OlderEvidenceTakesNothing", testOlderEvidenceTakesNothing},
		{"RestoreOfALostRecord", testRestore},
		{"SessionsPerDeviceBounded", testStoreSessionCap},
		{"ConcurrentApply", testConcurrentApply},
		{"ConcurrentReapAndRenew", testConcurrentReapAndRenew},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) { tc.fn(t, open) })
	}
}

func wr(d gateway.DeviceID, s gateway.SessionID, k gateway.Kind, age time.Duration) gateway.Write {
	return gateway.Write{Device: d, Session: s, Kind: k, Age: age}
}

func batch(gw string, epoch uint64, ws ...gateway.Write) gateway.Batch {
	return gateway.Batch{Gateway: gw, Epoch: epoch, Lease: lease, Writes: ws}
}

func onlineInfo(d gateway.DeviceID, ver uint64, since time.Time, sessions ...gateway.SessionInfo) gateway.DeviceInfo {
	var deadline time.Time
	for _, s := range sessions {
		if s.Deadline.After(deadline) {
			deadline = s.Deadline
		}
	}
	return gateway.DeviceInfo{Device: d, State: gateway.Online, Deadline: deadline, Ver: ver, Since: since, Sessions: sessions}
}

func offlineInfo(d gateway.DeviceID, ver uint64, since time.Time) gateway.DeviceInfo {
	return gateway.DeviceInfo{Device: d, State: gateway.Offline, Ver: ver, Since: since}
}

func sess(id gateway.SessionID, deadline time.Time) gateway.SessionInfo {
	return gateway.SessionInfo{ID: id, Deadline: deadline}
}

func testShardsAndNow(t *testing.T, open Opener) {
	for _, shards := range []int{1, 5} {
		e := newEnv(t, open, shards)
		if got := e.store.Shards(); got != shards {
			t.Errorf("Shards() = %d, want %d", got, shards)
		}
		for _, step := range []time.Duration{0, 1500 * time.Millisecond, time.Hour} {
			e.clock.Advance(step)
			got, err := e.store.Now(e.ctx)
			if err != nil {
				t.Fatalf("Now: %v", err)
			}
			if !got.Equal(e.now()) {
				t.Errorf("Now() = %v, want the clock's %v", got, e.now())
			}
		}
	}
}

func testConnectCreatesOnline(t *testing.T, open Opener) {
	tests := []struct {
		name   string
		kind   gateway.Kind
		replay bool
		reason gateway.Reason
	}{
		{"connect", gateway.Connect, false, gateway.ReasonConnect},
		{"renew", gateway.Renew, false, gateway.ReasonRenew},
		{"replayed connect", gateway.Connect, true, gateway.ReasonReplay},
		{"replayed renew", gateway.Renew, true, gateway.ReasonReplay},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, open, 4)
			d := gateway.DeviceID("dev-1")
			shard := gateway.ShardOf(d, 4)
			b := batch(gwA, 7, wr(d, "s1", tc.kind, 2*time.Second))
			b.Replay = tc.replay
			now := e.now()
			res := e.apply(b)
			e.checkEvents("Apply", res.Events, shard, online(d, 1, tc.reason, now, gwA, "s1"))
			deadline := now.Add(lease - 2*time.Second)
			want := onlineInfo(d, 1, now, gateway.SessionInfo{ID: "s1", Deadline: deadline, Gateway: gwA, Epoch: 7})
			want.Gateway, want.Session = gwA, "s1"
			e.checkDevice(d, want)
			e.checkLogged(shard, res.Events)
			if log := e.log(shard); len(log) != 1 {
				t.Errorf("shard %d log has %d events, want 1: %s", shard, len(log), describeEvents(log))
			}
			for s := range 4 {
				if s != shard && len(e.log(s)) != 0 {
					t.Errorf("shard %d log is not empty: %s", s, describeEvents(e.log(s)))
				}
			}
			fromZero, err := e.store.Events(e.ctx, shard, "0", 10)
			if err != nil {
				t.Fatalf("Events(after 0): %v", err)
			}
			if !slices.EqualFunc(fromZero, res.Events, sameEvent) {
				t.Errorf("Events(after \"0\") = %s, want %s", describeEvents(fromZero), describeEvents(res.Events))
			}
		})
	}
}

func testRenewLiveSession(t *testing.T, open Opener) {
	e := newEnv(t, open, 2)
	d := gateway.DeviceID("dev-1")
	shard := gateway.ShardOf(d, 2)
	t0 := e.now()
	e.apply(batch(gwA, 1, wr(d, "s1", gateway.Connect, 0)))

	e.clock.Advance(3 * time.Second)
	res := e.apply(batch(gwA, 1, wr(d, "s1", gateway.Renew, 5*time.Second)))
	e.checkEvents("renew with older evidence", res.Events, shard)
	e.checkDevice(d, onlineInfo(d, 1, t0, sess("s1", t0.Add(lease))))

	res = e.apply(batch(gwA, 1, wr(d, "s1", gateway.Renew, time.Second)))
	e.checkEvents("renew with newer evidence", res.Events, shard)
	e.checkDevice(d, onlineInfo(d, 1, t0, sess("s1", t0.Add(2*time.Second+lease))))

	res = e.apply(batch(gwA, 1, wr(d, "s1", gateway.Connect, 0)))
	e.checkEvents("connect of a live session", res.Events, shard)
	e.checkDevice(d, onlineInfo(d, 1, t0, sess("s1", t0.Add(3*time.Second+lease))))
	if log := e.log(shard); len(log) != 1 {
		t.Errorf("log has %d events, want the one online event: %s", len(log), describeEvents(log))
	}
}

// testSecondSession: invariant 2, leaving one session keeps another.
func testSecondSession(t *testing.T, open Opener) {
	tests := []struct {
		leave, kept gateway.SessionID
		keptLease   time.Duration // the kept session's deadline, from t0
	}{
		{"s1", "s2", 5*time.Second + lease},
		{"s2", "s1", lease},
	}
	for _, tc := range tests {
		t.Run("leave "+string(tc.leave), func(t *testing.T) {
			e := newEnv(t, open, 2)
			d := gateway.DeviceID("dev-1")
			shard := gateway.ShardOf(d, 2)
			t0 := e.now()
			e.apply(batch(gwA, 1, wr(d, "s1", gateway.Connect, 0)))
			e.clock.Advance(5 * time.Second)
			res := e.apply(batch(gwB, 1, wr(d, "s2", gateway.Connect, 0)))
			e.checkEvents("second session's connect", res.Events, shard)
			e.checkDevice(d, onlineInfo(d, 1, t0, sess("s1", t0.Add(lease)), sess("s2", t0.Add(5*time.Second+lease))))

			e.clock.Advance(time.Second)
			res = e.apply(batch(gwA, 1, wr(d, tc.leave, gateway.Leave, 0)))
			e.checkEvents("leave of one of two sessions", res.Events, shard)
			e.checkDevice(d, onlineInfo(d, 1, t0, sess(tc.kept, t0.Add(tc.keptLease))))
		})
	}
}

func testLeaveLastSession(t *testing.T, open Opener) {
	e := newEnv(t, open, 2)
	d := gateway.DeviceID("dev-1")
	shard := gateway.ShardOf(d, 2)
	connect := e.apply(batch(gwA, 1, wr(d, "s1", gateway.Connect, 0)))
	e.clock.Advance(2 * time.Second)
	t1 := e.now()
	res := e.apply(batch(gwB, 1, wr(d, "s1", gateway.Leave, 0)))
	e.checkEvents("leave", res.Events, shard, leaveEvent(d, 2, t1, gwB, "s1"))
	e.checkDevice(d, offlineInfo(d, 2, t1))
	if info := e.device(d); !info.Deadline.IsZero() || len(info.Sessions) != 0 {
		t.Errorf("Device after leave: deadline %v, sessions %s; want none", info.Deadline, describeSessions(info.Sessions))
	}
	e.checkLogged(shard, slices.Concat(connect.Events, res.Events))

	e.clock.Advance(lease + time.Second)
	reap := e.reap(shard, 10)
	if len(reap.Offline) != 0 || reap.Trimmed != 0 || reap.More || !reap.Next.IsZero() {
		t.Errorf("Reap after leave = %+v; want nothing (the leave removed the deadline entry)", reap)
	}
	if log := e.log(shard); len(log) != 2 {
		t.Errorf("log has %d events, want 2: %s", len(log), describeEvents(log))
	}
}

func testLeaveNewerEvidence(t *testing.T, open Opener) {
	tests := []struct {
		name    string
		age     time.Duration
		removed bool
	}{
		{"leave newer than the renewal", 0, true},
		{"leave as old as the renewal", time.Second, true},
		{"leave older than the renewal", time.Second + time.Millisecond, false},
		{"lapsed leave", lease + time.Second, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, open, 2)
			d := gateway.DeviceID("dev-1")
			shard := gateway.ShardOf(d, 2)
			t0 := e.now()
			e.apply(batch(gwA, 1, wr(d, "s1", gateway.Connect, 0)))
			e.clock.Advance(time.Second)
			res := e.apply(batch(gwA, 1, wr(d, "s1", gateway.Leave, tc.age)))
			if tc.removed {
				e.checkEvents("leave", res.Events, shard, leaveEvent(d, 2, e.now(), gwA, "s1"))
				e.checkDevice(d, offlineInfo(d, 2, e.now()))
				return
			}
			e.checkEvents("leave with older evidence than the session's", res.Events, shard)
			e.checkDevice(d, onlineInfo(d, 1, t0, sess("s1", t0.Add(lease))))
		})
	}
}

func testLapsedEvidence(t *testing.T, open Opener) {
	tests := []struct {
		name string
		kind gateway.Kind
		age  time.Duration
	}{
		{"connect aged the lease", gateway.Connect, lease},
		{"renew aged the lease", gateway.Renew, lease},
		{"connect aged past the lease", gateway.Connect, lease + time.Minute},
		{"renew aged past the lease", gateway.Renew, lease + time.Millisecond},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, open, 2)
			d, other := gateway.DeviceID("dev-1"), gateway.DeviceID("dev-2")
			shard := gateway.ShardOf(d, 2)
			b := batch(gwA, 1, wr(d, "s1", tc.kind, tc.age))
			b.Replay = true
			res := e.apply(b)
			e.checkEvents("lapsed write", res.Events, shard)
			e.checkAbsent(d)
			if log := e.log(shard); len(log) != 0 {
				t.Errorf("log after a lapsed write: %s", describeEvents(log))
			}

			// Nor does it add a session to a live device.
			t0 := e.now()
			e.apply(batch(gwA, 1, wr(other, "s1", gateway.Connect, 0)))
			res = e.apply(batch(gwA, 1, wr(other, "s2", tc.kind, tc.age), wr(other, "s1", tc.kind, tc.age)))
			e.checkEvents("lapsed writes to a live device", res.Events, gateway.ShardOf(other, 2))
			e.checkDevice(other, onlineInfo(other, 1, t0, sess("s1", t0.Add(lease))))

			e.clock.Advance(2 * lease)
			for s := range 2 {
				reap := e.reap(s, 10)
				for _, ev := range reap.Offline {
					if ev.Device == d {
						t.Errorf("Reap found the device of a lapsed write: %s", describeEvent(ev))
					}
				}
			}
			e.checkAbsent(d)
		})
	}

	t.Run("one millisecond inside the lease", func(t *testing.T) {
		e := newEnv(t, open, 2)
		d := gateway.DeviceID("dev-1")
		now := e.now()
		res := e.apply(batch(gwA, 1, wr(d, "s1", gateway.Renew, lease-time.Millisecond)))
		e.checkEvents("renew 1ms inside the lease", res.Events, gateway.ShardOf(d, 2), online(d, 1, gateway.ReasonRenew, now, gwA, "s1"))
		e.checkDevice(d, onlineInfo(d, 1, now, sess("s1", now.Add(time.Millisecond))))
	})
}

func testRenewAfterDeadline(t *testing.T, open Opener) {
	tests := []struct {
		name   string
		kind   gateway.Kind
		replay bool
		reason gateway.Reason
	}{
		{"renew", gateway.Renew, false, gateway.ReasonRenew},
		{"connect", gateway.Connect, false, gateway.ReasonConnect},
		{"replayed renew", gateway.Renew, true, gateway.ReasonReplay},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, open, 2)
			d := gateway.DeviceID("dev-1")
			shard := gateway.ShardOf(d, 2)
			t0 := e.now()
			e.apply(batch(gwA, 1, wr(d, "s1", gateway.Connect, 0)))
			e.clock.Advance(lease + 2*time.Second)
			now := e.now()
			b := batch(gwB, 2, wr(d, "s1", tc.kind, 0))
			b.Replay = tc.replay
			res := e.apply(b)
			e.checkEvents("write after the deadline", res.Events, shard,
				expired(d, 2, now, t0.Add(lease)),
				online(d, 3, tc.reason, now, gwB, "s1"))
			e.checkLogged(shard, res.Events)
			e.checkDevice(d, onlineInfo(d, 3, now, sess("s1", now.Add(lease))))
			reap := e.reap(shard, 10)
			if len(reap.Offline) != 0 || reap.More || !reap.Next.Equal(now.Add(lease)) {
				t.Errorf("Reap = %+v; want no event and Next %v", reap, now.Add(lease))
			}
		})
	}
}

func testLeaveAfterDeadline(t *testing.T, open Opener) {
	e := newEnv(t, open, 2)
	d := gateway.DeviceID("dev-1")
	shard := gateway.ShardOf(d, 2)
	t0 := e.now()
	e.apply(batch(gwA, 1, wr(d, "s1", gateway.Connect, 0)))
	e.clock.Advance(lease)
	now := e.now()
	res := e.apply(batch(gwA, 1, wr(d, "s1", gateway.Leave, 0)))
	e.checkEvents("leave at the deadline", res.Events, shard, expired(d, 2, now, t0.Add(lease)))
	e.checkDevice(d, offlineInfo(d, 2, now))
	reap := e.reap(shard, 10)
	if len(reap.Offline) != 0 || reap.More || !reap.Next.IsZero() {
		t.Errorf("Reap = %+v; want nothing", reap)
	}
}

// testExpiryKeepsOther: invariant 2, an expired session dropped by a
// write leaves the device's other session alone.
func testExpiryKeepsOther(t *testing.T, open Opener) {
	e := newEnv(t, open, 2)
	d := gateway.DeviceID("dev-1")
	shard := gateway.ShardOf(d, 2)
	t0 := e.now()
	e.apply(batch(gwA, 1, wr(d, "s1", gateway.Connect, 0)))
	e.clock.Advance(10 * time.Second)
	e.apply(batch(gwA, 1, wr(d, "s2", gateway.Connect, 0)))
	e.clock.Advance(lease - 9*time.Second) // s1 ran out 1s ago
	res := e.apply(batch(gwA, 1, wr(d, "s3", gateway.Leave, 0)))
	e.checkEvents("leave of an unknown session next to an expired one", res.Events, shard)
	e.checkDevice(d, onlineInfo(d, 1, t0, sess("s2", t0.Add(10*time.Second+lease))))
	res = e.apply(batch(gwA, 1, wr(d, "s2", gateway.Leave, 0)))
	e.checkEvents("leave of the last session", res.Events, shard, leaveEvent(d, 2, e.now(), gwA, "s2"))
}

func testReap(t *testing.T, open Opener) {
	e := newEnv(t, open, 2)
	devs := devicesIn(t, 2, 0, 4, "reap")
	other := devicesIn(t, 2, 1, 1, "other")[0]
	t0 := e.now()
	if r := e.reap(0, 10); len(r.Offline) != 0 || r.Trimmed != 0 || r.More || !r.Next.IsZero() {
		t.Errorf("Reap of an empty shard = %+v, want nothing", r)
	}
	deadline := make([]time.Time, len(devs))
	for i, d := range devs {
		e.apply(batch(gwA, 1, wr(d, "s1", gateway.Connect, 0)))
		deadline[i] = e.now().Add(lease)
		if i == 2 {
			e.apply(batch(gwA, 1, wr(other, "s1", gateway.Connect, 0)))
		}
		e.clock.Advance(time.Second)
	}
	if r := e.reap(0, 10); len(r.Offline) != 0 || r.More || !r.Next.Equal(deadline[0]) {
		t.Errorf("Reap before any deadline = %+v; want nothing, Next %v", r, deadline[0])
	}

	e.clock.Set(t0.Add(2*time.Second + lease)) // devs[2]'s deadline: due
	now := e.now()
	r := e.reap(0, 2)
	e.checkEvents("Reap(limit 2)", r.Offline, 0, expired(devs[0], 2, now, deadline[0]), expired(devs[1], 2, now, deadline[1]))
	if !r.More || !r.Next.Equal(deadline[2]) || r.Trimmed != 0 {
		t.Errorf("Reap(limit 2) of 3 due: More %v Next %v Trimmed %d; want true, %v, 0", r.More, r.Next, r.Trimmed, deadline[2])
	}
	e.checkLogged(0, r.Offline)

	r = e.reap(0, 2)
	e.checkEvents("second Reap(limit 2)", r.Offline, 0, expired(devs[2], 2, now, deadline[2]))
	if r.More || !r.Next.Equal(deadline[3]) {
		t.Errorf("second Reap: More %v Next %v; want false, %v", r.More, r.Next, deadline[3])
	}
	e.checkLogged(0, r.Offline)

	r = e.reap(0, 2)
	if len(r.Offline) != 0 || r.More || !r.Next.Equal(deadline[3]) {
		t.Errorf("third Reap = %+v; want nothing, Next %v", r, deadline[3])
	}
	for i, d := range devs[:3] {
		e.checkDevice(d, offlineInfo(d, 2, now))
		if info := e.device(d); !info.Deadline.IsZero() {
			t.Errorf("device %d deadline %v after reap, want zero", i, info.Deadline)
		}
	}
	e.checkDevice(devs[3], onlineInfo(devs[3], 1, t0.Add(3*time.Second), sess("s1", deadline[3])))
	if info := e.device(other); info.State != gateway.Online {
		t.Errorf("reaping shard 0 changed shard 1's device: %+v", info)
	}

	r = e.reap(1, 1)
	e.checkEvents("Reap of shard 1", r.Offline, 1, expired(other, 2, now, deadline[2]))
	if r.More || !r.Next.IsZero() {
		t.Errorf("Reap of shard 1: More %v Next %v; want false, zero", r.More, r.Next)
	}
}

// testReapKeepsLive: a device with an expired and a live session is not
// reaped offline, whichever session holds the device's deadline.
func testReapKeepsLive(t *testing.T, open Opener) {
	tests := []struct {
		name                  string
		lease1, lease2        time.Duration
		liveID, expiredID     gateway.SessionID
		liveDL, expiredDL, at time.Duration // from t0; s1 at t0, s2 at t0+10s
	}{
		{"older session expired", lease, lease, "s2", "s1", 10*time.Second + lease, lease, lease + time.Second},
		{"newer session expired", 3 * lease, lease, "s1", "s2", 3 * lease, 10*time.Second + lease, 10*time.Second + lease},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, open, 2)
			d := gateway.DeviceID("dev-1")
			shard := gateway.ShardOf(d, 2)
			t0 := e.now()
			b1 := batch(gwA, 1, wr(d, "s1", gateway.Connect, 0))
			b1.Lease = tc.lease1
			e.apply(b1)
			e.clock.Advance(10 * time.Second)
			b2 := batch(gwA, 1, wr(d, "s2", gateway.Connect, 0))
			b2.Lease = tc.lease2
			e.apply(b2)
			e.clock.Set(t0.Add(tc.at))
			r := e.reap(shard, 10)
			if len(r.Offline) != 0 || r.More {
				t.Errorf("Reap = %+v; want no offline event for a device with a live session", r)
			}
			if r.Trimmed > 1 {
				t.Errorf("Reap trimmed %d devices, want at most 1", r.Trimmed)
			}
			if !r.Next.Equal(t0.Add(tc.liveDL)) {
				t.Errorf("Reap Next %v, want the live session's deadline %v", r.Next, t0.Add(tc.liveDL))
			}
			e.checkDevice(d, onlineInfo(d, 1, t0, sess(tc.liveID, t0.Add(tc.liveDL))))
			for _, s := range e.device(d).Sessions {
				if s.ID == tc.expiredID && !s.Deadline.Equal(t0.Add(tc.expiredDL)) {
					t.Errorf("expired session %s kept with deadline %v, want %v", s.ID, s.Deadline, t0.Add(tc.expiredDL))
				}
			}
			if log := e.log(shard); len(log) != 1 {
				t.Errorf("log has %d events, want 1: %s", len(log), describeEvents(log))
			}
		})
	}
}

// testFencing: invariant 3, a batch from an older epoch changes nothing.
func testFencing(t *testing.T, open Opener) {
	e := newEnv(t, open, 4)
	devs := devicesIn(t, 4, 0, 3, "fence")
	d1, d2, d3 := devs[0], devs[1], devs[2]
	t0 := e.now()
	e.apply(batch(gwA, 2, wr(d1, "s1", gateway.Connect, 0)))
	e.clock.Advance(time.Second)

	fenced := func(what string, b gateway.Batch) {
		t.Helper()
		before := e.log(0)
		err := e.applyErr(b)
		if !errors.Is(err, gateway.ErrFenced) {
			t.Errorf("%s: Apply(%s) = %v, want ErrFenced", what, describeBatch(b), err)
		}
		if after := e.log(0); len(after) != len(before) {
			t.Errorf("%s: fenced batch wrote events %s", what, describeEvents(after[len(before):]))
		}
	}
	fenced("older epoch", batch(gwA, 1,
		wr(d1, "s1", gateway.Renew, 0), wr(d2, "s2", gateway.Connect, 0), wr(d1, "s3", gateway.Connect, 0)))
	fenced("older epoch leave", batch(gwA, 1, wr(d1, "s1", gateway.Leave, 0)))
	e.checkDevice(d1, onlineInfo(d1, 1, t0, gateway.SessionInfo{ID: "s1", Deadline: t0.Add(lease), Gateway: gwA, Epoch: 2}))
	e.checkAbsent(d2)

	res := e.apply(batch(gwB, 1, wr(d2, "s2", gateway.Connect, 0)))
	e.checkEvents("other gateway's epoch 1", res.Events, 0, online(d2, 1, gateway.ReasonConnect, e.now(), gwB, "s2"))

	res = e.apply(batch(gwA, 2, wr(d1, "s1", gateway.Renew, 0)))
	e.checkEvents("same epoch again", res.Events, 0)
	e.checkDevice(d1, onlineInfo(d1, 1, t0, gateway.SessionInfo{ID: "s1", Deadline: e.now().Add(lease), Gateway: gwA, Epoch: 2}))

	e.clock.Advance(time.Second)
	res = e.apply(batch(gwA, 3, wr(d3, "s3", gateway.Connect, 0)))
	e.checkEvents("newer epoch", res.Events, 0, online(d3, 1, gateway.ReasonConnect, e.now(), gwA, "s3"))
	fenced("epoch older than the newest", batch(gwA, 2, wr(d1, "s1", gateway.Renew, 0)))
	e.checkDevice(d1, onlineInfo(d1, 1, t0, sess("s1", t0.Add(time.Second+lease))))

	res = e.apply(batch(gwA, 3, wr(d1, "s1", gateway.Renew, 0)))
	e.checkEvents("newest epoch renewing an older epoch's session", res.Events, 0)
	e.checkDevice(d1, onlineInfo(d1, 1, t0, sess("s1", e.now().Add(lease))))
	res = e.apply(batch(gwB, 1, wr(d2, "s2", gateway.Leave, 0)))
	e.checkEvents("other gateway still on epoch 1", res.Events, 0, leaveEvent(d2, 2, e.now(), gwB, "s2"))
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
	if err := e.applyErr(batch(gwA, 4, wr(d, "s1", gateway.Connect, 0))); !errors.Is(err, gateway.ErrFenced) {
		t.Fatalf("epoch 4 after an empty epoch-5 batch: %v, want ErrFenced", err)
	}
	if log := e.log(shard); len(log) != 0 {
		t.Fatalf("events after an empty batch and a fenced one: %s", describeEvents(log))
	}
	e.checkAbsent(d)
	e.apply(batch(gwA, 5, wr(d, "s1", gateway.Connect, 0)))
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
	err := e.applyErr(batch(gwA, 1, wr(d, "s1", gateway.Renew, 0)))
	if !errors.Is(err, gateway.ErrFenced) {
		t.Fatalf("Apply from an older epoch = %v, want ErrFenced", err)
	}
	if log := e.log(shard); len(log) != 1 {
		t.Errorf("fenced batch wrote events: %s", describeEvents(log))
	}
	info := e.device(d)
	if info.State != gateway.Online || info.Ver != e.ver(d, 1) || !info.Deadline.Equal(t0.Add(lease)) {
		t.Errorf("Device after a fenced batch: state %s ver %d deadline %v; want online 1 %v (the runner's to reap)",
			info.State, info.Ver, info.Deadline, t0.Add(lease))
	}
	r := e.reap(shard, 10)
	e.checkEvents("Reap after a fenced batch", r.Offline, shard, expired(d, 2, e.now(), t0.Add(lease)))
}

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
		if log := e.log(s); len(log) != 0 {
			t.Errorf("refused batches wrote events to shard %d: %s", s, describeEvents(log))
		}
	}

	good := batch(gwA, 1, wr(in0, "s1", gateway.Connect, 0))
	for _, shard := range []int{-1, 4, 1 << 20} {
		calls := map[string]error{}
		_, calls["Apply"] = e.store.Apply(e.ctx, shard, good)
		_, calls["Reap"] = e.store.Reap(e.ctx, shard, 10)
		_, calls["Events"] = e.store.Events(e.ctx, shard, "", 10)
		_, calls["AcquireShard"] = e.store.AcquireShard(e.ctx, shard, "runner-1", time.Minute)
		calls["ReleaseShard"] = e.store.ReleaseShard(e.ctx, shard, "runner-1")
		for name, err := range calls {
			if !errors.Is(err, gateway.ErrBadShard) {
				t.Errorf("%s(shard %d) = %v, want ErrBadShard", name, shard, err)
			}
		}
	}
	e.checkAbsent(in0)
}

func testDeviceNotFound(t *testing.T, open Opener) {
	e := newEnv(t, open, 2)
	// The message says it once, for the operator who reads it.
	if _, err := e.store.Device(e.ctx, "never-seen"); !errors.Is(err, gateway.ErrNotFound) || err.Error() != "device never-seen: not found" {
		t.Errorf("Device of an empty store = %v, want ErrNotFound saying \"device never-seen: not found\"", err)
	}
	seen := devicesIn(t, 2, 0, 2, "dev")
	e.apply(batch(gwA, 1, wr(seen[0], "s1", gateway.Connect, 0)))
	if _, err := e.store.Device(e.ctx, seen[1]); !errors.Is(err, gateway.ErrNotFound) {
		t.Errorf("Device of an unseen device in a used shard = %v, want ErrNotFound", err)
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
	replay := batch(gwB, 1, wr(d, "s3", gateway.Connect, 0))
	replay.Replay = true
	now := e.now()
	step(e.apply(replay).Events, online(d, 5, gateway.ReasonReplay, now, gwB, "s3"))
	e.checkEvents("events of five transitions", got, shard, want...)
	e.checkEvents("log of five transitions", e.log(shard), shard, want...)
	e.checkDevice(d, onlineInfo(d, 5, now, sess("s3", now.Add(lease))))
}

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
	later := b1
	later.Replay = true
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

// testSessionMoves: a connectionless session renewed through another
// gateway inside the lease stays one session and emits nothing.
func testSessionMoves(t *testing.T, open Opener) {
	e := newEnv(t, open, 2)
	d := gateway.DeviceID("dev-1")
	shard := gateway.ShardOf(d, 2)
	t0 := e.now()
	e.apply(batch(gwA, 1, wr(d, "coap/default", gateway.Renew, 0)))
	e.clock.Advance(20 * time.Second)
	res := e.apply(batch(gwB, 4, wr(d, "coap/default", gateway.Renew, 0)))
	e.checkEvents("renewal through another gateway", res.Events, shard)
	e.checkDevice(d, onlineInfo(d, 1, t0, sess("coap/default", e.now().Add(lease))))
}

func testEventsPaging(t *testing.T, open Opener) {
	e := newEnv(t, open, 2)
	devs := devicesIn(t, 2, 0, 4, "ev")
	for _, d := range devs {
		e.apply(batch(gwA, 1, wr(d, "s1", gateway.Connect, 0)))
		e.clock.Advance(time.Millisecond)
	}
	e.apply(batch(gwA, 1, wr(devs[0], "s1", gateway.Leave, 0), wr(devs[2], "s1", gateway.Leave, 0)))
	e.clock.Advance(time.Millisecond)
	e.apply(batch(gwA, 1, wr(devs[0], "s1", gateway.Connect, 0)))
	e.apply(batch(gwA, 1, wr(devicesIn(t, 2, 1, 1, "ev1")[0], "s1", gateway.Connect, 0)))

	full, err := e.store.Events(e.ctx, 0, "", 100)
	if err != nil {
		t.Fatalf("Events: %v", err)
	}
	if len(full) != 7 {
		t.Fatalf("shard 0 has %d events, want 7: %s", len(full), describeEvents(full))
	}
	for i, ev := range full {
		prev := ""
		if i > 0 {
			prev = full[i-1].ID
		}
		if err := checkAfter(prev, ev.ID); err != nil {
			t.Errorf("event %d: %v", i, err)
		}
	}
	if log := e.log(1); len(log) != 1 {
		t.Errorf("shard 1 has %d events, want 1: %s", len(log), describeEvents(log))
	}

	var paged []gateway.Event
	after := "0"
	for range 10 {
		page, err := e.store.Events(e.ctx, 0, after, 3)
		if err != nil {
			t.Fatalf("Events(after %q, 3): %v", after, err)
		}
		if len(page) > 3 {
			t.Fatalf("Events(limit 3) returned %d events", len(page))
		}
		if len(page) == 0 {
			break
		}
		paged = append(paged, page...)
		after = page[len(page)-1].ID
	}
	if !slices.EqualFunc(paged, full, sameEvent) {
		t.Errorf("paging by 3 read %s\nwant %s", describeEvents(paged), describeEvents(full))
	}
	mid, err := e.store.Events(e.ctx, 0, full[2].ID, 2)
	if err != nil {
		t.Fatalf("Events(after %s, 2): %v", full[2].ID, err)
	}
	if !slices.EqualFunc(mid, full[3:5], sameEvent) {
		t.Errorf("Events(after event 2, 2) = %s, want events 3 and 4", describeEvents(mid))
	}
}

func testListPaging(t *testing.T, open Opener) {
	e := newEnv(t, open, 4)
	const n = 23
	want := map[gateway.DeviceID]gateway.State{}
	var ws []gateway.Write
	for i := range n {
		d := gateway.DeviceID(fmt.Sprintf("list-%02d", i))
		want[d] = gateway.Online
		ws = append(ws, wr(d, "s1", gateway.Connect, 0))
	}
	connect := func(ws []gateway.Write) {
		byShard := map[int][]gateway.Write{}
		for _, w := range ws {
			s := gateway.ShardOf(w.Device, 4)
			byShard[s] = append(byShard[s], w)
		}
		for _, ws := range byShard {
			e.apply(batch(gwA, 1, ws...))
		}
	}
	connect(ws)
	e.clock.Advance(time.Second)
	var leaves []gateway.Write
	for i := 0; i < n; i += 3 {
		d := gateway.DeviceID(fmt.Sprintf("list-%02d", i))
		want[d] = gateway.Offline
		leaves = append(leaves, wr(d, "s1", gateway.Leave, 0))
	}
	connect(leaves)

	for _, filter := range []gateway.State{"", gateway.Online, gateway.Offline} {
		for _, limit := range []int{4, 1, 0} {
			t.Run(fmt.Sprintf("state %q limit %d", filter, limit), func(t *testing.T) {
				seen := map[gateway.DeviceID]bool{}
				cursor := ""
				for page := 0; ; page++ {
					if page == maxPages {
						t.Fatalf("List did not end after %d pages", maxPages)
					}
					p, err := e.store.List(e.ctx, gateway.ListQuery{State: filter, Cursor: cursor, Limit: limit})
					if err != nil {
						t.Fatalf("List(cursor %q): %v", cursor, err)
					}
					if limit > 0 && len(p.Devices) > limit {
						t.Errorf("List page of %d devices, limit %d", len(p.Devices), limit)
					}
					for _, info := range p.Devices {
						if seen[info.Device] {
							t.Errorf("List returned %s twice", info.Device)
						}
						seen[info.Device] = true
						if filter != "" && info.State != filter {
							t.Errorf("List(state %s) returned %s in state %s", filter, info.Device, info.State)
						}
						direct, err := e.store.Device(e.ctx, info.Device)
						if err != nil {
							t.Fatalf("Device(%s): %v", info.Device, err)
						}
						if d := diffDevice(info, direct, e.now()); d != "" {
							t.Errorf("List's %s differs from Device's: %s", info.Device, d)
						}
					}
					if p.Next == "" {
						break
					}
					cursor = p.Next
				}
				for d, st := range want {
					if (filter == "" || st == filter) && !seen[d] {
						t.Errorf("List(state %q) missed %s (%s)", filter, d, st)
					}
				}
				for d := range seen {
					if _, ok := want[d]; !ok {
						t.Errorf("List returned unknown device %s", d)
					}
				}
			})
		}
	}
}

func testShardLock(t *testing.T, open Opener) {
	e := newEnv(t, open, 2)
	acquire := func(shard int, owner string, ttl time.Duration, want bool) {
		t.Helper()
		got, err := e.store.AcquireShard(e.ctx, shard, owner, ttl)
		if err != nil {
			t.Fatalf("AcquireShard(%d, %s): %v", shard, owner, err)
		}
		if got != want {
			t.Errorf("at +%v AcquireShard(%d, %s, %v) = %v, want %v",
				e.now().Sub(time.UnixMilli(startMs)), shard, owner, ttl, got, want)
		}
	}
	release := func(shard int, owner string) {
		t.Helper()
		if err := e.store.ReleaseShard(e.ctx, shard, owner); err != nil {
			t.Fatalf("ReleaseShard(%d, %s): %v", shard, owner, err)
		}
	}
	const ttl = 10 * time.Second
	release(0, "a") // not held: no-op
	acquire(0, "a", ttl, true)
	acquire(0, "b", ttl, false)
	acquire(1, "b", ttl, true) // shards are independent
	e.clock.Advance(6 * time.Second)
	acquire(0, "a", ttl, true) // extended to +16s
	e.clock.Advance(6 * time.Second)
	acquire(0, "b", ttl, false) // +12s: a's extended lease holds
	release(0, "b")             // not the owner: no-op
	acquire(0, "b", ttl, false)
	e.clock.Advance(4*time.Second + time.Millisecond)
	acquire(0, "b", ttl, true) // +16.001s: a's lease ran out
	acquire(0, "a", ttl, false)
	release(0, "a") // no longer the owner: no-op
	acquire(0, "a", ttl, false)
	release(0, "b")
	acquire(0, "a", ttl, true)
	acquire(1, "a", ttl, true) // b's lease of shard 1 (taken at +0) ran out
}

// testLateButValidRenewal: evidence observed at or before its session's
// deadline but applied after it (an outage delayed it) extends the
// session with no event, through the gateway that wrote the session or
// another; evidence observed after the deadline still ends the old
// presence first.
func testLateButValidRenewal(t *testing.T, open Opener) {
	for _, tc := range []struct {
		name  string
		gw    string
		kind  gateway.Kind
		stale time.Duration // how long after the deadline it was applied
	}{
		{"renew through the same gateway", gwA, gateway.Renew, 2 * time.Second},
		{"connect through another gateway", gwB, gateway.Connect, 5 * time.Second},
		{"renew long after the deadline", gwA, gateway.Renew, 3 * lease},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, open, 2)
			d := gateway.DeviceID("dev-1")
			shard := gateway.ShardOf(d, 2)
			t0 := e.now()
			e.apply(batch(gwA, 1, wr(d, "s1", gateway.Connect, 0)))
			deadline := t0.Add(lease)
			e.clock.Advance(lease + tc.stale)
			// observed exactly at the deadline: still valid
			age := tc.stale
			res := e.apply(batch(tc.gw, 1, wr(d, "s1", tc.kind, age)))
			if tc.stale >= lease {
				// observed at the deadline, but its own lease ran out too:
				// lapsed, never written; the session's expiry is
				e.checkEvents("lapsed evidence", res.Events, shard, expired(d, 2, e.now(), deadline))
				return
			}
			e.checkEvents("late but valid evidence", res.Events, shard)
			e.checkDevice(d, onlineInfo(d, 1, t0, sess("s1", deadline.Add(lease))))
			if log := e.log(shard); len(log) != 1 {
				t.Errorf("log %s, want the one online event", describeEvents(log))
			}
			// One millisecond later than the deadline is not valid.
			e2 := newEnv(t, open, 2)
			t1 := e2.now()
			e2.apply(batch(gwA, 1, wr(d, "s1", gateway.Connect, 0)))
			e2.clock.Advance(lease + tc.stale)
			now := e2.now()
			res = e2.apply(batch(tc.gw, 1, wr(d, "s1", tc.kind, age-time.Millisecond)))
			reason := gateway.ReasonRenew
			if tc.kind == gateway.Connect {
				reason = gateway.ReasonConnect
			}
			e2.checkEvents("evidence just after the deadline", res.Events, shard,
				expired(d, 2, now, t1.Add(lease)), online(d, 3, reason, now, tc.gw, "s1"))
		})
	}
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

// testLeaveTombstone: a connect or renew observed before a session's
// leave never brings that session back, through another gateway or from
// an outbox (issue 9 item 3); evidence observed after it does.
func testLeaveTombstone(t *testing.T, open Opener) {
	for _, tc := range []struct {
		name   string
		gw     string
		kind   gateway.Kind
		replay bool
	}{
		{"renew through the other gateway", gwA, gateway.Renew, false},
		{"connect replayed from an outbox", gwA, gateway.Connect, true},
		{"renew through the leaving gateway", gwB, gateway.Renew, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, open, 1)
			d := gateway.DeviceID("dev-1")
			t0 := e.now()
			e.apply(batch(gwA, 1, wr(d, "coap/default", gateway.Renew, 0)))
			e.clock.Advance(2 * time.Second)
			left := e.now()
			res := e.apply(batch(gwB, 1, wr(d, "coap/default", gateway.Leave, 0)))
			e.checkEvents("leave", res.Events, 0, leaveEvent(d, 2, left, gwB, "coap/default"))
			e.clock.Advance(3 * time.Second)
			// observed a millisecond before the leave
			stale := batch(tc.gw, 1, wr(d, "coap/default", tc.kind, e.now().Sub(left)+time.Millisecond))
			stale.Replay = tc.replay
			res = e.apply(stale)
			e.checkEvents("evidence observed before the leave", res.Events, 0)
			e.checkDevice(d, offlineInfo(d, 2, left))
			// observed after the leave: a new visit
			now := e.now()
			res = e.apply(batch(tc.gw, 1, wr(d, "coap/default", gateway.Renew, time.Second)))
			e.checkEvents("evidence observed after the leave", res.Events, 0, online(d, 3, gateway.ReasonRenew, now, tc.gw, "coap/default"))
			e.checkDevice(d, onlineInfo(d, 3, now, sess("coap/default", now.Add(lease-time.Second))))
			_ = t0
		})
	}
	t.Run("leave of a session the record does not hold", func(t *testing.T) {
		e := newEnv(t, open, 1)
		d := gateway.DeviceID("dev-1")
		t0 := e.now()
		e.apply(batch(gwA, 1, wr(d, "s1", gateway.Connect, 0)))
		e.clock.Advance(2 * time.Second)
		res := e.apply(batch(gwB, 1, wr(d, "s2", gateway.Leave, 0)))
		e.checkEvents("leave of an unknown session", res.Events, 0)
		e.clock.Advance(time.Second)
		res = e.apply(batch(gwB, 1, wr(d, "s2", gateway.Connect, 2*time.Second)))
		e.checkEvents("connect observed before that leave", res.Events, 0)
		e.checkDevice(d, onlineInfo(d, 1, t0, sess("s1", t0.Add(lease))))
	})
}

// testOlderEvidenceTakesNothing: one rule in both stores (issue 9 item
// 9). Evidence at least as new as its session's takes the session (its
// gateway and epoch); older evidence changes nothing of it; the device's
// last writer is the write of its newest evidence; and an expiry names
// the session that ran out last, with its gateway.
func testOlderEvidenceTakesNothing(t *testing.T, open Opener) {
	e := newEnv(t, open, 1)
	d := gateway.DeviceID("dev-1")
	t0 := e.now()
	e.apply(batch(gwA, 1, wr(d, "s1", gateway.Connect, 0)))
	e.clock.Advance(time.Second)
	// gw-b's evidence of s1 was observed before gw-a's
	e.apply(batch(gwB, 4, wr(d, "s1", gateway.Renew, 2*time.Second)))
	want := onlineInfo(d, 1, t0, gateway.SessionInfo{ID: "s1", Deadline: t0.Add(lease), Gateway: gwA, Epoch: 1})
	want.Gateway, want.Session = gwA, "s1"
	e.checkDevice(d, want)
	// s2 through gw-b is the newest evidence: gw-b/s2 is the last writer
	e.apply(batch(gwB, 4, wr(d, "s2", gateway.Connect, 0)))
	e.clock.Advance(time.Second)
	// an older renewal of s1 through gw-a moves s1, not the last writer
	e.apply(batch(gwA, 1, wr(d, "s1", gateway.Renew, 1500*time.Millisecond)))
	want = onlineInfo(d, 1, t0,
		gateway.SessionInfo{ID: "s1", Deadline: e.now().Add(lease - 1500*time.Millisecond), Gateway: gwA, Epoch: 1},
		gateway.SessionInfo{ID: "s2", Deadline: t0.Add(time.Second + lease), Gateway: gwB, Epoch: 4})
	want.Gateway, want.Session = gwB, "s2"
	e.checkDevice(d, want)
	// s2 runs out last: the expiry names it and gw-b
	e.clock.Advance(lease)
	res := e.reap(0, 10)
	if len(res.Offline) != 1 || res.Offline[0].Gateway != gwB || res.Offline[0].Session != "s2" {
		t.Fatalf("expiry %s, want one naming %s/s2", describeEvents(res.Offline), gwB)
	}
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
	b := batch(gwA, 1, wr(lost, "s1", gateway.Renew, 400*time.Millisecond), wr(known, "s1", gateway.Renew, 0))
	b.Restore = true
	res := e.apply(b)
	e.checkEvents("restore", res.Events, 0, online(known, 3, gateway.ReasonRenew, at, gwA, "s1"))
	info := e.device(lost)
	if info.State != gateway.Online || info.Ver != uint64(at.UnixMilli()) || !info.Deadline.Equal(at.Add(lease-400*time.Millisecond)) {
		t.Fatalf("restored device %+v, want online at ver %d until %v", info, at.UnixMilli(), at.Add(lease-400*time.Millisecond))
	}
	// a restore of a session whose deadline passed (the renewals that
	// bridged it were lost with the old state) extends it silently
	e.clock.Advance(lease)
	b = batch(gwA, 1, wr(lost, "s1", gateway.Renew, 0))
	b.Restore = true
	if res = e.apply(b); len(res.Events) != 0 {
		t.Fatalf("restore of an expired session wrote %s, want nothing", describeEvents(res.Events))
	}
	res = e.apply(batch(gwA, 1, wr(lost, "s1", gateway.Leave, 0)))
	if len(res.Events) != 1 || res.Events[0].State != gateway.Offline || res.Events[0].Ver != uint64(at.UnixMilli())+1 {
		t.Fatalf("leave of the restored device wrote %s, want offline at ver %d", describeEvents(res.Events), at.UnixMilli()+1)
	}
}

// testStoreSessionCap: a device holds at most gateway.MaxStoreSessions
// sessions in the store, however many gateways write them (issue 10: no
// device can make a script call slow for the others); a new session
// beyond is ignored, the device's known sessions still renew, and a leave
// frees a place.
func testStoreSessionCap(t *testing.T, open Opener) {
	e := newEnv(t, open, 1)
	d := gateway.DeviceID("dev-many")
	var ws []gateway.Write
	for i := range gateway.MaxStoreSessions + 1 {
		ws = append(ws, wr(d, gateway.SessionID(fmt.Sprintf("s%d", i)), gateway.Connect, 0))
	}
	half := gateway.MaxStoreSessions / 2
	e.apply(batch(gwA, 1, ws[:half]...))
	e.apply(batch(gwB, 1, ws[half:]...))
	last := ws[gateway.MaxStoreSessions].Session
	if info := e.device(d); len(info.Sessions) != gateway.MaxStoreSessions || slices.ContainsFunc(info.Sessions, func(s gateway.SessionInfo) bool { return s.ID == last }) {
		t.Fatalf("%d sessions, want %d without %s", len(info.Sessions), gateway.MaxStoreSessions, last)
	}
	e.clock.Advance(time.Second)
	e.apply(batch(gwA, 1, wr(d, "s0", gateway.Renew, 0), wr(d, "s1", gateway.Leave, 0)))
	e.apply(batch(gwB, 1, wr(d, last, gateway.Connect, 0)))
	info := e.device(d)
	has := func(id gateway.SessionID) bool {
		return slices.ContainsFunc(info.Sessions, func(s gateway.SessionInfo) bool { return s.ID == id })
	}
	if len(info.Sessions) != gateway.MaxStoreSessions || !has(last) || has("s1") || !info.Deadline.Equal(e.now().Add(lease)) {
		t.Fatalf("after a leave: %d sessions (has %s: %v, s1: %v), deadline %v", len(info.Sessions), last, has(last), has("s1"), info.Deadline)
	}
}
