package uplink

import (
	"slices"
	"sync"
	"time"

	"github.com/fleetgate/fleetgate/gateway"
)

// slot is the coalesced pending evidence of one session: at most one
// leave and one connect or renew, in the order they happened. The same
// rule serves the in-memory queue and the outbox; it may merge evidence,
// it never erases a visit:
//
//   - newer evidence of the same kind replaces older evidence (a renew
//     moves the time of a pending connect or renew; a later leave replaces
//     an earlier one);
//   - a connect or renew followed by a leave is a visit: the slot keeps
//     both and they are sent in that order, so a session that connects and
//     leaves between two flushes still gets its online and its offline
//     event (kindFirst);
//   - a leave is never swallowed by a later connect or renew: the slot then
//     holds both, sent leave first (the store ends the session, writing its
//     offline event if it was the last one, and the later evidence opens it
//     again); evidence before that leave is dropped, so a visit followed by
//     a new visit of the same session becomes the newer one, and a leave
//     followed by a visit becomes that visit (the online periods merge);
//   - a pending connect stays a connect when newer evidence replaces its
//     time, so the online event it may cause keeps reason connect.
//
// Ties (evidence observed at the same instant) are ordered by arrival.
type slot struct {
	leave time.Time    // zero: no leave pending
	kind  gateway.Kind // Connect or Renew; 0: none pending
	at    time.Time    // when kind was observed
	// kindFirst: kind was observed before leave (a visit) and is sent
	// first; otherwise the leave is sent first.
	kindFirst bool
	// kindLease and leaveLease are the leases the writes were observed
	// under (gateway.Write.Lease; 0 in an outbox entry of a release that
	// did not keep them: the batch's lease).
	kindLease, leaveLease time.Duration
	// merged: kind stands for several observations of which only the
	// newest is kept; the older ones may have been what bridged a delay
	// in sending (gateway.Write.Coalesced).
	merged bool
	// since is the earliest observation folded into the slot, merged
	// away or not (zero in a slot read from the outbox): until the slot
	// is written the gateway's coverage stops before it (cover.go).
	since time.Time
}

// add folds one piece of evidence, observed at under lease, into the slot.
// Merging two pieces of the same kind keeps the newer observation and
// the later of their deadlines (observation + lease).
func (s *slot) add(k gateway.Kind, at time.Time, lease time.Duration) {
	if s.since.IsZero() || at.Before(s.since) {
		s.since = at
	}
	if k == gateway.Leave {
		if !s.leave.IsZero() && !at.After(s.leave) {
			return // an older (or the same) leave: the pending one covers it
		}
		if s.leave.IsZero() {
			s.leaveLease = lease
		} else {
			_, s.leaveLease = widen(s.leave, s.leaveLease, at, lease)
		}
		s.leave = at
		s.kindFirst = s.kind != 0 && !s.at.After(at)
		return
	}
	before := !s.leave.IsZero() && at.Before(s.leave)
	switch {
	case s.kind == 0:
		s.kind, s.at, s.kindLease, s.kindFirst = k, at, lease, before
	case s.leave.IsZero() || before == s.kindFirst:
		// Same side of the leave (or no leave): one write.
		s.kind = sticky(s.kind, k)
		s.at, s.kindLease = widen(s.at, s.kindLease, at, lease)
		s.merged = true
	case !before:
		// After the leave while the pending kind was before it: the new
		// visit replaces the old one, sent after the leave.
		s.kind, s.at, s.kindLease, s.kindFirst = sticky(s.kind, k), at, lease, false
	default:
		// Before the leave while the pending kind is after it: the leave
		// supersedes it.
	}
}

// widen merges two observations with their leases into the later
// observation, with a lease that reaches the later of the two deadlines.
// A zero lease (unknown: the batch's) stays unknown.
func widen(a time.Time, la time.Duration, b time.Time, lb time.Duration) (time.Time, time.Duration) {
	if b.After(a) {
		a, la, b, lb = b, lb, a, la
	}
	if la == 0 || lb == 0 {
		return a, la
	}
	return a, max(la, b.Add(lb).Sub(a))
}

// sticky is the kind of two merged connects or renews: a connect stays a
// connect.
func sticky(a, b gateway.Kind) gateway.Kind {
	if a == gateway.Connect || b == gateway.Connect {
		return gateway.Connect
	}
	return b
}

// merge folds every write of o into s, in o's order.
func (s *slot) merge(o slot) {
	if !o.since.IsZero() && (s.since.IsZero() || o.since.Before(s.since)) {
		s.since = o.since
	}
	if o.kind != 0 && o.kindFirst {
		s.add(o.kind, o.at, o.kindLease)
	}
	if !o.leave.IsZero() {
		s.add(gateway.Leave, o.leave, o.leaveLease)
	}
	if o.kind != 0 && !o.kindFirst {
		s.add(o.kind, o.at, o.kindLease)
	}
	s.merged = s.merged || o.merged
}

// n is the number of writes the slot turns into (0, 1 or 2).
func (s *slot) n() int {
	n := 0
	if !s.leave.IsZero() {
		n++
	}
	if s.kind != 0 {
		n++
	}
	return n
}

// first is the observation time of the slot's oldest write.
func (s *slot) first() time.Time {
	switch {
	case s.leave.IsZero():
		return s.at
	case s.kind != 0 && s.at.Before(s.leave):
		return s.at
	}
	return s.leave
}

