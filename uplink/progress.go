package uplink

import (
	"sync/atomic"
	"time"
)

// busy records whether a loop is inside one step of work, and since when,
// so that a watchdog can tell a loop waiting for work (fine) from one
// stuck in a step (a stalled flush, a replay that never returns). Steps
// are bounded (every store call by Options.Timeout), so a step much
// longer than that is a stall.
type busy struct {
	since atomic.Int64 // unix ns of the step's start; 0 while waiting
}

func (b *busy) begin(now time.Time) { b.since.Store(now.UnixNano()) }
func (b *busy) end()                { b.since.Store(0) }

// stalledAt reports whether the loop has been inside one step for longer
// than limit at now.
func (b *busy) stalledAt(now time.Time, limit time.Duration) (time.Duration, bool) {
	s := b.since.Load()
	if s == 0 {
		return 0, false
	}
	d := now.Sub(time.Unix(0, s))
	return d, d > limit
}

// Stalled names the first of the uplink's loops that has been inside one
// step for longer than limit at now: "batcher" (a flush, to the store or
// into the outbox), "outbox" (a replay round, with its outbox deletions)
// or "probe" (a probe of the shards that are down); "" when none is. A
// loop waiting for work is not stalled.
// now is on the uplink's clock (Options.Clock).
// The service watchdog stops its keep-alives while this is not "".
func (u *Uplink) Stalled(now time.Time, limit time.Duration) (loop string, busyFor time.Duration) {
	if d, ok := u.flushBusy.stalledAt(now, limit); ok {
		return "batcher", d
	}
	if d, ok := u.outboxBusy.stalledAt(now, limit); ok {
		return "outbox", d
	}
	if d, ok := u.probeBusy.stalledAt(now, limit); ok {
		return "probe", d
	}
	return "", 0
}
