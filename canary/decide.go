// Package canary is the presence canary (docs/design.md §6.6): a
// synthetic device of the gateway itself. It heartbeats through the
// gateway's own CoAP front end for a live phase, goes silent, and times
// how long its offline event takes to come out of the store's event log
// (and out of the upstream publisher, when one publishes its shard),
// measured from its last heartbeat, against the worst-case detection
// bound. An offline event while it heartbeats is a false offline.
//
// The decisions are pure functions of a State and the time (Next,
// Observe); Canary runs them against the real clock, socket and store.
package canary

import "time"

// Path is where the canary's offline event is seen.
type Path int

const (
	// Log: the store's event log, read as /v1/watch reads it.
	Log Path = iota
	// Upstream: the events publisher, once the broker acknowledged it.
	Upstream
	paths
)

func (p Path) String() string {
	if p == Upstream {
		return "upstream"
	}
	return "log"
}

// Phase is what the canary is doing.
type Phase int

const (
	// Live: heartbeating every Plan.Heartbeat.
	Live Phase = iota
	// Stopped: silent, waiting for the offline event.
	Stopped
)

// Plan is the canary's schedule.
type Plan struct {
	// Heartbeat is the interval between heartbeats (presence.heartbeat_interval).
	Heartbeat time.Duration
	// Live is how long the canary heartbeats before it stops (canary.live).
	Live time.Duration
	// Bound is the worst-case detection the offline is held to (§6.6).
	Bound time.Duration
	// GiveUp is how long after the last heartbeat the canary waits for an
	// offline event before it counts it missed and goes live again.
	GiveUp time.Duration
}

// State is the canary's state between decisions.
type State struct {
	Phase Phase
	// Since is when the phase began.
	Since time.Time
	// Base is the device's ver when the live phase began: an event with
	// a ver at or below it is older than the phase.
	Base uint64
	// LastBeat is when the last heartbeat the gateway acknowledged in
	// this cycle was sent; zero before the first.
	LastBeat time.Time
	// Tried is when the last heartbeat was sent, acknowledged or not.
	Tried time.Time
	// Expect says which paths deliver the offline of this cycle (Log
	// always; Upstream when a publisher of this process holds the shard).
	Expect [paths]bool
	// Seen says which paths delivered it.
	Seen [paths]bool
	// Falsed is the ver of the last false offline counted, so that one
	// seen on both paths counts once.
	Falsed uint64
}

// Action is what Next asks the caller to do.
type Action int

const (
	// Wait until the returned time (or an observation).
	Wait Action = iota
	// Beat: send a heartbeat now, then call Beaten.
	Beat
	// Stop: go silent now (nothing is sent: the lease runs out); the
	// caller fills Expect for the cycle and calls Halted.
	Stop
	// Restart: the cycle is over; the caller reads the device's ver and
	// calls Started, which begins the next live phase.
	Restart
)

// Next decides what to do at now and when to decide again.
func Next(s State, p Plan, now time.Time) (Action, time.Time) {
	switch s.Phase {
	case Live:
		end := s.Since.Add(p.Live)
		if !s.LastBeat.IsZero() && !now.Before(end) {
			return Stop, now
		}
		due := s.Tried.Add(p.Heartbeat)
		if s.Tried.IsZero() || !now.Before(due) {
			return Beat, now
		}
		if s.LastBeat.IsZero() {
			return Wait, due // nothing acknowledged yet: no stop before one is
		}
		return Wait, earliest(due, end)
	default:
		if s.done() {
			return Restart, now
		}
		giveUp := s.LastBeat.Add(p.GiveUp)
		if !now.Before(giveUp) {
			return Restart, now
		}
		return Wait, giveUp
	}
}

// done reports whether every expected path delivered the offline.
func (s State) done() bool {
	for i := range s.Expect {
		if s.Expect[i] && !s.Seen[i] {
			return false
		}
	}
	return true
}

// Missed lists the expected paths that did not deliver the offline, at
// a Restart.
func (s State) Missed() []Path {
	if s.Phase != Stopped {
		return nil
	}
	var out []Path
	for i := range s.Expect {
		if s.Expect[i] && !s.Seen[i] {
			out = append(out, Path(i))
		}
	}
	return out
}

// Started begins a live phase at now; base is the device's ver then.
func Started(now time.Time, base uint64) State {
	return State{Phase: Live, Since: now, Base: base}
}

// Beaten records a heartbeat sent at sent that the gateway acknowledged
// (ok), or not: the next one is due a heartbeat interval after it either
// way, and the canary stops only after an acknowledged one, the
// evidence its detection is timed from.
func Beaten(s State, sent time.Time, ok bool) State {
	if s.Phase != Live {
		return s
	}
	s.Tried = sent
	if ok {
		s.LastBeat = sent
	}
	return s
}

// Halted ends the live phase at now, expecting the offline on the
// paths of expect.
func Halted(s State, now time.Time, expect [paths]bool) State {
	s.Phase, s.Since, s.Expect, s.Seen = Stopped, now, expect, [paths]bool{}
	return s
}

// Outcome is what an observed event means.
type Outcome int

const (
	// Ignored: not an offline of this cycle (an online, an older event,
	// a path not expected, or one already seen).
	Ignored Outcome = iota
	// FalseOffline: an offline while the canary heartbeats.
	FalseOffline
	// Detected: the offline of a stopped canary; Observe returns its
	// detection time, from the last heartbeat.
	Detected
)

// Observe judges an event of the canary's device seen on path at now:
// its state (offline or not) and ver.
func Observe(s State, path Path, offline bool, ver uint64, now time.Time) (State, Outcome, time.Duration) {
	if !offline || ver <= s.Base {
		return s, Ignored, 0
	}
	switch {
	case s.Phase == Live && !s.LastBeat.IsZero():
		if ver <= s.Falsed {
			return s, Ignored, 0
		}
		s.Falsed = ver
		return s, FalseOffline, 0
	case s.Phase == Stopped && s.Expect[path] && !s.Seen[path]:
		s.Seen[path] = true
		return s, Detected, now.Sub(s.LastBeat)
	}
	return s, Ignored, 0
}

func earliest(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}
