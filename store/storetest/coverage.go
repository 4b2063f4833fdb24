package storetest

import (
	"testing"
	"time"

	"github.com/fleetgate/fleetgate/gateway"
	"github.com/fleetgate/fleetgate/gateway/clocktest"
)

// GraceOpener opens a fresh store like Opener, with a gateway grace of
// grace, a gateway recheck of CoverRecheck, a gateway silence of
// CoverSilence (the Redis store) and a gateway horizon of CoverHorizon
// (the stores' options of those names).
type GraceOpener func(t *testing.T, shards int, now func() time.Time, grace time.Duration) gateway.Store

// The timing of the coverage cases.
const (
	coverGrace = 20 * time.Second
	// CoverRecheck and CoverSilence are what a GraceOpener configures.
	CoverRecheck = time.Second
	CoverSilence = 10 * time.Second
	CoverHorizon = lease + coverGrace
)

// RunCoverage runs the subtests of the coverage rule (gateway.Store,
// invariant 11 of docs/design.md §7) against stores with a gateway grace
// made by open: a session expires only once the coverage of its gateway
// has reached its deadline, or at the end of the grace.
func RunCoverage(t *testing.T, open GraceOpener) {
	for _, tc := range []struct {
		name string
		fn   func(*testing.T, GraceOpener)
	}{
		{"ReapWaitsForCoverage", testReapWaitsForCoverage},
		{"LateEvidenceWhileWaiting", testLateEvidenceWhileWaiting},
		{"UncoveredUntilTheGraceEnds", testUncoveredUntilGraceEnds},
		{"CoverageOnlyMovesForward", testCoverageForward},
		{"WriteDoesNotDropUncovered", testWriteKeepsUncovered},
		{"HeardGatewayBehindIsWaitedFor", testHeardLaggard},
		{"SilentGatewayWaitedForUntilTheHorizon", testSilentLaggard},
		{"SilentGatewayWaitedForPastTheGrace", testSilentLaggardPastGrace},
		{"NoCoverageReportedReapsAsBefore", testNoCoverage},
		{"Property", checkCoverageProperty},
		{"CoalescedWriteHasTheGrace", testCoalescedWriteHasTheGrace},
		{"LeaveWaitsForALaggingGateway", testLeaveWaitsForLaggard},
		{"HeldLeaveOutlivesAWriteWhileAGatewayLags", testHeldLeaveOutlivesWrite},
		{"HeldLeaveReapedAsALeave", testHeldLeaveReaped},
		{"LateConnectBridgesAnExpiredSession", testLateConnectBridges},
		{"ReplayedEvidenceBridgesWithinTheGrace", testReplayBridgesWithinGrace},
		{"LapsedRestoreIsReapedOnceCovered", testLapsedRestore},
		{"LapsedReplayMovesThePassedDeadline", testLapsedReplay},
		{"AgesCountFromWhenTheyWereComputed", testAgesAt},
	} {
		t.Run(tc.name, func(t *testing.T) { tc.fn(t, open) })
	}
}

// newCoverEnv is an env over a store with the coverage cases' grace.
func newCoverEnv(t *testing.T, open GraceOpener, shards int) *env {
	t.Helper()
	clock := clocktest.New(time.UnixMilli(startMs).UTC())
	store := open(t, shards, clock.Now, coverGrace)
	if store == nil {
		t.Fatalf("opener returned a nil store")
	}
	return &env{t: t, ctx: t.Context(), clock: clock, store: store, shards: shards}
}

// covering is b with coverage age age (gateway.Batch.Covers).
func covering(b gateway.Batch, age time.Duration) gateway.Batch {
	b.Covers, b.CoverAge = true, age
	return b
}

// cover applies an empty batch of gw that reports coverage up to age ago
// on shard.
func (e *env) cover(shard int, gw string, age time.Duration) {
	e.t.Helper()
	if _, err := e.store.Apply(e.ctx, shard, covering(batch(gw, 1), age)); err != nil {
		e.t.Fatalf("Apply(shard %d, coverage of %s): %v", shard, gw, err)
	}
}

