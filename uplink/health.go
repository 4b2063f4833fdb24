package uplink

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"time"
)

// Health is per shard. A shard whose batch the store did not take (its
// call failed or timed out for it, not refused) is down: its writes go
// to the outbox with no store call, so that no flush waits for a sick
// shard's timeout while the others are written at once. A down shard is
// probed with jittered backoff (Store.Probe: a read, no write, in one call
// for every down shard due, outside the flushes and replays); once it
// answers it is up again, and its outbox entries are replayed before new
// writes of it go to the store (order per session). The uplink is up
// while no shard is down.

// shardHealth is the health of one shard (under Uplink.hmu).
type shardHealth struct {
	down    bool
	since   time.Time // when it went down
	lastErr error
	// attempt counts the probes that failed, and the shards that went
	// down again after a probe found them up, since the shard last took
	// a batch: a shard that answers probes but not writes backs off too.
	attempt int
	next    time.Time // when its next probe is due
}

// shardUp reports whether shard is up.
func (u *Uplink) shardUp(shard int) bool {
	u.hmu.Lock()
	defer u.hmu.Unlock()
	return !u.health[shard].down
}

// isUp reports whether every shard is up.
func (u *Uplink) isUp() bool {
	u.hmu.Lock()
	defer u.hmu.Unlock()
	return u.ndown == 0
}

// shardsDown is the number of shards down.
func (u *Uplink) shardsDown() int {
	u.hmu.Lock()
	defer u.hmu.Unlock()
	return u.ndown
}

// markDown records that the store did not take a batch of each of
// shards, errs[i] being why shards[i] failed; their writes go to the
// outbox until a probe succeeds. Shards that go down together are first
// probed together.
func (u *Uplink) markDown(shards []int, errs []error) {
	if len(shards) == 0 {
		return
	}
	now := u.clock.Now()
	var newly []int
	u.hmu.Lock()
	wait := u.probeWaits()
	for i, sh := range shards {
		h := &u.health[sh]
		if !h.down {
			h.down, h.since, h.next = true, now, now.Add(wait(h.attempt))
			newly = append(newly, sh)
		}
		h.lastErr = errs[i]
	}
	if u.ndown == 0 && len(newly) > 0 {
		u.since = now
	}
	u.ndown += len(newly)
	u.lastErr = errs[len(errs)-1]
	ndown := u.ndown
	u.hmu.Unlock()
	if len(newly) > 0 {
		u.log.Warn("uplink down: buffering writes in the outbox; devices are still served",
			"shards", newly, "shards_down", ndown, "of", u.shards, "err", errs[0])
		u.signal(u.probe)
	}
}

// markUp records that shards answered a probe; their outbox entries are
// replayed next.
func (u *Uplink) markUp(shards []int) {
	now := u.clock.Now()
	var (
		up      []int
		downFor time.Duration
	)
	u.hmu.Lock()
	for _, sh := range shards {
		if h := &u.health[sh]; h.down {
			downFor = max(downFor, now.Sub(h.since))
			*h = shardHealth{attempt: h.attempt + 1}
			up = append(up, sh)
		}
	}
	u.ndown -= len(up)
	if u.ndown == 0 && len(up) > 0 {
		u.since, u.lastErr = now, nil
	}
	ndown := u.ndown
	u.hmu.Unlock()
	if len(up) > 0 {
		u.log.Info("uplink up: replaying the outbox", "shards", up, "shards_down", ndown, "down_for", downFor,
			"outbox_sessions", u.ob.Len())
		u.signal(u.wake)
	}
}

// probeDue returns the down shards whose probe is due at now; when none
// is, wait is the time until the next one (0 when no shard is down).
func (u *Uplink) probeDue(now time.Time) (due []int, wait time.Duration) {
	u.hmu.Lock()
	defer u.hmu.Unlock()
	var next time.Time
	for sh, h := range u.health {
		switch {
		case !h.down:
		case !h.next.After(now):
			due = append(due, sh)
		case next.IsZero() || h.next.Before(next):
			next = h.next
		}
	}
	if len(due) > 0 || next.IsZero() {
		return due, 0
	}
	return nil, next.Sub(now)
}

