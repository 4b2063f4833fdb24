package redisstore

import (
	"cmp"
	"context"
	_ "embed"
	"errors"
	"fmt"
	"hash/fnv"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/fleetgate/fleetgate/gateway"
)

// The event log side of the store (gateway.EventLog): snapshots, reads
// after a position, and the publisher's lease and position.
//
// Reads run on a client of their own, made from the store's client with
// the same options and its own connection pool (watchPoolSize), so that
// readers waiting in XREAD BLOCK never take a connection the devices'
// writes need. Each read is one MULTI on the shard's slot: the position
// script (lua/position.lua: incarnation, last generated ID, first ID,
// how many were trimmed) and the read itself (an XREAD COUNT, or a view.lua scan page), so
// the position and what was read are of one instant.
//
// A consumer with nothing to read waits with WaitEvents. On a standalone
// server that is one XREAD BLOCK over every shard's stream, so an idle
// consumer holds one connection. A Cluster refuses a command over keys of
// several slots (CROSSSLOT), and each shard's stream has its own hash
// tag, so there a wait is one XREAD BLOCK per shard, each on a connection
// of the node that owns the shard; the first that returns ends the
// others with CLIENT UNBLOCK, as the end of the caller's context ends
// them all (go-redis does not end a blocked command with its context).
// The waits a store serves at once are capped (Options.WatchWaits): one
// more fails at once with gateway.ErrBusy instead of waiting for a pooled
// connection.

var (
	//go:embed lua/position.lua
	positionLua string
	//go:embed lua/publisher.lua
	publisherLua string
)

const (
	// watchPoolSize is the least connection pool of the readers' client.
	watchPoolSize = 256
	// readMargin is the connections of the readers' pool left to the
	// checked reads (ReadEvents, snapshots) beside the waits.
	readMargin = 32
	// defaultWatchWaits is Options.WatchWaits of a standalone server
	// (each wait holds one connection) and of a Cluster (each holds one
	// connection per shard).
	defaultWatchWaits        = watchPoolSize - readMargin
	defaultClusterWatchWaits = 64
	// maxReadLimit caps the events of one ReadEvents call.
	maxReadLimit = 10_000
)

// watchState is the readers' client and scripts, made on first use.
type watchState struct {
	once  sync.Once
	mu    sync.Mutex
	c     redis.UniversalClient
	owned bool
	pos   *redis.Script
	pub   *redis.Script
	// waits holds a token per wait in progress (WaitEvents).
	waits chan struct{}
	// streams is each shard's stream key, shardOf the way back.
	streams []string
	shardOf map[string]int
}

// reader returns the readers' client, making it on first use.
func (s *Store) reader() *watchState {
	w := &s.watch
	w.once.Do(func() {
		w.pos = redis.NewScript(positionLua)
		w.pub = redis.NewScript(publisherLua)
		w.mu.Lock()
		defer w.mu.Unlock()
		w.shardOf = make(map[string]int, s.shards)
		for i := range s.shards {
			w.streams = append(w.streams, s.keys[i].data[2])
			w.shardOf[s.keys[i].data[2]] = i
		}
		waits := s.watchWaits
		switch c := s.c.(type) {
		case *redis.Client:
			waits = cmp.Or(waits, defaultWatchWaits)
			o := *c.Options()
			o.PoolSize = max(o.PoolSize, watchPoolSize, waits+readMargin)
			w.c, w.owned = redis.NewClient(&o), true
		case *redis.ClusterClient:
			// a node may own every shard: its pool holds a connection
			// per shard for every wait
			waits = cmp.Or(waits, defaultClusterWatchWaits)
			o := *c.Options()
			o.PoolSize = max(o.PoolSize, watchPoolSize, waits*s.shards+readMargin)
			w.c, w.owned = redis.NewClusterClient(&o), true
		default:
			waits = cmp.Or(waits, defaultWatchWaits)
			w.c = s.c
		}
		w.waits = make(chan struct{}, waits)
	})
	return w
}

func (w *watchState) close() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.owned && w.c != nil {
		w.owned = false
		return w.c.Close()
	}
	return nil
}

