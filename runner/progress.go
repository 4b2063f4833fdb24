package runner

import (
	"sync/atomic"
	"time"
)

// busy records whether Run is inside a cycle, and since when, so that a
// watchdog can tell a runner sleeping between cycles from one stuck in a
// cycle.
type busy struct {
	since atomic.Int64 // unix ns of the cycle's start; 0 while sleeping
}

func (b *busy) begin(now time.Time) { b.since.Store(now.UnixNano()) }
func (b *busy) end()                { b.since.Store(0) }

// Stalled reports whether the runner has been inside one cycle for longer
// than limit at now, and for how long. A runner sleeping between cycles,
// or not running, is not stalled. now is on the runner's clock
// (Options.Clock). The service watchdog stops its
// keep-alives while this is true.
func (r *Runner) Stalled(now time.Time, limit time.Duration) (busyFor time.Duration, stalled bool) {
	s := r.cycleBusy.since.Load()
	if s == 0 {
		return 0, false
	}
	d := now.Sub(time.Unix(0, s))
	return d, d > limit
}
