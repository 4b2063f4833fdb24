package sim

import (
	"slices"
	"sync"
	"time"

	"github.com/fleetgate/fleetgate/sim/check"
)

// truth is what one device did, written by the fleet as it happens.
type truth struct {
	mu       sync.Mutex
	id       string
	sessions []*check.Session
	active   bool
	period   time.Duration // check.Device.Period
}

// session returns the device's session called id, creating it.
func (t *truth) session(id string) *check.Session {
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, s := range t.sessions {
		if s.ID == id {
			return s
		}
	}
	s := &check.Session{ID: id}
	t.sessions = append(t.sessions, s)
	return s
}

// sent records that the gateway may have seen evidence of s at at.
func (t *truth) sent(s *check.Session, at time.Time) {
	t.mu.Lock()
	if at.After(s.LastSent) {
		s.LastSent = at
	}
	t.mu.Unlock()
}

// acked records acknowledged evidence of s, sent at at.
func (t *truth) acked(s *check.Session, at time.Time) {
	t.mu.Lock()
	s.Evidence = append(s.Evidence, at)
	if at.After(s.LastSent) {
		s.LastSent = at
	}
	t.mu.Unlock()
}

// left records the clean leave of s, sent at at.
func (t *truth) left(s *check.Session, at time.Time) {
	t.mu.Lock()
	s.Left = at
	if at.After(s.LastSent) {
		s.LastSent = at
	}
	t.mu.Unlock()
}

func (t *truth) setActive(v bool) {
	t.mu.Lock()
	t.active = v
	t.mu.Unlock()
}

// device is the checker's copy of the truth.
func (t *truth) device() check.Device {
	t.mu.Lock()
	defer t.mu.Unlock()
	d := check.Device{ID: t.id, Active: t.active, Period: t.period}
	for _, s := range t.sessions {
		c := *s
		c.Evidence = slices.Clone(s.Evidence)
		slices.SortFunc(c.Evidence, func(a, b time.Time) int { return a.Compare(b) })
		d.Sessions = append(d.Sessions, c)
	}
	return d
}
