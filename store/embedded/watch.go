package embedded

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"sync"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/fleetgate/fleetgate/gateway"
)

// The event log side of the store (gateway.EventLog). On-disk additions
// to codec.go's format:
//
//	store.meta     "incarnation" → 16 random hex digits, made on the
//	               first read of a position (a new file is a new
//	               incarnation: its log positions start over)
//	store.shard.<n>
//	  "trimmed"    u64 ms ‖ u64 seq: the newest event ID trimmed from ev/
//	  "pub"        u64 lease expiry ms, then the owner's bytes (publisher)
//	  "pubpos"     the saved publisher position "<incarnation>@<id>"
//
// A snapshot page is one bolt read transaction: the devices and the
// shard's tail are of one instant. Readers waiting for events are woken
// by the commit of every write transaction that appended one.

var (
	keyIncarnation = []byte("incarnation")
	keyTrimmed     = []byte("trimmed")
	keyPub         = []byte("pub")
	keyPubPos      = []byte("pubpos")
)

// maxReadLimit caps the events of one ReadEvents call.
const maxReadLimit = 10_000

// wakeup lets readers wait for the next commit that appended events: a
// channel closed and replaced by signal.
type wakeup struct {
	mu sync.Mutex
	ch chan struct{}
}

// wait returns a channel closed by the next signal.
func (w *wakeup) wait() <-chan struct{} {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.ch == nil {
		w.ch = make(chan struct{})
	}
	return w.ch
}

func (w *wakeup) signal() {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.ch != nil {
		close(w.ch)
		w.ch = nil
	}
}

// incarnation reads the file's incarnation, making it on first use.
func (s *Store) incarnation() (string, error) {
	var inc string
	err := s.db.View(func(tx *bolt.Tx) error {
		if m := tx.Bucket(bucketMeta); m != nil {
			inc = string(m.Get(keyIncarnation))
		}
		return nil
	})
	if err != nil || inc != "" {
		return inc, err
	}
	err = s.db.Update(func(tx *bolt.Tx) error {
		inc, err = makeIncarnation(tx)
		return err
	})
	return inc, err
}

// makeIncarnation returns the file's incarnation, making it in tx if it
// has none yet.
func makeIncarnation(tx *bolt.Tx) (string, error) {
	m := tx.Bucket(bucketMeta)
	if m == nil {
		return "", errors.New("meta bucket missing")
	}
	if v := m.Get(keyIncarnation); v != nil {
		return string(v), nil
	}
	var b [8]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", err
	}
	inc := hex.EncodeToString(b[:])
	return inc, m.Put(keyIncarnation, []byte(inc))
}

// SnapshotShard reads up to limit devices of shard in device ID order,
// from page (the first device ID to read; "" for the first), with the
// shard's tail, in one read transaction.
func (s *Store) SnapshotShard(ctx context.Context, shard int, page string, limit int) (gateway.SnapshotPage, error) {
	const op = "embedded: snapshot"
	if err := s.checkShard(ctx, shard); err != nil {
		return gateway.SnapshotPage{}, fmt.Errorf("%s: %w", op, err)
	}
	if page != "" {
		if _, err := gateway.ParseDeviceID(page); err != nil {
			return gateway.SnapshotPage{}, fmt.Errorf("%s: bad page %q", op, page)
		}
	}
	limit = min(max(limit, 0), maxListLimit)
	inc, err := s.incarnation()
	if err != nil {
		return gateway.SnapshotPage{}, fmt.Errorf("%s: %w", op, err)
	}
	out := gateway.SnapshotPage{At: gateway.Position{Incarnation: inc}}
	err = s.db.View(func(tx *bolt.Tx) error {
		sh, err := openShard(tx, shard)
		if err != nil {
			return err
		}
		t, err := decodeTail(sh.root.Get(keyTail))
		if err != nil {
			return fmt.Errorf("shard %d tail: %w", shard, err)
		}
		out.At.ID = logID(t.last)
		if limit == 0 {
			return nil
		}
		c := sh.dev.Cursor()
		k, v := c.First()
		if page != "" {
			k, v = c.Seek([]byte(page))
		}
		for ; k != nil; k, v = c.Next() {
			if len(out.Devices) == limit {
				out.Next = string(k)
				return nil
			}
			r, err := decodeRecord(v)
			if err != nil {
				return fmt.Errorf("device %s: %w", k, err)
			}
			out.Devices = append(out.Devices, deviceInfo(gateway.DeviceID(k), &r))
		}
		return nil
	})
	if err != nil {
		return gateway.SnapshotPage{}, fmt.Errorf("%s: %w", op, err)
	}
	return out, nil
}