// reapUntil reaps shard, moving the clock by step between reaps (the
// last step to until), until a reap at until; it returns the offline
// events written.
func (e *env) reapUntil(shard int, until time.Time, step time.Duration) []gateway.Event {
	e.t.Helper()
	var evs []gateway.Event
	for range maxPages {
		evs = append(evs, e.reap(shard, 100).Offline...)
		if !e.now().Before(until) {
			return evs
		}
		e.clock.Advance(min(step, until.Sub(e.now())))
	}
	e.t.Fatalf("reapUntil: %v not reached in %d steps of %v", until, maxPages, step)
	return nil
}

// connectCovered connects one device of shard 0 through gwA with
// coverage, and returns it with its deadline.
func connectCovered(e *env) (gateway.DeviceID, time.Time) {
	e.t.Helper()
	d := devicesIn(e.t, e.shards, 0, 1, "cover")[0]
	e.apply(covering(batch(gwA, 1, wr(d, "s1", gateway.Connect, 0)), 0))
	return d, e.now().Add(lease)
}

// The gateway's coverage stops before the deadline: a reap past the
// deadline holds the device; once the gateway covers the deadline the
// device goes offline, reason expired, at its true deadline.
func testReapWaitsForCoverage(t *testing.T, open GraceOpener) {
	e := newCoverEnv(t, open, 2)
	d, dl := connectCovered(e)
	e.clock.Advance(lease - time.Second)
	e.cover(0, gwA, 0) // coverage a second before the deadline
	e.clock.Advance(2 * time.Second)
	if r := e.reap(0, 100); len(r.Offline) != 0 || r.Held != 1 {
		t.Fatalf("reap past the deadline, coverage before it: %d offline, %d held; want 0 and 1", len(r.Offline), r.Held)
	}
	if got := e.device(d); got.State != gateway.Online {
		t.Fatalf("held device %s: %+v, want online", d, got)
	}
	e.cover(0, gwA, 0) // coverage past the deadline
	evs := e.reapUntil(0, e.now().Add(CoverRecheck), CoverRecheck/4)
	checkOffline(t, "reap once covered", evs, d, gateway.ReasonExpired, dl)
}

// checkOffline fails t unless evs is one offline event of d with reason
// and deadline dl.
func checkOffline(t *testing.T, what string, evs []gateway.Event, d gateway.DeviceID, reason gateway.Reason, dl time.Time) {
	t.Helper()
	if len(evs) != 1 || evs[0].Device != d || evs[0].State != gateway.Offline || evs[0].Reason != reason || !evs[0].Deadline.Equal(dl) {
		t.Fatalf("%s: %s; want one offline of %s, reason %s, deadline %v", what, describeEvents(evs), d, reason, dl)
	}
}

// Evidence observed before the deadline arrives while the device waits
// for its gateway's coverage: the session is extended, no event at all.
func testLateEvidenceWhileWaiting(t *testing.T, open GraceOpener) {
	e := newCoverEnv(t, open, 2)
	d, dl := connectCovered(e)
	e.clock.Advance(lease + 3*time.Second)
	if r := e.reap(0, 100); len(r.Offline) != 0 || r.Held != 1 {
		t.Fatalf("reap past the deadline without coverage: %d offline, %d held; want 0 and 1", len(r.Offline), r.Held)
	}
	// a renewal observed a second before the deadline, with coverage now
	age := e.now().Sub(dl) + time.Second
	res := e.apply(covering(batch(gwA, 1, wr(d, "s1", gateway.Renew, age)), 0))
	if len(res.Events) != 0 {
		t.Fatalf("late but valid renewal while waiting: events %s", describeEvents(res.Events))
	}
	e.clock.Advance(CoverRecheck)
	if evs := e.reapUntil(0, e.now().Add(coverGrace/2), CoverRecheck); len(evs) != 0 {
		t.Fatalf("reaps after the late renewal: %s", describeEvents(evs))
	}
	if got := e.device(d); got.State != gateway.Online {
		t.Fatalf("device %s after the late renewal: %+v, want online", d, got)
	}
}

