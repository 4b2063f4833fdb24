package embedded

import (
	"context"
	"fmt"
	"strings"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/fleetgate/fleetgate/gateway"
)

// Gateways lists the gateways of store.epochs (every gateway whose batch
// the store accepted; bbolt's key order is ID order), with their latest
// contact over the shards' "cover.<gateway>" records, their sessions
// summed over the shards' "sessions.<gateway>" counts (index.go), and
// lost while shard 0 keeps the "lost.<gateway>" marker of its lost event
// (gatewayEvents), as the Redis store reports it. Only its own gateway
// writes the file, so none is ever behind (its outbox is for the Redis
// store).
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
				held, err := sessionsOf(sh.root, out[i].ID)
				if err != nil {
					return fmt.Errorf("shard %d: sessions of %s: %w", n, out[i].ID, err)
				}
				out[i].Sessions += held
				if n == 0 {
					out[i].Lost = sh.root.Get([]byte(keyLost+out[i].ID)) != nil
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

// Keys of shard 0's bucket for its gateway events: "lost.<gateway>" → u64
// the contact the gateway was reported lost at, while it is; and
// "gwver.<gateway>" → u64 the ver of its last gateway event.
const (
	keyLost  = "lost."
	keyGwVer = "gwver."
)

// gatewayChange is a gateway event to write: the gateway, lost or back,
// its contact.
type gatewayChange struct {
	gw      string
	state   gateway.State
	contact int64
}

// gatewayChanges is the gateway events due on the writer's shard
// (shard 0) at its now, by the pure rule of lostOrBack, in ID order.
func (w *writer) gatewayChanges() ([]gatewayChange, error) {
	var out []gatewayChange
	c := w.sh.root.Cursor()
	for k, v := c.Seek([]byte(keyCover)); k != nil && strings.HasPrefix(string(k), keyCover); k, v = c.Next() {
		gw := string(k[len(keyCover):])
		l, err := decodeLiveness(v)
		if err != nil {
			return nil, fmt.Errorf("liveness of %s: %w", gw, err)
		}
		var lostAt *int64
		if b := w.sh.root.Get([]byte(keyLost + gw)); b != nil {
			at, err := decodeU64(b)
			if err != nil {
				return nil, fmt.Errorf("lost marker of %s: %w", gw, err)
			}
			lostAt = new(int64(at))
		}
		if state, ok := lostOrBack(l.contact, lostAt, w.now, max(w.s.openedMs, w.s.gapEnd[0]), w.s.lostAfter); ok {
			out = append(out, gatewayChange{gw, state, l.contact})
		}
	}
	return out, nil
}

// lostOrBack is the gateway event due at now for a gateway last heard at
// contact, reported lost at contact *lostAt while it is (nil while it is
// not): lost when it has not been heard for lostAfter, counted from the
// store's opening (since) when that is later (this process's downtime is
// not the gateway's); back when it was heard after it was reported lost.
func lostOrBack(contact int64, lostAt *int64, now, since, lostAfter int64) (gateway.State, bool) {
	switch {
	case lostAt == nil && now-max(contact, since) > lostAfter:
		return gateway.Lost, true
	case lostAt != nil && contact > *lostAt:
		return gateway.Back, true
	}
	return "", false
}

// gatewayEvents writes shard 0's gateway events (docs/design.md §3.4, as
// the Redis store's reap does), with their markers and vers: a ver is
// one more than the gateway's last, or the store time in ms when that is
// higher.
func (w *writer) gatewayEvents() error {
	changes, err := w.gatewayChanges()
	if err != nil {
		return err
	}
	for _, ch := range changes {
		lost := []byte(keyLost + ch.gw)
		if ch.state == gateway.Lost {
			err = w.sh.root.Put(lost, u64(uint64(ch.contact)))
		} else {
			err = w.sh.root.Delete(lost)
		}
		if err != nil {
			return err
		}
		verKey := []byte(keyGwVer + ch.gw)
		ver := uint64(w.now)
		if b := w.sh.root.Get(verKey); b != nil {
			last, err := decodeU64(b)
			if err != nil {
				return fmt.Errorf("gateway ver of %s: %w", ch.gw, err)
			}
			ver = max(ver, last+1)
		}
		if err := w.sh.root.Put(verKey, u64(ver)); err != nil {
			return err
		}
		ev := gateway.Event{Shard: w.sh.n, State: ch.state, Ver: ver, At: time.UnixMilli(w.now), Gateway: ch.gw, Contact: time.UnixMilli(ch.contact)}
		if err := w.append(&ev); err != nil {
			return err
		}
	}
	return nil
}
