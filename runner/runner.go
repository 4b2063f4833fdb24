// Package runner is the expiry runner (docs/design.md §2 point 5): it holds
// per-shard lock leases in the store, asks the store for due entries in
// bounded batches, and reports the offline events the store wrote.
//
// Correctness does not rest on the runner: Store.Reap removes an entry
// only in the same atomic step that appends its offline event, so a runner
// killed between any two calls loses nothing (the entry is still there for
// the next runner), and two runners reaping one shard at once (a lease
// that ran out under a slow runner) each reap different entries. The
// leases only keep runners from doing the same work twice.
package runner

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"log/slog"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/fleetgate/fleetgate/gateway"
)

// reapsPerCycle bounds the Reap calls on one shard in one cycle, so that
// a shard with a large backlog cannot starve the others: the cycle moves
// on and the next one starts at once.
const reapsPerCycle = 4

// minSleep is the shortest sleep between cycles when nothing is due: the
// stores keep deadlines in milliseconds.
const minSleep = time.Millisecond

// releaseTimeout bounds releasing the leases when Run ends.
const releaseTimeout = 2 * time.Second

// Options configures a Runner.
type Options struct {
	// Owner names this runner in the shard leases; it must be unique per
	// runner process, e.g. "<gateway-id>/<epoch>". Default
	// "<hostname>/<pid>".
	Owner string
	// Interval is the longest sleep between cycles (runner.interval).
	Interval time.Duration
	// Batch is the limit of one Reap call (runner.batch).
	Batch int
	// LockTTL is the shard lease; it is renewed every LockTTL/3.
	// Default max(5*Interval, 5s).
	LockTTL time.Duration
	// Clock times sleeps and leases; default gateway.SystemClock{}.
	Clock gateway.Clock
	// Logger defaults to discarding.
	Logger *slog.Logger
	// Registerer receives the runner's metrics; nil registers none.
	Registerer prometheus.Registerer
	// OnEvent, if set, is called with every offline event reaped, from
	// Run's goroutine.
	OnEvent func(gateway.Event)
}

// Runner reaps expired entries of the shards it holds a lease on. Create
// it with New and run it with Run.
type Runner struct {
	store   gateway.Reaper
	o       Options
	log     *slog.Logger
	m       *metrics
	leases  *leases
	running atomic.Bool
	// outage is set from a failed store call until the next that works,
	// so that an outage logs one warning, not one per call (Run's
	// goroutine only).
	outage bool
	// cycleBusy: Run is inside a cycle (see Stalled).
	cycleBusy busy
	// due is when each held shard is to be reaped next, on the runner's
	// clock (nextReap); a shard without an entry is due at once (Run's
	// goroutine only).
	due map[int]time.Time

	mu     sync.Mutex
	status Status
}

// Status is a snapshot of a runner for /v1/status.
type Status struct {
	Owner string `json:"owner"`
	// Shards are the shards this runner holds a lease on, ascending.
	Shards  []int  `json:"shards"`
	Cycles  uint64 `json:"cycles"`
	Reaped  uint64 `json:"reaped"`
	Trimmed uint64 `json:"trimmed"`
	Held    uint64 `json:"held"`
	// ReapGaps counts reaps that ended a gap in their shard's reaps
	// (gateway.ReapResult.Gap).
	ReapGaps   uint64 `json:"reap_gaps"`
	ReapCalls  uint64 `json:"reap_calls"`
	ReapErrors uint64 `json:"reap_errors"`
	// LastLag is at − deadline of the last offline event reaped.
	LastLag time.Duration `json:"last_lag_ns"`
	// LastEvent is the store time of the last offline event reaped.
	LastEvent time.Time `json:"last_event,omitzero"`
}

