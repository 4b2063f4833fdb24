package redisstore

import (
	"errors"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/fleetgate/fleetgate/gateway"
)

func TestStoreClockEstimate(t *testing.T) {
	const s = time.Second
	ms := func(d time.Duration) int64 { return d.Milliseconds() }
	var c storeClock
	if _, ok := c.notAfter(0, s); ok {
		t.Fatal("a clock that saw nothing gave a deadline")
	}
	// Store time 100 s, sent at local 10 s, answered at 10.1 s.
	c.observe(ms(100*s), 10*s, 10*s+100*time.Millisecond)
	if got, _ := c.notAfter(20*s, 2*s); got != ms(111*s+900*time.Millisecond) {
		t.Fatalf("after one reply: %d", got)
	}
	// The store's clock may be ahead of the estimate by the round trip
	// and the store's millisecond.
	if w := c.width(); w != 101*time.Millisecond {
		t.Fatalf("width after one reply: %v", w)
	}
	// A reply that comes back 5 s late (it ran at local 11 s) does not
	// pull the estimate back.
	c.observe(ms(101*s), 11*s, 16*s)
	if got, _ := c.notAfter(20*s, 2*s); got != ms(111*s+900*time.Millisecond) {
		t.Fatalf("after a late reply: %d", got)
	}
	if w := c.width(); w != 101*time.Millisecond {
		t.Fatalf("width after a late reply: %v", w)
	}
	// A tighter reply raises it.
	c.observe(ms(110*s+50*time.Millisecond), 20*s, 20*s)
	if got, _ := c.notAfter(20*s, 2*s); got != ms(112*s+50*time.Millisecond) {
		t.Fatalf("after a tighter reply: %d", got)
	}
	// Its upper bound is below the earlier ones (they are out of date:
	// the clocks drift): the width is its own.
	if w := c.width(); w != time.Millisecond {
		t.Fatalf("width after a tighter reply: %v", w)
	}
	// The store's clock went back 30 s (a failover to a node behind):
	// the estimate follows it.
	c.observe(ms(81*s), 21*s, 21*s+10*time.Millisecond)
	if got, _ := c.notAfter(21*s+10*time.Millisecond, 0); got != ms(81*s) {
		t.Fatalf("after the store's clock went back: %d", got)
	}
	if w := c.width(); w != 11*time.Millisecond {
		t.Fatalf("width after the store's clock went back: %v", w)
	}
}

// TestTruncatedStoreTimeIsNoClockStep: a store time is truncated to the
// millisecond, so a call that ran within a millisecond of its send, late
// in the store's millisecond, names a time up to a millisecond before its
// send. That is no clock that went back: a delayed reply of such a call
// (here 1.6 s) must not pull the estimate down to its lower bound, or
// every later call would date its evidence 1.6 s early.
func TestTruncatedStoreTimeIsNoClockStep(t *testing.T) {
	const s, ms = time.Second, time.Millisecond
	us := time.Microsecond
	// The store's clock is the local one + 90 s, exactly.
	var c storeClock
	// Sent at 10 s, ran 0.1 ms later (store 100.0001 s, named 100000 ms),
	// answered 0.2 ms after the send: the estimate is 89.9998 s.
	c.observe(100_000, 10*s, 10*s+200*us)
	before, _ := c.notAfter(20*s, 0)
	// Sent at 10.9995 s, ran 50 µs later at store 100.99955 s, named
	// 100999 ms (0.5 ms before the send, on the store's clock), its reply
	// delayed 1.6 s.
	c.observe(100_999, 11*s-500*us, 11*s-500*us+1600*ms)
	if got, _ := c.notAfter(20*s, 0); got != before {
		t.Fatalf("a truncated store time moved the estimate from %d to %d ms (a clock step taken from a delayed reply)", before, got)
	}
	// A store clock that did go back by 2 ms is still followed.
	c.observe(100_997, 11*s, 11*s+100*us)
	if got, _ := c.notAfter(20*s, 0); got >= before {
		t.Fatalf("a store clock 2 ms back was not followed: %d ms, was %d", got, before)
	}
}

// TestLateReplyDoesNotMakeCallsStale: a reply read long after its call
// ran (here: a store time 10 s old) does not lower the store clock's
// estimate, so the calls after it are not refused as stale (were it set
// from that reply, every later call would leave with a deadline in the
// store's past, and the gateway would buffer its writes for good); and a
// stale reply corrects the estimate.
func TestLateReplyDoesNotMakeCallsStale(t *testing.T) {
	forBackends(t, func(t *testing.T, c redis.UniversalClient) {
		s, err := Open(t.Context(), c, Options{Prefix: uniquePrefix(), Shards: 2})
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		dev := devicesIn(t, 2, 1, 1, "late")[0]
		b := gateway.Batch{Gateway: "gw", Epoch: 1, Lease: 10 * time.Second,
			Writes: []gateway.Write{write(dev, "coap/x", gateway.Connect, 0)}}
		if _, err := s.Apply(t.Context(), 1, b); err != nil {
			t.Fatal(err)
		}
		before := s.localNow()
		now, err := s.Now(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		// A reply of a call that ran 10 s ago, read now: sent 10 s before
		// the local time at which the store's clock read now, less a
		// millisecond for the truncation of store times to milliseconds
		// (a later send time would say that the store's clock went back).
		s.seen(1, now.Add(-10*time.Second).UnixMilli(), before-10*time.Second-time.Millisecond)
		b.Writes[0].Kind = gateway.Renew
		for i := range 3 {
			if _, err := s.Apply(t.Context(), 1, b); err != nil {
				t.Fatalf("apply %d after a late reply: %v", i, err)
			}
			if _, err := s.Reap(t.Context(), 1, 10); err != nil {
				t.Fatalf("reap %d after a late reply: %v", i, err)
			}
		}

		// Force the estimate 10 s behind (as a late reply could leave it): one
		// call is refused as stale, and its reply puts the clock right.
		s.rmu.Lock()
		s.clocks[1].offset -= 10 * time.Second
		s.rmu.Unlock()
		_, err = s.Apply(t.Context(), 1, b)
		if !errors.Is(err, gateway.ErrUnavailable) {
			t.Fatalf("apply with a clock 10 s behind: %v, want a stale call", err)
		}
		if _, err := s.Apply(t.Context(), 1, b); err != nil {
			t.Fatalf("apply after a stale reply: %v", err)
		}
	})
}

func TestNow(t *testing.T) {
	s, err := Open(t.Context(), sharedServer().Client(t), Options{Prefix: uniquePrefix(), Shards: 1})
	if err != nil {
		t.Fatal(err)
	}
	now, err := s.Now(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if d := time.Since(now); d < -time.Second || d > time.Second {
		t.Fatalf("Redis TIME %v is %v off the local clock", now, d)
	}
	// Without a test clock the scripts use Redis TIME too.
	evs, err := s.Apply(t.Context(), 0, batch("gw", 1, write("d", "s", gateway.Connect, 0)))
	if err != nil || len(evs.Events) != 1 {
		t.Fatalf("apply: %v %v", evs, err)
	}
	if d := evs.Events[0].At.Sub(now); d < 0 || d > 5*time.Second {
		t.Fatalf("event at %v, store clock read %v before", evs.Events[0].At, now)
	}
}