// A gateway that never covers the deadline: the device waits until the
// end of the grace and goes offline with reason gateway_lost, at its true
// deadline; never before.
func testUncoveredUntilGraceEnds(t *testing.T, open GraceOpener) {
	e := newCoverEnv(t, open, 2)
	d, dl := connectCovered(e)
	e.clock.Advance(lease + time.Millisecond)
	evs := e.reapUntil(0, dl.Add(coverGrace-time.Millisecond), 700*time.Millisecond)
	if len(evs) != 0 {
		t.Fatalf("offline before the end of the grace: %s", describeEvents(evs))
	}
	e.clock.Advance(time.Second)
	evs = e.reapUntil(0, e.now().Add(CoverRecheck), CoverRecheck/4)
	checkOffline(t, "at the end of the grace", evs, d, gateway.ReasonGatewayLost, dl)
}

// A batch that reports an older coverage than the gateway's does not
// lower it.
func testCoverageForward(t *testing.T, open GraceOpener) {
	e := newCoverEnv(t, open, 2)
	d, dl := connectCovered(e)
	e.clock.Advance(lease + 2*time.Second)
	e.cover(0, gwA, 0)                   // past the deadline
	e.cover(0, gwA, lease+2*time.Second) // back before the connect
	evs := e.reapUntil(0, e.now().Add(CoverRecheck), CoverRecheck/4)
	checkOffline(t, "reap after a lower coverage", evs, d, gateway.ReasonExpired, dl)
}

// A connect of another gateway, past the deadline of a session whose
// gateway has not covered it, does not drop that session: no offline,
// no online, the device stays online; once covered, the old session goes
// without an event.
func testWriteKeepsUncovered(t *testing.T, open GraceOpener) {
	e := newCoverEnv(t, open, 2)
	d, _ := connectCovered(e)
	e.clock.Advance(lease + time.Second)
	res := e.apply(covering(batch(gwB, 1, wr(d, "s2", gateway.Connect, 0)), 0))
	if len(res.Events) != 0 {
		t.Fatalf("connect through B past A's uncovered deadline: events %s, want none", describeEvents(res.Events))
	}
	e.cover(0, gwA, 0)
	if evs := e.reapUntil(0, e.now().Add(lease/2), CoverRecheck); len(evs) != 0 {
		t.Fatalf("reaps while B's session lives: %s", describeEvents(evs))
	}
	got := e.device(d)
	if got.State != gateway.Online || len(liveSessions(got.Sessions, e.now())) != 1 {
		t.Fatalf("device %s: %+v, want online with B's session alone", d, got)
	}
}

// Another gateway, heard but with a coverage that has not reached the
// device's deadline, is waited for too: the device may have moved to it
// with the same session name.
func testHeardLaggard(t *testing.T, open GraceOpener) {
	e := newCoverEnv(t, open, 2)
	e.cover(0, gwB, 0)
	d, dl := connectCovered(e)
	e.clock.Advance(lease + time.Second)
	e.cover(0, gwA, 0)
	e.cover(0, gwB, 3*time.Second) // heard, its coverage before the deadline
	if r := e.reap(0, 100); len(r.Offline) != 0 || r.Held != 1 {
		t.Fatalf("reap with B behind: %d offline, %d held; want 0 and 1", len(r.Offline), r.Held)
	}
	e.cover(0, gwB, 0)
	evs := e.reapUntil(0, e.now().Add(CoverRecheck), CoverRecheck/4)
	checkOffline(t, "reap once B covered", evs, d, gateway.ReasonExpired, dl)
}

