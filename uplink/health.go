package uplink

import (
	"cmp"
	"context"
	"math/rand/v2"
	"sync"
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
	d := u.probeMax
	if n < 32 {
		d = min(u.probeMin<<n, u.probeMax)
	}
	return d/2 + rand.N(d/2+1)
}

// healthLoop probes a down store with backoff, and replays the outbox
// round by round while the store is up, until ctx is done.
func (u *Uplink) healthLoop(ctx context.Context) {
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
			err := u.replayOnce(ctx)
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

// replayOnce sends one round of the outbox, oldest entries first: per
// shard at most MaxBatch writes in one store call (Batch.Replay), the
// shards concurrently, ages recomputed now. Evidence whose lease has run
// out is dropped, never sent. An entry is deleted only after the store
// acknowledged its batch (a crash in between replays it again, which the
// store tolerates), or when all of it lapsed or the store refused it for
// good. It returns the first error of a store that did not answer.
func (u *Uplink) replayOnce(ctx context.Context) error {
	u.sendMu.Lock()
	defer u.sendMu.Unlock()
	t := u.timing()
	perShard, bad, err := u.ob.oldestRecords(u.shards, t.maxBatch, t.maxBatch*u.shards)
	if err != nil {
		return err
	}
	now := u.clock.Now()
	type job struct {
		shard  int
		tws    []timedWrite
		recs   []record
		lapsed int // lapsed writes of recs, dropped with them
	}
	var (
		jobs   []job
		gone   []record // entries to delete
		lapsed int      // lapsed writes of gone
	)
	for shard, recs := range perShard {
		j := job{shard: shard}
		for _, r := range recs {
			live := r.item
			if !live.leave.IsZero() && now.Sub(live.leave) >= t.lease {
				live.leave = time.Time{}
			}
			if live.kind != 0 && now.Sub(live.at) >= t.lease {
				live.kind, live.at = 0, time.Time{}
			}
			if live.n() == 0 {
				gone = append(gone, r)
				lapsed += r.n()
				continue
			}
			j.recs = append(j.recs, r)
			j.lapsed += r.n() - live.n()
			j.tws = appendWrites(j.tws, []item{live})
		}
		if len(j.tws) > 0 {
			jobs = append(jobs, j)
		}
	}
	var (
		mu    sync.Mutex
		wg    sync.WaitGroup
		first error
	)
	for _, j := range jobs {
		wg.Go(func() {
			err := u.apply(ctx, t, j.shard, true, j.tws)
			ok := err == nil || u.refused(err, j.shard, len(j.tws))
			mu.Lock()
			defer mu.Unlock()
			if !ok {
				first = cmp.Or(first, err)
				return
			}
			gone = append(gone, j.recs...)
			lapsed += j.lapsed
		})
	}
	wg.Wait()
	if err := u.ob.remove(gone, bad); err != nil {
		return err
	}
	if lapsed > 0 {
		u.lapsed.Add(uint64(lapsed))
		u.m.dropped.WithLabelValues(reasonLapsed).Add(float64(lapsed))
	}
	return first
}
