package storetest

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"testing"
	"time"

	"pgregory.net/rapid"

	"github.com/fleetgate/fleetgate/gateway"
	"github.com/fleetgate/fleetgate/gateway/clocktest"
)

// Shape of the property runs: few devices, sessions and gateways so that
// random writes collide, and ages, leases and clock moves around the
// boundaries of the two leases.
const (
	propShards      = 2
	devicesPerShard = 2
	minSteps        = 8
	maxSteps        = 40
	maxWrites       = 4
	maxReapLimit    = 3
)

var (
	propGateways = []string{"gw-a", "gw-b", "gw-c"}
	propSessions = []gateway.SessionID{"s0", "s1", "coap/default"}
	propKinds    = []gateway.Kind{gateway.Connect, gateway.Renew, gateway.Leave}
	propLeases   = []time.Duration{3 * time.Second, 10 * time.Second}
	propAges     = []time.Duration{0, time.Millisecond, time.Second, 3*time.Second - time.Millisecond,
		3 * time.Second, 5 * time.Second, 10*time.Second - time.Millisecond, 10 * time.Second, 12 * time.Second}
	propAdvances = []time.Duration{time.Millisecond, time.Second, 2 * time.Second, 3 * time.Second,
		5 * time.Second, 10 * time.Second, 11 * time.Second}
)

// RunProperties checks the invariants 1–5 of docs/design.md §7 with rapid: random
// interleavings of connects, renewals and leaves from three gateways,
// duplicated and replayed batches, clock moves, reaps, gateway restarts
// and writes from fenced epochs, each run on a fresh store. After every
// step it compares the store with a reference model: every device's
// state, deadline, ver and live sessions, and the events the step wrote,
// as returned and as found in the log. Each run ends by listing the
// devices, letting every lease run out and reaping, which must leave every
// device offline, and listing them by state.
//
// The number of runs is rapid's (-rapid.checks, default 100); a run has
// minSteps to maxSteps steps.
func RunProperties(t *testing.T, open Opener) {
	t.Run("Invariants", func(t *testing.T) { checkProperties(t, t, open) })
	checkForgetProperty(t, open)
}

// checkProperties runs the property check, reporting to tb; the stores
// are opened on t.
func checkProperties(tb rapid.TB, t *testing.T, open Opener) {
	var devices [propShards][]gateway.DeviceID
	for s := range propShards {
		devices[s] = devicesIn(t, propShards, s, devicesPerShard, "prop")
	}
	rapid.Check(tb, func(rt *rapid.T) {
		clock := clocktest.New(time.UnixMilli(startMs).UTC())
		m := &machine{
			t:       rt,
			clock:   clock,
			store:   open(t, propShards, clock.Now),
			devices: devices,
			model:   newModel(),
			epochs:  map[string]uint64{},
			logged:  map[gateway.DeviceID]loggedState{},
		}
		for _, g := range propGateways {
			m.epochs[g] = 1
		}
		m.run()
	})
}

// machine drives one property run: the store, its clock, the model, and
// what the suite has read of the event logs.
type machine struct {
	t       *rapid.T
	clock   *clocktest.Clock
	store   gateway.Store
	devices [propShards][]gateway.DeviceID
	model   *model
	// epochs is each gateway's current epoch (its process generation).
	epochs map[string]uint64
	// last is the last batch the store accepted.
	last *sentBatch
	// cursor is the position in each shard's log up to which it was read.
	cursor [propShards]string
	// logged is each device's state as derived from its events.
	logged map[gateway.DeviceID]loggedState
}

type sentBatch struct {
	shard int
	batch gateway.Batch
	at    time.Time
}

type loggedState struct {
	state gateway.State
	ver   uint64
}

func (m *machine) run() {
	actions := []struct {
		name   string
		weight int
		fn     func()
	}{
		{"write", 4, m.write},
		{"replay", 1, m.replay},
		{"stale", 1, m.stale},
		{"restart", 1, m.restart},
		{"advance", 3, m.advance},
		{"reap", 2, m.reap},
	}
	var names []string
	byName := map[string]func(){}
	for _, a := range actions {
		byName[a.name] = a.fn
		for range a.weight {
			names = append(names, a.name)
		}
	}
	m.check(nil)
	steps := rapid.IntRange(minSteps, maxSteps).Draw(m.t, "steps")
	for range steps {
		byName[rapid.SampledFrom(names).Draw(m.t, "action")]()
	}
	m.checkList("")
	m.drain()
	m.checkList(gateway.Online)
	m.checkList(gateway.Offline)
}

