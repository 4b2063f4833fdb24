package adapter

import "time"

// Backoff is the restart policy of a crashed adapter: jittered
// exponential delays from Min to Max, reset once an adapter has run
// ResetAfter without a crash; FailAfter crashes within FailWindow mark it
// failed, and a failed adapter is retried at Max.
type Backoff struct {
	Min        time.Duration
	Max        time.Duration
	ResetAfter time.Duration
	FailAfter  int
	FailWindow time.Duration
}

// DefaultBackoff is the policy of the issue: 1 s → 2 min, reset after
// 10 min healthy, failed after 5 crashes in 10 min.
var DefaultBackoff = Backoff{
	Min:        time.Second,
	Max:        2 * time.Minute,
	ResetAfter: 10 * time.Minute,
	FailAfter:  5,
	FailWindow: 10 * time.Minute,
}

// crashLog is the restart state of one adapter.
type crashLog struct {
	delay   time.Duration // the last delay before jitter; 0 after a reset
	crashes []time.Time   // within FailWindow of the last crash
}

// next records a crash at now of an attempt that started at started and
// returns how long to wait before the next attempt and whether the
// adapter is failed. jitter in [0, 1) adds up to a quarter of the delay
// (never beyond Max). It is a pure function of its arguments and the
// log.
func (b Backoff) next(l *crashLog, started, now time.Time, jitter float64) (wait time.Duration, failed bool) {
	if now.Sub(started) >= b.ResetAfter {
		l.delay = 0
		l.crashes = l.crashes[:0]
	}
	keep := l.crashes[:0]
	for _, c := range l.crashes {
		if now.Sub(c) < b.FailWindow {
			keep = append(keep, c)
		}
	}
	l.crashes = append(keep, now)
	failed = len(l.crashes) >= b.FailAfter
	switch {
	case failed:
		l.delay = b.Max
	case l.delay == 0:
		l.delay = b.Min
	default:
		l.delay = min(2*l.delay, b.Max)
	}
	wait = l.delay + time.Duration(jitter*float64(l.delay)/4)
	return min(wait, b.Max), failed
}
