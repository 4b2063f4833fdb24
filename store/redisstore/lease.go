package redisstore

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

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

// RunnerLeases reports, per shard, whether a runner holds an unexpired
// lease of it: one pipeline of GETs (one per Cluster node), judged
// against the store's clock.
func (s *Store) RunnerLeases(ctx context.Context) ([]bool, error) {
	c, err := s.client()
	if err != nil {
		return nil, err
	}
	now, err := s.Now(ctx)
	if err != nil {
		return nil, err
	}
	cmds := make([]*redis.StringCmd, s.shards)
	_, _ = c.Pipelined(ctx, func(p redis.Pipeliner) error {
		for i := range cmds {
			cmds[i] = p.Get(ctx, s.keys[i].runner[0])
		}
		return nil
	})
	out := make([]bool, s.shards)
	for i, cmd := range cmds {
		v, err := cmd.Result()
		switch {
		case errors.Is(err, redis.Nil):
			continue
		case err != nil:
			return nil, unavailable("runner leases", err)
		}
		exp, _, _ := strings.Cut(v, " ")
		ms, err := strconv.ParseInt(exp, 10, 64)
		out[i] = err == nil && ms > now.UnixMilli()
	}
	return out, nil
}