func (m *machine) ctx() context.Context { return m.t.Context() }

func (m *machine) drawWrites(shard int) []gateway.Write {
	n := rapid.IntRange(1, maxWrites).Draw(m.t, "writes")
	ws := make([]gateway.Write, n)
	for i := range ws {
		ws[i] = gateway.Write{
			Device:  rapid.SampledFrom(m.devices[shard]).Draw(m.t, "device"),
			Session: rapid.SampledFrom(propSessions).Draw(m.t, "session"),
			Kind:    rapid.SampledFrom(propKinds).Draw(m.t, "kind"),
			Age:     rapid.SampledFrom(propAges).Draw(m.t, "age"),
		}
	}
	return ws
}

// write applies a batch from a gateway's current epoch, and maybe the
// same batch again at once (invariant 4).
func (m *machine) write() {
	g := rapid.SampledFrom(propGateways).Draw(m.t, "gateway")
	shard := rapid.IntRange(0, propShards-1).Draw(m.t, "shard")
	b := gateway.Batch{
		Gateway: g,
		Epoch:   m.epochs[g],
		Lease:   rapid.SampledFrom(propLeases).Draw(m.t, "lease"),
		Replay:  rapid.Bool().Draw(m.t, "replay"),
		Writes:  m.drawWrites(shard),
	}
	twice := rapid.Bool().Draw(m.t, "twice")
	m.applyAccepted(shard, b)
	if !twice {
		return
	}
	evs := m.applyAccepted(shard, b)
	if oneWritePerSession(b) && len(evs) > 0 {
		m.t.Fatalf("invariant 4: the same batch applied again wrote %s", describeEvents(evs))
	}
}

// replay applies the last accepted batch again as the outbox would: later,
// with ages recomputed, marked Replay, from the gateway's current epoch.
func (m *machine) replay() {
	if m.last == nil {
		return
	}
	b := m.last.batch
	b.Epoch = m.epochs[b.Gateway]
	b.Replay = true
	b.Writes = slices.Clone(b.Writes)
	for i := range b.Writes {
		b.Writes[i].Age += m.clock.Now().Sub(m.last.at)
	}
	m.applyAccepted(m.last.shard, b)
}

// stale sends a batch from an epoch older than the newest the store has
// recorded for that gateway in that shard (invariant 3).
func (m *machine) stale() {
	var fenced []fenceKey
	for k, e := range m.model.newest {
		if e > 1 {
			fenced = append(fenced, k)
		}
	}
	if len(fenced) == 0 {
		return
	}
	slices.SortFunc(fenced, func(a, b fenceKey) int { return cmp.Or(cmp.Compare(a.gw, b.gw), cmp.Compare(a.shard, b.shard)) })
	k := rapid.SampledFrom(fenced).Draw(m.t, "fenced")
	b := gateway.Batch{
		Gateway: k.gw,
		Epoch:   rapid.Uint64Range(1, m.model.newest[k]-1).Draw(m.t, "epoch"),
		Lease:   rapid.SampledFrom(propLeases).Draw(m.t, "lease"),
		Writes:  m.drawWrites(k.shard),
	}
	m.t.Logf("%v stale Apply(%d, %s)", m.elapsed(), k.shard, describeBatch(b))
	res, err := m.store.Apply(m.ctx(), k.shard, b)
	if !errors.Is(err, gateway.ErrFenced) {
		m.t.Fatalf("invariant 3: Apply(%d, %s) from an epoch older than %d = %v, %s; want ErrFenced",
			k.shard, describeBatch(b), m.model.newest[k], err, describeEvents(res.Events))
	}
	m.check(nil)
}

// restart starts a new process of a gateway: its epoch goes up by one.
func (m *machine) restart() {
	g := rapid.SampledFrom(propGateways).Draw(m.t, "gateway")
	m.epochs[g]++
	m.t.Logf("%v restart %s at epoch %d", m.elapsed(), g, m.epochs[g])
}

func (m *machine) advance() {
	d := rapid.SampledFrom(propAdvances).Draw(m.t, "advance")
	m.clock.Advance(d)
	m.t.Logf("%v advanced %v", m.elapsed(), d)
	m.check(nil)
}

func (m *machine) reap() {
	shard := rapid.IntRange(0, propShards-1).Draw(m.t, "shard")
	limit := rapid.IntRange(1, maxReapLimit).Draw(m.t, "limit")
	m.reapShard(shard, limit)
}

