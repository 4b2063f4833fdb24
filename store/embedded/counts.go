package embedded

import (
	"context"
	"encoding/binary"
	"fmt"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/fleetgate/fleetgate/gateway"
)

// keyCounts holds a shard's records by state (Store.Counts): 16 bytes,
// the online then the offline count, each 8 bytes big-endian. commit
// moves them in the transaction that changes the records; a shard
// without them (a file of an older release) is counted once, by the
// state file migration to format 4 or by Open.
var keyCounts = []byte("counts")

// shardCounts is a shard's stored counts.
type shardCounts struct{ online, offline uint64 }

func (c shardCounts) encode() []byte {
	return binary.BigEndian.AppendUint64(binary.BigEndian.AppendUint64(nil, c.online), c.offline)
}

func decodeCounts(b []byte) (shardCounts, error) {
	if len(b) != 16 {
		return shardCounts{}, fmt.Errorf("counts: %w", errCorrupt)
	}
	return shardCounts{binary.BigEndian.Uint64(b), binary.BigEndian.Uint64(b[8:])}, nil
}

// countShard counts the records of the shard bucket root, whose counts
// are absent, in one pass, and stores the counts.
func countShard(root *bolt.Bucket) error {
	var c shardCounts
	if dev := root.Bucket(bucketDev); dev != nil {
		err := dev.ForEach(func(k, v []byte) error {
			r, err := decodeRecord(v)
			if err != nil {
				return fmt.Errorf("device %s: %w", k, err)
			}
			if r.online {
				c.online++
			} else {
				c.offline++
			}
			return nil
		})
		if err != nil {
			return err
		}
	}
	return root.Put(keyCounts, c.encode())
}

// countShards counts every shard bucket of tx that has no counts yet.
func countShards(tx *bolt.Tx) error {
	for n := 0; ; n++ {
		root := tx.Bucket(shardBucket(n))
		if root == nil {
			return nil
		}
		if root.Get(keyCounts) != nil {
			continue
		}
		if err := countShard(root); err != nil {
			return fmt.Errorf("shard %d: %w", n, err)
		}
	}
}

// count adds the state changes of a commit to the shard's counts: each
// of online and offline moves by its delta.
func (w *writer) count(online, offline int64) error {
	if online == 0 && offline == 0 {
		return nil
	}
	c, err := decodeCounts(w.sh.root.Get(keyCounts))
	if err != nil {
		return err
	}
	c.online = uint64(int64(c.online) + online)
	c.offline = uint64(int64(c.offline) + offline)
	return w.sh.root.Put(keyCounts, c.encode())
}

// Counts sums the shards' counts (keyCounts) in one read transaction,
// and counts the suspect devices by walking each shard's deadline index
// over (now, now + window]: as many steps as there are suspect devices.
func (s *Store) Counts(ctx context.Context, window time.Duration) (gateway.Counts, error) {
	const op = "embedded: counts"
	if err := s.ready(ctx); err != nil {
		return gateway.Counts{}, fmt.Errorf("%s: %w", op, err)
	}
	now := s.nowMs()
	until := now + max(window, 0).Milliseconds()
	var out gateway.Counts
	err := s.db.View(func(tx *bolt.Tx) error {
		for n := range s.shards {
			sh, err := openShard(tx, n)
			if err != nil {
				return err
			}
			c, err := decodeCounts(sh.root.Get(keyCounts))
			if err != nil {
				return fmt.Errorf("shard %d: %w", n, err)
			}
			out.Online += int64(c.online)
			out.Offline += int64(c.offline)
			if until == now {
				continue
			}
			cur := sh.exp.Cursor()
			for k, _ := cur.Seek(u64(uint64(now + 1))); k != nil; k, _ = cur.Next() {
				if ms, _, ok := parseExpKey(k); !ok || ms > until {
					break
				}
				out.Suspect++
			}
		}
		return nil
	})
	if err != nil {
		return gateway.Counts{}, fmt.Errorf("%s: %w", op, err)
	}
	return out, nil
}