// incToken is the position token of an incarnation string of
// position.lua: short, and free of the cursor's separators.
func incToken(inc string) string {
	h := fnv.New64a()
	h.Write([]byte(inc))
	return strconv.FormatUint(h.Sum64(), 36)
}

// logPos is position.lua's reply.
type logPos struct {
	inc, last, first string
	removed          int64
}

// trimmedAfter reports whether events after id may have been trimmed:
// some were, and id is before the first left. Trimming leaves no trace
// of the newest ID it removed, so a position exactly at that ID is
// judged trimmed too (a consumer a whole log length behind).
func (p logPos) trimmedAfter(id string) bool {
	if p.removed <= 0 {
		return false
	}
	if p.first == "" {
		return gateway.CompareLogIDs(id, p.last) < 0
	}
	return gateway.CompareLogIDs(id, p.first) < 0
}

func parseLogPos(res []any, err error) (logPos, error) {
	if err != nil {
		return logPos{}, err
	}
	if len(res) != 4 {
		return logPos{}, fmt.Errorf("position: malformed reply %v", res)
	}
	p := logPos{inc: incToken(str(res[0])), last: str(res[1]), first: str(res[2]), removed: num(res[3])}
	if p.last == "0-0" {
		p.last = "0"
	}
	return p, nil
}

// tx runs fn's commands after the position script in one MULTI; a
// NOSCRIPT of either script (a restarted server, a failover) runs it
// again with EVAL.
func (s *Store) tx(ctx context.Context, shard int, after string, fn func(p redis.Pipeliner, eval bool)) (logPos, error) {
	w := s.reader()
	keys := []string{s.keys[shard].data[2], s.keys[shard].data[3], s.keys[shard].data[1]}
	for _, eval := range []bool{false, true} {
		var posCmd *redis.Cmd
		_, err := w.c.TxPipelined(ctx, func(p redis.Pipeliner) error {
			if eval {
				posCmd = w.pos.Eval(ctx, p, keys, after)
			} else {
				posCmd = w.pos.EvalSha(ctx, p, keys, after)
			}
			fn(p, eval)
			return nil
		})
		// the first failed command's error: the position script's, or
		// fn's (a view.lua not loaded while position.lua is)
		if err != nil && redis.HasErrorPrefix(err, "NOSCRIPT") && !eval {
			continue
		}
		if err != nil && !errors.Is(err, redis.Nil) {
			return logPos{}, err
		}
		return parseLogPos(posCmd.Slice())
	}
	return logPos{}, errors.New("position: NOSCRIPT after EVAL")
}

// SnapshotShard reads a page of shard's devices (view.lua's scan) and the shard's position in one MULTI. The page token
// is "<view.lua scan cursor>.<skip>".
func (s *Store) SnapshotShard(ctx context.Context, shard int, page string, limit int) (gateway.SnapshotPage, error) {
	if err := s.checkShard("snapshot", shard); err != nil {
		return gateway.SnapshotPage{}, err
	}
	cursor, skip := "0", 0
	if page != "" {
		c, k, ok := strings.Cut(page, ".")
		n, err := strconv.Atoi(k)
		if err2 := checkScanCursor(c); !ok || err != nil || err2 != nil || n < 0 {
			return gateway.SnapshotPage{}, fmt.Errorf("redisstore: snapshot: bad page %q", page)
		}
		cursor, skip = c, n
	}
	limit = min(max(limit, 0), maxListLimit)
	var view *redis.Cmd
	pos, err := s.tx(ctx, shard, "", func(p redis.Pipeliner, eval bool) {
		if limit == 0 {
			return
		}
		keys := s.keys[shard].data
		if eval {
			view = s.view.Eval(ctx, p, keys, "scan", cursor, skip, limit, scanCount)
		} else {
			view = s.view.EvalSha(ctx, p, keys, "scan", cursor, skip, limit, scanCount)
		}
	})
	if err != nil {
		return gateway.SnapshotPage{}, unavailable("snapshot", err)
	}
	out := gateway.SnapshotPage{At: gateway.Position{Incarnation: pos.inc, ID: pos.last}}
	if view == nil {
		return out, nil
	}
	res, err := view.Slice()
	if err != nil {
		return gateway.SnapshotPage{}, unavailable("snapshot", err)
	}
	c, k, devs, err := parseScan(res)
	if err != nil {
		return gateway.SnapshotPage{}, fmt.Errorf("redisstore: snapshot: %w", err)
	}
	out.Devices = devs
	if c != "0" || k != 0 {
		out.Next = c + "." + strconv.Itoa(k)
	}
	return out, nil
}