// drain ends a run: every lease runs out and reaping offlines every
// device (an offline event is never lost).
func (m *machine) drain() {
	m.clock.Advance(time.Minute)
	m.t.Logf("%v drain", m.elapsed())
	for s := range propShards {
		for i := 0; ; i++ {
			if i > devicesPerShard {
				m.t.Fatalf("Reap(%d) still reports More after %d calls", s, i)
			}
			if !m.reapShard(s, 1).More {
				break
			}
		}
	}
	for _, ds := range m.devices {
		for _, d := range ds {
			if md := m.model.devs[d]; md != nil && md.state != gateway.Offline {
				m.t.Fatalf("model: %s still online after the drain", d)
			}
		}
	}
}

// checkList pages through List(filter) with a small limit and compares
// the devices with the model.
func (m *machine) checkList(filter gateway.State) {
	limit := rapid.IntRange(1, maxReapLimit).Draw(m.t, "list limit")
	now := m.clock.Now()
	seen := map[gateway.DeviceID]bool{}
	cursor := ""
	for page := 0; ; page++ {
		if page == maxPages {
			m.t.Fatalf("List(%q) did not end after %d pages", filter, maxPages)
		}
		p, err := m.store.List(m.ctx(), gateway.ListQuery{State: filter, Cursor: cursor, Limit: limit})
		if err != nil {
			m.t.Fatalf("List(%q, cursor %q): %v", filter, cursor, err)
		}
		if len(p.Devices) > limit {
			m.t.Fatalf("List(%q, limit %d) returned %d devices", filter, limit, len(p.Devices))
		}
		for _, info := range p.Devices {
			md := m.model.devs[info.Device]
			if md == nil || md.ver == 0 || seen[info.Device] || (filter != "" && md.state != filter) {
				m.t.Fatalf("List(%q) returned %s (%s v%d) unexpectedly (or twice)", filter, info.Device, info.State, info.Ver)
			}
			seen[info.Device] = true
			if diff := diffDevice(info, md.info(info.Device), now); diff != "" {
				m.t.Fatalf("List(%q) %s: %s", filter, info.Device, diff)
			}
		}
		if p.Next == "" {
			break
		}
		cursor = p.Next
	}
	for d, md := range m.model.devs {
		if md.ver > 0 && (filter == "" || md.state == filter) && !seen[d] {
			m.t.Fatalf("List(%q) missed %s (%s v%d)", filter, d, md.state, md.ver)
		}
	}
}

func (m *machine) elapsed() time.Duration { return m.clock.Now().Sub(time.UnixMilli(startMs)) }

// applyAccepted applies b, which the store must accept, and checks it
// against the model; it returns the events written.
func (m *machine) applyAccepted(shard int, b gateway.Batch) []gateway.Event {
	now := m.clock.Now()
	m.t.Logf("%v Apply(%d, %s)", m.elapsed(), shard, describeBatch(b))
	res, err := m.store.Apply(m.ctx(), shard, b)
	if err != nil {
		m.t.Fatalf("Apply(%d, %s): %v", shard, describeBatch(b), err)
	}
	want, fenced := m.model.apply(shard, b, now)
	if fenced {
		m.t.Fatalf("model fenced a batch the generator meant to be current: %s", describeBatch(b))
	}
	if d := diffEvents(res.Events, shard, want); d != "" {
		m.t.Fatalf("Apply(%d, %s) events: %s", shard, describeBatch(b), d)
	}
	m.last = &sentBatch{shard: shard, batch: b, at: now}
	m.check(map[int][]gateway.Event{shard: res.Events})
	return res.Events
}

