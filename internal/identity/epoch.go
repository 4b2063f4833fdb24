// Package identity keeps the gateway's epoch: a counter in the gateway's
// bbolt state file, incremented at every start (DESIGN §1). Writes carry
// (gateway id, epoch) and the store refuses older epochs, so a delayed
// batch from a previous process of this gateway cannot resurrect anything.
package identity

import (
	"encoding/binary"
	"fmt"

	bolt "go.etcd.io/bbolt"
)

var (
	bucket = []byte("identity")
	key    = []byte("epoch")
)

// NextEpoch increments the persisted epoch and returns the new value (1 on
// a fresh file). The increment is committed (fsynced) before it returns,
// so two starts never share an epoch.
func NextEpoch(db *bolt.DB) (uint64, error) {
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
		epoch++
		var buf [8]byte
		binary.BigEndian.PutUint64(buf[:], epoch)
		return b.Put(key, buf[:])
	})
	if err != nil {
		return 0, fmt.Errorf("identity: next epoch: %w", err)
	}
	return epoch, nil
}
