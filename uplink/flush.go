package uplink

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/fleetgate/fleetgate/gateway"
)

// flushLoop flushes every flush interval, or at once when kicked (a shard
// reached MaxBatch, or the timing changed), until ctx is done.
func (u *Uplink) flushLoop(ctx context.Context) {
	for {
		tm := u.timing()
		interval := tm.interval
		started := u.clock.Now()
		t := u.clock.NewTimer(interval)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C():
		case <-u.kick:
			t.Stop()
		}
		// a wake-up later than the timer's by half an interval: the
		// process stalled (cover.go)
		if from, until, stalled := stallHold(started, u.clock.Now(), interval, tm.lease+u.grace); stalled {
			u.stall.note(from, until)
		}
		// A flush under way finishes (bounded by Options.Timeout) even if
		// ctx ends meanwhile, so that shutdown does not look like an outage.
		u.flushBusy.begin(u.clock.Now())
		if err := u.flushOnce(context.WithoutCancel(ctx), false); err != nil {
			u.log.Error("uplink flush failed; writes stay queued", "err", err)
		}
		u.flushBusy.end()
	}
}

// Flush sends everything pending now: to the store, or to the outbox
// for a shard that is down or whose outbox entries are not yet replayed.
// An error means writes could be neither sent nor buffered; they stay
// queued.
func (u *Uplink) Flush(ctx context.Context) error {
	t := u.timing()
	rounds := t.queueLimit/t.maxBatch + 2
	for range rounds {
		if err := u.flushOnce(ctx, true); err != nil {
			return err
		}
		if u.pending() == 0 {
			return nil
		}
	}
	return nil
}

// flushOnce moves everything pending of a shard that is down or whose
// outbox holds entries to the outbox (order per session), in one
// transaction, then takes up to MaxBatch writes of every other shard and
// sends them in one store call; the batches that fail go to the outbox
// in one transaction, and their shards are down from then on. Unless
// force, a leave observed less than the leave grace ago stays queued (a
// move between gateways with a clean goodbye: the new gateway's connect
// lands first), whether the call or the outbox takes the shard's writes:
// a replay writes a leave at once.
func (u *Uplink) flushOnce(ctx context.Context, force bool) error {
	u.sendMu.Lock()
	defer u.sendMu.Unlock()
	t := u.timing()
	now, hold := u.clock.Now(), t.leaveGrace
	if force {
		hold = 0
	}
	direct := make([]bool, u.shards)
	var buffered []item
	for shard, q := range u.queues {
		if direct[shard] = u.shardUp(shard) && !u.ob.holds(shard); !direct[shard] {
			its, _ := q.take(math.MaxInt, now, hold)
			buffered = append(buffered, its...)
		}
	}
	// into the outbox before the call, so that the coverage of its
	// batches counts them (cover.go)
	err := u.bufferOrRequeue(buffered)
	var (
		ws   []shardWrites
		sent [][]item
	)
	for shard, q := range u.queues {
		if !direct[shard] {
			continue
		}
		if its, _ := q.take(t.maxBatch, now, hold); len(its) > 0 {
			ws = append(ws, shardWrites{shard: shard, tws: appendWrites(nil, its)})
			sent = append(sent, its)
		}
	}
	if len(ws) > 0 || u.idleDue(t) {
		var failed []item
		for i, werr := range u.write(ctx, t, flushWrite, ws) {
			if werr != nil {
				failed = append(failed, sent[i]...)
			}
		}
		err = errors.Join(err, u.bufferOrRequeue(failed))
	}
	for _, q := range u.queues {
		if q.pending() >= t.maxBatch {
			u.signal(u.kick)
			break
		}
	}
	return err
}

// shardWrites is one shard's writes for a store call.
type shardWrites struct {
	shard int
	tws   []timedWrite
}

// writeKind says what a write call carries.
type writeKind int

const (
	flushWrite   writeKind = iota // queued writes, or none (keep-alive, epoch announcement)
	replayWrite                   // outbox entries (gateway.Batch.Replay)
	restoreWrite                  // live sessions of lost shards (gateway.Batch.Restore)
)

