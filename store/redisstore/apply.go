package redisstore

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/fleetgate/fleetgate/gateway"
)

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

// applyShards is ApplyShards on client c: one pipeline per master, the
// masters in parallel. Without WaitReplicas each pipeline runs on c (a
// Cluster client then follows MOVED and ASK); one go-redis Cluster
// pipeline over every master would not do: when it waits for a hung
// master and retries it, it sets the context's error on every command,
// those the other masters answered too, and a hung master would fail
// every shard. With WaitReplicas, each master's batches go on one
// connection to it, and the wait runs there after them (waitFor): WAIT
// counts the replicas that have the writes of its own connection.
func (s *Store) applyShards(ctx context.Context, c redis.UniversalClient, batches []gateway.ShardBatch) []gateway.ShardResult {
	out := make([]gateway.ShardResult, len(batches))
	bels, unlock := s.beliefs.lockAll(batches)
	defer unlock()
	shards := make([]int, len(batches))
	for i, sb := range batches {
		shards[i] = sb.Shard
	}
	errs := make([]error, len(batches))
	groups := s.masters(ctx, c, "apply", shards, errs)
	for i, err := range errs {
		out[i].Err = err
	}
	var wg sync.WaitGroup
	for node, idx := range groups {
		wg.Go(func() {
			if s.waitReplicas == 0 {
				s.applyOn(ctx, c, batches, idx, bels, out)
				return
			}
			conn := node.Conn()
			defer conn.Close()
			s.applyOn(ctx, conn, batches, idx, bels, out)
			s.waitFor(ctx, conn, batches, idx, bels, out)
		})
	}
	wg.Wait()
	return out
}

// Probe reads one key of each shard (EXISTS of its deadline index), in
// one pipeline per master (as applyShards, so that a hung master fails
// its own shards only), on the master that holds it; a shard whose
// master answers is up.
func (s *Store) Probe(ctx context.Context, shards []int) []error {
	errs := make([]error, len(shards))
	c, err := s.client()
	if err != nil {
		for i := range errs {
			errs[i] = err
		}
		return errs
	}
	cmds := make([]*redis.IntCmd, len(shards))
	var wg sync.WaitGroup
	for _, idx := range s.masters(ctx, c, "probe", shards, errs) {
		wg.Go(func() {
			_, _ = c.Pipelined(ctx, func(p redis.Pipeliner) error {
				for _, i := range idx {
					cmds[i] = p.Exists(ctx, s.keys[shards[i]].data[0])
				}
				return nil
			})
		})
	}
	wg.Wait()
	for i, cmd := range cmds {
		if cmd != nil && cmd.Err() != nil {
			errs[i] = unavailable("probe", cmd.Err())
		}
	}
	return errs
}

// masters groups the indexes of shards by the client of the master that
// holds each: c itself for a standalone server, the node's client (from
// the slot map, as a pipeline would route them) on a Cluster. A shard
// out of range or whose master is not known gets its error in errs (op
// names the call).
func (s *Store) masters(ctx context.Context, c redis.UniversalClient, op string, shards []int, errs []error) map[*redis.Client][]int {
	groups := make(map[*redis.Client][]int)
	for i, sh := range shards {
		if errs[i] = s.checkShard(op, sh); errs[i] != nil {
			continue
		}
		var node *redis.Client
		switch c := c.(type) {
		case *redis.Client:
			node = c
		case *redis.ClusterClient:
			n, err := c.MasterForKey(ctx, s.keys[sh].data[0])
			if err != nil {
				errs[i] = unavailable(op+": master of the shard", err)
				continue
			}
			node = n
		default:
			errs[i] = fmt.Errorf("redisstore: %s needs a standalone server or a Cluster, not a %T", op, c)
			continue
		}
		groups[node] = append(groups[node], i)
	}
	return groups
}

// scripter is what applyOn needs of a client or a connection.
type scripter interface {
	redis.Scripter
	Pipelined(ctx context.Context, fn func(redis.Pipeliner) error) ([]redis.Cmder, error)
}

