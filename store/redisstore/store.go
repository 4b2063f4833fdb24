// Package redisstore is the Redis implementation of gateway.Store
// (DESIGN §3). Each shard s keeps its keys under the hash tag {P:s}, so one
// Lua script call touches one Redis Cluster slot; the store works unchanged
// against a single Redis and a Redis Cluster through redis.UniversalClient.
//
// Every Apply is one script call per shard and batch, every Reap one script
// call; the scripts read the store clock (Redis TIME), check the gateway
// epoch, keep the packed device records and the deadline index, and append
// the events in the same atomic step (lua/record.lua documents the layout).
package redisstore

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/fleetgate/fleetgate/gateway"
)

// Schema is the version of the key layout and packed record, stored in
// P:meta next to the shard count.
const Schema = "1"

var (
	//go:embed lua/record.lua
	recordLua string
	//go:embed lua/apply.lua
	applyLua string
	//go:embed lua/reap.lua
	reapLua string
	//go:embed lua/view.lua
	viewLua string
	//go:embed lua/lease.lua
	leaseLua string
)

// Options configures Open.
type Options struct {
	// Prefix is the key prefix P; default "fleetgate".
	Prefix string
	// Shards is the shard count (≥ 1); it must match P:meta if present.
	Shards int
	// EventsMaxLen caps each shard's event stream (XADD MAXLEN ~);
	// default 1,000,000 / Shards.
	EventsMaxLen int64
	// Now is a test clock: when non-nil its millisecond value is passed to
	// the scripts instead of Redis TIME. Production leaves it nil.
	Now func() time.Time
	// Logger receives warnings; default slog.Default().
	Logger *slog.Logger
	// GatewayGrace is presence.gateway_grace: how long a due device is
	// held (not reaped) while the gateway that wrote it last is not heard
	// (record.lua, "Held devices"). Zero holds nothing.
	GatewayGrace time.Duration
	// GatewaySilence is the longest a live gateway goes without a store
	// call on a shard (its keep-alive with a margin); a gateway not heard
	// for longer is silent.
	GatewaySilence time.Duration
	// GatewayLost is how long a gateway may go unheard before the reap of
	// shard 0 writes one `lost` event for it to the gateways stream
	// ({P:0}:gateways), and one `back` event when it writes again: the
	// lease (a gateway silent that long has lost its devices' evidence).
	// Zero writes no gateway events.
	GatewayLost time.Duration
	// WaitReplicas is store.redis.wait_replicas: when set, a call whose
	// batches wrote events, or replayed an outbox, waits (WAIT) until that
	// many replicas have its writes, for at most WaitTimeout; with fewer,
	// each such batch fails with gateway.ErrUnavailable, so that the
	// uplink keeps it in its outbox and replays it (a replay is
	// idempotent). A standalone server only (with its replicas): a
	// Cluster is refused.
	WaitReplicas int
	WaitTimeout  time.Duration
	// WatchWaits caps the waits (WaitEvents: idle watch streams) the
	// store serves at once; one more fails at once with gateway.ErrBusy.
	// The readers' connection pool is sized to hold them: one connection
	// per wait on a standalone server (default 224), one per shard on a
	// Cluster node (default 64 waits).
	WatchWaits int
}

// Store is a gateway.Store over Redis. A store made by Open uses the
// caller's client and leaves it open; one made by Dial owns its client
// and closes it.
type Store struct {
	c      redis.UniversalClient // set once, before ready is closed
	prefix string
	shards int
	maxLen string
	now    func() time.Time
	log    *slog.Logger
	keys   []shardKeys

	apply, reap, view, lease *redis.Script

	beliefs beliefSet
	opened  time.Time // localNow's origin

	grace, silence int64 // ms, Options.GatewayGrace and GatewaySilence
	lostAfter      int64 // ms, Options.GatewayLost
	waitReplicas   int
	waitTimeout    time.Duration
	watchWaits     int // Options.WatchWaits
	rmu            sync.Mutex
	reaps          []reapState // per shard
	// clock estimates the store's clock from the script replies (clock.go).
	clock storeClock

	// ready is closed once c is set and P:meta checked; until then every
	// call fails with gateway.ErrUnavailable (Dial with Background).
	ready chan struct{}
	// closeFn, set by Dial, ends its background opener and closes the
	// client it made.
	closeFn func() error

	watch watchState // the event log's readers (watch.go)
}

// shardKeys are the keys of one shard, in the order the scripts expect.
type shardKeys struct {
	data   []string // exp, dev, events, epochs, inv, held
	runner []string
}

// reapState is what the reaps of one shard learned of the store's
// outages: a gateway counts as live only once heard after the end of the
// last one (since, store ms). failed: the last reap failed, so the next
// one cannot tell when the outage ended and counts no gateway as live.
type reapState struct {
	inc    string
	failed bool
	since  int64
}

