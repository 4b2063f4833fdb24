// Package storetest is the conformance suite that every gateway.Store
// implementation must pass: Run checks the Store contract (the doc comment
// of gateway.Store) case by case, and RunProperties checks the invariants
// of docs/design.md §7 over random interleavings of writes, clock moves, reaps and
// fenced writes against a small reference model.
//
// A backend wires it from its own test package:
//
//	func TestConformance(t *testing.T) {
//		storetest.Run(t, open)
//		storetest.RunProperties(t, open)
//	}
//
// Every store runs on a manual clock (gateway/clocktest) that the suite
// moves in whole milliseconds, so no test sleeps and every deadline is
// exact.
package storetest

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/fleetgate/fleetgate/gateway"
	"github.com/fleetgate/fleetgate/gateway/clocktest"
)

// Opener returns a fresh, empty store with the given shard count whose
// clock is now (a manual test clock; stores take it as Options.Now). Each
// call must be independent (its own bbolt file, or its own Redis key
// prefix), and the Opener closes what it opened with t.Cleanup.
type Opener func(t *testing.T, shards int, now func() time.Time) gateway.Store

// startMs is where every test clock starts (2030-01-01T00:00:00Z), a whole
// millisecond so that store timestamps compare exactly.
const startMs = 1_893_456_000_000

// logPage is the page size the suite reads event logs with.
const logPage = 100

// maxPages bounds every paging loop of the suite.
const maxPages = 1000

// env is one store under test with its clock.
type env struct {
	t      *testing.T
	ctx    context.Context
	clock  *clocktest.Clock
	store  gateway.Store
	shards int
}

func newEnv(t *testing.T, open Opener, shards int) *env {
	t.Helper()
	clock := clocktest.New(time.UnixMilli(startMs).UTC())
	store := open(t, shards, clock.Now)
	if store == nil {
		t.Fatalf("opener returned a nil store")
	}
	return &env{t: t, ctx: t.Context(), clock: clock, store: store, shards: shards}
}

func (e *env) now() time.Time { return e.clock.Now() }

// apply applies b to the shard of its first write and fails the test on
// an error.
func (e *env) apply(b gateway.Batch) gateway.ApplyResult {
	e.t.Helper()
	shard := gateway.ShardOf(b.Writes[0].Device, e.shards)
	res, err := e.store.Apply(e.ctx, shard, b)
	if err != nil {
		e.t.Fatalf("Apply(shard %d, %s): %v", shard, describeBatch(b), err)
	}
	return res
}

// applyErr applies b to the shard of its first write and returns the error.
func (e *env) applyErr(b gateway.Batch) error {
	_, err := e.store.Apply(e.ctx, gateway.ShardOf(b.Writes[0].Device, e.shards), b)
	return err
}

func (e *env) reap(shard, limit int) gateway.ReapResult {
	e.t.Helper()
	res, err := e.store.Reap(e.ctx, shard, limit)
	if err != nil {
		e.t.Fatalf("Reap(shard %d, limit %d): %v", shard, limit, err)
	}
	return res
}

func (e *env) device(id gateway.DeviceID) gateway.DeviceInfo {
	e.t.Helper()
	info, err := e.store.Device(e.ctx, id)
	if err != nil {
		e.t.Fatalf("Device(%s): %v", id, err)
	}
	return info
}

// log reads the whole event log of shard.
func (e *env) log(shard int) []gateway.Event {
	e.t.Helper()
	evs, err := readLog(e.ctx, e.store, shard, "")
	if err != nil {
		e.t.Fatal(err)
	}
	return evs
}

