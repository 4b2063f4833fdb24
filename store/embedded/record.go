package embedded

import (
	"fmt"
	"strings"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/fleetgate/fleetgate/gateway"
)

// writer is one write transaction on one shard, of Apply (writer.apply)
// or Reap (writer.reap): device records are read once, changed in memory
// and written back with their deadline index entries by commit; events
// are appended as they happen.
type writer struct {
	s       *Store
	sh      shard
	now     int64
	devices map[gateway.DeviceID]*entry
	order   []gateway.DeviceID
	tail    tail
	added   int
	events  []gateway.Event
	live    map[string]liveness // gateways read or written
	laggard *liveness           // the shard's slowest heard gateway, once read
	// leavers are the devices a bridged leave left without a session
	// (bridgedLeaves), with that session, in the order of the leaves
	leavers []leaver
	// verFloor is the shard's ver floor once read (floor)
	verFloor *uint64
	// sessions is what the changed records do to the session counts
	// per gateway (index.go), written by commit
	sessions map[string]int64
}

// leaver is a device a bridged leave left without a session.
type leaver struct {
	device  gateway.DeviceID
	session gateway.SessionID
}

// leaving notes a device a bridged leave of session left without a
// session: its offline waits for the end of the batch (endLeavers).
func (w *writer) leaving(d gateway.DeviceID, session gateway.SessionID) {
	w.leavers = append(w.leavers, leaver{d, session})
}

// endLeavers writes the offline (reason leave, through gw) of each
// device a bridged leave left without a session that no later write of
// the batch gave one.
func (w *writer) endLeavers(gw string) error {
	for _, l := range w.leavers {
		e := w.devices[l.device]
		if e == nil || !e.rec.online || len(e.rec.sessions) > 0 {
			continue
		}
		if err := w.transition(l.device, e, false, gateway.ReasonLeave, gw, l.session, 0); err != nil {
			return err
		}
	}
	w.leavers = w.leavers[:0]
	return nil
}

// entry is a device record loaded by a writer.
type entry struct {
	rec      record
	exists   bool
	dirty    bool
	deadline int64 // the index entry at load time, 0 for none
	// existed and wasOnline are the record as loaded (for the counts)
	existed, wasOnline bool
	// indexed, idxOnline and idxSince are the record's change index
	// entry (index.go) as loaded or last written; gws the gateways of
	// its sessions then (the session counts)
	indexed   bool
	idxOnline bool
	idxSince  int64
	gws       []string
}

// begin starts a writer on shard n in tx at the store clock's now.
func (s *Store) begin(tx *bolt.Tx, n int) (*writer, error) {
	sh, err := openShard(tx, n)
	if err != nil {
		return nil, err
	}
	t, err := decodeTail(sh.root.Get(keyTail))
	if err != nil {
		return nil, fmt.Errorf("shard %d tail: %w", n, err)
	}
	return &writer{s: s, sh: sh, now: s.nowMs(), devices: map[gateway.DeviceID]*entry{}, tail: t, live: map[string]liveness{},
		sessions: map[string]int64{}}, nil
}

// load is the entry of device d, its record read on first use.
func (w *writer) load(d gateway.DeviceID) (*entry, error) {
	if e, ok := w.devices[d]; ok {
		return e, nil
	}
	r, ok, err := w.sh.record(d)
	if err != nil {
		return nil, err
	}
	e := &entry{rec: r, exists: ok, deadline: r.deadline(), existed: ok, wasOnline: ok && r.online,
		indexed: ok, idxOnline: r.online, idxSince: r.since, gws: sessionGateways(&r)}
	w.devices[d] = e
	w.order = append(w.order, d)
	return e, nil
}

// liveness is what the store knows of a gateway on one shard: its
// coverage (ms on the store clock, gateway.Batch.Covers; 0 while it has
// reported none) and its contact (the store time of its last batch).
type liveness struct{ cover, contact int64 }

// gateway is the liveness of gw on the writer's shard.
func (w *writer) gateway(gw string) (liveness, error) {
	if l, ok := w.live[gw]; ok {
		return l, nil
	}
	l, err := decodeLiveness(w.sh.root.Get([]byte(keyCover + gw)))
	if err != nil {
		return l, fmt.Errorf("liveness of %s: %w", gw, err)
	}
	w.live[gw] = l
	return l, nil
}

// heard records a batch of gw at now, covering cover when it is not 0; a
// coverage only moves forward.
func (w *writer) heard(gw string, cover int64) error {
	l, err := w.gateway(gw)
	if err != nil {
		return err
	}
	l.contact, l.cover = w.now, max(l.cover, cover)
	w.live[gw] = l
	return w.sh.root.Put([]byte(keyCover+gw), l.encode())
}