// ReadEvents reads the events of shard after a position: one MULTI of
// the position script and an XREAD COUNT; when that finds none and block
// is positive, one XREAD BLOCK on the shard's stream, then the MULTI
// again (so that every batch returned was checked against trimming and
// the incarnation).
func (s *Store) ReadEvents(ctx context.Context, shard int, after gateway.Position, limit int, block time.Duration) ([]gateway.Event, error) {
	if err := s.checkShard("read events", shard); err != nil {
		return nil, err
	}
	if after.ID != "0" && !validStreamID(after.ID) {
		return nil, fmt.Errorf("redisstore: read events: position %q is not <ms>-<seq>", after.ID)
	}
	if limit <= 0 {
		limit = defaultLimit
	}
	limit = min(limit, maxReadLimit)
	for range 2 {
		evs, err := s.readOnce(ctx, shard, after, limit)
		if err != nil || len(evs) > 0 || block <= 0 {
			return evs, err
		}
		w := s.reader()
		xs, err := w.xwaits(ctx, []int{shard}, []string{after.ID})
		if err == nil {
			_, err = w.waitAll(ctx, xs, block)
		}
		switch {
		case ctx.Err() != nil:
			return nil, nil
		case err != nil:
			return nil, unavailable("read events", err)
		}
		block = 0
	}
	return nil, nil
}

// WaitEvents waits up to block for an event after one of the positions:
// one XREAD BLOCK over every shard's stream (a Cluster: one per shard),
// naming the shards it returned entries of.
func (s *Store) WaitEvents(ctx context.Context, after []gateway.Position, block time.Duration) ([]int, error) {
	if _, err := s.client(); err != nil {
		return nil, err
	}
	if len(after) != s.shards {
		return nil, fmt.Errorf("redisstore: wait events: %d positions, the store has %d shards", len(after), s.shards)
	}
	ids := make([]string, len(after))
	for i, p := range after {
		if p.ID != "0" && !validStreamID(p.ID) {
			return nil, fmt.Errorf("redisstore: wait events: shard %d: position %q is not <ms>-<seq>", i, p.ID)
		}
		ids[i] = p.ID
	}
	w := s.reader()
	busy := fmt.Errorf("redisstore: wait events: %w: %d waits in progress, the most this store serves (a wait holds one connection, one per shard on a Cluster)", gateway.ErrBusy, cap(w.waits))
	// a wait of block 0 holds its connections no longer than a read:
	// it takes no slot (an admission check must not fail a wait)
	if block <= 0 && len(w.waits) == cap(w.waits) {
		return nil, busy
	}
	if block > 0 {
		select {
		case w.waits <- struct{}{}:
			defer func() { <-w.waits }()
		default:
			return nil, busy
		}
	}
	all := make([]int, s.shards)
	for i := range all {
		all[i] = i
	}
	xs, err := w.xwaits(ctx, all, ids)
	if err != nil {
		return nil, s.waitFailed(ctx, err)
	}
	named, err := w.waitAll(ctx, xs, block)
	if err != nil {
		return nil, s.waitFailed(ctx, err)
	}
	return named, nil
}