// reapShard reaps and checks the result against the model: the earliest
// due entries, at most limit, each offlined with its deadline; More and
// Next as the model has them afterwards.
func (m *machine) reapShard(shard, limit int) gateway.ReapResult {
	now := m.clock.Now()
	m.t.Logf("%v Reap(%d, %d)", m.elapsed(), shard, limit)
	res, err := m.store.Reap(m.ctx(), shard, limit)
	if err != nil {
		m.t.Fatalf("Reap(%d, %d): %v", shard, limit, err)
	}
	due := m.model.due(shard, m.devices[shard], now)
	if res.Trimmed != 0 {
		m.t.Fatalf("Reap(%d) trimmed %d devices, but every due entry's sessions had all run out (the deadline index holds the max over a device's sessions)", shard, res.Trimmed)
	}
	if want := min(limit, len(due)); len(res.Offline) != want {
		m.t.Fatalf("Reap(%d, limit %d) with %d due wrote %d offline events, want %d: %s",
			shard, limit, len(due), len(res.Offline), want, describeEvents(res.Offline))
	}
	reaped := map[gateway.DeviceID]bool{}
	var latest time.Time
	for _, ev := range res.Offline {
		md := m.model.devs[ev.Device]
		if !slices.Contains(due, ev.Device) || reaped[ev.Device] {
			m.t.Fatalf("Reap(%d) offlined %s, which is not due (due: %v)", shard, ev.Device, due)
		}
		reaped[ev.Device] = true
		w := expired(ev.Device, md.ver+1, now, md.deadline())
		if d := diffEvent(ev, shard, w); d != "" {
			m.t.Fatalf("Reap(%d) event %s: %s", shard, describeEvent(ev), d)
		}
		latest = maxTime(latest, md.deadline())
	}
	for _, d := range due {
		if !reaped[d] && m.model.devs[d].deadline().Before(latest) {
			m.t.Fatalf("Reap(%d) left %s (deadline %v) but reaped a later deadline %v", shard, d, m.model.devs[d].deadline(), latest)
		}
	}
	for d := range reaped {
		m.model.devs[d].expire(now)
	}
	if more := len(due) > len(res.Offline); res.More != more {
		m.t.Fatalf("Reap(%d, %d) More = %v with %d due and %d reaped", shard, limit, res.More, len(due), len(res.Offline))
	}
	if next := m.model.next(m.devices[shard]); !res.Next.Equal(next) {
		m.t.Fatalf("Reap(%d) Next = %v, want %v", shard, res.Next, next)
	}
	m.check(map[int][]gateway.Event{shard: res.Offline})
	return res
}

// check compares every device with the model and reads the new events of
// every log, which must be exactly wrote (per shard), then checks the
// invariants 1 and 5 against the store.
func (m *machine) check(wrote map[int][]gateway.Event) {
	now := m.clock.Now()
	for s := range propShards {
		evs, err := readLog(m.ctx(), m.store, s, m.cursor[s])
		if err != nil {
			m.t.Fatal(err)
		}
		if !slices.EqualFunc(evs, wrote[s], sameEvent) {
			m.t.Fatalf("shard %d log grew by %s; want the step's events %s", s, describeEvents(evs), describeEvents(wrote[s]))
		}
		for _, ev := range evs {
			prev := m.logged[ev.Device]
			want := gateway.Online
			if prev.state == gateway.Online {
				want = gateway.Offline
			}
			if ev.State != want || ev.Ver != nextVer(prev.ver, ev.At) {
				m.t.Fatalf("invariant 5: %s's events go from v%d %s to v%d %s", ev.Device, prev.ver, prev.state, ev.Ver, ev.State)
			}
			m.logged[ev.Device] = loggedState{state: ev.State, ver: ev.Ver}
			m.cursor[s] = ev.ID
		}
	}
	for _, ds := range m.devices {
		for _, d := range ds {
			m.checkDevice(d, now)
		}
	}
	if err := checkScans(m.ctx(), m.store); err != nil {
		m.t.Fatal(err)
	}
}

func (m *machine) checkDevice(d gateway.DeviceID, now time.Time) {
	md := m.model.devs[d]
	if md == nil || md.ver == 0 {
		if diff := absentDiff(m.ctx(), m.store, d); diff != "" {
			m.t.Fatal(diff)
		}
		return
	}
	info, err := m.store.Device(m.ctx(), d)
	if err != nil {
		m.t.Fatalf("Device(%s): %v", d, err)
	}
	live := len(md.live(now)) > 0
	if got := info.State == gateway.Online && info.Deadline.After(now); got != live {
		m.t.Fatalf("invariant 1: %s online (state %s, deadline %v) = %v at %v; the model has live sessions %v",
			d, info.State, info.Deadline, got, now, md.live(now))
	}
	if l := m.logged[d]; info.State != l.state || info.Ver != l.ver {
		m.t.Fatalf("invariant 5: %s is %s v%d in the store, %s v%d by its events", d, info.State, info.Ver, l.state, l.ver)
	}
	if diff := diffDevice(info, md.info(d), now); diff != "" {
		m.t.Fatalf("Device(%s): %s", d, diff)
	}
	for _, s := range info.Sessions {
		if dl, ok := md.sessions[s.ID]; !ok || !dl.Equal(s.Deadline) {
			m.t.Fatalf("Device(%s) holds session %s until %v; the model holds %s", d, s.ID, s.Deadline, describeModelSessions(md.sessions))
		}
	}
}

