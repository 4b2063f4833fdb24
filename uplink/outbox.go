package uplink

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/fleetgate/fleetgate/gateway"
	bolt "go.etcd.io/bbolt"
)

// The outbox's buckets in the gateway's state file.
//
// outbox.sessions maps a session key (device 0x00 session) to its record:
// the coalesced evidence with wall-clock observation times (unix ms, the
// monotonic clock does not survive a restart) and the record's sequence
// number. outbox.bytime maps (first observation ms, sequence), both big
// endian, to the session key: a cursor over it yields the oldest entries
// first, and a session's entry is found directly by its key, so both
// replay and per-session coalescing are cheap.
var (
	bucketSessions = []byte("outbox.sessions")
	bucketByTime   = []byte("outbox.bytime")
)

// DefaultOutboxMaxSessions bounds the outbox when OutboxOptions.MaxSessions
// is not set (DESIGN §4, uplink.outbox_max_sessions).
const DefaultOutboxMaxSessions = 1_000_000

const recordVersion = 1

// OutboxOptions configure an Outbox.
type OutboxOptions struct {
	// MaxSessions bounds the entries (one per session); over it the oldest
	// entries are dropped and counted. Default DefaultOutboxMaxSessions.
	MaxSessions int
	Logger      *slog.Logger
}

// Outbox buffers, in the gateway's bbolt file, the writes that could not
// reach the store: one entry per session, coalesced, replayed oldest first
// once the store answers. Every change is one committed (fsynced)
// transaction, so an entry that was acknowledged survives kill -9.
type Outbox struct {
	db  *bolt.DB
	max int
	log *slog.Logger

	wmu sync.Mutex // serializes put and remove with their size bookkeeping

	mu     sync.Mutex
	n      int       // entries
	oldest time.Time // first observation of the oldest entry; zero when empty
}

// record is one outbox entry as read back.
type record struct {
	item
	seq uint64
	// tk is the time index key the entry was found under; it differs from
	// the entry's own key only when the index held a dangling key (after
	// an unreadable entry was overwritten).
	tk []byte
}