// New returns a runner over s; Options left zero take their defaults.
func New(s gateway.Reaper, o Options) *Runner {
	if o.Owner == "" {
		host, _ := os.Hostname()
		o.Owner = fmt.Sprintf("%s/%d", host, os.Getpid())
	}
	if o.Interval <= 0 {
		o.Interval = gateway.DefaultRunnerInterval
	}
	if o.Batch <= 0 {
		o.Batch = gateway.DefaultRunnerBatch
	}
	if o.LockTTL <= 0 {
		o.LockTTL = max(5*o.Interval, gateway.DefaultRunnerLockTTL)
	}
	if o.Clock == nil {
		o.Clock = gateway.SystemClock{}
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	return &Runner{
		store:  s,
		o:      o,
		log:    o.Logger.With("runner", o.Owner),
		m:      newMetrics(o.Registerer),
		leases: newLeases(s.Shards(), o.Owner, o.LockTTL/3),
		due:    map[int]time.Time{},
		status: Status{Owner: o.Owner, Shards: []int{}},
	}
}

// Run reaps until ctx is done, then releases the leases it holds and
// returns nil. A store error is logged and the call retried in a later
// cycle. Run must not be called again while it runs.
func (r *Runner) Run(ctx context.Context) error {
	if !r.running.CompareAndSwap(false, true) {
		return errors.New("runner: run: already running")
	}
	defer r.running.Store(false)
	defer r.releaseAll(ctx)
	r.log.Info("runner started", "interval", r.o.Interval, "batch", r.o.Batch, "lock_ttl", r.o.LockTTL, "shards", r.store.Shards())
	for {
		r.cycleBusy.begin(r.o.Clock.Now())
		wait := r.cycle(ctx)
		r.cycleBusy.end()
		if ctx.Err() != nil {
			return nil
		}
		if wait <= 0 {
			continue
		}
		t := r.o.Clock.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil
		case <-t.C():
		}
	}
}

// Status returns a snapshot of the runner's counters and leases.
func (r *Runner) Status() Status {
	r.mu.Lock()
	defer r.mu.Unlock()
	s := r.status
	s.Shards = slices.Clone(s.Shards)
	return s
}

// cycle renews the leases when due, reaps the held shards that are due
// and returns how long to sleep: 0 when a shard still has due entries,
// else until the next shard is due (its earliest deadline left, at most
// Interval after its last reap) or the next lease renewal, whichever
// comes first.
func (r *Runner) cycle(ctx context.Context) time.Duration {
	if r.leases.roundDue(r.o.Clock.Now()) {
		r.leaseRound(ctx)
	}
	for _, shard := range r.leases.expire(r.o.Clock.Now()) {
		r.log.Warn("runner: shard lease ran out before it could be renewed", "shard", shard)
	}
	held := r.leases.held()
	r.m.shardsOwned.Set(float64(len(held)))
	// Each shard is reaped when it is due (its own schedule, nextReap),
	// not whenever another shard is: a cycle woken by one shard's
	// deadline calls only that shard.
	var wake time.Time
	for _, shard := range held {
		if ctx.Err() != nil {
			return 0
		}
		if at, ok := r.due[shard]; !ok || !at.After(r.o.Clock.Now()) {
			res, ok := r.reapShard(ctx, shard)
			r.due[shard] = nextReap(r.o.Clock.Now(), res, ok, r.o.Interval)
		}
		if at := r.due[shard]; wake.IsZero() || at.Before(wake) {
			wake = at
		}
	}
	for shard := range r.due {
		if !r.leases.holds(shard) {
			delete(r.due, shard) // reaped at once when held again
		}
	}
	r.mu.Lock()
	r.status.Cycles++
	r.status.Shards = held
	r.mu.Unlock()
	now := r.o.Clock.Now()
	wait := min(r.o.Interval, r.leases.untilRound(now))
	if !wake.IsZero() {
		if !wake.After(now) {
			return 0 // a shard still has due entries
		}
		wait = min(wait, wake.Sub(now))
	}
	return max(wait, minSleep)
}

// nextReap is when a shard whose reap (res; ok false: the call failed)
// ended at now, on the runner's clock, is due again: at once while due
// entries remain, else when its earliest deadline left falls due (res
// reports the store time it ran at, so no call reads the store's clock)
// and at most interval later, which is also when a failed call is tried
// again.
func nextReap(now time.Time, res gateway.ReapResult, ok bool, interval time.Duration) time.Time {
	at := now.Add(interval)
	switch {
	case !ok:
	case res.More:
		at = now
	case !res.Next.IsZero() && res.Next.Sub(res.Now) < interval:
		at = now.Add(res.Next.Sub(res.Now))
	}
	return at
}