func oneWritePerSession(b gateway.Batch) bool {
	type key struct {
		d gateway.DeviceID
		s gateway.SessionID
	}
	seen := map[key]bool{}
	for _, w := range b.Writes {
		k := key{w.Device, w.Session}
		if seen[k] {
			return false
		}
		seen[k] = true
	}
	return true
}

// model is the reference implementation of the Store contract's Apply
// and Reap semantics.
type model struct {
	devs map[gateway.DeviceID]*modelDevice
	// newest is the newest epoch accepted per gateway and shard.
	newest map[fenceKey]uint64
}

type fenceKey struct {
	gw    string
	shard int
}

type modelDevice struct {
	state gateway.State
	ver   uint64
	since time.Time
	// sessions holds every session with its deadline, expired ones too
	// until a write to the device or a reap drops them.
	sessions map[gateway.SessionID]time.Time
	// left holds, per session that left, when its leave was observed:
	// evidence observed before it is ignored (leave tombstones).
	left map[gateway.SessionID]time.Time
}

func newModel() *model {
	return &model{devs: map[gateway.DeviceID]*modelDevice{}, newest: map[fenceKey]uint64{}}
}

func (m *model) device(d gateway.DeviceID) *modelDevice {
	md := m.devs[d]
	if md == nil {
		md = &modelDevice{state: gateway.Offline, sessions: map[gateway.SessionID]time.Time{}, left: map[gateway.SessionID]time.Time{}}
		m.devs[d] = md
	}
	return md
}

// apply is Store.Apply on the model; it returns the events to expect, or
// fenced.
func (m *model) apply(shard int, b gateway.Batch, now time.Time) (want []wantEvent, fenced bool) {
	k := fenceKey{b.Gateway, shard}
	if b.Epoch < m.newest[k] {
		return nil, true
	}
	m.newest[k] = b.Epoch
	// bridged[j]: write j is a leave, and a later write of the batch
	// carries live evidence of another session of its device: the
	// offline of a leave that leaves the device no session waits for the
	// end of the batch, and is written only if no later write gave it a
	// session
	bridged := make([]bool, len(b.Writes))
	for j, w := range b.Writes {
		if w.Kind != gateway.Leave {
			continue
		}
		for _, x := range b.Writes[j+1:] {
			if x.Device == w.Device && x.Session != w.Session && x.Kind != gateway.Leave && x.LeaseOr(b.Lease) > x.Age {
				bridged[j] = true
			}
		}
	}
	type leaver struct {
		device  gateway.DeviceID
		session gateway.SessionID
	}
	var leavers []leaver
	for j, w := range b.Writes {
		md := m.device(w.Device)
		d := now.Add(b.Lease - w.Age)
		obs := now.Add(-w.Age)
		if t, ok := md.left[w.Session]; ok && w.Kind != gateway.Leave && obs.Before(t) && !t.After(now) {
			continue
		}
		var late gateway.SessionID // late but valid evidence keeps its session
		if cur, ok := md.sessions[w.Session]; ok && w.Kind != gateway.Leave && !cur.After(now) && !now.Add(-w.Age).After(cur) {
			late = w.Session
		}
		// evidence observed by the deadline of the sessions that ran out
		// bridges them: the device was never silent, no offline
		bridge := w.Kind != gateway.Leave && d.After(now) && !obs.After(md.deadline())
		if ev, ok := md.dropExpired(w.Device, now, late, bridge); ok {
			want = append(want, ev)
		}
		switch w.Kind {
		case gateway.Connect, gateway.Renew:
			if !d.After(now) {
				// lapsed: it moves only a passed deadline of a late session
				if cur, ok := md.sessions[late]; late != "" && md.state == gateway.Online && ok && d.After(cur) {
					md.sessions[late] = d
				}
				continue
			}
			if cur, ok := md.sessions[w.Session]; !ok || d.After(cur) {
				md.sessions[w.Session] = d
			}
			if md.state == gateway.Online {
				continue
			}
			reason := gateway.ReasonConnect
			switch {
			case b.Replay:
				reason = gateway.ReasonReplay
			case w.Kind == gateway.Renew:
				reason = gateway.ReasonRenew
			}
			md.transition(gateway.Online, now)
			want = append(want, online(w.Device, md.ver, reason, now, b.Gateway, w.Session))
		case gateway.Leave:
			cur, ok := md.sessions[w.Session]
			if md.ver == 0 || (ok && cur.After(d)) {
				continue
			}
			if t, seen := md.left[w.Session]; !seen || obs.After(t) {
				md.left[w.Session] = obs
			}
			if !ok {
				continue
			}
			delete(md.sessions, w.Session)
			if len(md.sessions) == 0 && bridged[j] {
				leavers = append(leavers, leaver{w.Device, w.Session})
				continue
			}
			if len(md.sessions) == 0 {
				md.transition(gateway.Offline, now)
				want = append(want, leaveEvent(w.Device, md.ver, now, b.Gateway, w.Session))
			}
		}
	}
	for _, l := range leavers {
		if md := m.devs[l.device]; md.state == gateway.Online && len(md.sessions) == 0 {
			md.transition(gateway.Offline, now)
			want = append(want, leaveEvent(l.device, md.ver, now, b.Gateway, l.session))
		}
	}
	return want, false
}

