package embedded

import (
	"context"
	"fmt"
	"time"

	bolt "go.etcd.io/bbolt"
)

// AcquireShard takes or extends the runner lease of shard for owner until
// now + ttl on the store clock; it reports false when another owner
// holds an unexpired lease.
func (s *Store) AcquireShard(ctx context.Context, shard int, owner string, ttl time.Duration) (bool, error) {
	const op = "embedded: acquire shard"
	if err := s.checkShard(ctx, shard); err != nil {
		return false, fmt.Errorf("%s: %w", op, err)
	}
	if owner == "" || ttl <= 0 {
		return false, fmt.Errorf("%s: owner %q, ttl %v: want an owner and a positive ttl", op, owner, ttl)
	}
	var ok bool
	err := s.updateShard(op, shard, func(root *bolt.Bucket) (err error) {
		ok, err = s.takeLock(root, keyLock, owner, ttl)
		return err
	})
	return ok, err
}

// updateShard runs fn on the root bucket of shard n in one write
// transaction; an error of either is wrapped with op.
func (s *Store) updateShard(op string, n int, fn func(root *bolt.Bucket) error) error {
	err := s.db.Update(func(tx *bolt.Tx) error {
		sh, err := openShard(tx, n)
		if err != nil {
			return err
		}
		return fn(sh.root)
	})
	if err != nil {
		return fmt.Errorf("%s: %w", op, err)
	}
	return nil
}

// takeLock takes or extends the lease under key of a shard's root bucket
// for owner, for ttl on the store clock; false when another owner holds
// it unexpired.
func (s *Store) takeLock(root *bolt.Bucket, key []byte, owner string, ttl time.Duration) (bool, error) {
	now := time.UnixMilli(s.nowMs())
	if holder, until, held := readLock(root.Get(key)); held && holder != owner && until.After(now) {
		return false, nil
	}
	return true, root.Put(key, append(u64(uint64(now.Add(ttl).UnixMilli())), owner...))
}

// ReleaseShard gives up owner's lease of shard (no-op if not held).
func (s *Store) ReleaseShard(ctx context.Context, shard int, owner string) error {
	return s.releaseLock(ctx, "embedded: release shard", shard, keyLock, owner)
}

// releaseLock deletes the lease under key of shard if owner holds it.
func (s *Store) releaseLock(ctx context.Context, op string, shard int, key []byte, owner string) error {
	if err := s.checkShard(ctx, shard); err != nil {
		return fmt.Errorf("%s: %w", op, err)
	}
	return s.updateShard(op, shard, func(root *bolt.Bucket) error {
		if holder, _, held := readLock(root.Get(key)); held && holder == owner {
			return root.Delete(key)
		}
		return nil
	})
}

func readLock(v []byte) (owner string, until time.Time, ok bool) {
	if len(v) < 8 {
		return "", time.Time{}, false
	}
	exp, _ := decodeU64(v[:8])
	return string(v[8:]), time.UnixMilli(int64(exp)), true
}

// RunnerLeases reports, per shard, whether a runner holds an unexpired
// lease of it.
func (s *Store) RunnerLeases(ctx context.Context) ([]bool, error) {
	const op = "embedded: runner leases"
	if err := s.ready(ctx); err != nil {
		return nil, fmt.Errorf("%s: %w", op, err)
	}
	now := time.UnixMilli(s.nowMs())
	out := make([]bool, s.shards)
	err := s.db.View(func(tx *bolt.Tx) error {
		for i := range out {
			sh, err := openShard(tx, i)
			if err != nil {
				return err
			}
			_, until, held := readLock(sh.root.Get(keyLock))
			out[i] = held && until.After(now)
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("%s: %w", op, err)
	}
	return out, nil
}
