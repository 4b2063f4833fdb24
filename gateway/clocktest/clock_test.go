package clocktest_test

import (
	"runtime"
	"testing"
	"time"

	"github.com/fleetgate/fleetgate/gateway"
	"github.com/fleetgate/fleetgate/gateway/clocktest"
)

var start = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

// fired reports whether tm has fired, without waiting: a manual clock
// fires its timers inside Advance and Set.
func fired(tm gateway.Timer) (time.Time, bool) {
	select {
	case at := <-tm.C():
		return at, true
	default:
		return time.Time{}, false
	}
}

func TestNowMovesOnlyByHand(t *testing.T) {
	c := clocktest.New(start)
	if !c.Now().Equal(start) {
		t.Fatalf("Now = %v, want %v", c.Now(), start)
	}
	c.Advance(1500 * time.Millisecond)
	if want := start.Add(1500 * time.Millisecond); !c.Now().Equal(want) {
		t.Fatalf("after Advance: Now = %v, want %v", c.Now(), want)
	}
	c.Set(start) // never backwards
	if want := start.Add(1500 * time.Millisecond); !c.Now().Equal(want) {
		t.Fatalf("Set backwards moved the clock to %v", c.Now())
	}
	c.Set(start.Add(time.Hour))
	if want := start.Add(time.Hour); !c.Now().Equal(want) {
		t.Fatalf("after Set: Now = %v, want %v", c.Now(), want)
	}
}

func TestTimerFiresOnAdvance(t *testing.T) {
	c := clocktest.New(start)
	tm := c.NewTimer(10 * time.Second)
	if c.Timers() != 1 {
		t.Fatalf("Timers = %d, want 1", c.Timers())
	}
	c.Advance(10*time.Second - time.Nanosecond)
	if _, ok := fired(tm); ok {
		t.Fatal("timer fired before it was due")
	}
	c.Advance(time.Nanosecond)
	at, ok := fired(tm)
	if !ok || !at.Equal(start.Add(10*time.Second)) {
		t.Fatalf("timer due now: fired %v at %v", ok, at)
	}
	if c.Timers() != 0 {
		t.Fatalf("Timers = %d after firing, want 0", c.Timers())
	}
	if tm.Stop() {
		t.Fatal("Stop of a fired timer reported true")
	}
	c.Advance(time.Hour)
	if _, ok := fired(tm); ok {
		t.Fatal("timer fired twice")
	}
}

func TestTimerFiresOnSet(t *testing.T) {
	c := clocktest.New(start)
	late, early := c.NewTimer(2*time.Minute), c.NewTimer(time.Minute)
	c.Set(start.Add(90 * time.Second))
	if _, ok := fired(early); !ok {
		t.Fatal("due timer did not fire on Set")
	}
	if _, ok := fired(late); ok {
		t.Fatal("timer not yet due fired on Set")
	}
	c.Set(start.Add(5 * time.Minute))
	if at, ok := fired(late); !ok || !at.Equal(start.Add(5*time.Minute)) {
		t.Fatalf("late timer: fired %v at %v, want the clock's time", ok, at)
	}
}

func TestTimerWithNoDelayFiresAtOnce(t *testing.T) {
	c := clocktest.New(start)
	for _, d := range []time.Duration{0, -time.Second} {
		if _, ok := fired(c.NewTimer(d)); !ok {
			t.Errorf("NewTimer(%v) did not fire at once", d)
		}
	}
}

func TestStop(t *testing.T) {
	c := clocktest.New(start)
	a, b := c.NewTimer(time.Second), c.NewTimer(2*time.Second)
	if !a.Stop() {
		t.Fatal("Stop of a pending timer reported false")
	}
	if a.Stop() {
		t.Fatal("second Stop reported true")
	}
	if c.Timers() != 1 {
		t.Fatalf("Timers = %d, want 1", c.Timers())
	}
	c.Advance(time.Minute)
	if _, ok := fired(a); ok {
		t.Fatal("stopped timer fired")
	}
	if _, ok := fired(b); !ok {
		t.Fatal("the other timer did not fire")
	}
}

// TestTimerWakesSleeper is the pattern tests use: a goroutine sleeps on
// the clock, the test awaits Timers() and advances.
func TestTimerWakesSleeper(t *testing.T) {
	c := clocktest.New(start)
	woke := make(chan time.Time)
	go func() {
		tm := c.NewTimer(time.Minute)
		woke <- <-tm.C()
	}()
	deadline := time.Now().Add(10 * time.Second)
	for c.Timers() == 0 {
		if time.Now().After(deadline) {
			t.Fatal("sleeper never created its timer")
		}
		runtime.Gosched()
	}
	c.Advance(time.Minute)
	select {
	case at := <-woke:
		if !at.Equal(start.Add(time.Minute)) {
			t.Fatalf("woke at %v", at)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("sleeper not woken by Advance")
	}
}