// readLog reads the events of shard after position after, to the end, in
// pages, checking that positions strictly increase.
func readLog(ctx context.Context, s gateway.Store, shard int, after string) ([]gateway.Event, error) {
	var all []gateway.Event
	for range maxPages {
		page, err := s.Events(ctx, shard, after, logPage)
		if err != nil {
			return nil, fmt.Errorf("Events(shard %d, after %q): %w", shard, after, err)
		}
		if len(page) > logPage {
			return nil, fmt.Errorf("Events(shard %d, after %q, limit %d) returned %d events", shard, after, logPage, len(page))
		}
		for _, ev := range page {
			if err := checkAfter(after, ev.ID); err != nil {
				return nil, fmt.Errorf("Events(shard %d): %w", shard, err)
			}
			if ev.Shard != shard {
				return nil, fmt.Errorf("Events(shard %d) returned event %s of shard %d", shard, ev.ID, ev.Shard)
			}
			after = ev.ID
		}
		all = append(all, page...)
		if len(page) < logPage {
			return all, nil
		}
	}
	return nil, fmt.Errorf("Events(shard %d): log longer than %d pages", shard, maxPages)
}

// eventPos is an event ID "<ms>-<seq>" (Event.ID).
type eventPos struct{ ms, seq uint64 }

func parseEventID(id string) (eventPos, error) {
	ms, seq, ok := strings.Cut(id, "-")
	a, err1 := strconv.ParseUint(ms, 10, 64)
	b, err2 := strconv.ParseUint(seq, 10, 64)
	if !ok || err1 != nil || err2 != nil {
		return eventPos{}, fmt.Errorf("event ID %q is not <ms>-<seq>", id)
	}
	return eventPos{a, b}, nil
}

// checkAfter reports an error unless event ID id comes strictly after
// position after ("" and "0" are the start of the log).
func checkAfter(after, id string) error {
	p, err := parseEventID(id)
	if err != nil {
		return err
	}
	if after == "" || after == "0" {
		return nil
	}
	q, err := parseEventID(after)
	if err != nil {
		return err
	}
	if p.ms < q.ms || (p.ms == q.ms && p.seq <= q.seq) {
		return fmt.Errorf("event ID %s does not come after %s", id, after)
	}
	return nil
}

// devicesIn returns n device IDs named prefix-<i> that hash to shard.
func devicesIn(t testing.TB, shards, shard, n int, prefix string) []gateway.DeviceID {
	t.Helper()
	var ids []gateway.DeviceID
	for i := 0; i < 100*n*shards && len(ids) < n; i++ {
		id, err := gateway.ParseDeviceID(fmt.Sprintf("%s-%d", prefix, i))
		if err != nil {
			t.Fatal(err)
		}
		if gateway.ShardOf(id, shards) == shard {
			ids = append(ids, id)
		}
	}
	if len(ids) < n {
		t.Fatalf("found only %d devices of shard %d/%d", len(ids), shard, shards)
	}
	return ids
}

// wr is a write of session s of device d, observed age ago, under the
// batch's lease.
func wr(d gateway.DeviceID, s gateway.SessionID, k gateway.Kind, age time.Duration) gateway.Write {
	return gateway.Write{Device: d, Session: s, Kind: k, Age: age}
}

// batch is a batch of gw at epoch under the conformance lease.
func batch(gw string, epoch uint64, ws ...gateway.Write) gateway.Batch {
	return gateway.Batch{Gateway: gw, Epoch: epoch, Lease: lease, Writes: ws}
}

// onlineInfo is a device online since since at ver, with sessions and
// the latest of their deadlines.
func onlineInfo(d gateway.DeviceID, ver uint64, since time.Time, sessions ...gateway.SessionInfo) gateway.DeviceInfo {
	var deadline time.Time
	for _, s := range sessions {
		if s.Deadline.After(deadline) {
			deadline = s.Deadline
		}
	}
	return gateway.DeviceInfo{Device: d, State: gateway.Online, Deadline: deadline, Ver: ver, Since: since, Sessions: sessions}
}

// offlineInfo is a device offline since since at ver.
func offlineInfo(d gateway.DeviceID, ver uint64, since time.Time) gateway.DeviceInfo {
	return gateway.DeviceInfo{Device: d, State: gateway.Offline, Ver: ver, Since: since}
}

// sess is a session with its deadline (gateway and epoch not compared).
func sess(id gateway.SessionID, deadline time.Time) gateway.SessionInfo {
	return gateway.SessionInfo{ID: id, Deadline: deadline}
}