// Another gateway that is not heard (its link is cut), but was within the
// horizon, is waited for too: the device may have moved to it and its
// evidence there is late but valid up to the grace. A gateway last heard
// beyond the horizon is not.
func testSilentLaggard(t *testing.T, open GraceOpener) {
	e := newCoverEnv(t, open, 2)
	silent := e.now()
	e.cover(0, gwB, 0) // B's last call: its coverage stays before the deadline
	e.clock.Advance(10 * time.Second)
	d, dl := connectCovered(e)
	e.clock.Advance(lease + time.Second)
	e.cover(0, gwA, 0)
	if r := e.reap(0, 100); len(r.Offline) != 0 || r.Held != 1 {
		t.Fatalf("reap with B silent, behind, within the horizon: %d offline, %d held; want 0 and 1", len(r.Offline), r.Held)
	}
	// once B is beyond the horizon, A's device goes, expired (A covered
	// it), before the end of its grace
	var evs []gateway.Event
	for range maxPages {
		e.clock.Advance(CoverRecheck / 2)
		e.cover(0, gwA, 0)
		if evs = e.reap(0, 100).Offline; len(evs) > 0 || e.now().After(dl.Add(coverGrace)) {
			break
		}
	}
	checkOffline(t, "reap once B is beyond the horizon", evs, d, gateway.ReasonExpired, dl)
	if at := evs[0].At; at.Before(silent.Add(CoverHorizon)) || !at.Before(dl.Add(coverGrace)) {
		t.Fatalf("offline at %v: want after B's horizon %v and before the end of the grace %v", at, silent.Add(CoverHorizon), dl.Add(coverGrace))
	}
}

// A device's goodbye to one gateway, written while another gateway that
// was cut from the store just before has not covered it (the device may
// have moved there, its connect held up by the cut), is held until that
// gateway's horizon ends, which may be after the grace counted from the
// leave (the cut is shorter than lease + grace); then it is a leave.
func testSilentLaggardPastGrace(t *testing.T, open GraceOpener) {
	e := newCoverEnv(t, open, 2)
	d, _ := connectCovered(e)
	e.clock.Advance(10 * time.Second)
	silent := e.now()
	e.cover(0, gwB, 2*time.Second) // B's last call: its coverage stays before the leave
	e.clock.Advance(time.Second)
	left := e.now()
	if res := e.apply(covering(batch(gwA, 1, wr(d, "s1", gateway.Leave, 0)), 0)); len(res.Events) != 0 {
		t.Fatalf("leave with B cut and behind: %s, want it held", describeEvents(res.Events))
	}
	var evs []gateway.Event
	for range maxPages {
		e.clock.Advance(CoverRecheck / 2)
		e.cover(0, gwA, 0)
		if evs = e.reap(0, 100).Offline; len(evs) > 0 || e.now().After(silent.Add(CoverHorizon+5*time.Second)) {
			break
		}
	}
	checkOffline(t, "reap once B is beyond the horizon", evs, d, gateway.ReasonLeave, left)
	if at := evs[0].At; !at.After(silent.Add(CoverHorizon)) {
		t.Fatalf("offline at %v: want after B's horizon %v (past the grace after the leave, %v)", at, silent.Add(CoverHorizon), left.Add(coverGrace))
	}
}

// A gateway that reports no coverage (an older release) and is heard is
// judged as before: its device is reaped at its deadline.
func testNoCoverage(t *testing.T, open GraceOpener) {
	e := newCoverEnv(t, open, 2)
	d := devicesIn(t, 2, 0, 1, "cover")[0]
	e.apply(batch(gwA, 1, wr(d, "s1", gateway.Connect, 0)))
	dl := e.now().Add(lease)
	e.clock.Advance(lease - time.Second)
	e.apply(batch(gwA, 1, wr(devicesIn(t, 2, 0, 2, "other")[1], "x", gateway.Connect, 0)))
	e.clock.Advance(2 * time.Second)
	checkOffline(t, "reap of a device of a gateway without coverage", e.reap(0, 100).Offline, d, gateway.ReasonExpired, dl)
}

