package embedded

import (
	"context"
	"fmt"

	bolt "go.etcd.io/bbolt"

	"github.com/fleetgate/fleetgate/gateway"
)

// Reap handles at most limit due entries (deadline ≤ now) of shard in one
// bolt transaction: it drops their expired sessions and, for a device
// left with none, writes its offline event and removes its entry. Next is
// the earliest deadline left in the shard; More says whether it is due.
// A limit ≤ 0 handles nothing but still reports More and Next.
func (s *Store) Reap(ctx context.Context, shard int, limit int) (gateway.ReapResult, error) {
	const op = "embedded: reap"
	if err := s.checkShard(ctx, shard); err != nil {
		return gateway.ReapResult{}, fmt.Errorf("%s: %w", op, err)
	}
	var res gateway.ReapResult
	err := s.db.Update(func(tx *bolt.Tx) error {
		w, err := s.begin(tx, shard)
		if err != nil {
			return err
		}
		var due [][]byte
		c := w.sh.exp.Cursor()
		for k, _ := c.First(); k != nil && len(due) < limit; k, _ = c.Next() {
			ms, _, ok := parseExpKey(k)
			if ok && ms > w.now {
				break
			}
			due = append(due, append([]byte(nil), k...))
		}
		for _, k := range due {
			trimmed, err := w.reap(k)
			if err != nil {
				return err
			}
			if trimmed {
				res.Trimmed++
			}
		}
		if err := w.commit(); err != nil {
			return err
		}
		res.Offline = w.events
		res.Now = msTime(w.now)
		if k, _ := w.sh.exp.Cursor().First(); k != nil {
			ms, _, _ := parseExpKey(k)
			res.Next = msTime(ms)
			res.More = ms <= w.now
		}
		return nil
	})
	if err != nil {
		return gateway.ReapResult{}, fmt.Errorf("%s: %w", op, err)
	}
	return res, nil
}

// reap handles the due index entry k; it reports whether the device kept
// a live session (trimmed, no event).
func (w *writer) reap(k []byte) (bool, error) {
	ms, d, ok := parseExpKey(k)
	if !ok {
		w.s.log.Warn("dropping malformed deadline index key", "shard", w.sh.n, "key", fmt.Sprintf("%x", k))
		return false, w.sh.exp.Delete(k)
	}
	e, err := w.load(d)
	if err != nil {
		return false, err
	}
	if !e.exists || e.deadline != ms {
		// Not the record's entry: the index is repaired, never trusted.
		w.s.log.Warn("dropping stale deadline index entry", "shard", w.sh.n, "device", d, "deadline", ms)
		return false, w.sh.exp.Delete(k)
	}
	return w.dropExpired(d, e, "")
}
