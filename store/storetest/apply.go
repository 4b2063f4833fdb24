package storetest

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/fleetgate/fleetgate/gateway"
)

// testConnectCreatesOnline: the first live session of a device, by a
// connect or a renew, replayed or not, writes one online event (reason
// connect, renew or replay) to the device's shard alone, and the device
// holds the session until now − Age + Lease with its writer.
func testConnectCreatesOnline(t *testing.T, open Opener) {
	for _, ev := range []evidence{connectEvidence, renewEvidence, replayedConnect, replayedRenewal} {
		t.Run(ev.name, func(t *testing.T) {
			e := newEnv(t, open, 4)
			d := gateway.DeviceID("dev-1")
			shard := gateway.ShardOf(d, 4)
			now := e.now()
			res := e.apply(ev.batch(gwA, 7, d, "s1", 2*time.Second))
			e.checkEvents("Apply", res.Events, shard, online(d, 1, ev.reason, now, gwA, "s1"))
			e.checkDevice(d, lastWriter(onlineInfo(d, 1, now, sessBy("s1", now.Add(lease-2*time.Second), gwA, 7)), gwA, "s1"))
			e.checkLogged(shard, res.Events)
			for s := range 4 {
				if s == shard {
					e.checkLogLen("Apply", s, 1)
				} else {
					e.checkLogLen("other shard", s, 0)
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

// testRenewLiveSession: a renew or connect of a live session moves its
// deadline to the newer of the two and writes no event; older evidence
// moves nothing.
func testRenewLiveSession(t *testing.T, open Opener) {
	e, d, shard, t0 := newConnected(t, open, 2)

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
	e.checkLogLen("the one online event", shard, 1)
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
			e, d, shard, t0 := newConnected(t, open, 2)
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

// testSessionMoves: a connectionless session renewed through another
// gateway inside the lease stays one session and emits nothing.
func testSessionMoves(t *testing.T, open Opener) {
	e := newEnv(t, open, 2)
	d := gateway.DeviceID("dev-1")
	t0 := e.now()
	e.apply(batch(gwA, 1, wr(d, "coap/default", gateway.Renew, 0)))
	e.clock.Advance(20 * time.Second)
	res := e.apply(batch(gwB, 4, wr(d, "coap/default", gateway.Renew, 0)))
	e.checkEvents("renewal through another gateway", res.Events, gateway.ShardOf(d, 2))
	e.checkDevice(d, onlineInfo(d, 1, t0, sess("coap/default", e.now().Add(lease))))
}

// testOlderEvidenceTakesNothing: one rule in both stores. Evidence at
// least as new as its session's takes the session (its gateway and
// epoch); older evidence changes nothing of it; the device's last writer
// is the write of its newest evidence; and an expiry names the session
// that ran out last, with its gateway.
func testOlderEvidenceTakesNothing(t *testing.T, open Opener) {
	e, d, _, t0 := newConnected(t, open, 1)
	e.clock.Advance(time.Second)
	// gw-b's evidence of s1 was observed before gw-a's
	e.apply(batch(gwB, 4, wr(d, "s1", gateway.Renew, 2*time.Second)))
	e.checkDevice(d, lastWriter(onlineInfo(d, 1, t0, sessBy("s1", t0.Add(lease), gwA, 1)), gwA, "s1"))
	// s2 through gw-b is the newest evidence: gw-b/s2 is the last writer
	e.apply(batch(gwB, 4, wr(d, "s2", gateway.Connect, 0)))
	e.clock.Advance(time.Second)
	// an older renewal of s1 through gw-a moves s1, not the last writer
	e.apply(batch(gwA, 1, wr(d, "s1", gateway.Renew, 1500*time.Millisecond)))
	e.checkDevice(d, lastWriter(onlineInfo(d, 1, t0,
		sessBy("s1", e.now().Add(lease-1500*time.Millisecond), gwA, 1),
		sessBy("s2", t0.Add(time.Second+lease), gwB, 4)), gwB, "s2"))
	// s2 runs out last: the expiry names it and gw-b
	e.clock.Advance(lease)
	res := e.reap(0, 10)
	if len(res.Offline) != 1 || res.Offline[0].Gateway != gwB || res.Offline[0].Session != "s2" {
		t.Fatalf("expiry %s, want one naming %s/s2", describeEvents(res.Offline), gwB)
	}
}

// testStoreSessionCap: a device holds at most gateway.MaxStoreSessions
// sessions in the store, however many gateways write them (no
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

// testLapsedEvidence: a connect or renew observed a lease or more ago
// is ignored: it creates no device, adds no session to a live one, and
// leaves nothing for Reap; one observed a millisecond inside its lease
// counts.
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
			res := e.apply(replayed(batch(gwA, 1, wr(d, "s1", tc.kind, tc.age))))
			e.checkEvents("lapsed write", res.Events, shard)
			e.checkAbsent(d)
			e.checkLogLen("after a lapsed write", shard, 0)

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

// testLeaveLastSession: the leave of a device's last session, through
// any gateway, writes the offline event (reason leave), clears the
// device's deadline and sessions, and removes it from the deadline index.
func testLeaveLastSession(t *testing.T, open Opener) {
	e := newEnv(t, open, 2)
	d := gateway.DeviceID("dev-1")
	shard := gateway.ShardOf(d, 2)
	connect := e.apply(batch(gwA, 1, wr(d, "s1", gateway.Connect, 0)))
	e.clock.Advance(2 * time.Second)
	res := e.apply(batch(gwB, 1, wr(d, "s1", gateway.Leave, 0)))
	e.checkLeft(res.Events, d, gwB, "s1")
	if info := e.device(d); !info.Deadline.IsZero() || len(info.Sessions) != 0 {
		t.Errorf("Device after leave: deadline %v, sessions %s; want none", info.Deadline, describeSessions(info.Sessions))
	}
	e.checkLogged(shard, slices.Concat(connect.Events, res.Events))

	e.clock.Advance(lease + time.Second)
	// the leave removed the deadline entry
	reap := e.reap(shard, 10)
	e.checkReapedNothing("Reap after leave", reap, time.Time{})
	if reap.Trimmed != 0 {
		t.Errorf("Reap after leave trimmed %d devices, want 0", reap.Trimmed)
	}
	e.checkLogLen("connect and leave", shard, 2)
}

// testLeaveBridgedInBatch: a replayed batch that carries the leave of
// a device's last session and, later, live evidence of another session
// (the device moved away and back while the gateway's writes waited in
// its outbox) keeps the device online with no event, whatever the order;
// the reap writes nothing for the session that left. Evidence that has
// lapsed bridges nothing: the leave ends the device.
func testLeaveBridgedInBatch(t *testing.T, open Opener) {
	t.Run("bridged", func(t *testing.T) {
		e, d, shard, t0 := newConnected(t, open, 2)
		e.clock.Advance(2 * time.Second)
		res := e.apply(replayed(batch(gwA, 1, wr(d, "s1", gateway.Leave, time.Second), wr(d, "s2", gateway.Connect, 500*time.Millisecond))))
		e.checkEvents("leave of s1 then connect of s2 in one batch", res.Events, shard)
		info := e.device(d)
		if want := e.now().Add(lease - 500*time.Millisecond); info.State != gateway.Online || info.Ver != e.ver(d, 1) || !info.Since.Equal(t0) || !info.Deadline.Equal(want) {
			t.Errorf("device after the batch: %+v; want online since the connect, deadline %v", info, want)
		}
		e.clock.Advance(lease / 2)
		e.checkReapedNothing("reap with s2 live", e.reap(shard, 10), e.now().Add(lease/2-500*time.Millisecond))
	})
	t.Run("lapsed evidence bridges nothing", func(t *testing.T) {
		e, d, _, _ := newConnected(t, open, 2)
		e.clock.Advance(2 * time.Second)
		res := e.apply(replayed(batch(gwA, 1, wr(d, "s1", gateway.Leave, 0), wr(d, "s2", gateway.Connect, lease+time.Second))))
		e.checkLeft(res.Events, d, gwA, "s1")
	})
}

// testLeaveNewerEvidence: a leave removes its session unless the session
// holds newer evidence than the leave's.
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
			e, d, shard, t0 := newConnected(t, open, 2)
			e.clock.Advance(time.Second)
			res := e.apply(batch(gwA, 1, wr(d, "s1", gateway.Leave, tc.age)))
			if tc.removed {
				e.checkLeft(res.Events, d, gwA, "s1")
				return
			}
			e.checkEvents("leave with older evidence than the session's", res.Events, shard)
			e.checkDevice(d, onlineInfo(d, 1, t0, sess("s1", t0.Add(lease))))
		})
	}
}

// testLeaveTombstone: a connect or renew observed before a session's
// leave never brings that session back, through another gateway or from
// an outbox; evidence observed after it does.
func testLeaveTombstone(t *testing.T, open Opener) {
	for _, tc := range []struct {
		name string
		gw   string
		ev   evidence
	}{
		{"renew through the other gateway", gwA, renewEvidence},
		{"connect replayed from an outbox", gwA, replayedConnect},
		{"renew through the leaving gateway", gwB, renewEvidence},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, open, 1)
			d := gateway.DeviceID("dev-1")
			e.apply(batch(gwA, 1, wr(d, "coap/default", gateway.Renew, 0)))
			e.clock.Advance(2 * time.Second)
			left := e.now()
			res := e.apply(batch(gwB, 1, wr(d, "coap/default", gateway.Leave, 0)))
			e.checkEvents("leave", res.Events, 0, leaveEvent(d, 2, left, gwB, "coap/default"))
			e.clock.Advance(3 * time.Second)
			// observed a millisecond before the leave
			res = e.apply(tc.ev.batch(tc.gw, 1, d, "coap/default", e.now().Sub(left)+time.Millisecond))
			e.checkEvents("evidence observed before the leave", res.Events, 0)
			e.checkDevice(d, offlineInfo(d, 2, left))
			// observed after the leave: a new visit
			now := e.now()
			res = e.apply(batch(tc.gw, 1, wr(d, "coap/default", gateway.Renew, time.Second)))
			e.checkEvents("evidence observed after the leave", res.Events, 0, online(d, 3, gateway.ReasonRenew, now, tc.gw, "coap/default"))
			e.checkDevice(d, onlineInfo(d, 3, now, sess("coap/default", now.Add(lease-time.Second))))
		})
	}
	t.Run("leave of a session the record does not hold", func(t *testing.T) {
		e, d, _, t0 := newConnected(t, open, 1)
		e.clock.Advance(2 * time.Second)
		res := e.apply(batch(gwB, 1, wr(d, "s2", gateway.Leave, 0)))
		e.checkEvents("leave of an unknown session", res.Events, 0)
		e.clock.Advance(time.Second)
		res = e.apply(batch(gwB, 1, wr(d, "s2", gateway.Connect, 2*time.Second)))
		e.checkEvents("connect observed before that leave", res.Events, 0)
		e.checkDevice(d, onlineInfo(d, 1, t0, sess("s1", t0.Add(lease))))
	})
}