// Renewals observed a second after their sessions' deadlines, in one
// batch with a coverage past them: a coalesced one (Write.Coalesced)
// stands for several observations whose older ones bridged the gap, so
// within the grace it extends its session with no event; a plain one of
// the same batch is new evidence after a gap (expired, then online
// again). A replayed one (Batch.Replay) has the grace too.
func testCoalescedWriteHasTheGrace(t *testing.T, open GraceOpener) {
	e := newCoverEnv(t, open, 2)
	devs := devicesIn(t, e.shards, 0, 3, "late")
	var ws []gateway.Write
	for _, d := range devs {
		ws = append(ws, wr(d, "s1", gateway.Connect, 0))
	}
	e.apply(covering(batch(gwA, 1, ws...), 0))
	e.clock.Advance(lease + 2*time.Second)
	coalesced := wr(devs[0], "s1", gateway.Renew, time.Second)
	coalesced.Coalesced = true
	evs := e.apply(covering(batch(gwA, 1, coalesced, wr(devs[1], "s1", gateway.Renew, time.Second)), 0)).Events
	if len(evs) != 2 || evs[0].Device != devs[1] || evs[0].Reason != gateway.ReasonExpired ||
		evs[1].Device != devs[1] || evs[1].Reason != gateway.ReasonRenew {
		t.Fatalf("a coalesced and a plain renewal a second after their deadlines: %s; want the plain one's expired and renew only", describeEvents(evs))
	}
	if evs := e.apply(covering(replayed(batch(gwA, 1, wr(devs[2], "s1", gateway.Renew, time.Second))), 0)).Events; len(evs) != 0 {
		t.Fatalf("a replayed renewal a second after its deadline: %s, want none", describeEvents(evs))
	}
	dl := e.now().Add(lease - time.Second)
	for _, d := range devs {
		if got := e.device(d); got.State != gateway.Online || !got.Deadline.Equal(dl) {
			t.Errorf("device %s: %+v, want online until %v", d, got, dl)
		}
	}
}

// A move with a goodbye whose new gateway writes late: A's leave of the
// device's last session arrives while B, heard, has not covered the
// leave. No offline; B's connect, observed before the leave, then keeps
// the device online with no event at all.
func testLeaveWaitsForLaggard(t *testing.T, open GraceOpener) {
	e := newCoverEnv(t, open, 2)
	d, _ := connectCovered(e)
	e.clock.Advance(2 * time.Second)
	e.cover(0, gwB, 2*time.Second) // heard, covered up to the connect only
	res := e.apply(covering(batch(gwA, 1, wr(d, "s1", gateway.Leave, 0)), 0))
	if len(res.Events) != 0 {
		t.Fatalf("leave of the last session while B lags: events %s, want none", describeEvents(res.Events))
	}
	if got := e.device(d); got.State != gateway.Online {
		t.Fatalf("device %s after the held leave: %+v, want online", d, got)
	}
	if r := e.reap(0, 100); len(r.Offline) != 0 {
		t.Fatalf("reap while B lags: %s", describeEvents(r.Offline))
	}
	e.clock.Advance(500 * time.Millisecond)
	res = e.apply(covering(batch(gwB, 1, wr(d, "s2", gateway.Connect, time.Second+500*time.Millisecond)), 0))
	if len(res.Events) != 0 {
		t.Fatalf("B's connect, observed before the leave: events %s, want none", describeEvents(res.Events))
	}
	e.cover(0, gwA, 0)
	if evs := e.reapUntil(0, e.now().Add(lease/2), CoverRecheck); len(evs) != 0 {
		t.Fatalf("reaps while B's session lives: %s", describeEvents(evs))
	}
	if got := e.device(d); got.State != gateway.Online || len(liveSessions(got.Sessions, e.now())) != 1 {
		t.Fatalf("device %s: %+v, want online with B's session alone", d, got)
	}
}

// A held leave is not ended by a later write of the device through the
// same gateway (it came back there after a move) while another gateway
// lags: the device may have been connected there in between, and the
// reap, not the write, judges it; it trims the left session once that
// gateway has covered it, with no event.
func testHeldLeaveOutlivesWrite(t *testing.T, open GraceOpener) {
	e := newCoverEnv(t, open, 2)
	d, _ := connectCovered(e)
	e.clock.Advance(2 * time.Second)
	e.cover(0, gwB, 2*time.Second) // heard, covered up to the connect only
	if res := e.apply(covering(batch(gwA, 1, wr(d, "s1", gateway.Leave, 0)), 0)); len(res.Events) != 0 {
		t.Fatalf("leave of the last session while B lags: events %s, want none", describeEvents(res.Events))
	}
	e.clock.Advance(300 * time.Millisecond)
	if res := e.apply(covering(batch(gwA, 1, wr(d, "s3", gateway.Connect, 0)), 0)); len(res.Events) != 0 {
		t.Fatalf("A's connect 300 ms after the held leave, while B lags: events %s, want none", describeEvents(res.Events))
	}
	e.cover(0, gwB, 0)
	e.cover(0, gwA, 0)
	if evs := e.reapUntil(0, e.now().Add(lease/2), CoverRecheck); len(evs) != 0 {
		t.Fatalf("reaps once B covered: %s, want none", describeEvents(evs))
	}
	if got := e.device(d); got.State != gateway.Online || len(liveSessions(got.Sessions, e.now())) != 1 {
		t.Fatalf("device %s: %+v, want online with s3 alone", d, got)
	}
}