// probeFailed records that shards did not answer a probe that returned
// at now (errs[i] for shards[i]) and puts their next probe one backoff
// step further.
func (u *Uplink) probeFailed(shards []int, errs []error, now time.Time) {
	u.hmu.Lock()
	defer u.hmu.Unlock()
	wait := u.probeWaits()
	for i, sh := range shards {
		h := &u.health[sh]
		if !h.down {
			continue
		}
		h.attempt++
		h.next, h.lastErr = now.Add(wait(h.attempt)), fmt.Errorf("uplink: probe shard %d: %w", sh, errs[i])
		u.lastErr = h.lastErr
	}
}

// answered records that shards took a batch: their probe backoff starts
// over. Called with sendMu held.
func (u *Uplink) answered(shards []int) {
	u.hmu.Lock()
	defer u.hmu.Unlock()
	for _, sh := range shards {
		u.health[sh].attempt = 0
	}
}

// probeWaits returns the backoff before probe attempt n, drawn once per
// n, so that shards that go down or fail a probe together are probed
// together.
func (u *Uplink) probeWaits() func(n int) time.Duration {
	drawn := map[int]time.Duration{}
	return func(n int) time.Duration {
		d, ok := drawn[n]
		if !ok {
			d = u.backoff(n)
			drawn[n] = d
		}
		return d
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

// probeLoop probes the down shards as their probes come due, until ctx
// is done.
func (u *Uplink) probeLoop(ctx context.Context) {
	for ctx.Err() == nil {
		if wait, probed := u.probeOnce(ctx); !probed && !u.idle(ctx, u.probe, wait) {
			return
		}
	}
}

// probeOnce probes, in one call, the down shards whose probe is due:
// those that answer are up, the others are probed again later. When none
// is due it probes nothing and returns the time until the next one (0
// when no shard is down).
func (u *Uplink) probeOnce(ctx context.Context) (wait time.Duration, probed bool) {
	now := u.clock.Now()
	due, wait := u.probeDue(now)
	if len(due) == 0 {
		return wait, false
	}
	u.probeBusy.begin(now)
	pctx, cancel := context.WithTimeout(ctx, u.timeout)
	errs := u.store.Probe(pctx, due)
	cancel()
	u.probeBusy.end()
	now = u.clock.Now()
	if len(errs) != len(due) {
		errs = slices.Repeat([]error{fmt.Errorf("store answered %d probes for %d shards", len(errs), len(due))}, len(due))
	}
	var up, failed []int
	var ferrs []error
	for i, err := range errs {
		if err == nil {
			up = append(up, due[i])
		} else {
			failed, ferrs = append(failed, due[i]), append(ferrs, err)
		}
	}
	if len(failed) > 0 {
		u.log.Debug("uplink probe failed", "shards", failed, "err", ferrs[0])
	}
	u.probeFailed(failed, ferrs, now)
	u.markUp(up)
	return 0, true
}

// replayLoop replays the outbox round by round while a shard that is up
// holds entries, until ctx is done.
func (u *Uplink) replayLoop(ctx context.Context) {
	rp := &replayer{u: u}
	defer rp.wait()
	failed := 0
	for ctx.Err() == nil {
		if !u.replayable() {
			if !u.idle(ctx, u.wake, 0) {
				return
			}
			continue
		}
		u.outboxBusy.begin(u.clock.Now())
		err := rp.round(ctx)
		u.outboxBusy.end()
		if err == nil {
			failed = 0
			continue
		}
		// the shards whose batches failed are down now; anything else
		// (the outbox's own file) is tried again after a backoff, or
		// sooner when there is news (a shard up, the outbox filled)
		u.log.Debug("outbox replay round failed", "err", err)
		if !u.idle(ctx, u.wake, u.backoff(failed)) {
			return
		}
		failed++
	}
}

// replayable reports whether a shard that is up holds outbox entries.
func (u *Uplink) replayable() bool {
	for sh := range u.shards {
		if u.ob.holds(sh) && u.shardUp(sh) {
			return true
		}
	}
	return false
}

// idle waits until wake is signalled or d has passed on the uplink's
// clock (d 0: no time limit); false when ctx ended first.
func (u *Uplink) idle(ctx context.Context, wake <-chan struct{}, d time.Duration) bool {
	var timeout <-chan time.Time
	if d > 0 {
		t := u.clock.NewTimer(d)
		defer t.Stop()
		timeout = t.C()
	}
	select {
	case <-ctx.Done():
		return false
	case <-wake:
	case <-timeout:
	}
	return true
}