// uncovered says that a session that ran out must wait: its gateway
// reports coverage, and that coverage has not reached the session's
// deadline (the gateway may hold evidence of it not yet written).
func (w *writer) uncovered(x session) bool {
	l, err := w.gateway(x.gw)
	return err == nil && l.cover != 0 && l.cover < x.deadline
}

// waitFor says whether a due device must wait, and whether for the
// gateway of one of its own sessions: one of its sessions that ran out is
// uncovered, or a gateway heard within the horizon reports coverage that
// has not reached the device's deadline (the device may have moved to
// it).
func (w *writer) waitFor(r *record) (wait, own bool, err error) {
	for _, x := range r.sessions {
		if x.deadline <= w.now && w.uncovered(x) {
			return true, true, nil
		}
	}
	if w.laggard == nil {
		l, err := w.slowest("")
		if err != nil {
			return false, false, err
		}
		w.laggard = &l
	}
	return w.laggard.cover != 0 && w.laggard.cover < r.deadline(), false, nil
}

// slowest is the liveness of the gateway of the shard, other than except
// ("" for none), heard within the horizon with the least coverage (zero
// when none reports coverage).
func (w *writer) slowest(except string) (liveness, error) {
	var out liveness
	c := w.sh.root.Cursor()
	for k, v := c.Seek([]byte(keyCover)); k != nil && strings.HasPrefix(string(k), keyCover); k, v = c.Next() {
		if except != "" && string(k[len(keyCover):]) == except {
			continue
		}
		l, err := decodeLiveness(v)
		if err != nil {
			return out, fmt.Errorf("liveness of %s: %w", k[len(keyCover):], err)
		}
		if l.cover != 0 && w.now-l.contact <= w.s.horizon && (out.cover == 0 || l.cover < out.cover) {
			out = l
		}
	}
	return out, nil
}

// awaited says whether a gateway other than gw, heard within the horizon,
// reports coverage that has not reached obs: a device whose last session
// leaves at obs may have moved to it, its connect still on the way.
func (w *writer) awaited(gw string, obs int64) (bool, error) {
	if w.s.horizon <= 0 {
		return false, nil
	}
	l, err := w.slowest(gw)
	return l.cover != 0 && l.cover < obs, err
}

// dropExpired drops the sessions whose deadline is ≤ now, except keep
// (a session late but valid evidence is about to extend; "" for none)
// and those hold says must wait (nil: none); when that ends an online device's
// last session it writes the offline event, with reason (a leave when
// that session ended with its leave), at the old deadline, unless
// bridged (evidence observed by then is about to keep the device
// online). It reports whether a session was left.
func (w *writer) dropExpired(d gateway.DeviceID, e *entry, keep gateway.SessionID, hold func(session) bool, reason gateway.Reason, bridged func(deadline int64) bool) (bool, error) {
	r := &e.rec
	if len(r.sessions) == 0 {
		return false, nil
	}
	last := r.sessions[0]
	for _, x := range r.sessions {
		if x.deadline > last.deadline {
			last = x
		}
	}
	kept := r.sessions[:0]
	for _, x := range r.sessions {
		if x.deadline > w.now || (keep != "" && x.id == keep) || (hold != nil && hold(x)) {
			kept = append(kept, x)
		}
	}
	if len(kept) == len(r.sessions) {
		return true, nil
	}
	clear(r.sessions[len(kept):])
	r.sessions = kept
	e.dirty = true
	if len(kept) == 0 && r.online && (bridged == nil || !bridged(last.deadline)) {
		if reason == gateway.ReasonExpired && r.leftAt(last) {
			reason = gateway.ReasonLeave
		}
		return false, w.transition(d, e, false, reason, last.gw, last.id, last.deadline)
	}
	return len(kept) > 0, nil
}

// nextVer is the ver of a device's next transition at now: for its
// first, the store time in ms (so that a record lost with the file starts
// above every ver it handed out, as in the Redis store) or one above the
// shard's ver floor (the highest ver of a forgotten device, forget.go)
// when that is higher; else one more.
func nextVer(ver uint64, now int64, floor uint64) uint64 {
	if ver == 0 {
		return max(uint64(now), floor+1)
	}
	return ver + 1
}

// floor is the shard's ver floor, read once per writer.
func (w *writer) floor() uint64 {
	if w.verFloor == nil {
		f := decodeFloor(w.sh.root.Get(keyVerFloor))
		w.verFloor = &f
	}
	return *w.verFloor
}

