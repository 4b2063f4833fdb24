package redisstore

import (
	"context"
	"time"
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
