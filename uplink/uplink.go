// Package uplink carries the gateway's session writes to the central
// store (DESIGN §2 points 3–4): a batcher that coalesces pending writes
// per session and flushes them per shard every flush interval or at
// max_batch, with a bounded queue that pushes back on the session table;
// a bbolt outbox that buffers what the store could not take, coalesced
// per session and bounded, and replays it once the store answers; and the
// uplink's health (up/down, probed with jittered backoff).
//
// Pending writes coalesce per session, in the queue and in the outbox
// alike: the newest evidence wins, except that a leave is kept ahead of a
// later connect or renew of the same session (both are sent, leave first,
// so the store writes the offline and online events that happened).
// Order per session is kept across an outage: while the outbox holds
// anything, new writes go through it too, so an older buffered write never
// overtakes a newer one.
package uplink

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fleetgate/fleetgate/gateway"
	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sync/errgroup"
)

// Defaults for Options fields left zero.
const (
	DefaultTimeout   = 3 * time.Second
	DefaultProbeMin  = 100 * time.Millisecond
	DefaultProbeMax  = 10 * time.Second
	DefaultKeepAlive = 10 * time.Second
	// LeaveGraceFlushes is the leave grace in flush intervals: a leave is
	// sent at the first flush at least this many intervals after it was
	// observed, so the offline event of a leave comes at most
	// LeaveGraceFlushes+1 intervals (plus the store call) after it.
	LeaveGraceFlushes = 2
)

// Options configure an Uplink.
type Options struct {
	// Gateway and Epoch identify this process in every batch (fencing).
	Gateway string
	Epoch   uint64

	Lease         time.Duration
	FlushInterval time.Duration
	// MaxBatch bounds the writes of one store call; a shard holding that
	// many pending writes is flushed at once. Values below 2 are raised
	// to 2 (a session's leave and its later connect travel together).
	MaxBatch int
	// QueueLimit is the pending writes per shard at which Enqueue blocks
	// (backpressure); default 4*MaxBatch, never below MaxBatch.
	QueueLimit int
	// Timeout bounds one store call (Apply, or Now when probing) and the
	// final flush of Run.
	Timeout time.Duration
	// ProbeMin and ProbeMax bound the jittered exponential backoff between
	// probes of a down store.
	ProbeMin, ProbeMax time.Duration
	// KeepAlive is the longest the uplink leaves a shard without a store
	// call while the store is up: a shard not written for that long gets
	// an empty batch in the next call (one is made for it when nothing
	// else is pending), so that the store hears from this gateway on
	// every shard (gateway liveness, see gateway.Batch.Behind). Default
	// DefaultKeepAlive.
	KeepAlive time.Duration
	// Sessions calls fn for each live session of this gateway (the session
	// table's Range) until fn returns false. After a store call answers
	// that a shard's state was lost or replaced (gateway.ApplyResult.Reset)
	// the uplink re-sends those of that shard as a restore
	// (gateway.Batch.Restore), so that the store knows again every device
	// this gateway holds: none is reported online twice, and one that
	// stopped just before the loss still gets its offline. Nil re-sends
	// nothing.
	Sessions func(fn func(gateway.SessionView) bool)

	Clock      gateway.Clock
	Logger     *slog.Logger
	Registerer prometheus.Registerer
}

// Uplink batches writes to the store and buffers them in the outbox while
// the store is down. Its goroutines run inside Run.
type Uplink struct {
	store  gateway.Store
	ob     *Outbox
	shards int
	gw     string
	epoch  uint64
	clock  gateway.Clock
	log    *slog.Logger
	m      *metrics

	timeout            time.Duration
	probeMin, probeMax time.Duration
	queueLimitOpt      int

	tmu sync.Mutex
	tm  timing

	queues []*queue
	kick   chan struct{} // a shard reached MaxBatch, or the timing changed
	wake   chan struct{} // the health loop has work: down, or outbox filled

	// sendMu serializes flushes and replay rounds, so that the choice
	// between store and outbox and the order per session hold.
	sendMu sync.Mutex
	// announced: this process's epoch is recorded on every shard (write).
	announced bool // under sendMu
	// heard is when each shard last took a call of this process.
	heard     []time.Time // under sendMu
	keepAlive time.Duration
	// flushBusy and outboxBusy: the flush loop and the replay loop are
	// inside a step (see Stalled).
	flushBusy, outboxBusy busy
	sessions              func(fn func(gateway.SessionView) bool)

	hmu      sync.Mutex
	up       bool
	since    time.Time
	lastErr  error
	lapsed   atomic.Uint64
	overflow atomic.Uint64
	// unknownAge counts outbox writes dropped for an unknown age.
	unknownAge atomic.Uint64
	fenced     atomic.Uint64
	rejected   atomic.Uint64
}