// replayed is b replayed from an outbox (gateway.Batch.Replay).
func replayed(b gateway.Batch) gateway.Batch {
	b.Replay = true
	return b
}

// restored is b sent to restore live sessions the store lost
// (gateway.Batch.Restore).
func restored(b gateway.Batch) gateway.Batch {
	b.Restore = true
	return b
}

// withLease is b under lease l.
func withLease(b gateway.Batch, l time.Duration) gateway.Batch {
	b.Lease = l
	return b
}

// sessBy is a session with its deadline, written last by gw at epoch.
func sessBy(id gateway.SessionID, deadline time.Time, gw string, epoch uint64) gateway.SessionInfo {
	return gateway.SessionInfo{ID: id, Deadline: deadline, Gateway: gw, Epoch: epoch}
}

// lastWriter is info with the device's last writer, gw and session s.
func lastWriter(info gateway.DeviceInfo, gw string, s gateway.SessionID) gateway.DeviceInfo {
	info.Gateway, info.Session = gw, s
	return info
}

// evidence is a connect or renew, replayed from an outbox or not, with
// the reason of the online event it writes when it brings its device
// online.
type evidence struct {
	name   string
	kind   gateway.Kind
	replay bool
	reason gateway.Reason
}

var (
	connectEvidence = evidence{"connect", gateway.Connect, false, gateway.ReasonConnect}
	renewEvidence   = evidence{"renew", gateway.Renew, false, gateway.ReasonRenew}
	replayedConnect = evidence{"replayed connect", gateway.Connect, true, gateway.ReasonReplay}
	replayedRenewal = evidence{"replayed renew", gateway.Renew, true, gateway.ReasonReplay}
)

// batch is a batch of gw at epoch with the one write of this evidence of
// session s of device d, observed age ago.
func (ev evidence) batch(gw string, epoch uint64, d gateway.DeviceID, s gateway.SessionID, age time.Duration) gateway.Batch {
	b := batch(gw, epoch, wr(d, s, ev.kind, age))
	b.Replay = ev.replay
	return b
}

// newConnected returns a store of shards shards in which session s1 of
// device dev-1 connected through gw-a at epoch 1, with dev-1, its shard
// and the time of the connect.
func newConnected(t *testing.T, open Opener, shards int) (e *env, d gateway.DeviceID, shard int, t0 time.Time) {
	t.Helper()
	e = newEnv(t, open, shards)
	d = "dev-1"
	t0 = e.now()
	e.apply(batch(gwA, 1, wr(d, "s1", gateway.Connect, 0)))
	return e, d, gateway.ShardOf(d, shards), t0
}

// wantEvent is an expected event; ID is not compared, and Gateway and
// Session only for reasons other than expired (the runner's events name
// no writer).
type wantEvent struct {
	Device   gateway.DeviceID
	State    gateway.State
	Ver      uint64
	Reason   gateway.Reason
	At       time.Time
	Deadline time.Time // expired only
	Gateway  string
	Session  gateway.SessionID
}

func online(d gateway.DeviceID, ver uint64, r gateway.Reason, at time.Time, gw string, s gateway.SessionID) wantEvent {
	return wantEvent{Device: d, State: gateway.Online, Ver: ver, Reason: r, At: at, Gateway: gw, Session: s}
}

func leaveEvent(d gateway.DeviceID, ver uint64, at time.Time, gw string, s gateway.SessionID) wantEvent {
	return wantEvent{Device: d, State: gateway.Offline, Ver: ver, Reason: gateway.ReasonLeave, At: at, Gateway: gw, Session: s}
}

func expired(d gateway.DeviceID, ver uint64, at, deadline time.Time) wantEvent {
	return wantEvent{Device: d, State: gateway.Offline, Ver: ver, Reason: gateway.ReasonExpired, At: at, Deadline: deadline}
}