// unwritten is the earliest observation the slot stands for: its first
// write's, or an older one merged into it (since).
func (s *slot) unwritten() time.Time {
	if f := s.first(); s.since.IsZero() || f.Before(s.since) {
		return f
	}
	return s.since
}

// key names a session of a device.
type key struct {
	device  gateway.DeviceID
	session gateway.SessionID
}

// item is a session with its coalesced evidence.
type item struct {
	key
	slot
}

// timedWrite is a write with the time its evidence was observed, from
// which its age is computed just before it is sent.
type timedWrite struct {
	at time.Time
	w  gateway.Write
}

// appendWrites appends the writes of items, ordered by observation time
// (a device's sessions then reach the store in the order they happened);
// a connect or renew that stands for several observations is marked
// Coalesced.
func appendWrites(dst []timedWrite, items []item) []timedWrite {
	start := len(dst)
	for _, it := range items {
		kind := timedWrite{it.at, gateway.Write{Device: it.device, Session: it.session, Kind: it.kind, Lease: it.kindLease, Coalesced: it.merged}}
		if it.kind != 0 && it.kindFirst {
			dst = append(dst, kind)
		}
		if !it.leave.IsZero() {
			dst = append(dst, timedWrite{it.leave, gateway.Write{Device: it.device, Session: it.session, Kind: gateway.Leave, Lease: it.leaveLease}})
		}
		if it.kind != 0 && !it.kindFirst {
			dst = append(dst, kind)
		}
	}
	slices.SortStableFunc(dst[start:], func(a, b timedWrite) int { return a.at.Compare(b.at) })
	return dst
}

// withAges fills in each write's age at now (never negative) and returns
// the writes.
func withAges(tws []timedWrite, now time.Time) []gateway.Write {
	ws := make([]gateway.Write, len(tws))
	for i, tw := range tws {
		ws[i] = tw.w
		ws[i].Age = max(now.Sub(tw.at), 0)
	}
	return ws
}

// queue holds the pending writes of one shard, coalesced per session, in
// the order their sessions first appeared.
type queue struct {
	mu    sync.Mutex
	slots map[key]*slot
	order []key
	n     int           // pending writes
	space chan struct{} // closed (and replaced) when writes leave the queue
}

func newQueue() *queue {
	return &queue{slots: make(map[key]*slot), space: make(chan struct{})}
}

// tryAdd folds ev into the queue unless that would take the pending
// writes above limit; when it does not, space is the channel to wait on.
func (q *queue) tryAdd(ev gateway.Evidence, limit int) (ok bool, space <-chan struct{}) {
	q.mu.Lock()
	defer q.mu.Unlock()
	k := key{ev.Device, ev.Session}
	s, found := q.slots[k]
	if !found {
		if q.n+1 > limit {
			return false, q.space
		}
		s = &slot{}
		q.slots[k] = s
		q.order = append(q.order, k)
	}
	next := *s
	next.add(ev.Kind, ev.ObservedAt, ev.Lease)
	grew := next.n() - s.n()
	if found && grew > 0 && q.n+grew > limit {
		return false, q.space
	}
	*s = next
	q.n += grew
	return true, nil
}

// take removes sessions in arrival order until the next one would take
// the writes above limit (limit ≥ 2, so at least one session is taken if
// any is pending), and wakes writers waiting for space.
//
// A session whose pending leave was observed less than hold before now
// stays queued (leave grace: a device that moves to another gateway and
// then says goodbye here must not go offline in between, so its leave
// waits until the other gateway's connect has been flushed); hold 0
// takes every session.
func (q *queue) take(limit int, now time.Time, hold time.Duration) (items []item, writes int) {
	q.mu.Lock()
	defer q.mu.Unlock()
	var kept []key
	i := 0
	for ; i < len(q.order); i++ {
		k := q.order[i]
		s := q.slots[k]
		if hold > 0 && !s.leave.IsZero() && now.Sub(s.leave) < hold {
			kept = append(kept, k)
			continue
		}
		if writes+s.n() > limit {
			break
		}
		writes += s.n()
		items = append(items, item{k, *s})
		delete(q.slots, k)
	}
	if len(items) == 0 {
		return nil, 0
	}
	q.order = append(kept, q.order[i:]...)
	q.n -= writes
	close(q.space)
	q.space = make(chan struct{})
	return items, writes
}

// requeue puts items taken by take back (when they could be neither sent
// nor buffered), merging them with whatever arrived meanwhile.
func (q *queue) requeue(items []item) {
	q.mu.Lock()
	defer q.mu.Unlock()
	for _, it := range items {
		s, found := q.slots[it.key]
		if !found {
			s = &slot{}
			q.slots[it.key] = s
			q.order = append(q.order, it.key)
		}
		before := s.n()
		s.merge(it.slot)
		q.n += s.n() - before
	}
}

// peek returns every pending session with a copy of its slot, in the
// order the sessions first appeared, and leaves the queue as it is.
func (q *queue) peek() []item {
	q.mu.Lock()
	defer q.mu.Unlock()
	items := make([]item, len(q.order))
	for i, k := range q.order {
		items[i] = item{k, *q.slots[k]}
	}
	return items
}

// oldest is the earliest observation of the evidence pending, merged
// away or not (zero when none is).
func (q *queue) oldest() time.Time {
	q.mu.Lock()
	defer q.mu.Unlock()
	var o time.Time
	for _, s := range q.slots {
		if f := s.unwritten(); o.IsZero() || f.Before(o) {
			o = f
		}
	}
	return o
}

// pending is the number of writes waiting.
func (q *queue) pending() int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.n
}