// OpenOutbox creates the outbox's buckets in db if needed and reads its
// size. The outbox does not own db.
func OpenOutbox(db *bolt.DB, o OutboxOptions) (*Outbox, error) {
	if o.MaxSessions <= 0 {
		o.MaxSessions = DefaultOutboxMaxSessions
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	ob := &Outbox{db: db, max: o.MaxSessions, log: o.Logger}
	err := db.Update(func(tx *bolt.Tx) error {
		sb, err := tx.CreateBucketIfNotExists(bucketSessions)
		if err != nil {
			return err
		}
		tb, err := tx.CreateBucketIfNotExists(bucketByTime)
		if err != nil {
			return err
		}
		ob.n = sb.Stats().KeyN
		if m := tb.Stats().KeyN; m != ob.n {
			ob.log.Error("outbox index inconsistent, rebuilding it", "sessions", ob.n, "index", m)
			if tb, err = ob.rebuildIndex(tx); err != nil {
				return err
			}
		}
		ob.oldest = oldestIn(tb)
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("uplink: open outbox: %w", err)
	}
	return ob, nil
}

// rebuildIndex recreates the time index from the session entries,
// dropping entries that cannot be decoded, so that a damaged outbox costs
// entries rather than the gateway's start.
func (o *Outbox) rebuildIndex(tx *bolt.Tx) (*bolt.Bucket, error) {
	if err := tx.DeleteBucket(bucketByTime); err != nil {
		return nil, err
	}
	tb, err := tx.CreateBucket(bucketByTime)
	if err != nil {
		return nil, err
	}
	sb := tx.Bucket(bucketSessions)
	var (
		bad [][]byte
		seq uint64
	)
	o.n = 0
	err = sb.ForEach(func(sk, v []byte) error {
		r, err := decodeRecord(sk, v)
		if err != nil {
			o.log.Error("outbox entry unreadable, removing it", "key", fmt.Sprintf("%q", sk), "err", err)
			bad = append(bad, bytes.Clone(sk))
			return nil
		}
		o.n++
		seq = max(seq, r.seq)
		return tb.Put(timeKey(r.first(), r.seq), bytes.Clone(sk))
	})
	if err != nil {
		return nil, err
	}
	for _, sk := range bad {
		if err := sb.Delete(sk); err != nil {
			return nil, err
		}
	}
	// New entries must not reuse a sequence number of a kept one.
	return tb, tb.SetSequence(seq)
}

// Len is the number of entries (sessions) in the outbox.
func (o *Outbox) Len() int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.n
}

// Oldest is the wall-clock observation time of the oldest entry's oldest
// write, zero when the outbox is empty.
func (o *Outbox) Oldest() time.Time {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.oldest
}

// put stores items in one transaction, each coalesced with the entry its
// session may already have, then drops the oldest entries over the bound.
// It returns the writes dropped that way.
func (o *Outbox) put(items []item) (evicted int, err error) {
	o.wmu.Lock()
	defer o.wmu.Unlock()
	var (
		added  int
		oldest time.Time
	)
	err = o.db.Update(func(tx *bolt.Tx) error {
		sb, tb := tx.Bucket(bucketSessions), tx.Bucket(bucketByTime)
		added, evicted = 0, 0
		for _, it := range items {
			sk := sessionKey(it.key)
			s := it.slot
			switch v := sb.Get(sk); {
			case v == nil:
				added++
			default:
				old, err := decodeRecord(sk, v)
				if err != nil {
					// Overwritten; its index entry, if any, is found
					// dangling and removed by a later replay round.
					o.log.Error("outbox entry unreadable, replacing it", "device", it.device, "session", it.session, "err", err)
					break
				}
				if err := tb.Delete(timeKey(old.slot.first(), old.seq)); err != nil {
					return err
				}
				old.merge(s)
				s = old.slot
			}
			seq, err := tb.NextSequence()
			if err != nil {
				return err
			}
			if err := sb.Put(sk, encodeRecord(s, seq)); err != nil {
				return err
			}
			if err := tb.Put(timeKey(s.first(), seq), sk); err != nil {
				return err
			}
		}
		for n := o.Len() + added; n > o.max; n-- {
			c := tb.Cursor()
			_, sk := c.First()
			sk = bytes.Clone(sk)
			writes := 1
			if r, err := decodeRecord(sk, sb.Get(sk)); err == nil {
				writes = r.n()
			}
			if err := c.Delete(); err != nil {
				return err
			}
			if err := sb.Delete(sk); err != nil {
				return err
			}
			evicted += writes
			added--
		}
		oldest = oldestIn(tb)
		return nil
	})
	if err != nil {
		return 0, fmt.Errorf("uplink: outbox put: %w", err)
	}
	o.setSize(added, oldest)
	return evicted, nil
}

// oldestRecords reads entries oldest first for one replay round: per
// shard at most maxWrites writes, scanning at most scan entries besides
// those whose sequence number is in skip (being deleted). Entries that
// cannot be decoded are returned as bad, to be removed.
func (o *Outbox) oldestRecords(shards, maxWrites, scan int, skip map[uint64]bool) (perShard [][]record, bad [][]byte, err error) {
	perShard = make([][]record, shards)
	writes := make([]int, shards)
	full := 0
	err = o.db.View(func(tx *bolt.Tx) error {
		sb, tb := tx.Bucket(bucketSessions), tx.Bucket(bucketByTime)
		c := tb.Cursor()
		for tk, sk := c.First(); tk != nil && scan > 0 && full < shards; tk, sk = c.Next() {
			if skip[seqOf(tk)] {
				continue
			}
			scan--
			r, err := decodeRecord(sk, sb.Get(sk))
			if err != nil {
				o.log.Error("outbox entry unreadable, removing it", "key", fmt.Sprintf("%q", sk), "err", err)
				bad = append(bad, bytes.Clone(tk))
				continue
			}
			r.tk = bytes.Clone(tk)
			sh := gateway.ShardOf(r.device, shards)
			if writes[sh] == maxWrites {
				continue
			}
			if writes[sh]+r.n() > maxWrites {
				writes[sh] = maxWrites
				full++
				continue
			}
			writes[sh] += r.n()
			if writes[sh] == maxWrites {
				full++
			}
			perShard[sh] = append(perShard[sh], r)
		}
		return nil
	})
	if err != nil {
		return nil, nil, fmt.Errorf("uplink: outbox read: %w", err)
	}
	return perShard, bad, nil
}

// remove deletes, in one transaction, the entries recs were read from,
// unless an entry was replaced since (newer evidence was put for its
// session), and the time index keys in bad with their entries.
func (o *Outbox) remove(recs []record, bad [][]byte) error {
	if len(recs) == 0 && len(bad) == 0 {
		return nil
	}
	o.wmu.Lock()
	defer o.wmu.Unlock()
	var (
		removed int
		oldest  time.Time
	)
	err := o.db.Update(func(tx *bolt.Tx) error {
		sb, tb := tx.Bucket(bucketSessions), tx.Bucket(bucketByTime)
		removed = 0
		for _, r := range recs {
			sk := sessionKey(r.key)
			v := sb.Get(sk)
			if len(v) < 9 || binary.BigEndian.Uint64(v[1:9]) != r.seq {
				continue
			}
			if err := sb.Delete(sk); err != nil {
				return err
			}
			own := timeKey(r.first(), r.seq)
			if err := tb.Delete(own); err != nil {
				return err
			}
			if r.tk != nil && !bytes.Equal(r.tk, own) {
				if err := tb.Delete(r.tk); err != nil {
					return err
				}
			}
			removed++
		}
		for _, tk := range bad {
			sk := tb.Get(tk)
			if sk == nil {
				continue
			}
			if v := sb.Get(sk); v != nil {
				if _, err := decodeRecord(sk, v); err != nil {
					if err := sb.Delete(sk); err != nil {
						return err
					}
					removed++
				}
			}
			if err := tb.Delete(tk); err != nil {
				return err
			}
		}
		oldest = oldestIn(tb)
		return nil
	})
	if err != nil {
		return fmt.Errorf("uplink: outbox remove: %w", err)
	}
	o.setSize(-removed, oldest)
	return nil
}

// setSize records a committed transaction's change of size and oldest
// entry (callers hold wmu).
func (o *Outbox) setSize(delta int, oldest time.Time) {
	o.mu.Lock()
	o.n += delta
	o.oldest = oldest
	o.mu.Unlock()
}

func oldestIn(tb *bolt.Bucket) time.Time {
	tk, _ := tb.Cursor().First()
	if tk == nil {
		return time.Time{}
	}
	return timeOf(tk)
}

func sessionKey(k key) []byte {
	b := make([]byte, 0, len(k.device)+1+len(k.session))
	b = append(b, k.device...)
	b = append(b, 0)
	return append(b, k.session...)
}

// timeKey orders entries by first observation (ms, clamped at the epoch)
// and then by sequence.
func timeKey(t time.Time, seq uint64) []byte {
	b := make([]byte, 16)
	binary.BigEndian.PutUint64(b, uint64(max(t.UnixMilli(), 0)))
	binary.BigEndian.PutUint64(b[8:], seq)
	return b
}

func seqOf(tk []byte) uint64 { return binary.BigEndian.Uint64(tk[8:]) }

func timeOf(tk []byte) time.Time {
	return time.UnixMilli(int64(binary.BigEndian.Uint64(tk[:8])))
}

// A record is: version (1 byte), seq (8), kind (1, 0 for none), at ms (8),
// leave (1), leave ms (8); integers big endian. The leave byte is 0 for
// none, 1 for a leave sent before the kind (the only value the first
// gateways wrote, so their records read the same), 2 for a leave sent
// after it (a visit, slot.kindFirst; the times, in ms, may tie).
const recordLen = 27

const (
	leaveNone  = 0
	leaveFirst = 1
	leaveAfter = 2
)

func encodeRecord(s slot, seq uint64) []byte {
	b := make([]byte, recordLen)
	b[0] = recordVersion
	binary.BigEndian.PutUint64(b[1:], seq)
	b[9] = byte(s.kind)
	if s.kind != 0 {
		binary.BigEndian.PutUint64(b[10:], uint64(s.at.UnixMilli()))
	}
	if !s.leave.IsZero() {
		b[18] = leaveFirst
		if s.kind != 0 && s.kindFirst {
			b[18] = leaveAfter
		}
		binary.BigEndian.PutUint64(b[19:], uint64(s.leave.UnixMilli()))
	}
	return b
}

var errBadRecord = errors.New("malformed outbox record")

func decodeRecord(sk, v []byte) (record, error) {
	var r record
	dev, sess, ok := bytes.Cut(sk, []byte{0})
	if !ok || len(v) != recordLen || v[0] != recordVersion || v[18] > leaveAfter {
		return r, fmt.Errorf("%w: key %q, %d bytes", errBadRecord, sk, len(v))
	}
	d, err := gateway.ParseDeviceID(string(dev))
	if err != nil {
		return r, fmt.Errorf("%w: %w", errBadRecord, err)
	}
	s, err := gateway.ParseSessionID(string(sess))
	if err != nil {
		return r, fmt.Errorf("%w: %w", errBadRecord, err)
	}
	r.key = key{d, s}
	r.seq = binary.BigEndian.Uint64(v[1:])
	switch k := gateway.Kind(v[9]); k {
	case 0:
	case gateway.Connect, gateway.Renew:
		r.kind = k
		r.at = time.UnixMilli(int64(binary.BigEndian.Uint64(v[10:])))
	default:
		return r, fmt.Errorf("%w: kind %d", errBadRecord, k)
	}
	if v[18] != leaveNone {
		r.leave = time.UnixMilli(int64(binary.BigEndian.Uint64(v[19:])))
		r.kindFirst = v[18] == leaveAfter && r.kind != 0
	}
	if r.n() == 0 {
		return r, fmt.Errorf("%w: no writes", errBadRecord)
	}
	return r, nil
}
