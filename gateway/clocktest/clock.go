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
	// boot and booted: the boot Boot names and when it began.
	boot   gateway.BootID
	booted time.Time
}

var (
	_ gateway.Clock     = (*Clock)(nil)
	_ gateway.BootClock = (*Clock)(nil)
)

// DefaultBoot is the boot a new Clock is in.
var DefaultBoot = gateway.BootID{0: 0xb0, 15: 1}

// New returns a clock standing at start, in boot DefaultBoot, booted an
// hour before start.
func New(start time.Time) *Clock {
	return &Clock{now: start, boot: DefaultBoot, booted: start.Add(-time.Hour)}
}

// Boot returns the clock's boot and the time since that boot began: it
// moves with Now, and changes only with Reboot.
func (c *Clock) Boot() (gateway.BootID, time.Duration, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.boot, c.now.Sub(c.booted), nil
}

// Reboot puts the clock in boot id, begun since ago; Now does not move
// (as the wall clock of a machine that rebooted).
func (c *Clock) Reboot(id gateway.BootID, since time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.boot, c.booted = id, c.now.Add(-since)
}

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