// logID is the position of the event id: "0" before the first.
func logID(id eventID) string {
	if id == (eventID{}) {
		return "0"
	}
	return id.String()
}

// ReadEvents reads up to limit events of shard after a position; with
// none to read it waits up to block for a commit that appends one.
func (s *Store) ReadEvents(ctx context.Context, shard int, after gateway.Position, limit int, block time.Duration) ([]gateway.Event, error) {
	const op = "embedded: read events"
	if err := s.checkShard(ctx, shard); err != nil {
		return nil, fmt.Errorf("%s: %w", op, err)
	}
	from, err := parseAfter(after.ID)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", op, err)
	}
	if limit <= 0 {
		limit = defaultLimit
	}
	limit = min(limit, maxReadLimit)
	inc, err := s.incarnation()
	if err != nil {
		return nil, fmt.Errorf("%s: %w", op, err)
	}
	if after.Incarnation != "" && after.Incarnation != inc {
		return nil, fmt.Errorf("%s: %w", op, &gateway.ResyncError{Shard: shard, Reason: gateway.ResyncIncarnation})
	}
	evs, err := untilCommit(ctx, s, block, func() ([]gateway.Event, bool, error) {
		evs, err := s.readAfter(shard, from, limit)
		return evs, len(evs) > 0, err
	})
	if err != nil {
		return nil, fmt.Errorf("%s: %w", op, err)
	}
	return evs, nil
}

// WaitEvents waits up to block for a commit that appends an event after
// one of the positions, and names the shards with events after theirs
// (or whose position ReadEvents would refuse: trimmed past, or of
// another incarnation).
func (s *Store) WaitEvents(ctx context.Context, after []gateway.Position, block time.Duration) ([]int, error) {
	const op = "embedded: wait events"
	if err := s.ready(ctx); err != nil {
		return nil, fmt.Errorf("%s: %w", op, err)
	}
	if len(after) != s.shards {
		return nil, fmt.Errorf("%s: %d positions, the store has %d shards", op, len(after), s.shards)
	}
	from := make([][]byte, len(after))
	for i, p := range after {
		k, err := parseAfter(p.ID)
		if err != nil {
			return nil, fmt.Errorf("%s: shard %d: %w", op, i, err)
		}
		from[i] = k
	}
	inc, err := s.incarnation()
	if err != nil {
		return nil, fmt.Errorf("%s: %w", op, err)
	}
	ready, err := untilCommit(ctx, s, block, func() ([]int, bool, error) {
		ready, err := s.shardsWithNews(after, from, inc)
		return ready, len(ready) > 0, err
	})
	if err != nil {
		return nil, fmt.Errorf("%s: %w", op, err)
	}
	return ready, nil
}

// untilCommit calls check, then again after each commit of the store,
// until check says done or fails, block has passed or ctx ended (then
// the zero T and no error); block ≤ 0 checks once.
func untilCommit[T any](ctx context.Context, s *Store, block time.Duration, check func() (T, bool, error)) (T, error) {
	var zero T
	var timer *time.Timer
	for {
		woken := s.wake.wait()
		v, done, err := check()
		if err != nil || done || block <= 0 {
			return v, err
		}
		if timer == nil {
			timer = time.NewTimer(block)
			defer timer.Stop()
		}
		select {
		case <-woken:
		case <-timer.C:
			return zero, nil
		case <-ctx.Done():
			return zero, nil
		}
		if s.closed.Load() {
			return zero, errClosed
		}
	}
}

