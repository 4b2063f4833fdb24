// Package uplink carries the gateway's session writes to the central
// store (docs/design.md §2 points 3–4): a batcher that coalesces pending writes
// per session and flushes them per shard every flush interval or at
// max_batch, with a bounded queue that pushes back on the session table;
// a bbolt outbox that buffers what the store could not take, coalesced
// per session and bounded, and replays it once the store answers; and the
// uplink's health per shard (up/down, probed with jittered backoff): a
// shard the store does not answer for sends to the outbox while the
// others are written at once (health.go).
//
// Pending writes coalesce per session, in the queue and in the outbox
// alike: the newest evidence wins, except that a leave is kept ahead of a
// later connect or renew of the same session (both are sent, leave first,
// so the store writes the offline and online events that happened).
// Order per session is kept across an outage: while the outbox holds
// entries of a shard, new writes of that shard go through it too, so an
// older buffered write never overtakes a newer one.
package uplink

import (
	"context"
	"fmt"
	"log/slog"
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
	// Timeout bounds one store call (ApplyShards, or Probe of the down
	// shards) and the final flush of Run.
	Timeout time.Duration
	// ProbeMin and ProbeMax bound the jittered exponential backoff between
	// probes of a down shard.
	ProbeMin, ProbeMax time.Duration
	// GatewayGrace is presence.gateway_grace: the outbox replays evidence
	// whose lease has run out by up to this much (the store still takes
	// late but valid evidence then, and moves a passed deadline to it),
	// and drops it after.
	GatewayGrace time.Duration
	// KeepAlive is the longest the uplink leaves a shard without a store
	// call while the shard is up: a shard not written for that long gets
	// an empty batch in the next call (one is made for it when nothing
	// else is pending), so that the store hears from this gateway on
	// every shard (gateway liveness, see gateway.Batch.Behind). Default
	// DefaultKeepAlive.
	KeepAlive time.Duration
	// Sessions calls fn for each live session of this gateway and each
	// whose lease ran out lately (the session table's Restorable) until
	// fn returns false. After a store call answers
	// that a shard's state was lost or replaced (gateway.ApplyResult.Reset)
	// the uplink re-sends those of that shard as a restore
	// (gateway.Batch.Restore), so that the store knows again every device
	// this gateway holds: none is reported online twice, and one that
	// stopped before the loss still gets its offline. A session whose
	// deadline has passed is re-sent only if a write of it had been
	// accepted (SessionView.LastSent). Nil re-sends nothing.
	Sessions func(fn func(gateway.SessionView) bool)
	// Ledger, when set, keeps the sessions of Sessions in the state file
	// (ledger.go), and a restore after a loss also re-sends those a
	// previous process of this gateway recorded there and the outbox's
	// replayed ones. Nil keeps none.
	Ledger *Ledger
	// Unread returns the time before which everything observed outside
	// this process (the adapters' streams: adapter.Host.Unread) has been
	// read and handed to the uplink; zero when nothing says. The coverage
	// stops before it, up to two flush intervals (cover.go). Nil: none.
	Unread func() time.Time

	Clock      gateway.Clock
	Logger     *slog.Logger
	Registerer prometheus.Registerer
}

