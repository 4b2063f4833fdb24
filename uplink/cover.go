package uplink

import (
	"sync"
	"time"
)

// Coverage (gateway.Batch.Covers): every call tells the store up to when
// this gateway has sent everything it observed for the call's shard, so
// that the store expires a session only once this gateway could have
// renewed it and did not (invariant 11). Evidence not yet written is in
// one of these places, and the coverage of a call stops before the oldest
// of them. A queue slot or an outbox entry keeps a session's newest
// evidence only; the older evidence merged into it is unwritten too, and
// it may be what renewed the session before a deadline the newest one is
// past, so it counts (slot.unwritten, Outbox.unwritten):
//
//   - the shard's queue (what this call did not take),
//   - the outbox, when it holds entries of the shard (its oldest
//     evidence, of any shard and kept since the outbox was last empty, is
//     a lower bound of the shard's oldest; another shard's entries do not
//     hold this one back),
//   - an Enqueue waiting for room in a full queue (blocked),
//   - on its way from a front end's read to Enqueue: a flush interval is
//     allowed for it (the margin).
//   - not read yet, after this process stalled (stopped, starved of CPU,
//     its VM paused): what devices sent meanwhile waits in the sockets'
//     buffers and in the adapters' streams (an adapter runs on, and its
//     evidence is seconds old when it arrives), and the first calls after
//     the stall would cover it before it is read. A flush timer that
//     fires late by more than half a flush interval marks a stall, and
//     the coverage stays at the timer's start for as long after it fired
//     as it was late, and at least a flush interval (stallHold): time for
//     the backlog to be read, which takes longer the longer the stall
//     (a 3.6 s stop read back within a flush interval of 100 ms is not
//     what a gateway sharing its CPU does).
//   - in an adapter's stream, unread (Options.Unread): an adapter sends
//     a frame at least every half flush interval, and the host knows the
//     time its last frame read was made; evidence observed after that may
//     be on its way. The CPU quota of a starved gateway may leave frames
//     unread for longer than the margin while its flush timer still fires
//     on time (no stall is seen). The coverage stops before it, but at
//     most two flush intervals before the margin: an adapter whose stream
//     stopped (stuck, or blocked on its settlements) costs its gateway's
//     other devices that much detection at most, the backlog processing
//     the detection bound allows for.
//   - not heard at all, while this gateway was down: a process that
//     follows a killed or crashed one holds the coverage where its
//     predecessor last ran (its session ledger's newest record) for a
//     lease after it starts (restartHold).
//
// What the call itself carries is written with it, and what an earlier
// call carried is either applied or, when that call failed, in the
// outbox or the queue again.

// stall is the coverage held after a stall of this process.
type stall struct {
	mu          sync.Mutex
	from, until time.Time
}

// stallHold decides whether a flush timer started at started for
// interval that fired at fired marks a stall of the process, and if so
// from when the coverage is held (the timer's start: the process ran
// then) and until when: as long after it fired as it was late, but not
// past the gateway horizon (lease + gateway_grace) from its start, so that
// a device that stopped before the stall is still reported within the
// bound of a lost gateway; and at least an interval after it fired.
func stallHold(started, fired time.Time, interval, horizon time.Duration) (from, until time.Time, stalled bool) {
	late := fired.Sub(started) - interval
	if late <= interval/2 {
		return time.Time{}, time.Time{}, false
	}
	until = fired.Add(late)
	if end := started.Add(horizon); until.After(end) {
		until = end
	}
	if least := fired.Add(interval); until.Before(least) {
		until = least
	}
	return started, until, true
}

// restartHold decides whether this process, started at started, holds
// its coverage for its predecessor, which last wrote its session ledger
// at last (zero: no ledger, or nothing in it): a gateway killed or
// crashed and restarted did not listen while it was down, and what its
// devices sent meanwhile is lost (a datagram) or comes again later (a
// heartbeat, a reconnect); the absence of evidence then says nothing of
// them. The coverage stays at last until a lease after the start, time
// for every device that keeps sending to be heard again (it sends within
// its lease), but not past the gateway horizon (lease + gateway_grace)
// from last, so that a device that stopped before the crash is reported
// within the bound of a lost gateway. No hold when that has passed
// already.
func restartHold(last, started time.Time, lease, horizon time.Duration) (from, until time.Time, held bool) {
	if last.IsZero() || !last.Before(started) {
		return time.Time{}, time.Time{}, false
	}
	until = started.Add(lease)
	if end := last.Add(horizon); until.After(end) {
		until = end
	}
	if !until.After(started) {
		return time.Time{}, time.Time{}, false
	}
	return last, until, true
}

// note records a stall from from, the coverage held until until.
func (s *stall) note(from, until time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.until.After(from) && s.from.Before(from) {
		from = s.from // stalls in a row: held from the first
	}
	s.from, s.until = from, until
}

// held returns the point the coverage is held at, at now (zero when it
// is not).
func (s *stall) held(now time.Time) time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	if now.Before(s.until) {
		return s.from
	}
	return time.Time{}
}

// blocked tracks the evidence of Enqueue calls waiting for room.
type blocked struct {
	mu   sync.Mutex
	next uint64
	at   map[uint64]time.Time
}

// wait records evidence observed at at as waiting; done ends it.
func (b *blocked) wait(at time.Time) (done func()) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.at == nil {
		b.at = make(map[uint64]time.Time)
	}
	b.next++
	id := b.next
	b.at[id] = at
	return func() {
		b.mu.Lock()
		delete(b.at, id)
		b.mu.Unlock()
	}
}

// oldest is the observation time of the oldest waiting evidence (zero
// when none waits).
func (b *blocked) oldest() time.Time {
	b.mu.Lock()
	defer b.mu.Unlock()
	var o time.Time
	for _, at := range b.at {
		if o.IsZero() || at.Before(o) {
			o = at
		}
	}
	return o
}

// coverage is the point up to which a call made at now for shard has this
// gateway's evidence of that shard written, given the call takes what it
// carries: before the oldest evidence still queued, buffered or waiting,
// before a stall while its backlog is read, and a margin before now.
func (u *Uplink) coverage(shard int, now time.Time, margin time.Duration) time.Time {
	c := now
	var buffered time.Time
	if u.ob.holds(shard) {
		buffered = u.ob.unwritten()
	}
	var unread time.Time
	if u.unread != nil {
		if unread = u.unread(); !unread.IsZero() {
			if floor := now.Add(-2 * margin); unread.Before(floor) {
				unread = floor
			}
		}
	}
	for _, o := range [...]time.Time{buffered, u.blocked.oldest(), u.queues[shard].oldest(), u.stall.held(now), unread} {
		if !o.IsZero() && o.Before(c) {
			c = o
		}
	}
	return c.Add(-margin)
}