// xwaits are the XREADs that wait on the streams of shards, after ids
// (one per shard): one XREAD over all of them on a standalone server, one
// per shard on a Cluster, on the master that owns it.
func (w *watchState) xwaits(ctx context.Context, shards []int, ids []string) ([]*xwait, error) {
	switch c := w.c.(type) {
	case *redis.ClusterClient:
		xs := make([]*xwait, 0, len(shards))
		for i, sh := range shards {
			node, err := c.MasterForKey(ctx, w.streams[sh])
			if err != nil {
				return nil, err
			}
			xs = append(xs, &xwait{node: node, streams: []string{w.streams[sh], ids[i]}})
		}
		return xs, nil
	case *redis.Client:
		args := make([]string, 0, 2*len(shards))
		for _, sh := range shards {
			args = append(args, w.streams[sh])
		}
		return []*xwait{{node: c, streams: append(args, ids...)}}, nil
	default:
		return nil, fmt.Errorf("a client %T: want a *redis.Client or a *redis.ClusterClient", w.c)
	}
}

// waitFailed is WaitEvents' error: none when ctx ended.
func (s *Store) waitFailed(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return nil
	}
	return unavailable("wait events", err)
}

// xwait is one XREAD BLOCK of a wait, on a connection of its node taken
// for the wait, whose client ID (read first) lets CLIENT UNBLOCK end it.
type xwait struct {
	node    *redis.Client
	streams []string     // XREAD's STREAMS arguments: keys, then IDs
	conn    *redis.Conn  // set by the XREAD's goroutine
	id      atomic.Int64 // the connection's client ID, 0 until known
}

// waitAll runs the XREADs and names the shards they returned entries of.
// The first that returns entries or fails, or the end of ctx, ends the
// others with CLIENT UNBLOCK, so that no connection stays blocked past
// the wait. An XREAD that reaches the server after its CLIENT UNBLOCK
// would wait the whole block, so the unblocking repeats every 50ms until
// every XREAD returned.
func (w *watchState) waitAll(ctx context.Context, xs []*xwait, block time.Duration) ([]int, error) {
	type result struct {
		i     int
		named []int
		err   error
	}
	results := make(chan result, len(xs))
	for i, x := range xs {
		go func() {
			x.conn = x.node.Conn()
			id, err := x.conn.ClientID(ctx).Result()
			if err != nil {
				results <- result{i: i, err: err}
				return
			}
			x.id.Store(id)
			args := &redis.XReadArgs{Streams: x.streams, Count: 1, Block: -1}
			if block > 0 {
				args.Block = max(block, time.Millisecond)
			}
			streams, err := x.conn.XRead(context.WithoutCancel(ctx), args).Result()
			if errors.Is(err, redis.Nil) {
				err = nil
			}
			results <- result{i: i, named: w.named(streams), err: err}
		}()
	}
	// The connections go back to the pool once every XREAD returned: a
	// CLIENT UNBLOCK sent to one already back could end the XREAD of
	// another wait that took it, leaving that wait blind to a shard.
	defer func() {
		for _, x := range xs {
			x.conn.Close()
		}
	}()
	var out []int
	var first error
	returned := make([]bool, len(xs))
	done := ctx.Done()
	var tick <-chan time.Time
	for left := len(xs); left > 0; {
		select {
		case r := <-results:
			left--
			returned[r.i] = true
			out = append(out, r.named...)
			if r.err != nil && first == nil {
				first = r.err
			}
			if tick != nil || (len(r.named) == 0 && r.err == nil) {
				continue
			}
		case <-done:
			done = nil
			if tick != nil {
				continue
			}
		case <-tick:
		}
		if tick == nil {
			t := time.NewTicker(50 * time.Millisecond)
			defer t.Stop()
			tick = t.C
		}
		for i, x := range xs {
			if id := x.id.Load(); id != 0 && !returned[i] {
				// a connection no longer blocked ignores it
				x.node.ClientUnblock(context.WithoutCancel(ctx), id)
			}
		}
	}
	if first != nil && len(out) == 0 {
		return nil, first
	}
	slices.Sort(out)
	return out, nil
}

// named is the shards of the streams an XREAD returned entries of.
func (w *watchState) named(streams []redis.XStream) []int {
	var out []int
	for _, st := range streams {
		if i, ok := w.shardOf[st.Stream]; ok && len(st.Messages) > 0 {
			out = append(out, i)
		}
	}
	return out
}

