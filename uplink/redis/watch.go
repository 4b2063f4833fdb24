package redisstore

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"hash/fnv"
	"strconv"
	"strings"
	"sync"
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
// the position and what was read are of one instant. A reader with
// nothing to read then waits in XREAD BLOCK on the shard's stream alone:
// a Cluster refuses a command over keys of several slots (CROSSSLOT), so
// each waiting shard holds one connection of the node that owns it.

var (
	//go:embed lua/position.lua
	positionLua string
	//go:embed lua/publisher.lua
	publisherLua string
)

const (
	// watchPoolSize is the connection pool of the readers' client: each
	// reader waiting in XREAD BLOCK holds one connection.
	watchPoolSize = 256
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
}

// reader returns the readers' client, making it on first use.
func (s *Store) reader() *watchState {
	w := &s.watch
	w.once.Do(func() {
		w.pos = redis.NewScript(positionLua)
		w.pub = redis.NewScript(publisherLua)
		w.mu.Lock()
		defer w.mu.Unlock()
		switch c := s.c.(type) {
		case *redis.Client:
			o := *c.Options()
			o.PoolSize = max(o.PoolSize, watchPoolSize)
			w.c, w.owned = redis.NewClient(&o), true
		case *redis.ClusterClient:
			o := *c.Options()
			o.PoolSize = max(o.PoolSize, watchPoolSize)
			w.c, w.owned = redis.NewClusterClient(&o), true
		default:
			w.c = s.c
		}
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

// SnapshotShard reads a page of shard's devices (view.lua's scan, the
// paging of List) and the shard's position in one MULTI. The page token
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
			view = s.view.Eval(ctx, p, keys, "scan", cursor, skip, limit, "", scanCount)
		} else {
			view = s.view.EvalSha(ctx, p, keys, "scan", cursor, skip, limit, "", scanCount)
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
	key := s.keys[shard].data[2]
	for range 2 {
		evs, err := s.readOnce(ctx, shard, after, limit)
		if err != nil || len(evs) > 0 || block <= 0 {
			return evs, err
		}
		err = s.reader().c.XRead(ctx, &redis.XReadArgs{Streams: []string{key, after.ID}, Count: 1, Block: block}).Err()
		switch {
		case errors.Is(err, redis.Nil):
			return nil, nil
		case ctx.Err() != nil:
			return nil, nil
		case err != nil:
			return nil, unavailable("read events", err)
		}
		block = 0
	}
	return nil, nil
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
