package gateway

import (
	"context"
	"fmt"
	"hash/maphash"
	"math"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Defaults of TableOptions (docs/design.md §6.3 for the presence timings).
const (
	defaultTableShards = 64
	// DefaultMaxSessionsPerDevice is limits.max_sessions_per_device.
	DefaultMaxSessionsPerDevice = 32
	// DefaultMaxAnonymousDevices is limits.anonymous_max_devices.
	DefaultMaxAnonymousDevices = 1000
)

// ErrSessionLimit refuses a new session of a device that already has
// TableOptions.MaxSessionsPerDevice sessions on this gateway; its known
// sessions still renew. Front ends answer CoAP 4.03 and MQTT CONNACK
// "quota exceeded". It wraps ErrOverloaded for callers that only know
// that one.
var ErrSessionLimit = fmt.Errorf("too many sessions for one device: %w", ErrOverloaded)

// ErrAnonymousLimit refuses the first session of an anonymous device
// (Evidence.Anonymous) while TableOptions.MaxAnonymousDevices anonymous
// devices have sessions on this gateway; the anonymous devices already
// there still renew and open sessions. Front ends answer MQTT CONNACK
// "quota exceeded" and CoAP 5.03. It wraps ErrOverloaded.
var ErrAnonymousLimit = fmt.Errorf("too many anonymous devices: %w", ErrOverloaded)

// maxKeyLen is the longest session key: device, a zero byte, session.
const maxKeyLen = MaxDeviceIDLen + 1 + MaxSessionIDLen

// TableOptions configures a Table. Zero values take the defaults noted.
type TableOptions struct {
	// Shards is the number of in-memory shards (lock striping); it is
	// independent of the store's shards. Default 64.
	Shards int
	// Lease is presence.lease: a session not seen for that long is
	// dropped locally (Sweep). Default 90s.
	Lease time.Duration
	// RenewEvery is presence.renew_every: a renewal is sent centrally only
	// when it moves the session's deadline forward by at least this much.
	// Default 20s. It must be below Lease; the config loader checks that.
	RenewEvery time.Duration
	// MaxSessions is presence.max_sessions: beyond it a new session is
	// refused with ErrOverloaded (known sessions still renew). Default
	// 1,000,000.
	MaxSessions int
	// MaxSessionsPerDevice is limits.max_sessions_per_device: beyond it a
	// new session of a device is refused with ErrSessionLimit, so that one
	// device (or one stolen key) cannot grow its central record without
	// bound. Default DefaultMaxSessionsPerDevice.
	MaxSessionsPerDevice int
	// MaxAnonymousDevices is limits.anonymous_max_devices: the anonymous
	// devices (evidence with Anonymous set) that may have sessions at
	// once; beyond it the first session of another one is refused with
	// ErrAnonymousLimit, so that strangers cannot make devices (and
	// store records) without bound. Default DefaultMaxAnonymousDevices.
	MaxAnonymousDevices int
	// LearnLease is presence.learn_lease: evidence that carries no lease
	// of its own holds its session for the lease learned from its
	// device's sending period (Period), within [Lease, MaxLease], instead
	// of Lease. MaxLease is presence.max_lease; at or below Lease nothing
	// is learned.
	LearnLease bool
	MaxLease   time.Duration
	// KeepLapsed is how long Sweep keeps a session it dropped, for
	// Restorable: at least the longest the store may take to write its
	// offline (a restore after the store lost its state re-sends it);
	// the gateway keeps 2 × (lease + presence.gateway_grace): a due device
	// may wait lease + grace after the end of a store outage that itself
	// lasted up to that. Zero keeps none.
	KeepLapsed time.Duration
	// Clock is the table's time source. Default SystemClock.
	Clock Clock
}

// SessionView is a copy of one session of the table, for the admin API.
type SessionView struct {
	Device    DeviceID
	Session   SessionID
	Protocol  string
	FirstSeen time.Time
	LastSeen  time.Time
	// LastSent is the ObservedAt of the newest write the uplink accepted
	// (or is being handed); zero when there is none the table is sure of.
	LastSent time.Time
	// Deadline is the session's local deadline: the latest observation
	// plus the lease of its evidence.
	Deadline time.Time
}

// Table is the gateway's session table: every session seen on this
// gateway, with when it was first and last seen and when its newest
// central write was observed. It implements Observer and applies the
// throttle of docs/design.md §2 to decide what goes to the Uplink:
//
//   - Every piece of evidence holds its session for a lease: its own
//     (Evidence.Lease, what the front end granted), else, with
//     LearnLease, the lease learned from its device's sending period
//     (Learning.Lease of the device's Period, learned from the gaps
//     between the evidence of each of its sessions here; MaxLease until
//     it is learned), else Lease; the evidence goes to the Uplink with
//     it, so a reload changes nothing already observed.
//   - The first evidence of a session is sent as Connect, whatever its
//     kind, and so is any Connect. A session whose local lease ran out
//     (no evidence whose lease reaches now) is new again.
//   - A Renew is sent only when it moves the central deadline forward by
//     at least RenewEvery (ObservedAt + its lease ≥ the deadline of the
//     newest write sent + RenewEvery); otherwise it only refreshes
//     LastSeen.
//   - A Leave removes the session and is always sent, even for a session
//     the table does not hold: the store decides. It carries a lease
//     that reaches at least the deadline of the session's newest write
//     sent, so that the store never takes that write for newer evidence
//     than the leave.
//
// A reload (SetTiming) applies to evidence observed after it; a session
// keeps the deadlines of the evidence it has, so a shorter lease never
// ends a session early, locally or centrally.
//
// A write the Uplink refuses is not counted as sent: the session's next
// evidence goes through the throttle against the last write that was
// accepted, so a refused renewal, or the refused connect of a new session,
// is sent again by the next heartbeat. (When the refused send overlapped
// another send of the same session, the table cannot know which was
// accepted, and the next evidence is sent as a Connect.) A session that sends evidence every heartbeat_interval is
// thus written at most once per RenewEvery and, while the Uplink accepts,
// at least once per RenewEvery + heartbeat_interval.
//
// Each session costs one map entry keyed by device, a zero byte and
// session, pointing at a 48-byte record of five times and a protocol
// index (docs/benchmarks.md has the figures), and each device a map
// entry of its session count and learned Period (8 bytes, in the map
// slot its count alone took); MaxSessions bounds the total. Times are
// kept as offsets from the table's creation on its clock, so they follow
// the monotonic clock when the evidence carries it.
type Table struct {
	up     Uplink
	clock  Clock
	base   time.Time
	seed   maphash.Seed
	shards []tableShard
	max    int64
	n      atomic.Int64
	// perDevice is MaxSessionsPerDevice; limited counts its refusals.
	perDevice uint16
	limited   atomic.Uint64
	// maxAnon is MaxAnonymousDevices, anon the anonymous devices with
	// sessions, anonLimited the refusals.
	maxAnon     int64
	anon        atomic.Int64
	anonLimited atomic.Uint64
	timing      atomic.Pointer[timing]
	protos      protocols
	// lapsed holds the sessions Sweep dropped within keepLapsed.
	keepLapsed time.Duration
	lapsedMu   sync.Mutex
	lapsed     []SessionView
}

var _ Observer = (*Table)(nil)

// MaxStoreSessions is the most sessions a device holds in a store, across
// every gateway it reaches: a new session beyond it is ignored (both
// stores; store/redisstore/lua/record.lua MAX_SESSIONS), so no device can make
// a store call slow for the others.
const MaxStoreSessions = 256

type tableShard struct {
	mu sync.Mutex
	m  map[string]*entry
	// devices holds each device of the shard that has sessions (a
	// device's sessions are all in its shard).
	devices map[DeviceID]device
	// multi holds the devices of the shard with more than one session
	// (few: Devices looks only those up).
	multi map[DeviceID]struct{}
}

// device is what the table keeps of a device with sessions: how many
// (at most MaxSessionsPerDevice, which configs bound to 256), whether it
// is counted as anonymous (its first session came with
// Evidence.Anonymous), and its learned period (while learned leases are
// on): 8 bytes, so that the flag costs no map of its own.
type device struct {
	sessions uint16
	anon     bool
	period   Period
}

// entry is one session. Times are nanoseconds since Table.base.
type entry struct {
	first, seen int64
	// dl is the session's local deadline: the latest observation + lease
	// of its evidence.
	dl int64
	// sent is the time of the newest write handed to the uplink and
	// sentDL the latest deadline (observation + lease) of those writes,
	// valid when sentOK.
	sent, sentDL int64
	// seq counts sends and inflight those not finished, so that a refused
	// send undoes only itself and never restores the time of another
	// send that may be refused too.
	seq      uint32
	inflight uint16
	proto    uint8
	sentOK   bool
}

type timing struct {
	lease, renewEvery time.Duration
	// learn and maxLease are TableOptions.LearnLease and MaxLease.
	learn    bool
	maxLease time.Duration
}

func newTiming(lease, renewEvery time.Duration, learn bool, maxLease time.Duration) *timing {
	if lease <= 0 {
		lease = DefaultLease
	}
	if renewEvery <= 0 {
		renewEvery = DefaultRenewEvery
	}
	return &timing{lease: lease, renewEvery: renewEvery, learn: learn, maxLease: maxLease}
}

// learns says whether leases are learned under tm: asked for, with a
// ceiling above the lease.
func (tm *timing) learns() bool { return tm.learn && tm.maxLease > tm.lease }

// learning is the bounds of the leases learned under tm.
func (tm *timing) learning() Learning {
	return Learning{Floor: tm.lease, Ceiling: tm.maxLease, Margin: tm.renewEvery}
}

// NewTable returns an empty table that sends its writes to up.
func NewTable(up Uplink, o TableOptions) *Table {
	if o.Shards <= 0 {
		o.Shards = defaultTableShards
	}
	if o.MaxSessions <= 0 {
		o.MaxSessions = DefaultMaxSessions
	}
	if o.MaxSessionsPerDevice <= 0 {
		o.MaxSessionsPerDevice = DefaultMaxSessionsPerDevice
	}
	if o.MaxAnonymousDevices <= 0 {
		o.MaxAnonymousDevices = DefaultMaxAnonymousDevices
	}
	if o.Clock == nil {
		o.Clock = SystemClock{}
	}
	t := &Table{
		up:     up,
		clock:  o.Clock,
		base:   o.Clock.Now(),
		seed:   maphash.MakeSeed(),
		shards: make([]tableShard, o.Shards),
		max:    int64(o.MaxSessions),

		perDevice: uint16(min(o.MaxSessionsPerDevice, math.MaxUint16)),
		maxAnon:   int64(o.MaxAnonymousDevices),

		keepLapsed: o.KeepLapsed,
	}
	for i := range t.shards {
		t.shards[i].m = make(map[string]*entry)
		t.shards[i].devices = make(map[DeviceID]device)
		t.shards[i].multi = make(map[DeviceID]struct{})
	}
	t.timing.Store(newTiming(o.Lease, o.RenewEvery, o.LearnLease, o.MaxLease))
	t.protos.names.Store(&[]string{""})
	return t
}

// SetTiming replaces the lease and renew_every (config reload); values
// ≤ 0 take the defaults. It applies from the next Observe or Sweep.
func (t *Table) SetTiming(lease, renewEvery time.Duration) {
	old := t.timing.Load()
	t.timing.Store(newTiming(lease, renewEvery, old.learn, old.maxLease))
}

// SetLearning turns learned leases on or off and sets their ceiling,
// presence.max_lease (config reload). It applies to evidence observed
// after it: a lease already granted stays. A device first seen while it
// was off starts at the ceiling once it is on, and one whose period was
// learned before it was turned off counts the time it was off as a gap
// (a longer lease, never a shorter one).
func (t *Table) SetLearning(on bool, maxLease time.Duration) {
	old := t.timing.Load()
	t.timing.Store(newTiming(old.lease, old.renewEvery, on, maxLease))
}

// Observe records ev and hands the Uplink what the throttle lets through.
// It refuses an invalid device or session ID (ErrInvalidDeviceID,
// ErrInvalidSessionID), a new session beyond MaxSessions
// (ErrOverloaded) and a new session of a device beyond
// MaxSessionsPerDevice (ErrSessionLimit, counted by SessionLimitRefusals)
// and the first session of an anonymous device beyond
// MaxAnonymousDevices (ErrAnonymousLimit, counted by
// AnonymousLimitRefusals); it returns the Uplink's error, wrapped, when a write
// could not be enqueued (a Leave removes the session all the same; the
// central lease then ends it). A zero ObservedAt means now on the table's
// clock. No lock is held while the Uplink is called.
func (t *Table) Observe(ctx context.Context, ev Evidence) error {
	if err := checkEvidence(ev); err != nil {
		return fmt.Errorf("observe: %w", err)
	}
	if ev.ObservedAt.IsZero() {
		ev.ObservedAt = t.clock.Now()
	}
	var buf [maxKeyLen]byte
	key := append(append(append(buf[:0], ev.Device...), 0), ev.Session...)
	sh := t.shard(ev.Device)

	tm := t.timing.Load()
	own := ev.Lease > 0
	if !own {
		ev.Lease = tm.lease
	}
	at := t.offset(ev.ObservedAt)
	if ev.Kind == Leave {
		sh.mu.Lock()
		if e, ok := sh.m[string(key)]; ok {
			if e.sentOK {
				ev.Lease = max(ev.Lease, time.Duration(e.sentDL-at))
			}
			delete(sh.m, string(key))
			t.forget(sh, ev.Device)
			t.n.Add(-1)
		}
		sh.mu.Unlock()
		return t.send(ctx, ev)
	}

	sh.mu.Lock()
	e, ok := sh.m[string(key)]
	var period Period
	if tm.learns() {
		period = learn(tm, sh.devices[ev.Device].period, e, at)
		if !own {
			ev.Lease = tm.learning().Lease(period)
		}
	}
	dl := at + int64(ev.Lease)
	switch {
	case !ok:
		d := sh.devices[ev.Device]
		have := d.sessions
		if have >= t.perDevice {
			sh.mu.Unlock()
			t.limited.Add(1)
			return fmt.Errorf("observe: device %s session %s: max_sessions_per_device %d reached: %w", ev.Device, ev.Session, t.perDevice, ErrSessionLimit)
		}
		if t.n.Add(1) > t.max {
			t.n.Add(-1)
			sh.mu.Unlock()
			return fmt.Errorf("observe: device %s session %s: max_sessions %d reached: %w", ev.Device, ev.Session, t.max, ErrOverloaded)
		}
		if have == 0 && ev.Anonymous {
			if t.anon.Add(1) > t.maxAnon {
				t.anon.Add(-1)
				t.n.Add(-1)
				sh.mu.Unlock()
				t.anonLimited.Add(1)
				return fmt.Errorf("observe: anonymous device %s: anonymous_max_devices %d reached: %w", ev.Device, t.maxAnon, ErrAnonymousLimit)
			}
			d.anon = true
		}
		e = &entry{first: at, seen: at, dl: dl, proto: t.protos.index(ev.Protocol)}
		sh.m[string(key)] = e
		d.sessions = have + 1
		sh.devices[ev.Device] = d
		if have == 1 {
			sh.multi[ev.Device] = struct{}{}
		}
	case at >= e.dl:
		// The local lease ran out before Sweep came by: a new session,
		// as if it had been swept.
		e = &entry{first: at, seen: at, dl: dl, proto: t.protos.index(ev.Protocol)}
		sh.m[string(key)] = e
	default:
		e.seen, e.dl = max(e.seen, at), max(e.dl, dl)
	}
	if tm.learns() {
		d := sh.devices[ev.Device]
		d.period = period
		sh.devices[ev.Device] = d
	}
	kind, send := throttle(e, ev.Kind, dl, tm.renewEvery)
	if !send {
		sh.mu.Unlock()
		return nil
	}
	// Reserve the send, so that concurrent evidence is throttled against
	// it, and remember what to restore if the Uplink refuses it: the
	// previous state is known to be accepted only if no other send was
	// in flight.
	prevSent, prevDL, prevOK, prevSure := e.sent, e.sentDL, e.sentOK, e.inflight == 0
	if e.sentOK {
		// a reordered, older connect does not move them back
		e.sent, e.sentDL = max(e.sent, at), max(e.sentDL, dl)
	} else {
		e.sent, e.sentDL = at, dl
	}
	e.sentOK = true
	e.seq++
	e.inflight++
	seq := e.seq
	sh.mu.Unlock()

	ev.Kind = kind
	err := t.send(ctx, ev)
	sh.mu.Lock()
	e.inflight--
	if err != nil && e.seq == seq {
		if prevSure {
			e.sent, e.sentDL, e.sentOK = prevSent, prevDL, prevOK
		} else {
			// The previous state came from a send that may be refused
			// too: send a connect next time.
			e.sentOK = false
		}
	}
	sh.mu.Unlock()
	return err
}

// learn is the period of a device whose period was p (the zero Period
// when unknown) after evidence observed at offset at for the session of
// entry e, under tm. A new session (e nil) starts the device's period
// again: the gap since the device's last evidence, in another session,
// is not known, and an estimate that went on shrinking with the gaps
// inside each session could fall below the gaps between them (a device
// that reconnects at every wake without a persistent session).
func learn(tm *timing, p Period, e *entry, at int64) Period {
	if e == nil || p == (Period{}) {
		p = tm.learning().Start()
	}
	if e == nil {
		return p
	}
	return p.Observe(time.Duration(e.seen), time.Duration(at))
}

// throttle says whether evidence of kind k (Connect or Renew) for e's
// session, holding the session until offset dl, goes to the Uplink, and
// as what: a Connect when the session has no write the
// table is sure was sent, or when k is Connect; a Renew when it moves the
// central deadline forward by at least renewEvery; otherwise nothing.
// Leaves never come here: they are always sent.
func throttle(e *entry, k Kind, dl int64, renewEvery time.Duration) (Kind, bool) {
	switch {
	case !e.sentOK || k == Connect:
		return Connect, true
	case dl-e.sentDL >= int64(renewEvery):
		return Renew, true
	}
	return 0, false
}

func (t *Table) send(ctx context.Context, ev Evidence) error {
	if err := t.up.Enqueue(ctx, ev); err != nil {
		return fmt.Errorf("observe: enqueue %s of device %s session %s: %w", ev.Kind, ev.Device, ev.Session, err)
	}
	return nil
}

// checkEvidence re-validates the IDs (a DeviceID converted from an
// unchecked string would corrupt the session key and the store's records;
// the check is a pass over at most 330 bytes) and the kind.
func checkEvidence(ev Evidence) error {
	if _, err := ParseDeviceID(string(ev.Device)); err != nil {
		return err
	}
	if _, err := ParseSessionID(string(ev.Session)); err != nil {
		return err
	}
	switch ev.Kind {
	case Connect, Renew, Leave:
		return nil
	}
	return fmt.Errorf("evidence kind %v is not connect, renew or leave", ev.Kind)
}

// Sweep drops the sessions whose local lease ran out at now (no
// evidence whose lease reaches past now) and returns how many. It sends
// nothing: the central lease of each session ends on its own. It keeps
// those the uplink had accepted a write of for KeepLapsed after their
// deadline (Restorable).
func (t *Table) Sweep(now time.Time) int {
	cutoff := t.offset(now)
	dropped := 0
	var lapsed []SessionView
	for i := range t.shards {
		sh := &t.shards[i]
		sh.mu.Lock()
		for k, e := range sh.m {
			if e.dl <= cutoff {
				if t.keepLapsed > 0 && e.sentOK && e.dl > cutoff-int64(t.keepLapsed) {
					lapsed = append(lapsed, t.view(k, e))
				}
				delete(sh.m, k)
				t.forget(sh, DeviceID(k[:strings.IndexByte(k, 0)]))
				dropped++
			}
		}
		sh.mu.Unlock()
	}
	t.n.Add(-int64(dropped))
	if t.keepLapsed > 0 {
		t.lapsedMu.Lock()
		t.lapsed = append(slices.DeleteFunc(t.lapsed, func(v SessionView) bool {
			return !v.Deadline.Add(t.keepLapsed).After(now)
		}), lapsed...)
		t.lapsedMu.Unlock()
	}
	return dropped
}

// Restorable calls fn, until it returns false, for each session a
// restore after the store lost its state re-sends (uplink
// Options.Sessions): each live session (Range), then each session Sweep
// dropped whose deadline passed less than KeepLapsed before the last
// Sweep and of which the uplink had accepted a write (the store may have
// lost it before it wrote its offline).
func (t *Table) Restorable(fn func(SessionView) bool) {
	more := true
	t.Range(func(v SessionView) bool { more = fn(v); return more })
	if !more {
		return
	}
	t.lapsedMu.Lock()
	views := slices.Clone(t.lapsed)
	t.lapsedMu.Unlock()
	for _, v := range views {
		if !fn(v) {
			return
		}
	}
}

// RunSweep calls Sweep every interval on the table's clock until ctx is
// done, so that the table holds only live sessions (bounded memory).
func (t *Table) RunSweep(ctx context.Context, every time.Duration) error {
	for {
		tm := t.clock.NewTimer(every)
		select {
		case <-ctx.Done():
			tm.Stop()
			return nil
		case <-tm.C():
			t.Sweep(t.clock.Now())
		}
	}
}

// forget counts one session of device, in shard sh, less; the caller
// holds sh.mu.
func (t *Table) forget(sh *tableShard, device DeviceID) {
	d := sh.devices[device]
	if d.sessions > 1 {
		d.sessions--
		sh.devices[device] = d
		if d.sessions == 1 {
			delete(sh.multi, device)
		}
		return
	}
	delete(sh.devices, device)
	if d.anon {
		t.anon.Add(-1)
	}
}

// SessionLimitRefusals is the number of new sessions refused with
// ErrSessionLimit since the table was made.
func (t *Table) SessionLimitRefusals() uint64 { return t.limited.Load() }

// AnonymousLimitRefusals is the number of anonymous devices refused with
// ErrAnonymousLimit since the table was made.
func (t *Table) AnonymousLimitRefusals() uint64 { return t.anonLimited.Load() }

// AnonymousDevices is the number of anonymous devices with sessions in
// the table.
func (t *Table) AnonymousDevices() int { return int(t.anon.Load()) }

// Len is the number of sessions in the table.
func (t *Table) Len() int { return int(t.n.Load()) }

// DeviceCounts counts a table's devices by state (Table.Devices).
type DeviceCounts struct {
	Online, Suspect int
}

// Devices counts the devices with a session in the table at now, by the
// state DeriveState gives their local deadline (the latest observation
// plus the lease of that evidence, a device's own or a learned lease
// included, of their sessions): suspect when it is at most
// SuspectWindow(lease, suspectAfter) away, so, with the configured
// lease, when no session was seen within suspectAfter; online before. A
// device with a lease of its own is judged as the store's Counts and
// the API judge it: suspect in the last lease − suspectAfter of its
// lease. A device whose sessions' local deadlines all passed is counted
// nowhere: the next Sweep drops it, and its offline state is the
// store's to tell. It scans the table a shard at a time under the
// shard's lock; only the sessions of devices with several are looked up
// by device.
func (t *Table) Devices(now time.Time, suspectAfter time.Duration) DeviceCounts {
	n := t.offset(now)
	window := int64(SuspectWindow(t.timing.Load().lease, suspectAfter))
	var c DeviceCounts
	count := func(dl int64) {
		switch {
		case dl <= n:
		case dl-n <= window:
			c.Suspect++
		default:
			c.Online++
		}
	}
	several := map[DeviceID]int64{} // the latest deadline of the devices with several sessions
	for i := range t.shards {
		sh := &t.shards[i]
		sh.mu.Lock()
		if len(sh.multi) == 0 {
			for _, e := range sh.m {
				count(e.dl)
			}
		} else {
			for k, e := range sh.m {
				dev := DeviceID(k[:strings.IndexByte(k, 0)])
				if _, ok := sh.multi[dev]; !ok {
					count(e.dl)
				} else if dl, ok := several[dev]; !ok || e.dl > dl {
					several[dev] = e.dl
				}
			}
		}
		sh.mu.Unlock()
		for _, dl := range several {
			count(dl)
		}
		clear(several)
	}
	return c
}

// Sessions returns the sessions of device, ordered by session ID. It scans
// the device's shard (Len/Shards sessions) under its lock.
func (t *Table) Sessions(device DeviceID) []SessionView {
	prefix := string(device) + "\x00"
	sh := t.shard(device)
	var out []SessionView
	sh.mu.Lock()
	for k, e := range sh.m {
		if strings.HasPrefix(k, prefix) {
			out = append(out, t.view(k, e))
		}
	}
	sh.mu.Unlock()
	slices.SortFunc(out, func(a, b SessionView) int { return strings.Compare(string(a.Session), string(b.Session)) })
	return out
}

// Range calls fn for each session, in no particular order, until fn
// returns false. It copies one shard at a time and calls fn with no lock
// held, so fn may use the table; a session added or removed meanwhile may
// or may not be seen.
func (t *Table) Range(fn func(SessionView) bool) {
	var views []SessionView
	for i := range t.shards {
		sh := &t.shards[i]
		views = views[:0]
		sh.mu.Lock()
		for k, e := range sh.m {
			views = append(views, t.view(k, e))
		}
		sh.mu.Unlock()
		for _, v := range views {
			if !fn(v) {
				return
			}
		}
	}
}

func (t *Table) shard(d DeviceID) *tableShard {
	return &t.shards[maphash.String(t.seed, string(d))%uint64(len(t.shards))]
}

func (t *Table) offset(x time.Time) int64 { return int64(x.Sub(t.base)) }

func (t *Table) at(off int64) time.Time { return t.base.Add(time.Duration(off)) }

// view copies e, whose key is k; the caller holds the shard's lock.
func (t *Table) view(k string, e *entry) SessionView {
	i := strings.IndexByte(k, 0)
	v := SessionView{
		Device:    DeviceID(k[:i]),
		Session:   SessionID(k[i+1:]),
		Protocol:  t.protos.name(e.proto),
		FirstSeen: t.at(e.first),
		LastSeen:  t.at(e.seen),
		Deadline:  t.at(e.dl),
	}
	if e.sentOK {
		v.LastSent = t.at(e.sent)
	}
	return v
}

// protocols interns protocol names so that an entry holds a one-byte
// index. Index 0 is "": an unnamed protocol, and any name beyond the 255
// a table keeps (protocols name front ends and adapters, a handful).
type protocols struct {
	mu    sync.Mutex // serializes additions
	names atomic.Pointer[[]string]
}

// index returns name's index, adding it if there is room. Observe calls
// it with a shard lock held; it takes only p.mu.
func (p *protocols) index(name string) uint8 {
	if i := slices.Index(*p.names.Load(), name); i >= 0 {
		return uint8(i)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	names := *p.names.Load()
	if i := slices.Index(names, name); i >= 0 {
		return uint8(i)
	}
	if len(names) > math.MaxUint8 {
		return 0
	}
	grown := append(slices.Clip(names), name)
	p.names.Store(&grown)
	return uint8(len(grown) - 1)
}

func (p *protocols) name(i uint8) string { return (*p.names.Load())[i] }
