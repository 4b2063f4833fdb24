// Package redisstore is the Redis implementation of gateway.Store
// (docs/design.md §3). Each shard s keeps its keys under the hash tag {P:s}, so one
// Lua script call touches one Redis Cluster slot; the store works unchanged
// against a single Redis and a Redis Cluster through redis.UniversalClient.
//
// Every Apply is one script call per shard and batch, every Reap one script
// call; the scripts read the store clock (Redis TIME), check the gateway
// epoch, keep the packed device records and the deadline index, and append
// the events in the same atomic step (lua/record.lua documents the layout).
package redisstore

import (
	"cmp"
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
	// GatewayGrace is presence.gateway_grace: how long past its deadline
	// a due device is held (not reaped) while the coverage of a gateway of
	// its sessions has not reached it (record.lua, "Held devices"). Zero
	// holds nothing.
	GatewayGrace time.Duration
	// GatewayRecheck is how soon a reap looks again at a held device
	// whose gateway is heard (its coverage moves on with its next flush):
	// uplink.flush_interval; default one second.
	GatewayRecheck time.Duration
	// GatewayHorizon is how long after its last call on a shard a
	// gateway's coverage still holds every due device of the shard back
	// (a device may have moved to it; its evidence there is late but
	// valid up to the grace): presence.lease + presence.gateway_grace.
	// Zero waits only for the gateways of a device's own sessions.
	GatewayHorizon time.Duration
	// GatewaySilence is the longest a live gateway goes without a store
	// call on a shard (its keep-alive with a margin); a gateway not heard
	// for longer is silent.
	GatewaySilence time.Duration
	// ReapGap is the longest a shard goes without a reap while its
	// runners run; a longer gap (the store paused, every runner stopped,
	// the host or VM frozen: whatever stopped the reaps may have stopped
	// the gateways too) counts as an outage that ends at the next reap,
	// for whichever runner reaps (reap.lua): the gateways are judged only
	// once heard after it. Zero: gaps are not looked for.
	ReapGap time.Duration
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
	// idempotent). On a standalone server the call waits on its
	// connection; on a Cluster each master that the call wrote to is
	// waited on, on the connection that wrote there, and only that
	// master's batches fail.
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

	apply, reap, view, lease, forget *redis.Script

	beliefs beliefSet
	opened  time.Time // localNow's origin

	grace, silence int64 // ms, Options.GatewayGrace and GatewaySilence
	reapGap        int64 // ms, Options.ReapGap
	recheck        int64 // ms, Options.GatewayRecheck
	horizon        int64 // ms, Options.GatewayHorizon
	lostAfter      int64 // ms, Options.GatewayLost
	waitReplicas   int
	waitTimeout    time.Duration
	watchWaits     int // Options.WatchWaits
	rmu            sync.Mutex
	reaps          []reapState // per shard
	// clocks estimate the store's clock from the script replies, per
	// shard (clock.go): on a Cluster each shard's master has its own.
	clocks []storeClock

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
	data   []string // exp, dev, events, epochs, inv, held, gateways, idx
	runner []string
}

var (
	_ gateway.Store        = (*Store)(nil)
	_ gateway.Writer       = (*Store)(nil)
	_ gateway.Reaper       = (*Store)(nil)
	_ gateway.Reader       = (*Store)(nil)
	_ gateway.PublisherLog = (*Store)(nil)
)

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
		forget: redis.NewScript(recordLua + forgetLua),
		ready:  make(chan struct{}),
		grace:  o.GatewayGrace.Milliseconds(),
		reaps:  make([]reapState, o.Shards),
		clocks: make([]storeClock, o.Shards),
	}
	s.recheck = cmp.Or(o.GatewayRecheck, time.Second).Milliseconds()
	s.horizon = o.GatewayHorizon.Milliseconds()
	s.silence = o.GatewaySilence.Milliseconds()
	s.reapGap = o.ReapGap.Milliseconds()
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
			data:   []string{tag + ":exp", tag + ":dev", tag + ":events", tag + ":epochs", tag + ":inv", tag + ":held", tag + ":gateways", tag + ":idx"},
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
	for _, sc := range []*redis.Script{s.apply, s.reap, s.view, s.lease, s.forget} {
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

// checkShard fails with errNotOpen until the store is ready and with a
// wrapped gateway.ErrBadShard for a shard out of range.
func (s *Store) checkShard(op string, shard int) error {
	if _, err := s.client(); err != nil {
		return err
	}
	if shard < 0 || shard >= s.shards {
		return fmt.Errorf("redisstore: %s: shard %d of %d: %w", op, shard, s.shards, gateway.ErrBadShard)
	}
	return nil
}

// unavailable wraps a failed call to Redis as gateway.ErrUnavailable.
func unavailable(op string, err error) error {
	return fmt.Errorf("redisstore: %s: %w: %w", op, gateway.ErrUnavailable, err)
}

// str is a script reply item as a string; "" for any other type.
func str(v any) string {
	s, _ := v.(string)
	return s
}

// num is a script reply item (an integer or a decimal string) as an
// int64; 0 for anything else.
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
