package gateway_test

import (
	"testing"
	"time"
	"unsafe"

	"pgregory.net/rapid"

	"github.com/fleetgate/fleetgate/gateway"
)

const ms = time.Millisecond

// drawLearning draws the bounds of a learned lease: a floor (presence.lease)
// of 1 s to 2 min, a margin (renew_every) below it, a ceiling
// (presence.max_lease) up to a week.
func drawLearning(rt *rapid.T) gateway.Learning {
	floor := time.Duration(rapid.Int64Range(1_000, 120_000).Draw(rt, "floor_ms")) * ms
	margin := time.Duration(rapid.Int64Range(0, floor.Milliseconds()-1).Draw(rt, "margin_ms")) * ms
	ceiling := floor + time.Duration(rapid.Int64Range(0, (7*24*time.Hour).Milliseconds()).Draw(rt, "ceiling_extra_ms"))*ms
	return gateway.Learning{Floor: floor, Ceiling: ceiling, Margin: margin}
}

// TestPeriodSize: a device's learned period is 4 bytes, which fit in the
// map slot of the table's session count (8 bytes with it, the size of a
// slot's value either way).
func TestPeriodSize(t *testing.T) {
	if n := unsafe.Sizeof(gateway.Period{}); n != 4 {
		t.Fatalf("Period is %d bytes, want 4", n)
	}
}

// TestPeriodStartsAtCeiling: a device first seen gets the ceiling (start
// safe: presence.max_lease until its period is known), also after a
// restart, which starts every device anew.
func TestPeriodStartsAtCeiling(t *testing.T) {
	rapid.Check(t, func(rt *rapid.T) {
		l := drawLearning(rt)
		if got := l.Lease(l.Start()); got != l.Ceiling {
			rt.Fatalf("first lease %v, want the ceiling %v (%+v)", got, l.Ceiling, l)
		}
	})
}

// TestPeriodNeverBelowLastGap: whatever came before, after a gap g the
// lease covers LearnFactor gaps of g (up to the ceiling): the device that
// sends again after the same gap, or after two more lost, is never left
// without a lease (lease − margin ≥ 3g: the throttle's lag included).
func TestPeriodNeverBelowLastGap(t *testing.T) {
	rapid.Check(t, func(rt *rapid.T) {
		l := drawLearning(rt)
		now := time.Duration(rapid.Int64Range(0, 1<<40).Draw(rt, "start_ns"))
		p := l.Start()
		for range rapid.IntRange(1, 50).Draw(rt, "gaps") {
			gap := time.Duration(rapid.Int64Range(0, int64(l.Ceiling)).Draw(rt, "gap_ns"))
			p = p.Observe(now, now+gap)
			now += gap
			if p.Estimate() < gap {
				rt.Fatalf("estimate %v after a gap of %v", p.Estimate(), gap)
			}
			if got, want := l.Lease(p), min(gateway.LearnFactor*gap+l.Margin, l.Ceiling); got < want {
				rt.Fatalf("lease %v after a gap of %v, want at least %v", got, gap, want)
			}
			if got := l.Lease(p); got < l.Floor || got > max(l.Ceiling, l.Floor) {
				rt.Fatalf("lease %v outside [%v, %v]", got, l.Floor, l.Ceiling)
			}
		}
	})
}

// TestPeriodKeepsADeviceOnSchedule: a device that wakes every T (±10 %)
// and sends a burst of messages spread over at most 40 % of T (a connect,
// a subscribe, a few publishes; an extra message, a retransmission) is
// never left without a lease: each message's lease, less the throttle's
// margin, reaches its next message. This is the no-false-offline
// invariant of a device that keeps its period, from its first message
// on, for any ceiling that covers LearnFactor × 1.1 T.
func TestPeriodKeepsADeviceOnSchedule(t *testing.T) {
	rapid.Check(t, func(rt *rapid.T) {
		period := time.Duration(rapid.Int64Range(100, (2*time.Hour).Milliseconds()).Draw(rt, "period_ms")) * ms
		l := drawLearning(rt)
		l.Ceiling = max(l.Ceiling, gateway.LearnFactor*(period+period/10)+l.Margin)
		var times []time.Duration
		wake := time.Duration(rapid.Int64Range(0, 1<<40).Draw(rt, "start_ns"))
		for range rapid.IntRange(2, 40).Draw(rt, "wakes") {
			burst := rapid.IntRange(1, 8).Draw(rt, "burst")
			span := time.Duration(rapid.Int64Range(0, int64(period*4/10)).Draw(rt, "span_ns"))
			at := wake
			for i := range burst {
				if i > 0 {
					at = wake + time.Duration(rapid.Int64Range(int64(at-wake), int64(span)).Draw(rt, "offset_ns"))
				}
				times = append(times, at)
			}
			jitter := time.Duration(rapid.Int64Range(-int64(period/10), int64(period/10)).Draw(rt, "jitter_ns"))
			wake += period + jitter
		}
		p := l.Start()
		lease := l.Lease(p)
		for i := 1; i < len(times); i++ {
			if gap := times[i] - times[i-1]; lease-l.Margin < gap {
				rt.Fatalf("message %d: lease %v (margin %v) does not reach the next message %v later (period %v, estimate %v)",
					i-1, lease, l.Margin, gap, period, p.Estimate())
			}
			p = p.Observe(times[i-1], times[i])
			lease = l.Lease(p)
		}
	})
}

