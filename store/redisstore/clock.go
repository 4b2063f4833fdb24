package redisstore

import (
	"context"
	"strconv"
	"time"

	"github.com/fleetgate/fleetgate/gateway"
)

// Now is the store clock: Redis TIME, or Options.Now in tests.
func (s *Store) Now(ctx context.Context) (time.Time, error) {
	if s.now != nil {
		return s.now().Truncate(time.Millisecond), nil
	}
	c, err := s.client()
	if err != nil {
		return time.Time{}, err
	}
	t, err := c.Time(ctx).Result()
	if err != nil {
		return time.Time{}, unavailable("now", err)
	}
	return t.Truncate(time.Millisecond), nil
}

// nowArg is the scripts' clock argument: "" for Redis TIME.
func (s *Store) nowArg() string {
	if s.now == nil {
		return ""
	}
	return strconv.FormatInt(s.now().UnixMilli(), 10)
}

// localNow is the clock beliefs age by: the time since Open, on the
// monotonic clock (or the test clock when set).
// clockNow is the time on the clock the gateway's ages are on: the
// test clock (Options.Now), else the system's.
func (s *Store) clockNow() time.Time {
	if s.now != nil {
		return s.now()
	}
	return time.Now()
}

func (s *Store) localNow() time.Duration {
	if s.now != nil {
		return s.now().Sub(s.opened)
	}
	return time.Since(s.opened)
}

// storeClock estimates the store's clock (ms since the Unix epoch, Redis
// TIME) from this process's local clock, for the deadline a script call
// carries (A_NOTAFTER): a call that runs after it is refused as stale.
//
// Each reply that names the store time s of its run bounds the offset
// s − local: a call sent at local time t0 and answered at t1 ran between
// them, so the offset lies in [s − t1, s − t0 + 1 ms] (s is truncated to
// the millisecond). The estimate is the
// largest lower bound seen, so a reply that comes back late (a pipeline
// that also waited for a dead Cluster node, a starved process) never
// pulls it back. (Were each reply's time taken as "now", a late reply
// would leave every later call with a deadline in the store's past: all
// refused as stale, their replies unread, the store unreachable for
// good.) An observation whose upper bound is
// below the estimate means the store's clock went back (a failover to a
// node behind it): the estimate restarts from that observation.
//
// A zero storeClock knows nothing; the zero value is ready to use. It is
// not safe for concurrent use (Store guards it with rmu).
type storeClock struct {
	known  bool
	offset time.Duration // store ms minus local time: a lower bound
	// upper is the least upper bound of the offset seen since the
	// estimate last restarted (or since a lower bound passed the one
	// before): the store's clock is at most upper - offset ahead of the
	// estimate (width).
	upper time.Duration
}

// observe records the store time store (ms) of a call sent at local time
// sent and answered at recv. The store's times are truncated to the
// millisecond: the call ran within the millisecond that follows store,
// so the upper bound counts that millisecond. (Without it, a call that
// ran within a millisecond of its send, late in the store's millisecond,
// looked like a clock that went back; the estimate restarted from that
// call's lower bound, seconds low when its reply had been delayed, and
// every call after it dated its evidence that much too early: deadlines
// short by as much, false offlines.)
func (c *storeClock) observe(store int64, sent, recv time.Duration) {
	at := time.Duration(store) * time.Millisecond
	lo, hi := at-recv, at+time.Millisecond-sent
	switch {
	case !c.known || hi < c.offset:
		c.known, c.offset, c.upper = true, lo, hi
	case lo > c.offset:
		// an upper bound below the new lower one is out of date (the
		// two clocks drift apart)
		if c.offset = lo; c.upper < lo {
			c.upper = hi
		} else {
			c.upper = min(c.upper, hi)
		}
	default:
		c.upper = min(c.upper, hi)
	}
}

// width is how far the store's clock may be ahead of the estimate: the
// distance between the tightest bounds seen (a round trip and the
// store's millisecond when the replies come back at once, more while
// every reply comes back late).
func (c *storeClock) width() time.Duration { return c.upper - c.offset }

