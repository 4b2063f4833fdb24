package embedded

import (
	"fmt"

	bolt "go.etcd.io/bbolt"

	"github.com/fleetgate/fleetgate/gateway"
)

// CheckIndexes checks the change index and the session counts of every
// shard of the file against its records (checkIndexes), for the
// conformance suite's Inspector.
func CheckIndexes(db *bolt.DB, shards int) error {
	return db.View(func(tx *bolt.Tx) error {
		for n := range shards {
			sh, err := openShard(tx, n)
			if err != nil {
				return err
			}
			records := map[gateway.DeviceID]record{}
			err = sh.dev.ForEach(func(k, v []byte) error {
				r, err := decodeRecord(v)
				records[gateway.DeviceID(k)] = r
				return err
			})
			if err != nil {
				return err
			}
			if err := checkIndexes(sh, records); err != nil {
				return fmt.Errorf("shard %d: %w", n, err)
			}
		}
		return nil
	})
}