// TestPeriodOutliers: one short gap among gaps of T lowers the estimate by
// at most half that gap (robust to a duplicate or an extra message); one
// long gap (two uplinks lost) raises it at once, and regular gaps bring
// it back to T within three of them.
func TestPeriodOutliers(t *testing.T) {
	rapid.Check(t, func(rt *rapid.T) {
		period := time.Duration(rapid.Int64Range(1_000, (time.Hour).Milliseconds()).Draw(rt, "period_ms")) * ms
		l := gateway.Learning{Floor: time.Second, Ceiling: 4 * gateway.LearnFactor * period}
		now := time.Duration(0)
		p := l.Start()
		step := func(gap time.Duration) {
			p = p.Observe(now, now+gap)
			now += gap
		}
		// learn T: the start estimate shrinks by half of each gap
		for range 2 * int((l.Ceiling/gateway.LearnFactor)/period+2) {
			step(period)
			if p.Estimate() <= period+ms {
				break
			}
		}
		if est := p.Estimate(); est < period || est > period+ms {
			rt.Fatalf("estimate %v after regular gaps of %v", est, period)
		}
		short := time.Duration(rapid.Int64Range(0, int64(period)).Draw(rt, "short_ns"))
		step(short)
		if est := p.Estimate(); est < period-short/2-ms {
			rt.Fatalf("estimate %v after a short gap of %v among gaps of %v", est, short, period)
		}
		step(period - short)
		factor := rapid.Int64Range(2, 5).Draw(rt, "long_factor")
		step(time.Duration(factor) * period)
		if est := p.Estimate(); est < time.Duration(factor)*period {
			rt.Fatalf("estimate %v after a gap of %d × %v", est, factor, period)
		}
		for range 2 * factor {
			step(period)
		}
		if est := p.Estimate(); est > period+ms {
			rt.Fatalf("estimate %v still above %v after %d regular gaps", est, period, 2*factor)
		}
	})
}

// TestPeriodShrinksSlowly: a device that speeds up from T1 to T2 (up to
// a hundredfold) keeps an estimate of at least T1 − elapsed/2 while it
// learns (LearnShrink; up to a millisecond per message of rounding), and
// has T2 within 2 × (T1 − T2) + T2.
func TestPeriodShrinksSlowly(t *testing.T) {
	rapid.Check(t, func(rt *rapid.T) {
		t1 := time.Duration(rapid.Int64Range(1_000, (time.Hour).Milliseconds()).Draw(rt, "t1_ms")) * ms
		t2 := time.Duration(rapid.Int64Range(max(1, t1.Milliseconds()/100), t1.Milliseconds()).Draw(rt, "t2_ms")) * ms
		l := gateway.Learning{Floor: time.Second, Ceiling: gateway.LearnFactor * t1}
		p := l.Start().Observe(0, 10*t1)
		now := 10 * t1
		for range 30 {
			p = p.Observe(now, now+t1)
			now += t1
		}
		from := now
		for n := time.Duration(1); now-from <= gateway.LearnShrink*(t1-t2)+t2; n++ {
			p = p.Observe(now, now+t2)
			now += t2
			elapsed := now - from
			if floor := t1 - elapsed/gateway.LearnShrink - n*ms; p.Estimate() < min(floor, t2) {
				rt.Fatalf("estimate %v at %v after the speed-up from %v to %v: shrank faster than half the time", p.Estimate(), elapsed, t1, t2)
			}
		}
		if est := p.Estimate(); est > t2+ms {
			rt.Fatalf("estimate %v, want %v, %v after the speed-up from %v", est, t2, now-from, t1)
		}
	})
}

// TestPeriodReordered: evidence older than the last teaches nothing.
func TestPeriodReordered(t *testing.T) {
	l := gateway.Learning{Floor: time.Second, Ceiling: time.Hour}
	p := l.Start().Observe(0, time.Minute).Observe(time.Minute, 2*time.Minute)
	if q := p.Observe(2*time.Minute, 90*time.Second); q != p {
		t.Fatalf("older evidence changed the period: %+v → %+v", p, q)
	}
}