// notAfter is the store time (ms) after which a call sent at local time
// now, which its caller waits on for wait, is stale; ok is false while no
// store time has been seen.
func (c *storeClock) notAfter(now, wait time.Duration) (ms int64, ok bool) {
	if !c.known {
		return 0, false
	}
	return (now + c.offset + wait).Milliseconds(), true
}

// staleAfter is how long after it was sent a script call may still run:
// the call's timeout and a margin for the clocks.
const staleAfter = callTimeout + time.Second

// notAfter is the store time after which a call to shard sent now is
// stale ("" when the shard's clock has not been seen yet): the store's
// clock as estimated now, plus staleAfter (or less, by ctx's deadline).
func (s *Store) notAfter(ctx context.Context, shard int) string {
	if s.now != nil {
		// a test clock jumps while calls are in flight: no call is stale
		return ""
	}
	wait := staleAfter
	if dl, ok := ctx.Deadline(); ok {
		wait = min(wait, time.Until(dl)+time.Second)
	}
	s.rmu.Lock()
	defer s.rmu.Unlock()
	ms, ok := s.clocks[shard].notAfter(s.localNow(), wait)
	if !ok {
		return ""
	}
	return strconv.FormatInt(ms, 10)
}

// sentAt is the store time of a call to shard sent now, as estimated from
// earlier replies: a lower bound ("" when the shard's clock has not been
// seen yet, or with a test clock). The ages of the call's writes count
// from it (apply.lua, A_SENTAT), not from the time the call runs, which a
// starved gateway or server may delay by up to staleAfter: evidence is
// then not taken as newer than it is, and a gateway's evidence and its
// coverage (covered) are on one clock.
func (s *Store) sentAt(shard int) string {
	if s.now != nil {
		return ""
	}
	s.rmu.Lock()
	defer s.rmu.Unlock()
	ms, ok := s.clocks[shard].notAfter(s.localNow(), 0)
	if !ok {
		return ""
	}
	return strconv.FormatInt(ms, 10)
}

// skew is apply.lua's A_SKEW for a call to shard: how much later on the
// store's clock than the call dates it (A_SENTAT less its age, both
// truncated to the millisecond) its evidence may have been observed, in
// whole milliseconds: the width of the clock's estimate and a millisecond
// for each truncation ("" with a test clock, which dates evidence
// exactly, or while the shard's clock has not been seen yet). Another
// gateway's evidence is dated on its own estimate, so the two dates of a
// move made before-break may come in either order by that much
// (apply.lua's leave).
func (s *Store) skew(shard int) string {
	if s.now != nil {
		return ""
	}
	s.rmu.Lock()
	defer s.rmu.Unlock()
	c := s.clocks[shard]
	if !c.known {
		return ""
	}
	w := c.width() + 2*time.Millisecond
	return strconv.FormatInt(int64((w+time.Millisecond-1)/time.Millisecond), 10)
}

// covered is the store time (ms) of the coverage of a batch (Batch.Covers,
// made now): a lower bound of the store's clock when the gateway's
// coverage point passed, so that the store never takes a gateway to have
// covered more than it did; "" when the batch reports none or the
// store's clock has not been seen yet.
func (s *Store) covered(shard int, b gateway.Batch) string {
	if !b.Covers {
		return ""
	}
	if s.now != nil {
		return strconv.FormatInt(s.now().Add(-b.CoverAge).UnixMilli(), 10)
	}
	s.rmu.Lock()
	defer s.rmu.Unlock()
	ms, ok := s.clocks[shard].notAfter(s.localNow()-b.CoverAge, 0)
	if !ok {
		return ""
	}
	return strconv.FormatInt(ms, 10)
}

// seen records the store time now that a script call to shard sent at
// local time sent (localNow) returned, stale or not.
func (s *Store) seen(shard int, now int64, sent time.Duration) {
	s.rmu.Lock()
	defer s.rmu.Unlock()
	s.clocks[shard].observe(now, sent, s.localNow())
}
