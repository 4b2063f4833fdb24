package uplink

import (
	"bytes"
	"encoding/binary"
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
// the coalesced evidence with its observation times on CLOCK_BOOTTIME and
// the boot they belong to (gateway.BootClock: the monotonic clock does not
// survive a restart, and the wall clock steps), the lease each write was
// observed under, and the record's sequence number. outbox.bytime maps
// (first observation ms, sequence), both big endian, to the session key:
// a cursor over it yields the oldest entries first, and a session's entry
// is found directly by its key, so both replay and per-session coalescing
// are cheap.
//
// An entry whose age cannot be known, because it was observed in another
// boot or its time is ahead of the boot clock, is never replayed: it is
// dropped and counted (reason unknown_age). Its lease may not have run
// out, but nothing bounds how old it is, and replaying it as fresh could
// resurrect a device (docs/reliability.md).
var (
	bucketSessions = []byte("outbox.sessions")
	bucketByTime   = []byte("outbox.bytime")
)

// DefaultOutboxMaxSessions bounds the outbox when OutboxOptions.MaxSessions
// is not set (uplink.outbox_max_sessions, docs/design.md §6.3).
const DefaultOutboxMaxSessions = 1_000_000

// OutboxOptions configure an Outbox.
type OutboxOptions struct {
	// Shards is the store's shard count (presence.shards): the outbox
	// counts its entries per shard (gateway.ShardOf of their device), so
	// that a shard with none sends straight to the store while another's
	// entries wait. Required; the uplink's store must have as many.
	Shards int
	// MaxSessions bounds the entries (one per session); over it the oldest
	// entries are dropped and counted. Default DefaultOutboxMaxSessions.
	MaxSessions int
	Logger      *slog.Logger
	// Clock is the clock of the evidence put in and of the records read
	// back (the uplink's); default gateway.SystemClock.
	Clock gateway.Clock
	// Boot is the clock entries are kept on: default Clock when it is a
	// gateway.BootClock (the test clock), else the system's
	// CLOCK_BOOTTIME and boot ID (NewSystemBoot).
	Boot gateway.BootClock
}

// Outbox buffers, in the gateway's bbolt file, the writes that could not
// reach the store: one entry per session, coalesced, replayed oldest first
// once the store answers. Every change is one committed (fsynced)
// transaction, so an entry that was acknowledged survives kill -9.
type Outbox struct {
	db    *bolt.DB
	max   int
	log   *slog.Logger
	clock gateway.Clock
	boot  gateway.BootClock

	wmu sync.Mutex // serializes put and remove with their size bookkeeping

	shards int

	mu     sync.Mutex
	n      int       // entries
	held   []int     // entries per shard
	oldest time.Time // first observation of the oldest entry (boot clock); zero when empty
	// floor is the earliest observation put since the outbox was last
	// empty, merged away or not (boot clock; zero when empty): an entry
	// keeps a session's newest evidence only, and until it is written
	// the gateway's coverage stops before the oldest it stands for. Not
	// kept across a restart (the oldest entry's then).
	floor time.Time
}

// record is one outbox entry as read back: its times are on the boot
// clock of boot (wall-clock times when boot is zero: an entry of a
// release that kept no boot), or on Outbox.clock once readable turned
// them.
type record struct {
	item
	boot gateway.BootID
	seq  uint64
	// own is the entry's own time index key, from its times as stored.
	own []byte
	// tk is the time index key the entry was found under; it differs from
	// the entry's own key only when the index held a dangling key (after
	// an unreadable entry was overwritten).
	tk []byte
}

// OpenOutbox creates the outbox's buckets in db if needed and reads its
// size, in all and per shard. The outbox does not own db.
func OpenOutbox(db *bolt.DB, o OutboxOptions) (*Outbox, error) {
	if o.Shards < 1 {
		return nil, fmt.Errorf("uplink: open outbox: %d shards", o.Shards)
	}
	if o.MaxSessions <= 0 {
		o.MaxSessions = DefaultOutboxMaxSessions
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	if o.Clock == nil {
		o.Clock = gateway.SystemClock{}
	}
	if o.Boot == nil {
		if b, ok := o.Clock.(gateway.BootClock); ok {
			o.Boot = b
		} else {
			b, err := NewSystemBoot("")
			if err != nil {
				return nil, fmt.Errorf("uplink: open outbox: %w", err)
			}
			o.Boot = b
		}
	}
	ob := &Outbox{db: db, max: o.MaxSessions, log: o.Logger, clock: o.Clock, boot: o.Boot, shards: o.Shards, held: make([]int, o.Shards)}
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
		return tx.Bucket(bucketSessions).ForEach(func(sk, _ []byte) error {
			ob.held[ob.shardOf(sk)]++
			return nil
		})
	})
	if err != nil {
		return nil, fmt.Errorf("uplink: open outbox: %w", err)
	}
	return ob, nil
}