// reapShard calls Reap on shard while it reports more due entries, at
// most reapsPerCycle times; it returns the last result, and false if a
// call failed.
func (r *Runner) reapShard(ctx context.Context, shard int) (gateway.ReapResult, bool) {
	var res gateway.ReapResult
	for range reapsPerCycle {
		start := time.Now()
		var err error
		res, err = r.store.Reap(ctx, shard, r.o.Batch)
		r.m.reapDuration.Observe(time.Since(start).Seconds())
		r.m.reapCalls.Inc()
		if err != nil {
			r.m.reapErrors.Inc()
			r.mu.Lock()
			r.status.ReapCalls++
			r.status.ReapErrors++
			r.mu.Unlock()
			r.storeFailed(ctx, "reap", shard, err)
			return gateway.ReapResult{}, false
		}
		r.storeAnswered()
		r.record(shard, res)
		if !res.More {
			break
		}
	}
	return res, true
}

// record counts one successful Reap call and hands its events on.
func (r *Runner) record(shard int, res gateway.ReapResult) {
	r.m.reaped.Add(float64(len(res.Offline)))
	r.m.trimmed.Add(float64(res.Trimmed))
	r.m.held.Add(float64(res.Held))
	if res.Gap {
		r.m.gaps.Inc() // the store logs it
	}
	for _, ev := range res.Offline {
		r.m.lag.Observe(ev.At.Sub(ev.Deadline).Seconds())
		r.log.Debug("device offline", "device", ev.Device, "shard", shard, "ver", ev.Ver, "lag", ev.At.Sub(ev.Deadline))
		if r.o.OnEvent != nil {
			r.o.OnEvent(ev)
		}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.status.ReapCalls++
	r.status.Reaped += uint64(len(res.Offline))
	r.status.Trimmed += uint64(res.Trimmed)
	r.status.Held += uint64(res.Held)
	if res.Gap {
		r.status.ReapGaps++
	}
	if n := len(res.Offline); n > 0 {
		last := res.Offline[n-1]
		r.status.LastLag = last.At.Sub(last.Deadline)
		r.status.LastEvent = last.At
	}
}

// leaseRound extends the leases held and asks for free shards as the
// round allows (see leases).
func (r *Runner) leaseRound(ctx context.Context) {
	p := r.leases.begin(r.o.Clock.Now())
	for _, shard := range r.leases.order {
		held := r.leases.holds(shard)
		if !held && !p.mayTake(r.leases.count()) {
			continue
		}
		start := r.o.Clock.Now()
		ok, err := r.store.AcquireShard(ctx, shard, r.o.Owner, r.o.LockTTL)
		if err == nil {
			r.storeAnswered()
		}
		switch {
		case err != nil:
			r.storeFailed(ctx, "acquire shard", shard, err)
		case ok:
			if !held {
				r.log.Info("runner: shard acquired", "shard", shard)
			}
			r.leases.hold(shard, start.Add(r.o.LockTTL))
		default:
			if held {
				r.log.Warn("runner: shard lease lost to another runner", "shard", shard)
				r.leases.drop(shard)
			}
			p.refused++
		}
	}
	r.leases.end(p)
}

// storeFailed logs a failed store call: a warning for the first failure
// after a success, then debug records until the store answers again.
// Nothing is lost meanwhile: due entries stay in the store until a reap
// succeeds.
func (r *Runner) storeFailed(ctx context.Context, op string, shard int, err error) {
	if ctx.Err() != nil {
		return
	}
	if r.outage {
		r.log.Debug("runner: store call failed", "op", op, "shard", shard, "err", err)
		return
	}
	r.outage = true
	r.log.Warn("runner: store call failed; retrying every cycle", "op", op, "shard", shard, "err", err)
}

// storeAnswered ends an outage begun by storeFailed.
func (r *Runner) storeAnswered() {
	if r.outage {
		r.outage = false
		r.log.Info("runner: store answers again")
	}
}

// releaseAll gives up every lease held, so that another runner can take
// the shards at once instead of after LockTTL.
func (r *Runner) releaseAll(ctx context.Context) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), releaseTimeout)
	defer cancel()
	r.leases.expire(r.o.Clock.Now())
	for _, shard := range r.leases.held() {
		if err := r.store.ReleaseShard(ctx, shard, r.o.Owner); err != nil {
			r.log.Warn("runner: release shard", "shard", shard, "err", err)
		}
		r.leases.drop(shard)
	}
	r.m.shardsOwned.Set(0)
	r.mu.Lock()
	r.status.Shards = []int{}
	r.mu.Unlock()
	r.log.Info("runner stopped")
}

// rotation is where owner starts its walk over the shards: runners
// starting together contend for different shards first.
func rotation(owner string, shards int) int {
	h := fnv.New32a()
	h.Write([]byte(owner))
	return int(h.Sum32() % uint32(shards))
}