// A held leave whose device never shows up elsewhere: once the lagging
// gateway covers the leave, the reap writes the offline, reason leave,
// with the leave's time as its deadline.
func testHeldLeaveReaped(t *testing.T, open GraceOpener) {
	e := newCoverEnv(t, open, 2)
	d, _ := connectCovered(e)
	e.clock.Advance(2 * time.Second)
	e.cover(0, gwB, 2*time.Second)
	left := e.now()
	if res := e.apply(covering(batch(gwA, 1, wr(d, "s1", gateway.Leave, 0)), 0)); len(res.Events) != 0 {
		t.Fatalf("leave while B lags: events %s, want none", describeEvents(res.Events))
	}
	e.clock.Advance(CoverRecheck)
	e.cover(0, gwA, 0)
	e.cover(0, gwB, 0)
	evs := e.reapUntil(0, e.now().Add(2*CoverRecheck), CoverRecheck/4)
	checkOffline(t, "reap once B covered the leave", evs, d, gateway.ReasonLeave, left)
	if evs[0].Gateway != gwA || evs[0].Session != "s1" {
		t.Fatalf("offline %s: want A's session s1", describeEvents(evs))
	}
}

// A device whose session on A ran out (A covered it) while its new
// session on B was already open, B's connect written late: the connect
// bridges the expired session, no offline and no online.
func testLateConnectBridges(t *testing.T, open GraceOpener) {
	e := newCoverEnv(t, open, 2)
	d, dl := connectCovered(e)
	e.clock.Advance(lease + time.Second)
	e.cover(0, gwA, 0)
	age := e.now().Sub(dl) + 500*time.Millisecond // observed before A's deadline
	if res := e.apply(covering(batch(gwB, 1, wr(d, "s2", gateway.Connect, age)), 0)); len(res.Events) != 0 {
		t.Fatalf("B's late connect, observed before A's deadline: events %s, want none", describeEvents(res.Events))
	}
	// one observed after the deadline of the session that ran out is not
	// a bridge: the device was silent in between
	d2, dl2 := connectCovered2(e)
	e.clock.Advance(lease + time.Second)
	e.cover(0, gwA, 0)
	age = e.now().Sub(dl2) - 500*time.Millisecond
	res := e.apply(covering(batch(gwB, 1, wr(d2, "s2", gateway.Connect, age)), 0))
	if len(res.Events) != 2 || res.Events[0].State != gateway.Offline || res.Events[1].State != gateway.Online {
		t.Fatalf("B's connect observed after A's deadline: events %s, want an offline then an online", describeEvents(res.Events))
	}
}