// testRenewAfterDeadline: evidence applied after its session's deadline,
// before any reap, first writes the expiry the runner would have written,
// then the new online event.
func testRenewAfterDeadline(t *testing.T, open Opener) {
	for _, ev := range []evidence{renewEvidence, connectEvidence, replayedRenewal} {
		t.Run(ev.name, func(t *testing.T) {
			e, d, shard, t0 := newConnected(t, open, 2)
			e.clock.Advance(lease + 2*time.Second)
			now := e.now()
			res := e.apply(ev.batch(gwB, 2, d, "s1", 0))
			e.checkEvents("write after the deadline", res.Events, shard,
				expired(d, 2, now, t0.Add(lease)),
				online(d, 3, ev.reason, now, gwB, "s1"))
			e.checkLogged(shard, res.Events)
			e.checkDevice(d, onlineInfo(d, 3, now, sess("s1", now.Add(lease))))
			e.checkReapedNothing("Reap", e.reap(shard, 10), now.Add(lease))
		})
	}
}

// testLeaveAfterDeadline: a leave applied at its session's deadline
// writes the expiry, not a leave, and leaves nothing for Reap.
func testLeaveAfterDeadline(t *testing.T, open Opener) {
	e, d, shard, t0 := newConnected(t, open, 2)
	e.clock.Advance(lease)
	now := e.now()
	res := e.apply(batch(gwA, 1, wr(d, "s1", gateway.Leave, 0)))
	e.checkEvents("leave at the deadline", res.Events, shard, expired(d, 2, now, t0.Add(lease)))
	e.checkDevice(d, offlineInfo(d, 2, now))
	e.checkReapedNothing("Reap", e.reap(shard, 10), time.Time{})
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
		ev    evidence
		stale time.Duration // how long after the deadline it was applied
	}{
		{"renew through the same gateway", gwA, renewEvidence, 2 * time.Second},
		{"connect through another gateway", gwB, connectEvidence, 5 * time.Second},
		{"renew long after the deadline", gwA, renewEvidence, 3 * lease},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e, d, shard, t0 := newConnected(t, open, 2)
			deadline := t0.Add(lease)
			e.clock.Advance(lease + tc.stale)
			// observed exactly at the deadline: still valid
			age := tc.stale
			res := e.apply(tc.ev.batch(tc.gw, 1, d, "s1", age))
			if tc.stale >= lease {
				// observed at the deadline, but its own lease ran out too:
				// lapsed; it moves the session's passed deadline to its
				// own, and the reap writes the offline with that
				e.checkEvents("lapsed evidence", res.Events, shard)
				e.checkEvents("the reap after lapsed evidence", e.reap(shard, 100).Offline, shard, expired(d, 2, e.now(), deadline.Add(lease)))
				return
			}
			e.checkEvents("late but valid evidence", res.Events, shard)
			e.checkDevice(d, onlineInfo(d, 1, t0, sess("s1", deadline.Add(lease))))
			e.checkLogLen("the one online event", shard, 1)
			// One millisecond later than the deadline is not valid.
			e2, _, _, t1 := newConnected(t, open, 2)
			e2.clock.Advance(lease + tc.stale)
			now := e2.now()
			res = e2.apply(tc.ev.batch(tc.gw, 1, d, "s1", age-time.Millisecond))
			e2.checkEvents("evidence just after the deadline", res.Events, shard,
				expired(d, 2, now, t1.Add(lease)), online(d, 3, tc.ev.reason, now, tc.gw, "s1"))
		})
	}
}

// testExpiryKeepsOther: invariant 2, an expired session dropped by a
// write leaves the device's other session alone.
func testExpiryKeepsOther(t *testing.T, open Opener) {
	e, d, shard, t0 := newConnected(t, open, 2)
	e.clock.Advance(10 * time.Second)
	e.apply(batch(gwA, 1, wr(d, "s2", gateway.Connect, 0)))
	e.clock.Advance(lease - 9*time.Second) // s1 ran out 1s ago
	res := e.apply(batch(gwA, 1, wr(d, "s3", gateway.Leave, 0)))
	e.checkEvents("leave of an unknown session next to an expired one", res.Events, shard)
	e.checkDevice(d, onlineInfo(d, 1, t0, sess("s2", t0.Add(10*time.Second+lease))))
	res = e.apply(batch(gwA, 1, wr(d, "s2", gateway.Leave, 0)))
	e.checkEvents("leave of the last session", res.Events, shard, leaveEvent(d, 2, e.now(), gwA, "s2"))
}
