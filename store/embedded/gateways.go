package embedded

import (
	"context"
	"fmt"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/fleetgate/fleetgate/gateway"
)

// Gateways lists the gateways of store.epochs (every gateway whose batch
// the store accepted; bbolt's key order is ID order), with their latest contact over the shards'
// "cover.<gateway>" records. Only its own gateway writes the file, so none
// is ever behind (its outbox is for the Redis store) or lost.
func (s *Store) Gateways(ctx context.Context) ([]gateway.GatewayInfo, error) {
	const op = "embedded: gateways"
	if err := s.ready(ctx); err != nil {
		return nil, fmt.Errorf("%s: %w", op, err)
	}
	var out []gateway.GatewayInfo
	err := s.db.View(func(tx *bolt.Tx) error {
		epochs := tx.Bucket(bucketEpochs)
		if epochs == nil {
			return fmt.Errorf("epochs bucket missing")
		}
		err := epochs.ForEach(func(k, v []byte) error {
			epoch, err := decodeU64(v)
			if err != nil {
				return fmt.Errorf("epoch of %s: %w", k, err)
			}
			out = append(out, gateway.GatewayInfo{ID: string(k), Epoch: epoch})
			return nil
		})
		if err != nil {
			return err
		}
		for n := range s.shards {
			sh, err := openShard(tx, n)
			if err != nil {
				return err
			}
			for i := range out {
				l, err := decodeLiveness(sh.root.Get([]byte(keyCover + out[i].ID)))
				if err != nil {
					return fmt.Errorf("shard %d: liveness of %s: %w", n, out[i].ID, err)
				}
				if l.contact > 0 && time.UnixMilli(l.contact).After(out[i].Contact) {
					out[i].Contact = time.UnixMilli(l.contact)
				}
			}
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("%s: %w", op, err)
	}
	return out, nil
}