// due lists the devices of a shard whose deadline entry is due at now.
func (m *model) due(shard int, devs []gateway.DeviceID, now time.Time) []gateway.DeviceID {
	var due []gateway.DeviceID
	for _, d := range devs {
		if md := m.devs[d]; md != nil && md.state == gateway.Online && !md.deadline().After(now) {
			due = append(due, d)
		}
	}
	return due
}

// next is the earliest deadline entry among devs, zero if none.
func (m *model) next(devs []gateway.DeviceID) time.Time {
	var next time.Time
	for _, d := range devs {
		if md := m.devs[d]; md != nil && md.state == gateway.Online {
			if dl := md.deadline(); next.IsZero() || dl.Before(next) {
				next = dl
			}
		}
	}
	return next
}

// deadline is the max over the held sessions.
func (md *modelDevice) deadline() time.Time {
	var dl time.Time
	for _, t := range md.sessions {
		dl = maxTime(dl, t)
	}
	return dl
}

func (md *modelDevice) live(now time.Time) []gateway.SessionID {
	var ids []gateway.SessionID
	for id, dl := range md.sessions {
		if dl.After(now) {
			ids = append(ids, id)
		}
	}
	slices.Sort(ids)
	return ids
}

func (md *modelDevice) transition(s gateway.State, now time.Time) {
	md.state = s
	md.ver = nextVer(md.ver, now)
	md.since = now
}

// dropExpired drops the sessions whose deadline is not after now, but
// keep; if that ends an online device, it returns the expired event,
// unless bridge (the write's evidence came by their deadline).
func (md *modelDevice) dropExpired(d gateway.DeviceID, now time.Time, keep gateway.SessionID, bridge bool) (wantEvent, bool) {
	old := md.deadline()
	had := len(md.sessions)
	maps.DeleteFunc(md.sessions, func(id gateway.SessionID, dl time.Time) bool { return !dl.After(now) && id != keep })
	// (a device a bridged leave left without a session, within its
	// batch, has none to run out)
	if had == 0 || len(md.sessions) > 0 || md.state != gateway.Online || bridge {
		return wantEvent{}, false
	}
	md.transition(gateway.Offline, now)
	return expired(d, md.ver, now, old), true
}

// expire is a reap of the device.
func (md *modelDevice) expire(now time.Time) {
	clear(md.sessions)
	md.transition(gateway.Offline, now)
}

func (md *modelDevice) info(d gateway.DeviceID) gateway.DeviceInfo {
	info := gateway.DeviceInfo{Device: d, State: md.state, Ver: md.ver, Since: md.since}
	if md.state == gateway.Online {
		info.Deadline = md.deadline()
	}
	for id, dl := range md.sessions {
		info.Sessions = append(info.Sessions, gateway.SessionInfo{ID: id, Deadline: dl})
	}
	return info
}

func describeModelSessions(ss map[gateway.SessionID]time.Time) string {
	ids := slices.Sorted(maps.Keys(ss))
	parts := make([]string, len(ids))
	for i, id := range ids {
		parts[i] = fmt.Sprintf("%s until %s", id, ss[id].UTC().Format(time.StampMilli))
	}
	return fmt.Sprint(parts)
}

func maxTime(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}