type timing struct {
	lease      time.Duration
	interval   time.Duration
	maxBatch   int
	queueLimit int
	// leaveGrace is how long a leave waits in the queue: two flush
	// intervals (see queue.take).
	leaveGrace time.Duration
}

var _ gateway.Uplink = (*Uplink)(nil)

// New returns an uplink to store that buffers in ob. Call Run to start
// its flush and health loops.
func New(store gateway.Store, ob *Outbox, o Options) *Uplink {
	if o.Clock == nil {
		o.Clock = gateway.SystemClock{}
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	if o.Timeout <= 0 {
		o.Timeout = DefaultTimeout
	}
	if o.ProbeMin <= 0 {
		o.ProbeMin = DefaultProbeMin
	}
	if o.ProbeMax < o.ProbeMin {
		o.ProbeMax = max(DefaultProbeMax, o.ProbeMin)
	}
	if o.KeepAlive <= 0 {
		o.KeepAlive = DefaultKeepAlive
	}
	u := &Uplink{
		store:         store,
		ob:            ob,
		shards:        store.Shards(),
		gw:            o.Gateway,
		epoch:         o.Epoch,
		clock:         o.Clock,
		log:           o.Logger,
		timeout:       o.Timeout,
		probeMin:      o.ProbeMin,
		probeMax:      o.ProbeMax,
		queueLimitOpt: o.QueueLimit,
		keepAlive:     o.KeepAlive,
		sessions:      o.Sessions,
		kick:          make(chan struct{}, 1),
		wake:          make(chan struct{}, 1),
		up:            true,
		since:         o.Clock.Now(),
	}
	u.tm = u.makeTiming(o.Lease, o.FlushInterval, o.MaxBatch)
	u.heard = make([]time.Time, u.shards)
	u.queues = make([]*queue, u.shards)
	for i := range u.queues {
		u.queues[i] = newQueue()
	}
	u.m = newMetrics(u, o.Registerer)
	return u
}

func (u *Uplink) makeTiming(lease, interval time.Duration, maxBatch int) timing {
	if lease <= 0 {
		lease = gateway.DefaultLease
	}
	if interval <= 0 {
		interval = gateway.DefaultFlushInterval
	}
	if maxBatch <= 0 {
		maxBatch = gateway.DefaultMaxBatch
	}
	maxBatch = max(maxBatch, 2)
	limit := u.queueLimitOpt
	if limit <= 0 {
		limit = 4 * maxBatch
	}
	return timing{lease: lease, interval: interval, maxBatch: maxBatch, queueLimit: max(limit, maxBatch), leaveGrace: LeaveGraceFlushes * interval}
}

// SetTiming changes the lease, flush interval and batch size (SIGHUP
// reload); zero values take the defaults. It applies from the next flush.
func (u *Uplink) SetTiming(lease, flush time.Duration, maxBatch int) {
	t := u.makeTiming(lease, flush, maxBatch)
	u.tmu.Lock()
	u.tm = t
	u.tmu.Unlock()
	u.signal(u.kick)
}

func (u *Uplink) timing() timing {
	u.tmu.Lock()
	defer u.tmu.Unlock()
	return u.tm
}

func (u *Uplink) signal(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}

// Enqueue queues ev for the next flush of its shard, coalesced with what
// its session already has pending. It blocks while the shard's queue is
// at QueueLimit, until a flush makes room or ctx is done (then the error
// wraps both gateway.ErrOverloaded and ctx.Err()).
func (u *Uplink) Enqueue(ctx context.Context, ev gateway.Evidence) error {
	if ev.Kind < gateway.Connect || ev.Kind > gateway.Leave {
		return fmt.Errorf("uplink: enqueue %s/%s: unknown evidence %v", ev.Device, ev.Session, ev.Kind)
	}
	q := u.queues[gateway.ShardOf(ev.Device, u.shards)]
	if ev.Lease <= 0 {
		// The lease in force now travels with the evidence: a reload
		// changes nothing already queued or buffered.
		ev.Lease = u.timing().lease
	}
	for {
		t := u.timing()
		ok, space := q.tryAdd(ev, t.queueLimit)
		if ok {
			if q.pending() >= t.maxBatch {
				u.signal(u.kick)
			}
			return nil
		}
		u.signal(u.kick)
		select {
		case <-space:
		case <-ctx.Done():
			return fmt.Errorf("uplink: enqueue: %w: %w", gateway.ErrOverloaded, ctx.Err())
		}
	}
}

// Run flushes every flush interval (or when a shard reaches MaxBatch),
// watches the store's health and replays the outbox, until ctx is done;
// then it does a final flush, to the store or the outbox, bounded by
// Options.Timeout. It returns only the final flush's error.
func (u *Uplink) Run(ctx context.Context) error {
	g, gctx := errgroup.WithContext(ctx)
	g.Go(func() error { u.flushLoop(gctx); return nil })
	g.Go(func() error { u.healthLoop(gctx); return nil })
	_ = g.Wait()
	fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), u.timeout)
	defer cancel()
	return u.Flush(fctx)
}