// A device moved from A to B while B's writes waited in its outbox: B's
// replay keeps the session's newest evidence only, observed after the
// deadline of A's session that ran out; the connect that came before it
// is gone. As late evidence of its own session may be (a replay, a
// coalesced write), the replay bridges the expired session if observed
// within the grace after its deadline: no offline, no online. One
// observed later did not bridge it: an offline, then an online.
func testReplayBridgesWithinGrace(t *testing.T, open GraceOpener) {
	e := newCoverEnv(t, open, 2)
	d, dl := connectCovered(e)
	e.clock.Advance(lease + time.Second)
	e.cover(0, gwA, 0)
	age := e.now().Sub(dl) - 500*time.Millisecond // observed 0.5 s after A's deadline
	if res := e.apply(covering(replayed(batch(gwB, 1, wr(d, "s2", gateway.Renew, age))), 0)); len(res.Events) != 0 {
		t.Fatalf("B's replay observed 0.5 s after A's deadline: events %s, want none", describeEvents(res.Events))
	}
	if got := e.device(d); got.State != gateway.Online {
		t.Fatalf("after B's replay: %+v, want online", got)
	}
	d2, dl2 := connectCovered2(e)
	e.clock.Advance(lease + coverGrace + 2*time.Second)
	e.cover(0, gwA, 0)
	e.cover(0, gwB, 0)
	age = e.now().Sub(dl2) - coverGrace - time.Second
	res := e.apply(covering(replayed(batch(gwB, 1, wr(d2, "s2", gateway.Renew, age))), 0))
	var evs []gateway.Event
	for _, ev := range append(res.Events, e.reapUntil(0, e.now(), time.Second)...) {
		if ev.Device == d2 {
			evs = append(evs, ev)
		}
	}
	if len(evs) != 2 || evs[0].State != gateway.Offline || evs[1].State != gateway.Online {
		t.Fatalf("B's replay observed a grace and 1 s after A's deadline: events %s, want an offline then an online", describeEvents(evs))
	}
}

// connectCovered2 is connectCovered for a second device of shard 0.
func connectCovered2(e *env) (gateway.DeviceID, time.Time) {
	e.t.Helper()
	d := devicesIn(e.t, e.shards, 0, 2, "cover")[1]
	e.apply(covering(batch(gwA, 1, wr(d, "s1", gateway.Connect, 0)), 0))
	return d, e.now().Add(lease)
}

// A restore of a session that ran out before the store lost its state
// (its offline may never have been written): on a record the store lost
// it brings the device back online without an event, the session ending
// at the restore, and the reap writes its offline, reason expired, once
// the gateway's coverage reaches that; on a record the store has it
// changes nothing.
func testLapsedRestore(t *testing.T, open GraceOpener) {
	e := newCoverEnv(t, open, 2)
	ds := devicesIn(t, e.shards, 0, 2, "lapsed")
	lost, known := ds[0], ds[1]
	e.apply(covering(batch(gwA, 1, wr(known, "s1", gateway.Connect, 0)), 0))
	e.apply(covering(batch(gwA, 1, wr(known, "s1", gateway.Leave, 0)), 0))
	before := e.device(known)
	e.clock.Advance(time.Second)
	at := e.now()
	ran := lease + 2*time.Second // observed so long ago that its deadline passed 2 s ago
	res := e.apply(covering(restored(batch(gwA, 1, wr(lost, "s1", gateway.Renew, ran), wr(known, "s1", gateway.Renew, ran))), time.Second))
	if len(res.Events) != 0 {
		t.Fatalf("restore of sessions that ran out wrote %s, want nothing", describeEvents(res.Events))
	}
	if got := e.device(lost); got.State != gateway.Online || got.Ver != uint64(at.UnixMilli()) || !got.Deadline.Equal(at) {
		t.Fatalf("lost device after its lapsed restore: %+v; want online at ver %d until %v", got, at.UnixMilli(), at)
	}
	if got := e.device(known); got.State != gateway.Offline || got.Ver != before.Ver {
		t.Fatalf("known device after a lapsed restore: %+v; want it unchanged (%+v)", got, before)
	}
	e.clock.Advance(CoverRecheck / 2)
	if r := e.reap(0, 100); len(r.Offline) != 0 || r.Held != 1 {
		t.Fatalf("reap before the gateway covers the restore: %s, %d held; want none and 1", describeEvents(r.Offline), r.Held)
	}
	e.cover(0, gwA, 0)
	evs := e.reapUntil(0, e.now().Add(CoverRecheck), CoverRecheck/4)
	checkOffline(t, "reap once the restore is covered", evs, lost, gateway.ReasonExpired, at)
}