// applyOn applies the batches at idx in one pipeline of EVALSHA calls on
// c, bels their beliefs, and sets their results in out. A batch whose
// script is missing on its node (NOSCRIPT) is sent again on its own with
// EVAL. On a connection to one node, a batch whose slot that node does
// not serve (MOVED, ASK: a failover or a migration the slot map has not
// caught up with) fails as unavailable; the client reloads its map
// within clusterReload.
func (s *Store) applyOn(ctx context.Context, c scripter, batches []gateway.ShardBatch, idx []int, bels []*beliefs, out []gateway.ShardResult) {
	cmds := make([]*redis.Cmd, len(idx))
	args := make([][]any, len(idx))
	sent := s.localNow()
	// Each command carries its own error (a network failure is set on
	// all of them), so the pipeline's first error needs no reading.
	_, _ = c.Pipelined(ctx, func(p redis.Pipeliner) error {
		for j, i := range idx {
			sb := batches[i]
			a, err := s.applyArgs(ctx, sb.Shard, sb.Batch, bels[i])
			if err != nil {
				out[i].Err = err
				continue
			}
			args[j] = a
			cmds[j] = s.apply.EvalSha(ctx, p, s.keys[sb.Shard].data, a...)
		}
		return nil
	})
	for j, i := range idx {
		if cmds[j] == nil {
			continue
		}
		sb := batches[i]
		res, err := cmds[j].Slice()
		if err != nil && redis.HasErrorPrefix(err, "NOSCRIPT") {
			res, err = s.apply.Run(ctx, c, s.keys[sb.Shard].data, args[j]...).Slice()
		}
		out[i].Result, out[i].Err = s.applyResult(sb.Shard, sb.Batch, res, err, bels[i], sent)
	}
}

// waitFor waits until WaitReplicas replicas have the writes of conn when
// one of the batches at idx wrote events or replayed an outbox; with
// fewer (or an error), those batches fail with gateway.ErrUnavailable,
// their beliefs are forgotten (their writes may be lost with the
// master), and a reset one of them saw is kept for the shard's next
// call to report: the caller restores after it, and this call's reply
// is not read.
func (s *Store) waitFor(ctx context.Context, conn *redis.Conn, batches []gateway.ShardBatch, idx []int, bels []*beliefs, out []gateway.ShardResult) {
	waits := func(i int) bool {
		return out[i].Err == nil && (len(out[i].Result.Events) > 0 || batches[i].Batch.Replay)
	}
	if !slices.ContainsFunc(idx, waits) {
		return
	}
	n, err := conn.Wait(ctx, s.waitReplicas, s.waitTimeout).Result()
	if err == nil && int(n) >= s.waitReplicas {
		return
	}
	if err == nil {
		err = fmt.Errorf("%d of %d replicas acknowledged within %v", n, s.waitReplicas, s.waitTimeout)
	}
	for _, i := range idx {
		if waits(i) {
			if bel := bels[i]; bel != nil {
				bel.unreported = bel.unreported || out[i].Result.Reset
				bel.forget()
			}
			out[i] = gateway.ShardResult{Err: unavailable("apply: wait for replicas", err)}
		}
	}
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
	b = b.AgedTo(s.clockNow())
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
	args := make([]any, 0, 20+writeArgs*(len(b.Writes)-nfast))
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
	// The gateway grace, and the writes late evidence gets it for: every
	// write of a replay (""), else the coalesced writes (one byte per
	// write in batch order, 1 for a coalesced one), else none ("-").
	replayGrace, graced := s.grace, "-"
	if b.Replay {
		graced = ""
	} else if slices.ContainsFunc(b.Writes, func(w gateway.Write) bool { return w.Coalesced }) {
		graced = gracedWrites(b.Writes)
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
		s.notAfter(ctx, shard),          // A_NOTAFTER
		replayGrace,                     // A_GRACE
		beliefAt,                        // A_BELIEFAT
		seen,                            // A_SEEN
		s.covered(shard, b),             // A_COVERED
		graced,                          // A_GRACED
		s.horizon,                       // A_HORIZON
		s.sentAt(shard),                 // A_SENTAT
		s.reapGap,                       // A_GAP
		s.skew(shard),                   // A_SKEW
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

// gracedWrites is apply.lua's A_GRACED for writes: one byte per write,
// 1 for a coalesced one (gateway.Write.Coalesced), else 0.
func gracedWrites(ws []gateway.Write) string {
	b := make([]byte, len(ws))
	for i, w := range ws {
		b[i] = '0'
		if w.Coalesced {
			b[i] = '1'
		}
	}
	return string(b)
}

// applyResult reads the apply script's reply (or the error of its call)
// and updates the caller's beliefs and the store clock with it; sent is
// when the call was sent (localNow).
func (s *Store) applyResult(shard int, b gateway.Batch, res []any, err error, bel *beliefs, sent time.Duration) (gateway.ApplyResult, error) {
	r, inc, status, err := parseApply(shard, b, res, err)
	if now, ok := applyNow(res); ok {
		s.seen(shard, now, sent)
	}
	if bel != nil {
		if err != nil {
			// unknown outcome, fenced or malformed: nothing believed stands
			bel.forget()
		} else {
			r.Reset = bel.learn(inc, status, b.Writes, num(res[3]))
		}
	}
	if err == nil {
		r.Incarnation = inc
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