// shardOf is the shard of the device of a session key.
func (o *Outbox) shardOf(sk []byte) int {
	dev, _, _ := bytes.Cut(sk, []byte{0})
	return gateway.ShardOf(gateway.DeviceID(dev), o.shards)
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

// holds reports whether the outbox has entries of shard.
func (o *Outbox) holds(shard int) bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.held[shard] > 0
}

// Oldest is the observation time of the oldest entry's oldest write, on
// the outbox's clock; zero when the outbox is empty.
func (o *Outbox) Oldest() time.Time {
	o.mu.Lock()
	oldest := o.oldest
	o.mu.Unlock()
	return o.onClock(oldest)
}

// unwritten is Oldest, or older evidence merged into an entry since the
// outbox was last empty (its floor), on the outbox's clock: the coverage
// stops before it (cover.go).
func (o *Outbox) unwritten() time.Time {
	o.mu.Lock()
	oldest := minTime(o.oldest, o.floor)
	o.mu.Unlock()
	return o.onClock(oldest)
}

// onClock turns a time since boot into a time on the outbox's clock (zero
// for zero, or when the boot clock cannot be read).
func (o *Outbox) onClock(oldest time.Time) time.Time {
	if oldest.IsZero() {
		return time.Time{}
	}
	_, since, err := o.boot.Boot()
	if err != nil {
		return time.Time{}
	}
	return o.clock.Now().Add(-(since - bootDur(oldest)))
}

// onBoot is a time since boot as the time.Time records hold.
func onBoot(since time.Duration) time.Time { return time.Unix(0, int64(since)) }

// bootDur is the time since boot a record's time.Time holds.
func bootDur(t time.Time) time.Duration { return time.Duration(t.UnixNano()) }

// toBoot turns the times of items, on the outbox's clock, into times
// since boot, read with now and since (one reading of both clocks).
func toBoot(items []item, now time.Time, since time.Duration) []item {
	out := make([]item, len(items))
	for i, it := range items {
		if it.kind != 0 {
			it.at = onBoot(since - now.Sub(it.at))
		}
		if !it.leave.IsZero() {
			it.leave = onBoot(since - now.Sub(it.leave))
		}
		if !it.since.IsZero() {
			it.since = onBoot(since - now.Sub(it.since))
		}
		out[i] = it
	}
	return out
}

// readable turns a record's times into times on the outbox's clock, read
// with now, the current boot and since (one reading). It reports false
// when the record's age is unknown: observed in another boot, or ahead of
// the boot clock. An entry of a release that kept no boot (zero boot,
// wall-clock times) is read on the wall clock when that puts it inside
// this boot and not in the future, and is unknown otherwise.
func (r *record) readable(now time.Time, boot gateway.BootID, since time.Duration) bool {
	age := func(t time.Time) (time.Duration, bool) {
		var a time.Duration
		if r.boot == (gateway.BootID{}) {
			a = now.Sub(t)
		} else {
			a = since - bootDur(t)
		}
		return a, a >= 0 && a <= since
	}
	if r.boot != boot && r.boot != (gateway.BootID{}) {
		return false
	}
	if r.kind != 0 {
		a, ok := age(r.at)
		if !ok {
			return false
		}
		r.at = now.Add(-a)
	}
	if !r.leave.IsZero() {
		a, ok := age(r.leave)
		if !ok {
			return false
		}
		r.leave = now.Add(-a)
	}
	r.boot = boot
	return true
}

// earliest is the earliest observation items stand for, merged away or
// not (zero for none).
func earliest(items []item) time.Time {
	var e time.Time
	for _, it := range items {
		if u := it.unwritten(); e.IsZero() || u.Before(e) {
			e = u
		}
	}
	return e
}