// shardsWithNews names the shards that have an event after from (log
// keys), were trimmed past it, or whose position is not of inc.
func (s *Store) shardsWithNews(after []gateway.Position, from [][]byte, inc string) ([]int, error) {
	var out []int
	err := s.db.View(func(tx *bolt.Tx) error {
		for i := range after {
			if after[i].Incarnation != "" && after[i].Incarnation != inc {
				out = append(out, i)
				continue
			}
			sh, err := openShard(tx, i)
			if err != nil {
				return err
			}
			if tr, ok := parseEventKey(sh.root.Get(keyTrimmed)); ok && (from[i] == nil || string(tr.key()) >= string(from[i])) {
				out = append(out, i)
				continue
			}
			c := sh.ev.Cursor()
			k, _ := c.First()
			if from[i] != nil {
				k, _ = c.Seek(from[i])
			}
			if k != nil {
				out = append(out, i)
			}
		}
		return nil
	})
	return out, err
}

// readAfter reads up to limit events from log key from on, failing with
// a *ResyncError when an event after from was trimmed.
func (s *Store) readAfter(shard int, from []byte, limit int) ([]gateway.Event, error) {
	var out []gateway.Event
	err := s.db.View(func(tx *bolt.Tx) error {
		sh, err := openShard(tx, shard)
		if err != nil {
			return err
		}
		if tr, ok := parseEventKey(sh.root.Get(keyTrimmed)); ok {
			if from == nil || string(tr.key()) >= string(from) {
				return &gateway.ResyncError{Shard: shard, Reason: gateway.ResyncTrimmed}
			}
		}
		c := sh.ev.Cursor()
		k, v := c.First()
		if from != nil {
			k, v = c.Seek(from)
		}
		for ; k != nil && len(out) < limit; k, v = c.Next() {
			e, err := decodeEvent(shard, k, v)
			if err != nil {
				return fmt.Errorf("event %x: %w", k, err)
			}
			out = append(out, e)
		}
		return nil
	})
	return out, err
}

// AcquirePublisher takes or extends the publisher lease of shard for
// owner until now + ttl on the store clock and returns the saved
// position.
func (s *Store) AcquirePublisher(ctx context.Context, shard int, owner string, ttl time.Duration) (gateway.Position, bool, error) {
	const op = "embedded: acquire publisher"
	if err := s.checkShard(ctx, shard); err != nil {
		return gateway.Position{}, false, fmt.Errorf("%s: %w", op, err)
	}
	if owner == "" || ttl <= 0 {
		return gateway.Position{}, false, fmt.Errorf("%s: owner %q, ttl %v: want an owner and a positive ttl", op, owner, ttl)
	}
	var pos gateway.Position
	var ok bool
	err := s.updateShard(op, shard, func(root *bolt.Bucket) (err error) {
		if v := root.Get(keyPubPos); v != nil {
			p, err := parsePosition(string(v))
			if err != nil {
				return err
			}
			pos = p
		}
		if ok, err = s.takeLock(root, keyPub, owner, ttl); !ok {
			pos = gateway.Position{} // the holder's, not the caller's
		}
		return err
	})
	if err != nil {
		return gateway.Position{}, false, err
	}
	return pos, ok, nil
}

func parsePosition(v string) (gateway.Position, error) {
	c, err := gateway.ParseCursor("v1:"+v, 1)
	if err != nil {
		return gateway.Position{}, fmt.Errorf("saved position: %w", err)
	}
	return c[0], nil
}

// SavePublisher writes owner's publisher position of shard.
func (s *Store) SavePublisher(ctx context.Context, shard int, owner string, pos gateway.Position) error {
	const op = "embedded: save publisher"
	if err := s.checkShard(ctx, shard); err != nil {
		return fmt.Errorf("%s: %w", op, err)
	}
	return s.updateShard(op, shard, func(root *bolt.Bucket) error {
		if holder, _, held := readLock(root.Get(keyPub)); !held || holder != owner {
			return fmt.Errorf("shard %d owner %s: %w", shard, owner, gateway.ErrNotHolder)
		}
		return root.Put(keyPubPos, []byte(pos.String()))
	})
}

// ReleasePublisher gives up owner's publisher lease of shard.
func (s *Store) ReleasePublisher(ctx context.Context, shard int, owner string) error {
	return s.releaseLock(ctx, "embedded: release publisher", shard, keyPub, owner)
}