var _ gateway.Store = (*Store)(nil)

// Open checks P:meta against o.Shards and Schema, creating it on first
// use, and loads the scripts. A mismatch wraps gateway.ErrShardMismatch.
// The store uses c and leaves it open on Close.
func Open(ctx context.Context, c redis.UniversalClient, o Options) (*Store, error) {
	s, err := newStore(o)
	if err != nil {
		return nil, err
	}
	if err := s.open(ctx, c); err != nil {
		return nil, err
	}
	return s, nil
}

// newStore makes a store that is not ready yet.
func newStore(o Options) (*Store, error) {
	if o.Shards < 1 {
		return nil, fmt.Errorf("redisstore: open: shards %d < 1", o.Shards)
	}
	if o.Prefix == "" {
		o.Prefix = "fleetgate"
	}
	if strings.ContainsAny(o.Prefix, "{}") {
		return nil, fmt.Errorf("redisstore: open: prefix %q: braces would break the {P:s} hash tags", o.Prefix)
	}
	if o.EventsMaxLen <= 0 {
		o.EventsMaxLen = max(1, 1_000_000/int64(o.Shards))
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	s := &Store{
		prefix: o.Prefix,
		shards: o.Shards,
		maxLen: strconv.FormatInt(o.EventsMaxLen, 10),
		now:    o.Now,
		log:    o.Logger.With("store", "redis", "prefix", o.Prefix),
		apply:  redis.NewScript(recordLua + applyLua),
		reap:   redis.NewScript(recordLua + reapLua),
		view:   redis.NewScript(recordLua + viewLua),
		lease:  redis.NewScript(leaseLua),
		ready:  make(chan struct{}),
		grace:  o.GatewayGrace.Milliseconds(),
		reaps:  make([]reapState, o.Shards),
	}
	s.silence = o.GatewaySilence.Milliseconds()
	s.lostAfter = o.GatewayLost.Milliseconds()
	s.waitReplicas, s.waitTimeout = o.WaitReplicas, o.WaitTimeout
	s.watchWaits = max(o.WatchWaits, 0)
	if s.waitTimeout <= 0 {
		s.waitTimeout = callTimeout / 2
	}
	s.opened = time.Now()
	if s.now != nil {
		s.opened = s.now()
	}
	for i := 0; i < o.Shards; i++ {
		tag := fmt.Sprintf("{%s:%d}", o.Prefix, i)
		s.keys = append(s.keys, shardKeys{
			data:   []string{tag + ":exp", tag + ":dev", tag + ":events", tag + ":epochs", tag + ":inv", tag + ":held", tag + ":gateways"},
			runner: []string{tag + ":runner"},
		})
	}
	return s, nil
}

// open checks P:meta and loads the scripts through c, then makes the
// store ready. It succeeds at most once.
func (s *Store) open(ctx context.Context, c redis.UniversalClient) error {
	if err := checkMeta(ctx, c, s.prefix, s.shards); err != nil {
		return err
	}
	// Loading is an optimisation: Run falls back to EVAL on NOSCRIPT
	// (a restarted server, a flushed cache, a node that took over a slot).
	for _, sc := range []*redis.Script{s.apply, s.reap, s.view, s.lease} {
		if err := sc.Load(ctx, c).Err(); err != nil {
			return fmt.Errorf("redisstore: open: load scripts: %w: %w", gateway.ErrUnavailable, err)
		}
	}
	s.c = c
	close(s.ready)
	return nil
}

// errNotOpen is every call's error until the store is ready.
var errNotOpen = fmt.Errorf("redisstore: not opened yet: %w", gateway.ErrUnavailable)

// client is the store's client once it is ready.
func (s *Store) client() (redis.UniversalClient, error) {
	select {
	case <-s.ready:
		return s.c, nil
	default:
		return nil, errNotOpen
	}
}

// checkMeta records the shard count and schema in P:meta on first use
// and compares them with what is there.
func checkMeta(ctx context.Context, c redis.UniversalClient, prefix string, shards int) error {
	key := prefix + ":meta"
	want := strconv.Itoa(shards)
	pipe := c.TxPipeline()
	pipe.HSetNX(ctx, key, "shards", want)
	pipe.HSetNX(ctx, key, "schema", Schema)
	got := pipe.HMGet(ctx, key, "shards", "schema")
	if _, err := pipe.Exec(ctx); err != nil {
		return fmt.Errorf("redisstore: open: %s: %w: %w", key, gateway.ErrUnavailable, err)
	}
	v := got.Val()
	if v[0] != want || v[1] != Schema {
		return fmt.Errorf("redisstore: open: %s holds shards=%v schema=%v, want shards=%s schema=%s: %w",
			key, v[0], v[1], want, Schema, gateway.ErrShardMismatch)
	}
	return nil
}

// Shards is the shard count the store was opened with.
func (s *Store) Shards() int { return s.shards }

// Close closes the store's own connections: the readers' client
// (watch.go) and, for a store made by Dial, its client (after ending
// its background opener); a store made by Open leaves its client to
// the caller.
func (s *Store) Close() error {
	err := s.watch.close()
	if s.closeFn != nil {
		err = errors.Join(err, s.closeFn())
	}
	return err
}

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

func (s *Store) checkShard(op string, shard int) error {
	if _, err := s.client(); err != nil {
		return err
	}
	if shard < 0 || shard >= s.shards {
		return fmt.Errorf("redisstore: %s: shard %d of %d: %w", op, shard, s.shards, gateway.ErrBadShard)
	}
	return nil
}

func unavailable(op string, err error) error {
	return fmt.Errorf("redisstore: %s: %w: %w", op, gateway.ErrUnavailable, err)
}

// Apply applies a batch of writes of one shard in one script call.
func (s *Store) Apply(ctx context.Context, shard int, b gateway.Batch) (gateway.ApplyResult, error) {
	c, err := s.client()
	if err != nil {
		return gateway.ApplyResult{}, err
	}
	if s.waitReplicas > 0 {
		r := s.applyShards(ctx, c, []gateway.ShardBatch{{Shard: shard, Batch: b}})[0]
		return r.Result, r.Err
	}
	bels, unlock := s.beliefs.lockAll([]gateway.ShardBatch{{Shard: shard, Batch: b}})
	defer unlock()
	args, err := s.applyArgs(ctx, shard, b, bels[0])
	if err != nil {
		return gateway.ApplyResult{}, err
	}
	sent := s.localNow()
	res, err := s.apply.Run(ctx, c, s.keys[shard].data, args...).Slice()
	return s.applyResult(shard, b, res, err, bels[0], sent)
}

// ApplyShards applies the batches of several shards in one pipeline of
// EVALSHA calls: one round trip (one per Cluster node, in parallel). A
// batch whose script is missing on its node (NOSCRIPT, after a restart or
// a failover) is sent again on its own with EVAL.
func (s *Store) ApplyShards(ctx context.Context, batches []gateway.ShardBatch) []gateway.ShardResult {
	c, err := s.client()
	if err != nil {
		out := make([]gateway.ShardResult, len(batches))
		for i := range out {
			out[i].Err = err
		}
		return out
	}
	return s.applyShards(ctx, c, batches)
}

// applyShards is ApplyShards on client c; with WaitReplicas it runs on one
// connection of c, so that WAIT counts the replicas that have its writes.
func (s *Store) applyShards(ctx context.Context, c redis.UniversalClient, batches []gateway.ShardBatch) []gateway.ShardResult {
	out := make([]gateway.ShardResult, len(batches))
	var conn *redis.Conn
	if s.waitReplicas > 0 {
		sc, ok := c.(*redis.Client)
		if !ok {
			for i := range out {
				out[i].Err = errors.New("redisstore: wait_replicas needs a standalone server")
			}
			return out
		}
		conn = sc.Conn()
		defer conn.Close()
	}
	pipelined, run := c.Pipelined, func(keys []string, args []any) *redis.Cmd { return s.apply.Run(ctx, c, keys, args...) }
	if conn != nil {
		pipelined, run = conn.Pipelined, func(keys []string, args []any) *redis.Cmd { return s.apply.Run(ctx, conn, keys, args...) }
	}
	cmds := make([]*redis.Cmd, len(batches))
	args := make([][]any, len(batches))
	bels, unlock := s.beliefs.lockAll(batches)
	defer unlock()
	sent := s.localNow()
	// Each command carries its own error (a network failure is set on
	// all of them), so the pipeline's first error needs no reading.
	_, _ = pipelined(ctx, func(p redis.Pipeliner) error {
		for i, sb := range batches {
			a, err := s.applyArgs(ctx, sb.Shard, sb.Batch, bels[i])
			if err != nil {
				out[i].Err = err
				continue
			}
			args[i] = a
			cmds[i] = s.apply.EvalSha(ctx, p, s.keys[sb.Shard].data, a...)
		}
		return nil
	})
	for i, sb := range batches {
		if cmds[i] == nil {
			continue
		}
		res, err := cmds[i].Slice()
		if err != nil && redis.HasErrorPrefix(err, "NOSCRIPT") {
			res, err = run(s.keys[sb.Shard].data, args[i]).Slice()
		}
		out[i].Result, out[i].Err = s.applyResult(sb.Shard, sb.Batch, res, err, bels[i], sent)
	}
	if conn != nil {
		s.waitFor(ctx, conn, batches, out)
	}
	return out
}

// waitFor waits until WaitReplicas replicas have the writes of conn when a
// batch of the call wrote events or replayed an outbox; with fewer (or an
// error), those batches fail with gateway.ErrUnavailable.
func (s *Store) waitFor(ctx context.Context, conn *redis.Conn, batches []gateway.ShardBatch, out []gateway.ShardResult) {
	need := false
	for i, r := range out {
		if r.Err == nil && (len(r.Result.Events) > 0 || batches[i].Batch.Replay) {
			need = true
		}
	}
	if !need {
		return
	}
	n, err := conn.Wait(ctx, s.waitReplicas, s.waitTimeout).Result()
	if err == nil && int(n) >= s.waitReplicas {
		return
	}
	if err == nil {
		err = fmt.Errorf("%d of %d replicas acknowledged within %v", n, s.waitReplicas, s.waitTimeout)
	}
	for i, r := range out {
		if r.Err == nil && (len(r.Result.Events) > 0 || batches[i].Batch.Replay) {
			out[i] = gateway.ShardResult{Err: unavailable("apply: wait for replicas", err)}
		}
	}
}

// localNow is the clock beliefs age by: the time since Open, on the
// monotonic clock (or the test clock when set).
func (s *Store) localNow() time.Duration {
	if s.now != nil {
		return s.now().Sub(s.opened)
	}
	return time.Since(s.opened)
}

// writeArgs is the number of apply.lua arguments per general write
// (W_ARGS there): device, session, kind, age ms, lease ms.
const writeArgs = 5

// applyArgs checks a batch and lays it out as the apply script's ARGV,
// the writes bel allows first as believed renewals.
func (s *Store) applyArgs(ctx context.Context, shard int, b gateway.Batch, bel *beliefs) ([]any, error) {
	if err := s.checkShard("apply", shard); err != nil {
		return nil, err
	}
	for _, w := range b.Writes {
		if got := gateway.ShardOf(w.Device, s.shards); got != shard {
			return nil, fmt.Errorf("redisstore: apply: device %s hashes to shard %d, not %d: %w",
				w.Device, got, shard, gateway.ErrWrongShard)
		}
		if w.Kind < gateway.Connect || w.Kind > gateway.Leave {
			return nil, fmt.Errorf("redisstore: apply: device %s session %s: unknown %v", w.Device, w.Session, w.Kind)
		}
		if w.Lease < 0 {
			return nil, fmt.Errorf("redisstore: apply: device %s session %s: lease %v negative", w.Device, w.Session, w.Lease)
		}
	}
	order, nfast, oldest := bel.believed(b)
	inc, sessions, ages, devices, beliefAt, seen := "", "", "", "", "", ""
	if bel != nil {
		inc, seen = bel.inc, bel.seen
	}
	if nfast > 0 {
		sessions, ages, devices = joinSessions(b.Writes, order, nfast), packAges(b.Writes, order, nfast), joinDevices(b.Writes, order, nfast)
		beliefAt = strconv.FormatInt(oldest, 10)
	}
	args := make([]any, 0, 17+writeArgs*(len(b.Writes)-nfast))
	replay, behind := "0", "0"
	switch {
	case b.Restore:
		replay = "2"
	case b.Replay:
		replay = "1"
	}
	if b.Behind {
		behind = "1"
	}
	replayGrace := int64(0)
	if b.Replay || b.Coalesced {
		replayGrace = s.grace
	}
	// The header, in the order of apply.lua's A_ positions.
	args = append(args,
		b.Gateway,                       // A_GW
		strconv.FormatUint(b.Epoch, 10), // A_EPOCH
		b.Lease.Milliseconds(),          // A_LEASE
		replay,                          // A_REPLAY
		s.nowArg(),                      // A_NOW
		s.maxLen,                        // A_MAXLEN
		inc,                             // A_INC
		nfast,                           // A_NFAST
		string(order),                   // A_ORDER
		sessions,                        // A_FASTSIDS
		ages,                            // A_FASTAGES
		devices,                         // A_FASTDEVS
		behind,                          // A_BEHIND
		s.notAfter(ctx),                 // A_NOTAFTER
		replayGrace,                     // A_GRACE
		beliefAt,                        // A_BELIEFAT
		seen,                            // A_SEEN
	)
	// From A_WRITES on: the other writes, writeArgs arguments each.
	for i, w := range b.Writes {
		if nfast == 0 || order[i] == '0' {
			args = append(args, string(w.Device), string(w.Session), int(w.Kind), max(0, w.Age.Milliseconds()),
				w.LeaseOr(b.Lease).Milliseconds())
		}
	}
	return args, nil
}

// applyResult reads the apply script's reply (or the error of its call)
// and updates the caller's beliefs and the store clock with it; sent is
// when the call was sent (localNow).
func (s *Store) applyResult(shard int, b gateway.Batch, res []any, err error, bel *beliefs, sent time.Duration) (gateway.ApplyResult, error) {
	r, inc, status, err := parseApply(shard, b, res, err)
	if now, ok := applyNow(res); ok {
		s.seen(now, sent)
	}
	if bel != nil {
		if err != nil {
			// unknown outcome, fenced or malformed: nothing believed stands
			bel.forget()
		} else {
			r.Reset = bel.learn(inc, status, b.Writes, num(res[3]))
		}
	}
	return r, err
}

// applyNow is the store time an apply reply names: a stale call's too, so
// that the next call is judged on the store's clock.
func applyNow(res []any) (int64, bool) {
	if len(res) == 0 {
		return 0, false
	}
	switch n, _ := res[0].(int64); {
	case n == 1 && len(res) >= 4:
		return num(res[3]), true
	case n == -1 && len(res) == 2:
		return num(res[1]), true
	}
	return 0, false
}

// parseApply reads the apply script's reply {1, incarnation, status,
// now, events...}, {0, newest epoch} or {-1, now}.
func parseApply(shard int, b gateway.Batch, res []any, err error) (r gateway.ApplyResult, inc string, status []any, _ error) {
	if err != nil {
		return r, "", nil, unavailable("apply", err)
	}
	if len(res) == 0 {
		return r, "", nil, fmt.Errorf("redisstore: apply: empty reply")
	}
	if ok, _ := res[0].(int64); ok == 0 {
		newest := ""
		if len(res) > 1 {
			newest, _ = res[1].(string)
		}
		return r, "", nil, fmt.Errorf("redisstore: apply: gateway %s epoch %d, newest seen on shard %d is %s: %w",
			b.Gateway, b.Epoch, shard, newest, gateway.ErrFenced)
	}
	if n, _ := res[0].(int64); n == -1 {
		return r, "", nil, fmt.Errorf("redisstore: apply: %w: stale call ran at %d, after its caller gave up", gateway.ErrUnavailable, num(res[1]))
	}
	if len(res) < 4 {
		return r, "", nil, fmt.Errorf("redisstore: apply: short reply of %d items", len(res))
	}
	status, ok := res[2].([]any)
	if !ok {
		return r, "", nil, fmt.Errorf("redisstore: apply: malformed status %v", res[2])
	}
	evs, err := parseEvents(shard, res[4:])
	if err != nil {
		return r, "", nil, fmt.Errorf("redisstore: apply: %w", err)
	}
	return gateway.ApplyResult{Events: evs}, str(res[1]), status, nil
}

// Reap handles at most limit due entries of shard in one script call;
// limit ≤ 0 handles none and only reports More and Next. With a gateway
// grace, a due device whose last writer is not heard is held instead
// (record.lua, "Held devices"); a gateway counts as heard only after the
// end of the last outage this store saw on the shard: a failed reap, or
// a new incarnation (a restart, a failover, lost data).
func (s *Store) Reap(ctx context.Context, shard int, limit int) (gateway.ReapResult, error) {
	c, err := s.client()
	if err != nil {
		return gateway.ReapResult{}, err
	}
	if err := s.checkShard("reap", shard); err != nil {
		return gateway.ReapResult{}, err
	}
	limit = max(limit, 0)
	s.rmu.Lock()
	st := s.reaps[shard]
	s.rmu.Unlock()
	since := strconv.FormatInt(st.since, 10)
	if st.failed {
		since = "now"
	}
	lostAfter := int64(0)
	if shard == 0 {
		lostAfter = s.lostAfter
	}
	sent := s.localNow()
	res, err := s.reap.Run(ctx, c, s.keys[shard].data,
		// in the order of reap.lua's R_ positions
		limit,           // R_LIMIT
		s.nowArg(),      // R_NOW
		s.maxLen,        // R_MAXLEN
		s.grace,         // R_GRACE
		s.silence,       // R_SILENCE
		since,           // R_SINCE
		s.notAfter(ctx), // R_NOTAFTER
		lostAfter,       // R_LOSTAFTER
	).Slice()
	if err == nil && len(res) == 2 && num(res[0]) == -1 {
		s.seen(num(res[1]), sent)
		err = fmt.Errorf("%w: stale call ran at %d, after its caller gave up", gateway.ErrUnavailable, num(res[1]))
	}
	if err != nil {
		s.rmu.Lock()
		s.reaps[shard].failed = true
		s.rmu.Unlock()
		return gateway.ReapResult{}, unavailable("reap", err)
	}
	if len(res) < reapHeader || (len(res)-reapHeader)%reapEventLen != 0 {
		return gateway.ReapResult{}, fmt.Errorf("redisstore: reap: malformed reply of %d items", len(res))
	}
	trimmed, _ := res[0].(int64)
	more, _ := res[1].(int64)
	next, _ := res[2].(int64)
	orphans, _ := res[3].(int64)
	if orphans > 0 {
		s.log.Warn("reap removed due entries without an online record", "shard", shard, "count", orphans)
	}
	now := num(res[4])
	s.seen(now, sent)
	held, _ := res[5].(int64)
	inc := str(res[6])
	s.rmu.Lock()
	cur := &s.reaps[shard]
	if cur.failed || (cur.inc != "" && cur.inc != inc) {
		// an outage ended: gateways count as live once heard again
		cur.since = now
		if s.grace > 0 {
			s.log.Info("store outage or new incarnation seen: holding due devices until their gateways are heard again",
				"shard", shard, "grace", time.Duration(s.grace)*time.Millisecond)
		}
	}
	cur.failed, cur.inc = false, inc
	s.rmu.Unlock()
	r := gateway.ReapResult{Offline: parseReapEvents(shard, now, res[reapHeader:]), Trimmed: int(trimmed), Held: int(held), More: more == 1, Now: time.UnixMilli(now)}
	if next >= 0 {
		r.Next = time.UnixMilli(next)
	}
	return r, nil
}

// The reap script's flat reply: reapHeader items (trimmed, more, next,
// orphans, now, held, incarnation), then reapEventLen items per offline
// event.
const reapHeader, reapEventLen = 7, 7

// parseReapEvents reads the reap script's events, each
// id, device, ver, gw, session, deadline, reason: all of them are offline
// events at now (ms).
func parseReapEvents(shard int, now int64, items []any) []gateway.Event {
	at := time.UnixMilli(now)
	evs := make([]gateway.Event, 0, len(items)/reapEventLen)
	for i := 0; i+reapEventLen <= len(items); i += reapEventLen {
		evs = append(evs, gateway.Event{
			ID:       str(items[i]),
			Shard:    shard,
			Device:   gateway.DeviceID(str(items[i+1])),
			State:    gateway.Offline,
			Ver:      uint64(num(items[i+2])),
			At:       at,
			Reason:   gateway.Reason(str(items[i+6])),
			Gateway:  str(items[i+3]),
			Session:  gateway.SessionID(str(items[i+4])),
			Deadline: time.UnixMilli(num(items[i+5])),
		})
	}
	return evs
}

// parseEvents reads the scripts' event tuples
// {id, device, state, ver, at, reason, gw, session, deadline}.
func parseEvents(shard int, items []any) ([]gateway.Event, error) {
	evs := make([]gateway.Event, 0, len(items))
	for _, it := range items {
		f, ok := it.([]any)
		if !ok || len(f) != 9 {
			return nil, fmt.Errorf("malformed event %v", it)
		}
		e := gateway.Event{
			ID:      str(f[0]),
			Shard:   shard,
			Device:  gateway.DeviceID(str(f[1])),
			State:   gateway.State(str(f[2])),
			Ver:     uint64(num(f[3])),
			At:      time.UnixMilli(num(f[4])),
			Reason:  gateway.Reason(str(f[5])),
			Gateway: str(f[6]),
			Session: gateway.SessionID(str(f[7])),
		}
		if e.Reason == gateway.ReasonExpired || e.Reason == gateway.ReasonGatewayLost {
			e.Deadline = time.UnixMilli(num(f[8]))
		}
		evs = append(evs, e)
	}
	return evs, nil
}

func str(v any) string {
	s, _ := v.(string)
	return s
}

func num(v any) int64 {
	switch n := v.(type) {
	case int64:
		return n
	case string:
		i, _ := strconv.ParseInt(n, 10, 64)
		return i
	}
	return 0
}

// Device reads one device; gateway.ErrNotFound if the store never saw it.
func (s *Store) Device(ctx context.Context, id gateway.DeviceID) (gateway.DeviceInfo, error) {
	c, err := s.client()
	if err != nil {
		return gateway.DeviceInfo{}, err
	}
	shard := gateway.ShardOf(id, s.shards)
	res, err := s.view.Run(ctx, c, s.keys[shard].data, "get", string(id)).Slice()
	if err != nil {
		return gateway.DeviceInfo{}, unavailable("device", err)
	}
	if len(res) == 0 {
		return gateway.DeviceInfo{}, fmt.Errorf("device %s: %w", id, gateway.ErrNotFound)
	}
	d, err := parseView(res[0])
	if err != nil {
		return gateway.DeviceInfo{}, fmt.Errorf("redisstore: device %s: %w", id, err)
	}
	return d, nil
}

// parseScan reads the view script's "scan" reply: the HSCAN cursor to
// resume at, the items of its step to pass over, and the devices.
func parseScan(res []any) (cursor string, skip int, devs []gateway.DeviceInfo, err error) {
	if len(res) < 2 {
		return "", 0, nil, errors.New("short reply")
	}
	for _, v := range res[2:] {
		d, err := parseView(v)
		if err != nil {
			return "", 0, nil, err
		}
		devs = append(devs, d)
	}
	return str(res[0]), int(num(res[1])), devs, nil
}

// parseView reads a device view of view.lua.
func parseView(v any) (gateway.DeviceInfo, error) {
	f, ok := v.([]any)
	if !ok || len(f) != 8 {
		return gateway.DeviceInfo{}, fmt.Errorf("malformed device view %v", v)
	}
	d := gateway.DeviceInfo{
		Device:  gateway.DeviceID(str(f[0])),
		State:   gateway.Offline,
		Ver:     uint64(num(f[2])),
		Since:   time.UnixMilli(num(f[3])),
		Gateway: str(f[4]),
		Session: gateway.SessionID(str(f[5])),
	}
	if num(f[1]) == 1 {
		d.State = gateway.Online
	}
	if dl := num(f[6]); dl >= 0 {
		d.Deadline = time.UnixMilli(dl)
	}
	sess, _ := f[7].([]any)
	for i := 0; i+3 < len(sess); i += 4 {
		d.Sessions = append(d.Sessions, gateway.SessionInfo{
			ID:       gateway.SessionID(str(sess[i])),
			Deadline: time.UnixMilli(num(sess[i+1])),
			Gateway:  str(sess[i+2]),
			Epoch:    uint64(num(sess[i+3])),
		})
	}
	return d, nil
}

// listCursor is the position of List: a shard, an HSCAN cursor of that
// shard's {P:s}:dev, and how many items of that cursor's step were already
// returned. Encoded "<shard>.<cursor>.<skip>".
type listCursor struct {
	shard  int
	cursor string
	skip   int
}

func (c listCursor) String() string { return fmt.Sprintf("%d.%s.%d", c.shard, c.cursor, c.skip) }

// checkScanCursor accepts a position of view.lua's scan: an HSCAN cursor,
// or "lp" (inside a listpack's one step).
func checkScanCursor(c string) error {
	if c == "lp" {
		return nil
	}
	_, err := strconv.ParseUint(c, 10, 64)
	return err
}

func parseListCursor(s string, shards int) (listCursor, error) {
	if s == "" {
		return listCursor{cursor: "0"}, nil
	}
	p := strings.Split(s, ".")
	if len(p) == 3 {
		shard, err1 := strconv.Atoi(p[0])
		err2 := checkScanCursor(p[1])
		skip, err3 := strconv.Atoi(p[2])
		if err1 == nil && err2 == nil && err3 == nil && shard >= 0 && shard < shards && skip >= 0 {
			return listCursor{shard: shard, cursor: p[1], skip: skip}, nil
		}
	}
	return listCursor{}, fmt.Errorf("bad cursor %q", s)
}

const (
	// maxListCalls bounds the script calls of one List page.
	maxListCalls = 64
	// defaultLimit is the page size of List and Events for a limit ≤ 0.
	defaultLimit = 100
	// maxListLimit caps a List page.
	maxListLimit = 1000
	// scanCount is the HSCAN COUNT of List. It never changes between
	// pages: a cursor's skip counts items of the step HSCAN returns at
	// that cursor with this COUNT.
	scanCount = 100
)

// List pages through the devices of every shard in shard order (HSCAN of
// {P:s}:dev), filtered by state, at most 1000 a page. As with SCAN, a
// device present for the whole iteration is returned at least once,
// except that one changing between two pages whose boundary falls inside
// one HSCAN step may be skipped or repeated.
func (s *Store) List(ctx context.Context, q gateway.ListQuery) (gateway.ListPage, error) {
	c, err := s.client()
	if err != nil {
		return gateway.ListPage{}, err
	}
	filter := ""
	switch q.State {
	case "":
	case gateway.Online, gateway.Offline:
		filter = string(q.State)
	default:
		return gateway.ListPage{}, fmt.Errorf("redisstore: list: state filter %q: the store knows online and offline only", q.State)
	}
	limit := q.Limit
	if limit <= 0 {
		limit = defaultLimit
	}
	limit = min(limit, maxListLimit)
	cur, err := parseListCursor(q.Cursor, s.shards)
	if err != nil {
		return gateway.ListPage{}, fmt.Errorf("redisstore: list: %w", err)
	}
	var page gateway.ListPage
	for calls := 0; calls < maxListCalls && len(page.Devices) < limit; calls++ {
		res, err := s.view.Run(ctx, c, s.keys[cur.shard].data,
			"scan", cur.cursor, cur.skip, limit-len(page.Devices), filter, scanCount).Slice()
		if err != nil {
			return gateway.ListPage{}, unavailable("list", err)
		}
		var devs []gateway.DeviceInfo
		cur.cursor, cur.skip, devs, err = parseScan(res)
		if err != nil {
			return gateway.ListPage{}, fmt.Errorf("redisstore: list: %w", err)
		}
		page.Devices = append(page.Devices, devs...)
		if cur.cursor == "0" && cur.skip == 0 {
			if cur.shard+1 == s.shards {
				return page, nil
			}
			cur = listCursor{shard: cur.shard + 1, cursor: "0"}
		}
	}
	page.Next = cur.String()
	return page, nil
}

// Events reads up to limit events of shard after position after (XRANGE,
// exclusive); "" or "0" reads from the start. limit ≤ 0 means 100.
func (s *Store) Events(ctx context.Context, shard int, after string, limit int) ([]gateway.Event, error) {
	c, err := s.client()
	if err != nil {
		return nil, err
	}
	if err := s.checkShard("events", shard); err != nil {
		return nil, err
	}
	if limit <= 0 {
		limit = defaultLimit
	}
	start := "-"
	if after != "" && after != "0" {
		if !validStreamID(after) {
			return nil, fmt.Errorf("redisstore: events: position %q is not <ms>-<seq>", after)
		}
		start = "(" + after
	}
	msgs, err := c.XRangeN(ctx, s.keys[shard].data[2], start, "+", int64(limit)).Result()
	if err != nil {
		return nil, unavailable("events", err)
	}
	evs := make([]gateway.Event, 0, len(msgs))
	for _, m := range msgs {
		e, err := streamEvent(shard, m)
		if err != nil {
			return nil, fmt.Errorf("redisstore: events: %w", err)
		}
		evs = append(evs, e)
	}
	return evs, nil
}

// validStreamID reports whether id is a stream ID "<ms>-<seq>".
func validStreamID(id string) bool {
	ms, seq, ok := strings.Cut(id, "-")
	_, err1 := strconv.ParseUint(ms, 10, 64)
	_, err2 := strconv.ParseUint(seq, 10, 64)
	return ok && err1 == nil && err2 == nil
}

func streamEvent(shard int, m redis.XMessage) (gateway.Event, error) {
	field := func(k string) string {
		v, _ := m.Values[k].(string)
		return v
	}
	ver, err1 := strconv.ParseUint(field("ver"), 10, 64)
	at, err2 := strconv.ParseInt(field("at"), 10, 64)
	if err := errors.Join(err1, err2); err != nil {
		return gateway.Event{}, fmt.Errorf("event %s: %w", m.ID, err)
	}
	e := gateway.Event{
		ID:      m.ID,
		Shard:   shard,
		Device:  gateway.DeviceID(field("device")),
		State:   gateway.State(field("state")),
		Ver:     ver,
		At:      time.UnixMilli(at),
		Reason:  gateway.Reason(field("reason")),
		Gateway: field("gw"),
		Session: gateway.SessionID(field("session")),
	}
	if dl := field("deadline"); dl != "" {
		ms, err := strconv.ParseInt(dl, 10, 64)
		if err != nil {
			return gateway.Event{}, fmt.Errorf("event %s: deadline: %w", m.ID, err)
		}
		e.Deadline = time.UnixMilli(ms)
	}
	return e, nil
}

// AcquireShard takes or extends the runner lease of shard for owner
// ({P:s}:runner, expiring after ttl on the store clock); false when
// another owner holds an unexpired lease.
func (s *Store) AcquireShard(ctx context.Context, shard int, owner string, ttl time.Duration) (bool, error) {
	c, err := s.client()
	if err != nil {
		return false, err
	}
	if err := s.checkShard("acquire shard", shard); err != nil {
		return false, err
	}
	ms := max(1, ttl.Milliseconds())
	n, err := s.lease.Run(ctx, c, s.keys[shard].runner, "acquire", owner, ms, s.nowArg()).Int()
	if err != nil {
		return false, unavailable("acquire shard", err)
	}
	return n == 1, nil
}

// ReleaseShard gives up owner's lease of shard; a no-op if not held.
func (s *Store) ReleaseShard(ctx context.Context, shard int, owner string) error {
	c, err := s.client()
	if err != nil {
		return err
	}
	if err := s.checkShard("release shard", shard); err != nil {
		return err
	}
	if err := s.lease.Run(ctx, c, s.keys[shard].runner, "release", owner, 0, s.nowArg()).Err(); err != nil {
		return unavailable("release shard", err)
	}
	return nil
}

// staleAfter is how long after it was sent a script call may still run:
// the call's timeout and a margin for the clocks.
const staleAfter = callTimeout + time.Second

// notAfter is the store time after which a call sent now is stale ("" when
// the store's clock has not been seen yet): the store's clock as estimated
// now, plus staleAfter (or less, by ctx's deadline).
func (s *Store) notAfter(ctx context.Context) string {
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
	ms, ok := s.clock.notAfter(s.localNow(), wait)
	if !ok {
		return ""
	}
	return strconv.FormatInt(ms, 10)
}

// seen records the store time now that a script call sent at local time
// sent (localNow) returned, stale or not.
func (s *Store) seen(now int64, sent time.Duration) {
	s.rmu.Lock()
	defer s.rmu.Unlock()
	s.clock.observe(now, sent, s.localNow())
}