// diffEvent describes how got differs from w, "" when it matches.
func diffEvent(got gateway.Event, shard int, w wantEvent) string {
	var d fieldDiffs
	d.add(got.Device != w.Device, "device", got.Device, w.Device)
	d.add(got.Shard != shard, "shard", got.Shard, shard)
	d.add(got.State != w.State, "state", got.State, w.State)
	d.add(got.Ver != w.Ver, "ver", got.Ver, w.Ver)
	d.add(got.Reason != w.Reason, "reason", got.Reason, w.Reason)
	d.add(!got.At.Equal(w.At), "at", got.At, w.At)
	d.add(!got.Deadline.Equal(w.Deadline), "deadline", got.Deadline, w.Deadline)
	if w.Reason != gateway.ReasonExpired {
		d.add(got.Gateway != w.Gateway, "gw", got.Gateway, w.Gateway)
		d.add(got.Session != w.Session, "session", got.Session, w.Session)
	}
	if _, err := parseEventID(got.ID); err != nil {
		d = append(d, err.Error())
	}
	return strings.Join(d, "; ")
}

// fieldDiffs lists the fields in which a value differs from the one
// wanted.
type fieldDiffs []string

// add notes field with its got and want values when they differ.
func (d *fieldDiffs) add(differ bool, field string, got, want any) {
	if differ {
		*d = append(*d, fmt.Sprintf("%s %v, want %v", field, got, want))
	}
}

// diffEvents describes how got differs from want, "" when it matches.
func diffEvents(got []gateway.Event, shard int, want []wantEvent) string {
	var b strings.Builder
	if len(got) != len(want) {
		fmt.Fprintf(&b, "%d events, want %d", len(got), len(want))
	}
	for i := range min(len(got), len(want)) {
		if d := diffEvent(got[i], shard, want[i]); d != "" {
			fmt.Fprintf(&b, "\n  event %d (%s): %s", i, describeEvent(got[i]), d)
		}
	}
	if b.Len() == 0 {
		return ""
	}
	fmt.Fprintf(&b, "\n  got:  %s\n  want: %s", describeEvents(got), describeWants(want))
	return b.String()
}

func (e *env) checkEvents(what string, got []gateway.Event, shard int, want ...wantEvent) {
	e.t.Helper()
	want = slices.Clone(want)
	for i := range want {
		want[i].Ver = e.ver(want[i].Device, want[i].Ver)
	}
	if d := diffEvents(got, shard, want); d != "" {
		e.t.Errorf("%s: %s", what, d)
	}
}

// firstVer is the ver of a device's first event, written at at: the store
// time in ms (gateway.Store: versions never repeat, even when a store
// loses a device's record).
func firstVer(at time.Time) uint64 { return uint64(at.UnixMilli()) }

// nextVer is the ver of the event after one of ver (0: none) at at,
// within one incarnation of the store.
func nextVer(ver uint64, at time.Time) uint64 {
	if ver == 0 {
		return firstVer(at)
	}
	return ver + 1
}

// ver is the ver of device d's n-th transition (n counts from 1; 0 is
// 0): the ver of its first event in the log, plus n - 1. The cases write
// vers as ordinals; this is where the first one is checked to be the
// store time it was written at.
func (e *env) ver(d gateway.DeviceID, n uint64) uint64 {
	e.t.Helper()
	if n == 0 {
		return 0
	}
	for _, ev := range e.log(gateway.ShardOf(d, e.shards)) {
		if ev.Device == d {
			if ev.Ver != firstVer(ev.At) {
				e.t.Errorf("%s's first event has ver %d, want the store time %d", d, ev.Ver, firstVer(ev.At))
			}
			return ev.Ver + n - 1
		}
	}
	return n
}

// checkLogged checks that the last len(evs) events of shard's log are
// evs, ID for ID.
func (e *env) checkLogged(shard int, evs []gateway.Event) {
	e.t.Helper()
	log := e.log(shard)
	if len(log) < len(evs) {
		e.t.Errorf("shard %d log has %d events, fewer than the %d returned", shard, len(log), len(evs))
		return
	}
	tail := log[len(log)-len(evs):]
	if !slices.EqualFunc(tail, evs, sameEvent) {
		e.t.Errorf("shard %d log ends with\n  %s\nwant the returned events\n  %s", shard, describeEvents(tail), describeEvents(evs))
	}
}