// transition moves the device to online or offline and appends the event.
func (w *writer) transition(d gateway.DeviceID, e *entry, online bool, reason gateway.Reason, gw string, sess gateway.SessionID, deadline int64) error {
	r := &e.rec
	r.online = online
	r.ver = nextVer(r.ver, w.now, w.floor())
	r.since = w.now
	e.exists, e.dirty = true, true
	ev := gateway.Event{
		Shard:    w.sh.n,
		Device:   d,
		State:    gateway.Offline,
		Ver:      r.ver,
		At:       time.UnixMilli(w.now),
		Reason:   reason,
		Gateway:  gw,
		Session:  sess,
		Deadline: msTime(deadline),
	}
	if online {
		ev.State = gateway.Online
	}
	if err := w.append(&ev); err != nil {
		return err
	}
	w.events = append(w.events, ev)
	return nil
}

// append appends ev to the shard's log, setting its ID.
func (w *writer) append(ev *gateway.Event) error {
	id := w.tail.last.next(w.now)
	ev.ID = id.String()
	if err := w.sh.ev.Put(id.key(), encodeEvent(ev)); err != nil {
		return fmt.Errorf("append event: %w", err)
	}
	w.tail.last = id
	w.tail.count++
	w.added++
	return nil
}

// commit writes the changed records, moves their deadline index entries
// and the shard's event log tail, and trims the log.
func (w *writer) commit() error {
	var online, offline int64
	for _, d := range w.order {
		e := w.devices[d]
		if !e.dirty || !e.exists {
			continue
		}
		if err := w.sh.dev.Put([]byte(d), encodeRecord(&e.rec)); err != nil {
			return fmt.Errorf("device %s: %w", d, err)
		}
		if !e.existed || e.wasOnline != e.rec.online {
			switch {
			case !e.existed:
			case e.wasOnline:
				online--
			default:
				offline--
			}
			if e.rec.online {
				online++
			} else {
				offline++
			}
			e.existed, e.wasOnline = true, e.rec.online
		}
		if err := w.index(d, e); err != nil {
			return fmt.Errorf("device %s: %w", d, err)
		}
		if nd := e.rec.deadline(); nd != e.deadline {
			if e.deadline != 0 {
				if err := w.sh.exp.Delete(expKey(e.deadline, d)); err != nil {
					return fmt.Errorf("device %s: index: %w", d, err)
				}
			}
			if nd != 0 {
				if err := w.sh.exp.Put(expKey(nd, d), nil); err != nil {
					return fmt.Errorf("device %s: index: %w", d, err)
				}
			}
			e.deadline = nd
		}
	}
	if err := w.count(online, offline); err != nil {
		return fmt.Errorf("counts: %w", err)
	}
	if err := addSessions(w.sh.root, w.sessions); err != nil {
		return fmt.Errorf("session counts: %w", err)
	}
	clear(w.sessions)
	if w.added == 0 {
		return nil
	}
	if err := w.trim(); err != nil {
		return fmt.Errorf("trim events: %w", err)
	}
	w.sh.root.Tx().OnCommit(w.s.wake.signal)
	return w.sh.root.Put(keyTail, w.tail.encode())
}

// trim removes the oldest events beyond the cap: at most a bounded number
// per transaction, so a cap lowered between runs is reached over several
// writes rather than in one long transaction.
func (w *writer) trim() error {
	budget := w.added + 1024
	c := w.sh.ev.Cursor()
	var last []byte
	for k, _ := c.First(); k != nil && w.tail.count > w.s.maxLen && budget > 0; k, _ = c.First() {
		last = append(last[:0], k...)
		if err := c.Delete(); err != nil {
			return err
		}
		w.tail.count--
		budget--
	}
	if last != nil {
		// the newest trimmed ID: readers after an older one have a gap
		return w.sh.root.Put(keyTrimmed, last)
	}
	return nil
}

// index moves the change index entry of a written record whose state or
// last change moved, and notes what its sessions do to the session
// counts (index.go).
func (w *writer) index(d gateway.DeviceID, e *entry) error {
	r := &e.rec
	if !e.indexed || e.idxOnline != r.online || e.idxSince != r.since {
		if e.indexed {
			if err := w.sh.chg.Delete(chgKey(e.idxOnline, e.idxSince, d)); err != nil {
				return fmt.Errorf("change index: %w", err)
			}
		}
		if err := w.sh.chg.Put(chgKey(r.online, r.since, d), nil); err != nil {
			return fmt.Errorf("change index: %w", err)
		}
		e.indexed, e.idxOnline, e.idxSince = true, r.online, r.since
	}
	if !sameGateways(r, e.gws) {
		gws := sessionGateways(r)
		moveSessions(w.sessions, e.gws, gws)
		e.gws = gws
	}
	return nil
}

// sameGateways reports whether the sessions of r have the gateways gws,
// in order.
func sameGateways(r *record, gws []string) bool {
	if len(r.sessions) != len(gws) {
		return false
	}
	for i, x := range r.sessions {
		if x.gw != gws[i] {
			return false
		}
	}
	return true
}
