// Package clocktest is a manual clock for tests: time moves only when the
// test calls Advance or Set, and timers fire then.
package clocktest

import (
	"sync"
	"time"

	"github.com/fleetgate/fleetgate/gateway"
)

// Clock is a gateway.Clock under the test's control. The zero value is not
// usable; use New.
type Clock struct {
	mu     sync.Mutex
	now    time.Time
	timers []*timer
}

var _ gateway.Clock = (*Clock)(nil)

// New returns a clock standing at start.
func New(start time.Time) *Clock { return &Clock{now: start} }

// Now returns the clock's time.
func (c *Clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

// Advance moves the clock forward by d and fires the timers now due.
func (c *Clock) Advance(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.fireLocked()
	c.mu.Unlock()
}

// Set moves the clock to t (never backwards) and fires due timers.
func (c *Clock) Set(t time.Time) {
	c.mu.Lock()
	if t.After(c.now) {
		c.now = t
	}
	c.fireLocked()
	c.mu.Unlock()
}

// Timers is the number of timers not yet fired or stopped; tests use it
// to await a goroutine that has gone to sleep on the clock.
func (c *Clock) Timers() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.timers)
}

// NewTimer returns a timer that fires when the clock reaches now+d.
func (c *Clock) NewTimer(d time.Duration) gateway.Timer {
	c.mu.Lock()
	defer c.mu.Unlock()
	t := &timer{c: c, at: c.now.Add(d), ch: make(chan time.Time, 1)}
	c.timers = append(c.timers, t)
	c.fireLocked()
	return t
}

func (c *Clock) fireLocked() {
	kept := c.timers[:0]
	for _, t := range c.timers {
		if !t.at.After(c.now) {
			t.ch <- c.now
			continue
		}
		kept = append(kept, t)
	}
	c.timers = kept
}

type timer struct {
	c  *Clock
	at time.Time
	ch chan time.Time
}

func (t *timer) C() <-chan time.Time { return t.ch }

func (t *timer) Stop() bool {
	t.c.mu.Lock()
	defer t.c.mu.Unlock()
	for i, x := range t.c.timers {
		if x == t {
			t.c.timers = append(t.c.timers[:i], t.c.timers[i+1:]...)
			return true
		}
	}
	return false
}