// checkLogLen checks that shard's log holds n events.
func (e *env) checkLogLen(what string, shard, n int) {
	e.t.Helper()
	if log := e.log(shard); len(log) != n {
		e.t.Errorf("%s: shard %d log has %d events, want %d: %s", what, shard, len(log), n, describeEvents(log))
	}
}

// checkReapedNothing checks that a reap wrote no event, left nothing
// due, and reported next as the earliest deadline (zero: none).
func (e *env) checkReapedNothing(what string, r gateway.ReapResult, next time.Time) {
	e.t.Helper()
	if len(r.Offline) != 0 || r.More || !r.Next.Equal(next) {
		e.t.Errorf("%s = %+v; want no event, More false, Next %v", what, r, next)
	}
}

// checkLeft checks that evs are the leave of device d's last session s
// through gw now, its second transition, and that d is offline since.
func (e *env) checkLeft(evs []gateway.Event, d gateway.DeviceID, gw string, s gateway.SessionID) {
	e.t.Helper()
	now := e.now()
	e.checkEvents("leave", evs, gateway.ShardOf(d, e.shards), leaveEvent(d, 2, now, gw, s))
	e.checkDevice(d, offlineInfo(d, 2, now))
}

// checkFenced checks that b is refused with gateway.ErrFenced and
// writes no event to the shard of its first write.
func (e *env) checkFenced(what string, b gateway.Batch) {
	e.t.Helper()
	shard := gateway.ShardOf(b.Writes[0].Device, e.shards)
	before := e.log(shard)
	if err := e.applyErr(b); !errors.Is(err, gateway.ErrFenced) {
		e.t.Errorf("%s: Apply(%s) = %v, want ErrFenced", what, describeBatch(b), err)
	}
	if after := e.log(shard); len(after) != len(before) {
		e.t.Errorf("%s: fenced batch wrote events %s", what, describeEvents(after[len(before):]))
	}
}

// sameEvent compares every field, times by instant.
func sameEvent(a, b gateway.Event) bool {
	return a.ID == b.ID && a.Shard == b.Shard && a.Device == b.Device && a.State == b.State &&
		a.Ver == b.Ver && a.At.Equal(b.At) && a.Reason == b.Reason && a.Gateway == b.Gateway &&
		a.Session == b.Session && a.Deadline.Equal(b.Deadline)
}

// checkDevice compares the fields of a device that the suite can predict.
func (e *env) checkDevice(id gateway.DeviceID, want gateway.DeviceInfo) {
	e.t.Helper()
	want.Ver = e.ver(id, want.Ver)
	got := e.device(id)
	if d := diffDevice(got, want, e.now()); d != "" {
		e.t.Errorf("Device(%s): %s", id, d)
	}
}

// diffDevice compares State, Deadline, Ver, Since and the live sessions
// (deadline after now: a store may still hold expired ones until the next
// write or reap); Gateway, Session and the sessions' Gateway and Epoch
// only where want sets them.
func diffDevice(got, want gateway.DeviceInfo, now time.Time) string {
	var d fieldDiffs
	d.add(got.Device != want.Device, "device", got.Device, want.Device)
	d.add(got.State != want.State, "state", got.State, want.State)
	d.add(!got.Deadline.Equal(want.Deadline), "deadline", got.Deadline, want.Deadline)
	d.add(got.Ver != want.Ver, "ver", got.Ver, want.Ver)
	d.add(!got.Since.Equal(want.Since), "since", got.Since, want.Since)
	d.add(want.Gateway != "" && got.Gateway != want.Gateway, "gw", got.Gateway, want.Gateway)
	d.add(want.Session != "" && got.Session != want.Session, "session", got.Session, want.Session)
	live, wantLive := liveSessions(got.Sessions, now), liveSessions(want.Sessions, now)
	if !sameSessions(live, wantLive) {
		d.add(true, "live sessions", describeSessions(live), describeSessions(wantLive))
	}
	return strings.Join(d, "; ")
}

