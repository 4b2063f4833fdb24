package sim

import (
	"context"
	"time"
)

// actor is one device (or the fleet's own chores) as the scheduler
// drives it.
type actor interface {
	// act does what was due at at; now is when it runs. It returns
	// when it acts next, the zero time for never.
	act(at, now time.Time) time.Time
}

// schedTick is the scheduler's resolution: an action runs within a
// tick (and the time a pass takes) of when it is due.
const schedTick = 10 * time.Millisecond

// scheduler runs every actor of the fleet from one goroutine with a
// timer wheel. Other goroutines (the MQTT connections' readers) hand it
// work through post; after each pass it calls the flushers (the UDP
// ports' batched sends).
type scheduler struct {
	w        *wheel
	actors   []actor
	due      []int64 // each actor's live entry: older ones are stale
	inbox    chan func(now time.Time)
	flushers []func()
}

func newScheduler(origin time.Time, horizon time.Duration) *scheduler {
	slots := min(int(horizon/schedTick)+1, 1<<16) // later entries wait a revolution or more
	return &scheduler{w: newWheel(origin, schedTick, slots), inbox: make(chan func(time.Time), 4096)}
}

// add registers a; it acts first at first (zero: not until woken).
func (s *scheduler) add(a actor, first time.Time) int32 {
	id := int32(len(s.actors))
	s.actors = append(s.actors, a)
	s.due = append(s.due, -1)
	if !first.IsZero() {
		s.at(id, first)
	}
	return id
}

// at moves actor id's next action to at, replacing the one it had; on
// the scheduler's goroutine only.
func (s *scheduler) at(id int32, at time.Time) {
	s.due[id] = int64(at.Sub(s.w.origin))
	s.w.add(at, id)
}

// post hands f to the scheduler's goroutine, waiting while the inbox
// is full; false when ctx ended first (then f may never run).
func (s *scheduler) post(ctx context.Context, f func(now time.Time)) bool {
	if ctx.Err() != nil {
		return false
	}
	select {
	case s.inbox <- f:
		return true
	case <-ctx.Done():
		return false
	}
}

// run drives the actors until ctx ends.
func (s *scheduler) run(ctx context.Context) {
	t := time.NewTicker(schedTick)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case f := <-s.inbox:
			f(time.Now())
			for range len(s.inbox) {
				f = <-s.inbox
				f(time.Now())
			}
		case <-t.C:
			s.pass(time.Now())
		}
		for _, f := range s.flushers {
			f()
		}
	}
}

// pass runs every action due by now.
func (s *scheduler) pass(now time.Time) {
	s.w.expire(now, func(id int32, at time.Time) {
		if int64(at.Sub(s.w.origin)) != s.due[id] {
			return // replaced
		}
		s.due[id] = -1
		if next := s.actors[id].act(at, now); !next.IsZero() {
			s.at(id, next)
		}
	})
}