// readOnce is one MULTI of the position script and XREAD COUNT limit.
func (s *Store) readOnce(ctx context.Context, shard int, after gateway.Position, limit int) ([]gateway.Event, error) {
	key := s.keys[shard].data[2]
	var read *redis.XStreamSliceCmd
	pos, err := s.tx(ctx, shard, after.ID, func(p redis.Pipeliner, _ bool) {
		read = p.XRead(ctx, &redis.XReadArgs{Streams: []string{key, after.ID}, Count: int64(limit), Block: -1})
	})
	if err != nil {
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		return nil, unavailable("read events", err)
	}
	if after.Incarnation != "" && after.Incarnation != pos.inc {
		return nil, fmt.Errorf("redisstore: read events: %w", &gateway.ResyncError{Shard: shard, Reason: gateway.ResyncIncarnation})
	}
	if pos.trimmedAfter(after.ID) {
		return nil, fmt.Errorf("redisstore: read events: %w", &gateway.ResyncError{Shard: shard, Reason: gateway.ResyncTrimmed})
	}
	streams, err := read.Result()
	if errors.Is(err, redis.Nil) {
		return nil, nil
	}
	if err != nil {
		return nil, unavailable("read events", err)
	}
	var evs []gateway.Event
	for _, st := range streams {
		evs = make([]gateway.Event, 0, len(st.Messages))
		for _, m := range st.Messages {
			e, err := streamEvent(shard, m)
			if err != nil {
				return nil, fmt.Errorf("redisstore: read events: %w", err)
			}
			evs = append(evs, e)
		}
	}
	return evs, nil
}

// pubKeys is the publisher hash of shard.
func (s *Store) pubKeys(shard int) []string {
	return []string{fmt.Sprintf("{%s:%d}:pub", s.prefix, shard)}
}

// AcquirePublisher takes or extends the publisher lease of shard
// ({P:s}:pub, lua/publisher.lua) and returns the saved position.
func (s *Store) AcquirePublisher(ctx context.Context, shard int, owner string, ttl time.Duration) (gateway.Position, bool, error) {
	if err := s.checkShard("acquire publisher", shard); err != nil {
		return gateway.Position{}, false, err
	}
	if owner == "" {
		return gateway.Position{}, false, errors.New("redisstore: acquire publisher: empty owner")
	}
	w := s.reader()
	res, err := w.pub.Run(ctx, s.c, s.pubKeys(shard), "acquire", owner, max(1, ttl.Milliseconds()), s.nowArg()).Slice()
	if err != nil {
		return gateway.Position{}, false, unavailable("acquire publisher", err)
	}
	if len(res) == 0 || num(res[0]) != 1 {
		return gateway.Position{}, false, nil
	}
	var pos gateway.Position
	if len(res) > 1 && str(res[1]) != "" {
		inc, id, ok := strings.Cut(str(res[1]), "@")
		if !ok {
			return gateway.Position{}, false, fmt.Errorf("redisstore: acquire publisher: malformed saved position %q", str(res[1]))
		}
		pos = gateway.Position{Incarnation: inc, ID: id}
	}
	return pos, true, nil
}

// SavePublisher writes owner's publisher position of shard.
func (s *Store) SavePublisher(ctx context.Context, shard int, owner string, pos gateway.Position) error {
	if err := s.checkShard("save publisher", shard); err != nil {
		return err
	}
	n, err := s.reader().pub.Run(ctx, s.c, s.pubKeys(shard), "save", owner, pos.String(), s.nowArg()).Int()
	if err != nil {
		return unavailable("save publisher", err)
	}
	if n != 1 {
		return fmt.Errorf("redisstore: save publisher: shard %d owner %s: %w", shard, owner, gateway.ErrNotHolder)
	}
	return nil
}

// ReleasePublisher gives up owner's publisher lease of shard.
func (s *Store) ReleasePublisher(ctx context.Context, shard int, owner string) error {
	if err := s.checkShard("release publisher", shard); err != nil {
		return err
	}
	if err := s.reader().pub.Run(ctx, s.c, s.pubKeys(shard), "release", owner, 0, s.nowArg()).Err(); err != nil {
		return unavailable("release publisher", err)
	}
	return nil
}