// sameSessions reports whether got are the sessions want, in order, by
// ID and deadline, and by gateway and epoch where want sets them.
func sameSessions(got, want []gateway.SessionInfo) bool {
	return slices.EqualFunc(got, want, func(g, w gateway.SessionInfo) bool {
		return g.ID == w.ID && g.Deadline.Equal(w.Deadline) &&
			(w.Gateway == "" || g.Gateway == w.Gateway) && (w.Epoch == 0 || g.Epoch == w.Epoch)
	})
}

// liveSessions returns the sessions whose deadline is after now, sorted
// by ID.
func liveSessions(ss []gateway.SessionInfo, now time.Time) []gateway.SessionInfo {
	var live []gateway.SessionInfo
	for _, s := range ss {
		if s.Deadline.After(now) {
			live = append(live, s)
		}
	}
	slices.SortFunc(live, func(a, b gateway.SessionInfo) int { return strings.Compare(string(a.ID), string(b.ID)) })
	return live
}

// checkAbsent checks that the store holds nothing of id: never seen, or
// a record without sessions or events.
func (e *env) checkAbsent(id gateway.DeviceID) {
	e.t.Helper()
	if d := absentDiff(e.ctx, e.store, id); d != "" {
		e.t.Error(d)
	}
}

func absentDiff(ctx context.Context, s gateway.Store, id gateway.DeviceID) string {
	info, err := s.Device(ctx, id)
	if errors.Is(err, gateway.ErrNotFound) {
		return ""
	}
	if err != nil {
		return fmt.Sprintf("Device(%s): %v", id, err)
	}
	if info.State != gateway.Offline || info.Ver != 0 || len(info.Sessions) != 0 || !info.Deadline.IsZero() {
		return fmt.Sprintf("Device(%s) = state %s, ver %d, deadline %v, sessions %s; want ErrNotFound or an empty offline record",
			id, info.State, info.Ver, info.Deadline, describeSessions(info.Sessions))
	}
	return ""
}

func describeBatch(b gateway.Batch) string {
	var s strings.Builder
	fmt.Fprintf(&s, "%s@%d lease %v", b.Gateway, b.Epoch, b.Lease)
	if b.Replay {
		s.WriteString(" replay")
	}
	s.WriteString(" [")
	for i, w := range b.Writes {
		if i > 0 {
			s.WriteString(", ")
		}
		fmt.Fprintf(&s, "%s %s/%s age %v", w.Kind, w.Device, w.Session, w.Age)
	}
	s.WriteString("]")
	return s.String()
}

func describeEvent(ev gateway.Event) string {
	s := fmt.Sprintf("%s %s v%d %s %s at %s", ev.ID, ev.Device, ev.Ver, ev.State, ev.Reason, ev.At.UTC().Format(time.StampMilli))
	if !ev.Deadline.IsZero() {
		s += " deadline " + ev.Deadline.UTC().Format(time.StampMilli)
	}
	if ev.Gateway != "" || ev.Session != "" {
		s += fmt.Sprintf(" by %s/%s", ev.Gateway, ev.Session)
	}
	return s
}

func describeEvents(evs []gateway.Event) string {
	parts := make([]string, len(evs))
	for i, ev := range evs {
		parts[i] = describeEvent(ev)
	}
	return "[" + strings.Join(parts, " | ") + "]"
}

func describeWants(ws []wantEvent) string {
	parts := make([]string, len(ws))
	for i, w := range ws {
		parts[i] = describeEvent(gateway.Event{ID: "-", Device: w.Device, Ver: w.Ver, State: w.State, Reason: w.Reason,
			At: w.At, Deadline: w.Deadline, Gateway: w.Gateway, Session: w.Session})
	}
	return "[" + strings.Join(parts, " | ") + "]"
}

func describeSessions(ss []gateway.SessionInfo) string {
	parts := make([]string, len(ss))
	for i, s := range ss {
		parts[i] = fmt.Sprintf("%s until %s by %s@%d", s.ID, s.Deadline.UTC().Format(time.StampMilli), s.Gateway, s.Epoch)
	}
	return "[" + strings.Join(parts, ", ") + "]"
}
