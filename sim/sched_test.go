package sim

import (
	"testing"
	"time"
)

// countingActor records when it acted and acts again every `every`
// until times runs out.
type countingActor struct {
	acted []time.Time
	every time.Duration
	times int
}

var _ actor = (*countingActor)(nil)

func (a *countingActor) act(at, _ time.Time) time.Time {
	a.acted = append(a.acted, at)
	if len(a.acted) >= a.times {
		return time.Time{}
	}
	return at.Add(a.every)
}

// An actor acts at the times it asks for, and moving its next action
// (at) replaces the one it had: the old entry never fires.
func TestSchedulerReplacesAndRepeats(t *testing.T) {
	origin := time.Unix(5000, 0)
	s := newScheduler(origin, time.Second)
	a := &countingActor{every: 300 * time.Millisecond, times: 3}
	b := &countingActor{every: time.Hour, times: 1}
	s.add(a, origin.Add(100*time.Millisecond))
	idB := s.add(b, origin.Add(200*time.Millisecond))
	s.at(idB, origin.Add(2*time.Second)) // replaces 200 ms
	for now := origin; now.Before(origin.Add(3 * time.Second)); now = now.Add(schedTick) {
		s.pass(now)
	}
	want := []time.Duration{100 * time.Millisecond, 400 * time.Millisecond, 700 * time.Millisecond}
	if len(a.acted) != len(want) {
		t.Fatalf("a acted at %v", a.acted)
	}
	for i, w := range want {
		if !a.acted[i].Equal(origin.Add(w)) {
			t.Fatalf("a acted at %v, want %v", a.acted, want)
		}
	}
	if len(b.acted) != 1 || !b.acted[0].Equal(origin.Add(2*time.Second)) {
		t.Fatalf("b acted at %v, want once at 2s", b.acted)
	}
}