// write is the uplink's one way to the store, for flushes, outbox
// replays and restores alike: one batch per element of ws, in one
// Store.ApplyShards call (one round trip with the Redis store), ages
// computed just before it, counted by one set of metrics. It returns,
// per element, nil when the store applied the batch or, but for a
// restore, refused it for good (dropped, logged and counted: see
// refused), else the error of a store that did not take it; the shards
// of those batches are down from then on (health.go). Called with sendMu
// held, and never for a shard that is down.
//
// The call also carries an empty batch for each shard ws leaves out that
// is up and has not heard from this process for KeepAlive (gateway
// liveness), or in a flush for half a flush interval (so that its
// coverage moves on), or ever: the stores keep the newest epoch per
// shard, so until this process's epoch is recorded on a shard a delayed
// batch of an older process of this gateway would still be accepted
// there (invariant 3). Every batch says whether the outbox still holds
// writes of its shard (Behind) and up to when this gateway's evidence of
// its shard is written (Covers, cover.go), except while the shard is
// being restored.
//
// A shard whose state the store lost or replaced (ApplyResult.Reset)
// gets its sessions restored (restoreShards), and again after each call
// the shard answers until the restore has gone through; one told by the
// keep-alive of a restore of other shards is due from then on.
func (u *Uplink) write(ctx context.Context, t timing, kind writeKind, ws []shardWrites) []error {
	now := u.clock.Now()
	batches := make([]gateway.ShardBatch, 0, len(ws))
	has := make([]bool, u.shards)
	for _, w := range ws {
		b := u.batch(t, kind == replayWrite, u.ob.holds(w.shard), withAges(w.tws, now))
		b.Restore = kind == restoreWrite
		batches = append(batches, gateway.ShardBatch{Shard: w.shard, Batch: b})
		has[w.shard] = true
	}
	idle := u.keepAlive
	if kind == flushWrite {
		idle = min(idle, t.interval/2)
	}
	for shard := range has {
		if !has[shard] && now.Sub(u.heard[shard]) >= idle && u.shardUp(shard) {
			batches = append(batches, gateway.ShardBatch{Shard: shard, Batch: u.batch(t, false, u.ob.holds(shard), nil)})
		}
	}
	if len(batches) == 0 {
		return nil
	}
	for i := range batches {
		// a shard being restored is covered by nothing this process
		// wrote before: the store's state does not hold it
		if u.restoreDue[batches[i].Shard] {
			continue
		}
		b := &batches[i].Batch
		b.Covers, b.CoverAge = true, now.Sub(u.coverage(batches[i].Shard, now, t.interval))
	}
	// the ages are counted from now (gateway.Batch.AgesAt) on the system
	// clock, the stores' clock in production; under a test clock, which a
	// store may not share, they count from the call as before
	if _, system := u.clock.(gateway.SystemClock); system {
		for i := range batches {
			batches[i].Batch.AgesAt = now
		}
	}
	parent := ctx
	ctx, cancel := context.WithTimeout(ctx, u.timeout)
	defer cancel()
	start := time.Now()
	results := u.store.ApplyShards(ctx, batches)
	took := time.Since(start).Seconds()
	u.m.calls.Inc()
	if len(results) != len(batches) {
		results = make([]gateway.ShardResult, len(batches))
		for i := range results {
			results[i].Err = fmt.Errorf("store answered %d results for %d batches: %w", len(results), len(batches), gateway.ErrUnavailable)
		}
	}
	errs := make([]error, len(batches))
	var (
		reset, applied, down []int
		downErrs             []error
		answering            []int
		met                  []string
	)
	for i, r := range results {
		if r.Err == nil {
			answering, met = append(answering, batches[i].Shard), append(met, r.Result.Incarnation)
		}
	}
	// a state lost or replaced since the previous process restored on it
	// (that process may have ended before its restore went through)
	changed := u.noteIncarnations(answering, met)
	for i, r := range results {
		sb := batches[i]
		u.m.flushes.Inc()
		u.m.flushSeconds.Observe(took)
		if r.Err == nil && (r.Result.Reset || u.restoreDue[sb.Shard] || slices.Contains(changed, sb.Shard)) {
			reset = append(reset, sb.Shard)
		}
		if r.Err == nil {
			u.heard[sb.Shard] = now
			applied = append(applied, sb.Shard)
			for _, w := range sb.Batch.Writes {
				u.m.written.WithLabelValues(w.Kind.String()).Inc()
			}
			if i < len(ws) && kind != restoreWrite {
				u.ledgerConnects(t, kind == replayWrite, ws[i].tws, now)
				u.noteLeaves(t, ws[i].tws, now)
			}
			continue
		}
		u.m.flushErrors.Inc()
		err := fmt.Errorf("uplink: apply shard %d: %w", sb.Shard, r.Err)
		refused := u.refused(err, sb.Shard, len(sb.Batch.Writes))
		if !refused {
			down, downErrs = append(down, sb.Shard), append(downErrs, err)
		}
		// a refused restore is reported too: no session of it was restored
		if !refused || kind == restoreWrite {
			errs[i] = err
		}
	}
	u.answered(applied)
	u.markDown(down, downErrs)
	defer u.markRestored(applied)
	switch {
	case len(reset) == 0:
	case kind != restoreWrite:
		u.restoreShards(parent, t, reset)
	default:
		// a restore's keep-alives told other shards (not has) of the
		// loss: each is due, restored at the next call it answers (the
		// store reports a loss once, to the first call that meets it)
		for _, shard := range reset {
			if !has[shard] {
				u.restoreDue[shard] = true
			}
		}
	}
	return errs[:len(ws)]
}

