package embedded

import (
	"context"
	"encoding/binary"
	"fmt"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/fleetgate/fleetgate/gateway"
)

var _ gateway.Forgetter = (*Store)(nil)

// Forget removes device from the store with the semantics of
// gateway.Forgetter, in one bolt transaction: its record (with its
// sessions and leave tombstones), its deadline and change index entries
// go (and the record leaves the shard's counts, its sessions their
// gateways'), the
// shard's ver floor rises to the removed event's ver (it never falls),
// and the removed
// event is appended to the shard's log.
func (s *Store) Forget(ctx context.Context, device gateway.DeviceID, by string) (gateway.Event, error) {
	const op = "embedded: forget"
	shard := gateway.ShardOf(device, s.shards)
	if err := s.checkShard(ctx, shard); err != nil {
		return gateway.Event{}, fmt.Errorf("%s: %w", op, err)
	}
	var ev gateway.Event
	err := s.db.Update(func(tx *bolt.Tx) error {
		w, err := s.begin(tx, shard)
		if err != nil {
			return err
		}
		e, err := w.load(device)
		if err != nil {
			return err
		}
		if !e.exists {
			return fmt.Errorf("device %s: %w", device, gateway.ErrNotFound)
		}
		ver := e.rec.ver + 1
		if err := w.sh.dev.Delete([]byte(device)); err != nil {
			return fmt.Errorf("device %s: %w", device, err)
		}
		if e.deadline != 0 {
			if err := w.sh.exp.Delete(expKey(e.deadline, device)); err != nil {
				return fmt.Errorf("device %s: index: %w", device, err)
			}
		}
		if e.indexed {
			if err := w.sh.chg.Delete(chgKey(e.idxOnline, e.idxSince, device)); err != nil {
				return fmt.Errorf("device %s: change index: %w", device, err)
			}
		}
		moveSessions(w.sessions, e.gws, nil)
		online, offline := int64(0), int64(-1)
		if e.rec.online {
			online, offline = -1, 0
		}
		if err := w.count(online, offline); err != nil {
			return fmt.Errorf("counts: %w", err)
		}
		if err := w.sh.root.Put(keyVerFloor, encodeFloor(max(w.floor(), ver))); err != nil {
			return fmt.Errorf("ver floor: %w", err)
		}
		ev = gateway.Event{
			Shard: shard, Device: device, State: gateway.Removed, Ver: ver,
			At: time.UnixMilli(w.now), Reason: gateway.ReasonForget, Gateway: by, Session: e.rec.session,
		}
		id := w.tail.last.next(w.now)
		ev.ID = id.String()
		if err := w.sh.ev.Put(id.key(), encodeEvent(&ev)); err != nil {
			return fmt.Errorf("append event: %w", err)
		}
		w.tail.last = id
		w.tail.count++
		w.added++
		e.dirty = false // deleted: commit must not write it back
		return w.commit()
	})
	if err != nil {
		return gateway.Event{}, fmt.Errorf("%s: %w", op, err)
	}
	return ev, nil
}

// encodeFloor and decodeFloor are the shard's "verfloor" value (u64; an
// absent or short value is 0).
func encodeFloor(v uint64) []byte { return u64(v) }

func decodeFloor(b []byte) uint64 {
	if len(b) != 8 {
		return 0
	}
	return binary.BigEndian.Uint64(b)
}
