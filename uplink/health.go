package uplink

import (
	"context"
	"math/rand/v2"
	"time"
)

func (u *Uplink) isUp() bool {
	u.hmu.Lock()
	defer u.hmu.Unlock()
	return u.up
}

// markDown records that the store failed; new writes go to the outbox
// until a probe succeeds.
func (u *Uplink) markDown(err error) {
	u.hmu.Lock()
	was := u.up
	u.up, u.lastErr = false, err
	if was {
		u.since = u.clock.Now()
	}
	u.hmu.Unlock()
	if was {
		u.log.Warn("uplink down: buffering writes in the outbox; devices are still served", "err", err)
	}
	u.signal(u.wake)
}

func (u *Uplink) markUp() {
	u.hmu.Lock()
	was := u.up
	var downFor time.Duration
	if !was {
		now := u.clock.Now()
		downFor = now.Sub(u.since)
		u.up, u.since, u.lastErr = true, now, nil
	}
	u.hmu.Unlock()
	if !was {
		u.log.Info("uplink up: replaying the outbox", "down_for", downFor, "outbox_sessions", u.ob.Len())
	}
}

// backoff is the wait before probe attempt n (0-based): exponential from
// probeMin to probeMax, jittered over its upper half so that gateways
// that lost the store together do not probe in step.
func (u *Uplink) backoff(n int) time.Duration {
	d := u.probeMin
	for i := 0; i < n && d < u.probeMax; i++ {
		d *= 2
	}
	d = min(d, u.probeMax)
	return d/2 + rand.N(d/2+1)
}

// healthLoop probes a down store with backoff, and replays the outbox
// round by round while the store is up, until ctx is done.
func (u *Uplink) healthLoop(ctx context.Context) {
	rp := &replayer{u: u}
	defer rp.wait()
	attempt := 0
	for ctx.Err() == nil {
		if !u.isUp() {
			if !u.sleep(ctx, u.backoff(attempt)) {
				return
			}
			attempt++
			pctx, cancel := context.WithTimeout(ctx, u.timeout)
			_, err := u.store.Now(pctx)
			cancel()
			if err != nil {
				u.log.Debug("uplink probe failed", "attempt", attempt, "err", err)
				continue
			}
			u.markUp()
		}
		if u.ob.Len() > 0 {
			u.outboxBusy.begin(u.clock.Now())
			err := rp.round(ctx)
			u.outboxBusy.end()
			switch {
			case ctx.Err() != nil:
				return
			case err != nil:
				u.markDown(err)
			default:
				attempt = 0
			}
			continue
		}
		attempt = 0
		select {
		case <-ctx.Done():
			return
		case <-u.wake:
		}
	}
}

// sleep waits d on the uplink's clock; false when ctx ended first.
func (u *Uplink) sleep(ctx context.Context, d time.Duration) bool {
	t := u.clock.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C():
		return true
	}
}