// Evidence replayed after an outage longer than its lease has lapsed when
// it arrives, but if it was observed before its session's deadline (up to
// the grace after, as any replay) the device did not fall silent there:
// the session's passed deadline moves to the evidence's, and the reap
// writes the offline with that, the true deadline. Evidence observed more
// than the grace after the deadline moves nothing.
func testLapsedReplay(t *testing.T, open GraceOpener) {
	e := newCoverEnv(t, open, 2)
	ds := devicesIn(t, e.shards, 0, 3, "lapsedreplay")
	valid, gap, held := ds[0], ds[1], ds[2]
	t0 := e.now()
	e.apply(covering(batch(gwA, 1, wr(valid, "s1", gateway.Connect, 0), wr(gap, "s1", gateway.Connect, 0)), 0))
	e.apply(covering(batch(gwB, 1, wr(held, "s1", gateway.Connect, 0)), 0))
	// the devices are held past their deadline: gw-b's coverage stops
	// short of it (held's own gateway; the others', within the horizon)
	e.clock.Set(t0.Add(lease + time.Second))
	e.cover(0, gwB, 5*time.Second)
	if r := e.reap(0, 100); len(r.Offline) != 0 || r.Held == 0 {
		t.Fatalf("reap with gw-b behind: %s, %d held; want the devices held", describeEvents(r.Offline), r.Held)
	}
	e.clock.Set(t0.Add(85 * time.Second))
	// valid and held observed at t0+10s (their deadline t0+30s), gap at
	// t0+52s (beyond the grace after its deadline): all lapsed by now
	// (the write may expire gap itself, §5 of the design)
	res := e.apply(covering(replayed(batch(gwA, 1, wr(valid, "s1", gateway.Renew, 75*time.Second),
		wr(gap, "s1", gateway.Renew, 33*time.Second))), 0))
	evs := res.Events
	res = e.apply(covering(replayed(batch(gwB, 1, wr(held, "s1", gateway.Renew, 75*time.Second))), 0))
	evs = append(evs, res.Events...)
	evs = append(evs, e.reapUntil(0, e.now(), time.Second)...)
	want := map[gateway.DeviceID]time.Time{valid: t0.Add(40 * time.Second), gap: t0.Add(lease), held: t0.Add(40 * time.Second)}
	if len(evs) != 3 {
		t.Fatalf("reap: %s, want the offlines of all three", describeEvents(evs))
	}
	for _, ev := range evs {
		if ev.State != gateway.Offline || ev.Reason != gateway.ReasonExpired || !ev.Deadline.Equal(want[ev.Device]) {
			t.Errorf("reap: %s; want %s offline, expired, deadline %v", describeEvents([]gateway.Event{ev}), ev.Device, want[ev.Device])
		}
	}
}

// A batch whose ages were computed 3 s before the call (a starved
// gateway, gateway.Batch.AgesAt) covers up to 3 s before the call, not up
// to the call: a deadline that passed 2 s before the call is not covered,
// and the reap holds the device until a later batch covers it. Its
// evidence is dated the same way: a renewal observed 3 s before the call,
// just before the deadline, keeps the session.
func testAgesAt(t *testing.T, open GraceOpener) {
	e := newCoverEnv(t, open, 2)
	d, _ := connectCovered(e)
	e.clock.Advance(lease + 2*time.Second)
	late := covering(batch(gwA, 1), 0)
	late.AgesAt = e.now().Add(-3 * time.Second)
	if _, err := e.store.Apply(e.ctx, 0, late); err != nil {
		t.Fatal(err)
	}
	if r := e.reap(0, 100); len(r.Offline) != 0 || r.Held != 1 {
		t.Fatalf("reap after a batch whose ages were counted before the deadline: %d offline, %d held; want 0 and 1", len(r.Offline), r.Held)
	}
	// a renewal observed 3.5 s before a call made 2 s past the deadline:
	// inside the lease, it keeps the session
	renew := covering(batch(gwA, 1, wr(d, "s1", gateway.Renew, 500*time.Millisecond)), 0)
	renew.AgesAt = e.now().Add(-3 * time.Second)
	e.apply(renew)
	want := e.now().Add(-3500 * time.Millisecond).Add(lease)
	if got := e.device(d); got.State != gateway.Online || !got.Deadline.Equal(want) {
		t.Fatalf("after the renewal dated by its ages' time: %+v, want online until %v", got, want)
	}
}
