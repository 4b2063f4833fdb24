package gateway

import "time"

// Learned leases (presence.learn_lease, docs/design.md §1 "Learned
// leases"): a device whose evidence carries no lease of its own (none
// asked for, none in the devices file, none of its adapter) holds its
// sessions for a lease learned from how often it sends.
const (
	// LearnFactor is how many periods a learned lease spans: a device
	// that keeps its period may miss two messages in a row and stay
	// online, as a device on the shipped timing may miss two heartbeats
	// (lease 90 s, heartbeat 30 s).
	LearnFactor = 3
	// LearnShrink is how slowly the estimate shrinks: by at most
	// 1/LearnShrink of the time that passes, whatever the gaps.
	LearnShrink = 2
)

// Learning bounds the leases a table learns.
type Learning struct {
	// Floor and Ceiling bound a learned lease: presence.lease and
	// presence.max_lease. A Ceiling at or below Floor learns nothing
	// (every lease is Floor).
	Floor, Ceiling time.Duration
	// Margin is added to LearnFactor periods: presence.renew_every, the
	// most the throttle lets a device's central deadline lag behind its
	// evidence.
	Margin time.Duration
}

// Period is what a table knows of one device's sending period: an
// estimate in milliseconds, 4 bytes a device (they fit beside its
// session count in the table: learning costs no memory). The zero
// Period is a device not seen yet (Learning.Start).
//
// The estimate learns from the gaps between two pieces of evidence of
// one of the device's sessions (the table starts it again with each new
// session). It grows at once to any longer gap and
// shrinks by at most half the time that passes (LearnShrink): after a
// gap g it is at least g, so the lease it gives covers LearnFactor such
// gaps; a burst of messages close together (a device that connects,
// subscribes and publishes, then sleeps) barely lowers it; a device that
// slows down is covered from its first longer gap on; one that speeds up
// from period T1 to T2 is learned within LearnShrink × (T1 − T2).
type Period struct {
	est uint32 // ms
}

// Start is the Period of a device first seen: an estimate whose lease is
// the Ceiling, so that a device is never held for less than its period
// before that period is known; it shrinks from there as the device's
// gaps show.
func (l Learning) Start() Period {
	return Period{est: millis((l.Ceiling - l.Margin + LearnFactor - 1) / LearnFactor)}
}

// Observe is p after a piece of evidence observed at now whose session's
// previous one was observed at last (offsets on one clock). Evidence
// older than the last (reordered on its way) teaches nothing.
func (p Period) Observe(last, now time.Duration) Period {
	if now < last {
		return p
	}
	g := millis(now - last)
	return Period{est: max(g, p.est-min(p.est, (g+LearnShrink-1)/LearnShrink))}
}

// Estimate is p's period estimate.
func (p Period) Estimate() time.Duration { return time.Duration(p.est) * time.Millisecond }

// Lease is the lease p gives within l: LearnFactor × the estimate +
// Margin, within [Floor, Ceiling].
func (l Learning) Lease(p Period) time.Duration {
	return min(max(LearnFactor*p.Estimate()+l.Margin, l.Floor), max(l.Ceiling, l.Floor))
}

// millis is d in milliseconds rounded up (an estimate never below the
// gap it learned from), at least 0, at most the largest uint32 (49 days,
// beyond any lease).
func millis(d time.Duration) uint32 {
	if d <= 0 {
		return 0
	}
	return uint32(min((d+time.Millisecond-1)/time.Millisecond, 1<<32-1))
}