// put stores items, observed on the outbox's clock, in one transaction,
// each coalesced with the entry its session may already have, then drops
// the oldest entries over the bound. It returns the writes dropped that
// way (evicted) and those of entries of unknown age it replaced.
func (o *Outbox) put(items []item) (evicted, unknown int, err error) {
	boot, since, err := o.boot.Boot()
	if err != nil {
		return 0, 0, fmt.Errorf("uplink: outbox put: %w", err)
	}
	items = toBoot(items, o.clock.Now(), since)
	o.wmu.Lock()
	defer o.wmu.Unlock()
	var (
		added  int
		delta  []int // entries per shard
		oldest time.Time
	)
	err = o.db.Update(func(tx *bolt.Tx) error {
		sb, tb := tx.Bucket(bucketSessions), tx.Bucket(bucketByTime)
		added, evicted, unknown, delta = 0, 0, 0, make([]int, o.shards)
		for _, it := range items {
			sk := sessionKey(it.key)
			s := it.slot
			switch v := sb.Get(sk); {
			case v == nil:
				added++
				delta[o.shardOf(sk)]++
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
				if old.boot != boot || bootDur(old.first()) > since {
					// Of unknown age: the new evidence replaces it.
					unknown += old.n()
					break
				}
				old.merge(s)
				s = old.slot
			}
			seq, err := tb.NextSequence()
			if err != nil {
				return err
			}
			if err := sb.Put(sk, encodeRecord(s, boot, seq)); err != nil {
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
			delta[o.shardOf(sk)]--
		}
		oldest = oldestIn(tb)
		return nil
	})
	if err != nil {
		return 0, 0, fmt.Errorf("uplink: outbox put: %w", err)
	}
	o.setSize(added, delta, oldest, earliest(items))
	return evicted, unknown, nil
}

// oldestRecords reads entries oldest first for one replay round, of the
// shards in want only: per shard at most maxWrites writes, scanning at
// most scan entries of those shards besides those whose sequence number
// is in skip (being deleted), with their times on the outbox's clock;
// entries of the other shards are passed over (only their session key is
// read). Entries of unknown age are returned as unknown, and entries that
// cannot be decoded as bad, to be removed.
func (o *Outbox) oldestRecords(want []bool, maxWrites, scan int, skip map[uint64]bool) (perShard [][]record, unknown []record, bad [][]byte, err error) {
	boot, since, err := o.boot.Boot()
	if err != nil {
		return nil, nil, nil, fmt.Errorf("uplink: outbox read: %w", err)
	}
	now := o.clock.Now()
	perShard = make([][]record, o.shards)
	writes := make([]int, o.shards)
	full, shards := 0, 0
	for _, w := range want {
		if w {
			shards++
		}
	}
	err = o.db.View(func(tx *bolt.Tx) error {
		sb, tb := tx.Bucket(bucketSessions), tx.Bucket(bucketByTime)
		c := tb.Cursor()
		for tk, sk := c.First(); tk != nil && scan > 0 && full < shards; tk, sk = c.Next() {
			sh := o.shardOf(sk)
			if !want[sh] || skip[seqOf(tk)] {
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
			if !r.readable(now, boot, since) {
				unknown = append(unknown, r)
				continue
			}
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
		return nil, nil, nil, fmt.Errorf("uplink: outbox read: %w", err)
	}
	return perShard, unknown, bad, nil
}

// remove deletes, in one transaction, the entries recs were read from
// (by oldestRecords, or with their times as stored), unless an entry was
// replaced since (newer evidence was put for its session), and the time
// index keys in bad with their entries.
func (o *Outbox) remove(recs []record, bad [][]byte) error {
	if len(recs) == 0 && len(bad) == 0 {
		return nil
	}
	o.wmu.Lock()
	defer o.wmu.Unlock()
	var (
		removed int
		delta   []int // entries per shard
		oldest  time.Time
	)
	err := o.db.Update(func(tx *bolt.Tx) error {
		sb, tb := tx.Bucket(bucketSessions), tx.Bucket(bucketByTime)
		removed, delta = 0, make([]int, o.shards)
		for _, r := range recs {
			sk := sessionKey(r.key)
			v := sb.Get(sk)
			if len(v) < 9 || binary.BigEndian.Uint64(v[1:9]) != r.seq {
				continue
			}
			if err := sb.Delete(sk); err != nil {
				return err
			}
			own := r.own
			if own == nil {
				own = timeKey(r.first(), r.seq)
			}
			if err := tb.Delete(own); err != nil {
				return err
			}
			if r.tk != nil && !bytes.Equal(r.tk, own) {
				if err := tb.Delete(r.tk); err != nil {
					return err
				}
			}
			removed++
			delta[o.shardOf(sk)]--
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
					delta[o.shardOf(sk)]--
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
	o.setSize(-removed, delta, oldest, time.Time{})
	return nil
}

// setSize records a committed transaction's change of size, in all and
// per shard, its oldest entry and the earliest observation it put (zero
// for none; callers hold wmu).
func (o *Outbox) setSize(n int, perShard []int, oldest, put time.Time) {
	o.mu.Lock()
	o.n += n
	for sh, d := range perShard {
		o.held[sh] += d
	}
	o.oldest = oldest
	switch {
	case o.n == 0:
		o.floor = time.Time{}
	case o.floor.IsZero() || (!put.IsZero() && put.Before(o.floor)):
		o.floor = minTime(oldest, put)
	}
	if o.floor.After(oldest) && !oldest.IsZero() {
		o.floor = oldest
	}
	o.mu.Unlock()
}

// minTime is the earlier of two times, a zero one ignored.
func minTime(a, b time.Time) time.Time {
	if a.IsZero() || (!b.IsZero() && b.Before(a)) {
		return b
	}
	return a
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
