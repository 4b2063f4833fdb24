// Package identity keeps the gateway's epoch: a counter in the gateway's
// bbolt state file, incremented at every start (docs/design.md §1). Writes carry
// (gateway id, epoch) and the store refuses older epochs, so a delayed
// batch from a previous process of this gateway cannot resurrect anything.
package identity

import (
	"encoding/binary"
	"fmt"
	"time"

	bolt "go.etcd.io/bbolt"
)

var (
	bucket = []byte("identity")
	key    = []byte("epoch")
)

// NextEpoch returns max(stored epoch + 1, now in Unix seconds) and
// persists it; the write is committed (fsynced) before it returns, so two
// starts never share an epoch. Seeding from the wall clock keeps epochs
// rising when the state file is lost or moved aside as corrupt: a restart
// at epoch 1 would be fenced by the store for ever.
func NextEpoch(db *bolt.DB, now time.Time) (uint64, error) {
	var epoch uint64
	err := db.Update(func(tx *bolt.Tx) error {
		b, err := tx.CreateBucketIfNotExists(bucket)
		if err != nil {
			return err
		}
		if v := b.Get(key); v != nil {
			if len(v) != 8 {
				return fmt.Errorf("stored epoch has %d bytes, want 8", len(v))
			}
			epoch = binary.BigEndian.Uint64(v)
		}
		epoch = max(epoch+1, uint64(max(now.Unix(), 0)))
		var buf [8]byte
		binary.BigEndian.PutUint64(buf[:], epoch)
		return b.Put(key, buf[:])
	})
	if err != nil {
		return 0, fmt.Errorf("identity: next epoch: %w", err)
	}
	return epoch, nil
}