// batch is a batch of this process with writes.
func (u *Uplink) batch(t timing, replay, behind bool, ws []gateway.Write) gateway.Batch {
	return gateway.Batch{Gateway: u.gw, Epoch: u.epoch, Lease: t.lease, Replay: replay, Behind: behind, Writes: ws}
}

// idleDue reports whether a shard that is up has not heard from this
// process for half a flush interval (its coverage would not move on).
// Called with sendMu held.
func (u *Uplink) idleDue(t timing) bool {
	now := u.clock.Now()
	for shard, h := range u.heard {
		if now.Sub(h) >= min(u.keepAlive, t.interval/2) && u.shardUp(shard) {
			return true
		}
	}
	return false
}

// refused reports whether err means the store refused the batch for good,
// which is then dropped (logged and counted) rather than buffered: a
// fenced epoch (this process is stale) or a shard bug.
func (u *Uplink) refused(err error, shard, writes int) bool {
	switch {
	case errors.Is(err, gateway.ErrFenced):
		u.fenced.Add(uint64(writes))
		u.m.refused.WithLabelValues(reasonFenced).Add(float64(writes))
		u.log.Error("STORE FENCED THIS GATEWAY EPOCH: a newer process of this gateway is writing; dropping batch",
			"epoch", u.epoch, "shard", shard, "writes", writes, "err", err)
		return true
	case errors.Is(err, gateway.ErrWrongShard), errors.Is(err, gateway.ErrBadShard):
		u.rejected.Add(uint64(writes))
		u.m.refused.WithLabelValues(reasonRejected).Add(float64(writes))
		u.log.Error("store rejected batch as misrouted (a bug); dropping it", "shard", shard, "writes", writes, "err", err)
		return true
	}
	return false
}

// buffer puts items into the outbox and wakes the replay loop.
func (u *Uplink) buffer(items []item) error {
	evicted, unknown, err := u.ob.put(items)
	if err != nil {
		return err
	}
	u.countUnknownAge(unknown)
	if evicted > 0 {
		u.overflow.Add(uint64(evicted))
		u.m.dropped.WithLabelValues(reasonOverflow).Add(float64(evicted))
		u.log.Warn("outbox full: dropped the oldest entries", "writes", evicted, "max_sessions", u.ob.max)
	}
	u.signal(u.wake)
	return nil
}

// bufferOrRequeue buffers items, or puts them back into their queues when
// the outbox cannot take them (the error says so).
func (u *Uplink) bufferOrRequeue(items []item) error {
	if len(items) == 0 {
		return nil
	}
	err := u.buffer(items)
	if err != nil {
		u.requeue(items)
	}
	return err
}

// countUnknownAge counts outbox writes dropped because their age is
// unknown (observed in another boot, or ahead of the boot clock).
func (u *Uplink) countUnknownAge(writes int) {
	if writes == 0 {
		return
	}
	u.unknownAge.Add(uint64(writes))
	u.m.dropped.WithLabelValues(reasonUnknownAge).Add(float64(writes))
	u.log.Warn("outbox: dropped entries of unknown age (observed before a reboot, or ahead of the boot clock); they are never replayed as fresh",
		"writes", writes)
}

// requeue puts items that could be neither sent nor buffered back into
// their queues.
func (u *Uplink) requeue(items []item) {
	perShard := make(map[int][]item)
	for _, it := range items {
		sh := gateway.ShardOf(it.device, u.shards)
		perShard[sh] = append(perShard[sh], it)
	}
	for sh, its := range perShard {
		u.queues[sh].requeue(its)
	}
}