func (u *Uplink) flushLoop(ctx context.Context) {
	for {
		t := u.clock.NewTimer(u.timing().interval)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C():
		case <-u.kick:
			t.Stop()
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
// while the store is down or the outbox is not yet replayed. An error
// means writes could be neither sent nor buffered; they stay queued.
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

// flushOnce takes up to MaxBatch writes per shard and sends them in one
// store call; what fails goes to the outbox in one transaction. While the
// uplink is down or the outbox holds entries it moves everything pending
// to the outbox instead. Unless force, a leave observed less than the
// leave grace ago stays queued (a move between gateways with a clean
// goodbye: the new gateway's connect lands first).
func (u *Uplink) flushOnce(ctx context.Context, force bool) error {
	u.sendMu.Lock()
	defer u.sendMu.Unlock()
	t := u.timing()
	toOutbox := !u.isUp() || u.ob.Len() > 0
	limit := t.maxBatch
	now, hold := u.clock.Now(), time.Duration(0)
	if !force && !toOutbox {
		hold = t.leaveGrace
	}
	if toOutbox {
		limit = math.MaxInt
	}
	taken := make([][]item, u.shards)
	total := 0
	for i, q := range u.queues {
		var n int
		taken[i], n = q.take(limit, now, hold)
		total += n
	}
	if total == 0 {
		if !toOutbox && u.keepAliveDue() {
			u.write(ctx, t, flushWrite, nil)
		}
		return nil
	}
	var failed []item
	if toOutbox {
		for _, items := range taken {
			failed = append(failed, items...)
		}
	} else {
		var ws []shardWrites
		var items [][]item
		for shard, its := range taken {
			if len(its) > 0 {
				ws = append(ws, shardWrites{shard: shard, tws: appendWrites(nil, its), coalesced: slices.ContainsFunc(its, merged)})
				items = append(items, its)
			}
		}
		var first error
		for i, err := range u.write(ctx, t, flushWrite, ws) {
			if err != nil {
				failed = append(failed, items[i]...)
				first = cmp.Or(first, err)
			}
		}
		if first != nil {
			u.markDown(first)
		}
	}
	if len(failed) > 0 {
		if err := u.buffer(failed); err != nil {
			u.restore(failed)
			return err
		}
	}
	for _, q := range u.queues {
		if q.pending() >= t.maxBatch {
			u.signal(u.kick)
			break
		}
	}
	return nil
}

// shardWrites is one shard's writes for a store call; coalesced says
// that some stand for several observations (gateway.Batch.Coalesced).
type shardWrites struct {
	shard     int
	tws       []timedWrite
	coalesced bool
}

// merged reports whether it stands for several observations.
func merged(it item) bool { return it.merged }

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
// refused), else the error of a store that did not take it. Called with
// sendMu held.
//
// The call also carries an empty batch for each shard ws leaves out that
// has not heard from this process for KeepAlive (gateway liveness), and
// for every such shard until this process's epoch is recorded on all of
// them: the stores keep the newest epoch per shard, so without it a
// delayed batch of an older process of this gateway would still be
// accepted on a shard this process has not written to yet (invariant 3).
// Every batch says whether the outbox still holds writes (Behind).
//
// A shard whose state the store lost or replaced (ApplyResult.Reset)
// gets its live sessions restored (restoreShards) unless the call was
// itself a restore: the next calls' renewals write what is left.
func (u *Uplink) write(ctx context.Context, t timing, kind writeKind, ws []shardWrites) []error {
	now := u.clock.Now()
	behind := u.ob.Len() > 0
	batches := make([]gateway.ShardBatch, 0, len(ws))
	for _, w := range ws {
		b := u.batch(t, kind == replayWrite, behind, withAges(w.tws, now))
		b.Restore = kind == restoreWrite
		b.Coalesced = w.coalesced
		batches = append(batches, gateway.ShardBatch{Shard: w.shard, Batch: b})
	}
	has := make([]bool, u.shards)
	for _, w := range ws {
		has[w.shard] = true
	}
	for shard := range has {
		if !has[shard] && (!u.announced || now.Sub(u.heard[shard]) >= u.keepAlive) {
			batches = append(batches, gateway.ShardBatch{Shard: shard, Batch: u.batch(t, false, behind, nil)})
		}
	}
	if len(batches) == 0 {
		return nil
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
	var reset []int
	for i, r := range results {
		sb := batches[i]
		u.m.flushes.Inc()
		u.m.flushSeconds.Observe(took)
		if r.Err == nil && r.Result.Reset {
			reset = append(reset, sb.Shard)
		}
		if r.Err == nil {
			u.heard[sb.Shard] = now
			for _, w := range sb.Batch.Writes {
				u.m.written.WithLabelValues(w.Kind.String()).Inc()
			}
			continue
		}
		u.m.flushErrors.Inc()
		err := fmt.Errorf("uplink: apply shard %d: %w", sb.Shard, r.Err)
		// a refused restore is reported too: no session of it was restored
		if !u.refused(err, sb.Shard, len(sb.Batch.Writes)) || kind == restoreWrite {
			errs[i] = err
		}
	}
	if !u.announced && !slices.ContainsFunc(errs, func(err error) bool { return err != nil }) {
		u.announced = true
	}
	if len(reset) > 0 && kind != restoreWrite {
		u.restoreShards(parent, t, reset)
	}
	return errs[:len(ws)]
}

// restoreShards re-sends this gateway's live sessions of the shards whose
// state the store lost or replaced (Options.Sessions), as renewals of
// their newest evidence in restore batches of at most MaxBatch writes:
// round k writes the k-th batch of every shard, all in one write call.
// A session with a connect still queued is left out: that connect, not a
// silent restore, must bring it online. A session whose leave is queued
// (it is gone from the table) is restored from the leave's observation,
// so that the leave still finds it and writes its offline. It is best
// effort: a failed batch is logged and its shard's later batches are not
// sent, and the sessions' next renewals write them anyway. Called with
// sendMu held.
func (u *Uplink) restoreShards(ctx context.Context, t timing, shards []int) {
	if u.sessions == nil {
		return
	}
	want := make([]bool, u.shards)
	for _, s := range shards {
		want[s] = true
	}
	now := u.clock.Now()
	per := make(map[int][]timedWrite)
	n := 0
	queued := make(map[key]slot)
	for _, s := range shards {
		q := u.queues[s]
		q.mu.Lock()
		for k, sl := range q.slots {
			queued[k] = *sl
			if sl.kind != gateway.Connect && !sl.leave.IsZero() && now.Sub(sl.leave) < t.lease {
				lease := cmp.Or(sl.leaveLease, t.lease)
				per[s] = append(per[s], timedWrite{sl.leave, gateway.Write{Device: k.device, Session: k.session, Kind: gateway.Renew, Lease: lease}})
				n++
			}
		}
		q.mu.Unlock()
	}
	u.sessions(func(v gateway.SessionView) bool {
		s := gateway.ShardOf(v.Device, u.shards)
		sl, isQueued := queued[key{v.Device, v.Session}]
		// its newest evidence, with the lease that holds it until the
		// session's deadline
		if want[s] && v.Deadline.After(now) && !(isQueued && (sl.kind == gateway.Connect || !sl.leave.IsZero())) {
			per[s] = append(per[s], timedWrite{v.LastSeen, gateway.Write{Device: v.Device, Session: v.Session, Kind: gateway.Renew,
				Lease: v.Deadline.Sub(v.LastSeen)}})
			n++
		}
		return true
	})
	u.log.Warn("store lost or replaced this gateway's shards: restoring their live sessions", "shards", shards, "sessions", n)
	for len(per) > 0 {
		var ws []shardWrites
		for s, tws := range per {
			k := min(len(tws), t.maxBatch)
			ws = append(ws, shardWrites{shard: s, tws: tws[:k]})
		}
		for i, err := range u.write(ctx, t, restoreWrite, ws) {
			w := ws[i]
			if err != nil {
				u.log.Warn("restore failed", "shard", w.shard, "sessions", len(w.tws), "err", err)
				delete(per, w.shard)
				continue
			}
			u.m.restored.Add(float64(len(w.tws)))
			if rest := per[w.shard][len(w.tws):]; len(rest) > 0 {
				per[w.shard] = rest
			} else {
				delete(per, w.shard)
			}
		}
	}
}

// batch is a batch of this process with writes.
func (u *Uplink) batch(t timing, replay, behind bool, ws []gateway.Write) gateway.Batch {
	return gateway.Batch{Gateway: u.gw, Epoch: u.epoch, Lease: t.lease, Replay: replay, Behind: behind, Writes: ws}
}

// keepAliveDue reports whether a shard has not heard from this process
// for KeepAlive. Called with sendMu held.
func (u *Uplink) keepAliveDue() bool {
	now := u.clock.Now()
	for _, h := range u.heard {
		if now.Sub(h) >= u.keepAlive {
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

// buffer puts items into the outbox and wakes the health loop.
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

// restore puts items that could be neither sent nor buffered back into
// their queues.
func (u *Uplink) restore(items []item) {
	perShard := make(map[int][]item)
	for _, it := range items {
		sh := gateway.ShardOf(it.device, u.shards)
		perShard[sh] = append(perShard[sh], it)
	}
	for sh, its := range perShard {
		u.queues[sh].restore(its)
	}
}

func (u *Uplink) pending() int {
	n := 0
	for _, q := range u.queues {
		n += q.pending()
	}
	return n
}

// Status is the uplink's state for /v1/status (marshalled as it is).
type Status struct {
	// Up is false while the store does not answer; Since is when Up last
	// changed, LastError why it went down.
	Up        bool      `json:"up"`
	Since     time.Time `json:"since"`
	LastError string    `json:"last_error,omitempty"`
	// OutboxSessions is the outbox's entries; OutboxOldest the age of the
	// oldest evidence in it (0 when empty).
	OutboxSessions int           `json:"outbox_sessions"`
	OutboxOldest   time.Duration `json:"outbox_oldest_age_ns"`
	// Pending is the writes waiting in the batcher.
	Pending int     `json:"pending"`
	Dropped Dropped `json:"dropped"`
}

// Dropped counts writes given up, by reason.
type Dropped struct {
	// Overflow: oldest outbox entries dropped over outbox_max_sessions.
	Overflow uint64 `json:"overflow"`
	// Lapsed: outbox evidence whose lease ran out before it was replayed.
	Lapsed uint64 `json:"lapsed"`
	// UnknownAge: outbox evidence whose age could not be known (observed
	// before a reboot, or ahead of the boot clock); never replayed.
	UnknownAge uint64 `json:"unknown_age"`
	// Fenced: refused by the store because a newer epoch of this gateway
	// exists.
	Fenced uint64 `json:"fenced"`
	// Rejected: refused by the store as misrouted (a bug).
	Rejected uint64 `json:"rejected"`
}

// Status reports the uplink's state.
func (u *Uplink) Status() Status {
	u.hmu.Lock()
	s := Status{Up: u.up, Since: u.since}
	if u.lastErr != nil {
		s.LastError = u.lastErr.Error()
	}
	u.hmu.Unlock()
	s.OutboxSessions = u.ob.Len()
	s.OutboxOldest = u.outboxOldest()
	s.Pending = u.pending()
	s.Dropped = Dropped{
		Overflow:   u.overflow.Load(),
		Lapsed:     u.lapsed.Load(),
		UnknownAge: u.unknownAge.Load(),
		Fenced:     u.fenced.Load(),
		Rejected:   u.rejected.Load(),
	}
	return s
}

func (u *Uplink) outboxOldest() time.Duration {
	o := u.ob.Oldest()
	if o.IsZero() {
		return 0
	}
	return max(u.clock.Now().Sub(o), 0)
}