// Uplink batches writes to the store and buffers them in the outbox while
// the store is down. Its goroutines run inside Run.
type Uplink struct {
	store  gateway.Writer
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

	queues  []*queue
	blocked blocked       // Enqueue calls waiting for room (cover.go)
	stall   stall         // the coverage held after this process stalled (cover.go)
	kick    chan struct{} // a shard reached MaxBatch, or the timing changed
	wake    chan struct{} // the replay loop may have work: outbox filled, or a shard up
	probe   chan struct{} // a shard went down

	// sendMu serializes flushes and replay rounds, so that the choice
	// between store and outbox and the order per session hold. Probes
	// write nothing and run without it.
	sendMu sync.Mutex
	// heard is when each shard last took a call of this process (zero:
	// none yet, so its epoch is not recorded there).
	heard []time.Time // under sendMu
	// restoreDue marks the shards whose restore has not gone through yet
	// (restoreShards): each call that the shard answers tries again.
	restoreDue []bool // under sendMu
	// left are the leaves the store accepted, restorable for a while
	// (restore.go, noteLeaves), and leftPruned its length when last
	// pruned; under sendMu.
	left       []leftSession
	leftPruned int
	keepAlive  time.Duration
	grace      time.Duration // Options.GatewayGrace
	// flushBusy, outboxBusy and probeBusy: the flush, replay and probe
	// loops are inside a step (see Stalled).
	flushBusy, outboxBusy, probeBusy busy
	sessions                         func(fn func(gateway.SessionView) bool)
	unread                           func() time.Time
	ledger                           *Ledger
	// incMu guards incs (the incarnation each shard's calls met in this
	// process; "" before the first) and restoredIncs (the one this
	// gateway's sessions were last restored on, or found standing on,
	// the previous process's from the ledger until then).
	incMu              sync.Mutex
	incs, restoredIncs []string
	// started is when this process's uplink was made: replayed evidence
	// observed before is a previous process's.
	started time.Time

	// hmu guards the health of the shards (health.go): ndown of them are
	// down; since is when the uplink (every shard) last went down or up,
	// lastErr the newest error of a down shard.
	hmu      sync.Mutex
	health   []shardHealth
	ndown    int
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

// New returns an uplink to store that buffers in ob, which must be opened
// for the store's shard count (it panics otherwise). Call Run to start
// its flush, probe and replay loops.
func New(store gateway.Writer, ob *Outbox, o Options) *Uplink {
	if ob.shards != store.Shards() {
		panic(fmt.Sprintf("uplink: outbox opened for %d shards, the store has %d", ob.shards, store.Shards()))
	}
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
		grace:         max(o.GatewayGrace, 0),
		sessions:      o.Sessions,
		unread:        o.Unread,
		ledger:        o.Ledger,
		kick:          make(chan struct{}, 1),
		wake:          make(chan struct{}, 1),
		probe:         make(chan struct{}, 1),
		since:         o.Clock.Now(),
		started:       o.Clock.Now(),
	}
	u.tm = u.makeTiming(o.Lease, o.FlushInterval, o.MaxBatch)
	u.heard = make([]time.Time, u.shards)
	u.restoreDue = make([]bool, u.shards)
	u.incs, u.restoredIncs = make([]string, u.shards), make([]string, u.shards)
	if o.Ledger != nil {
		for s, inc := range o.Ledger.Incarnations() {
			if s >= 0 && s < u.shards {
				u.restoredIncs[s] = inc
			}
		}
		// the predecessor's devices are heard again only as they send
		// (cover.go)
		if from, until, held := restartHold(o.Ledger.Last(), u.started, u.tm.lease, u.tm.lease+u.grace); held {
			u.stall.note(from, until)
		}
	}
	u.health = make([]shardHealth, u.shards)
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
	var done func()
	defer func() {
		if done != nil {
			done()
		}
	}()
	for {
		t := u.timing()
		ok, space := q.tryAdd(ev, t.queueLimit)
		if ok {
			if q.pending() >= t.maxBatch {
				u.signal(u.kick)
			}
			return nil
		}
		if done == nil {
			// what waits here is not yet written: the coverage stops
			// before it (cover.go)
			done = u.blocked.wait(ev.ObservedAt)
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
// probes the shards that are down and replays the outbox, until ctx is
// done; then it does a final flush, to the store or the outbox, bounded
// by Options.Timeout. It returns only the final flush's error.
func (u *Uplink) Run(ctx context.Context) error {
	g, gctx := errgroup.WithContext(ctx)
	g.Go(func() error { u.flushLoop(gctx); return nil })
	g.Go(func() error { u.probeLoop(gctx); return nil })
	g.Go(func() error { u.replayLoop(gctx); return nil })
	g.Go(func() error { u.ledgerLoop(gctx); return nil })
	_ = g.Wait()
	fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), u.timeout)
	defer cancel()
	err := u.Flush(fctx)
	if lerr := u.rewriteLedger(u.clock.Now()); lerr != nil {
		u.m.ledgerErrors.Inc()
		u.log.Warn("session ledger not written at shutdown; a restore after a store loss may miss sessions", "err", lerr)
	}
	return err
}

// pending is the number of writes waiting in the queues of all shards.
func (u *Uplink) pending() int {
	n := 0
	for _, q := range u.queues {
		n += q.pending()
	}
	return n
}
