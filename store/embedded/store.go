// Package embedded implements gateway.Store in the gateway's own bbolt
// file (store.backend: embedded): the model of the Redis store (docs/design.md §3; this store: §4.2)
// with the same semantics, one bolt transaction per call. The on-disk
// format is documented in codec.go.
package embedded

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/fleetgate/fleetgate/gateway"
)

// Options configures Open.
type Options struct {
	// Shards is the shard count (≥ 1); it is recorded in the file and
	// must match on every later Open.
	Shards int
	// EventsMaxLen caps each shard's event log; the oldest events are
	// trimmed. Default 1_000_000/Shards.
	EventsMaxLen int64
	// Now is the store clock (default time.Now); it is read with
	// millisecond precision.
	Now func() time.Time
	// Logger defaults to discarding.
	Logger *slog.Logger
	// GatewayGrace is presence.gateway_grace: how long past its deadline
	// a due device waits (is not reaped) while the coverage of a gateway
	// of its sessions has not reached it (gateway.Batch.Covers); at its
	// end the device goes offline with reason gateway_lost. Zero waits
	// for nothing.
	GatewayGrace time.Duration
	// GatewayRecheck is how soon after a reap that left devices waiting
	// it reports them due again (ReapResult.Next): uplink.flush_interval;
	// default one second.
	GatewayRecheck time.Duration
	// GatewayHorizon is how long after its last call on a shard a
	// gateway's coverage still holds every due device of the shard back
	// (a device may have moved to it; its evidence there is late but
	// valid up to the grace): presence.lease + presence.gateway_grace.
	GatewayHorizon time.Duration
	// ReapGap is the longest a shard goes without a reap while the runner
	// runs; a longer gap (the process stopped or starved, the host or VM
	// frozen: whatever stopped the reaps stopped the gateway's flushes
	// too) counts as an outage that ends at the next reap: the grace of a
	// device whose gateway's coverage has not reached its deadline counts
	// from then, and so does a gateway's silence. Zero: gaps are not
	// looked for.
	ReapGap time.Duration
	// GatewayLost is how long a gateway may go unheard before the reap
	// of shard 0 writes its lost event (presence.lease; zero: no gateway
	// events), counted from Open when that is later.
	GatewayLost time.Duration
}

// Store is the embedded presence store. It is safe for concurrent use;
// bbolt serialises its writes.
type Store struct {
	db     *bolt.DB
	shards int
	maxLen uint64
	now    func() time.Time
	log    *slog.Logger
	closed atomic.Bool
	wake   wakeup // readers waiting for events (watch.go)

	grace, recheck, horizon int64 // ms, Options.GatewayGrace, GatewayRecheck and GatewayHorizon
	lostAfter               int64 // ms, Options.GatewayLost
	openedMs                int64 // the store time of Open
	reapGap                 int64 // ms, Options.ReapGap
	// reaped and gapEnd are per shard the store time of the last reap
	// and of the end of the last gap in the reaps (reap.go), 0 for none;
	// read and written inside the reap's bolt transaction, which bbolt
	// runs one at a time.
	reaped, gapEnd []int64
}

var (
	_ gateway.Store        = (*Store)(nil)
	_ gateway.Writer       = (*Store)(nil)
	_ gateway.Reaper       = (*Store)(nil)
	_ gateway.Reader       = (*Store)(nil)
	_ gateway.PublisherLog = (*Store)(nil)
)

// errClosed is returned by every call after Close.
var errClosed = fmt.Errorf("embedded store closed: %w", gateway.ErrUnavailable)

// Open uses its own top-level buckets (all named with prefix "store.") in
// db, which the gateway also uses for its epoch and outbox; it does not
// own db (Close does not close it). It records shards and schema in a meta
// bucket and refuses a mismatch with a wrapped gateway.ErrShardMismatch.
func Open(db *bolt.DB, o Options) (*Store, error) {
	if o.Shards < 1 || o.Shards > 1<<16 {
		return nil, fmt.Errorf("embedded: open: shards %d not in 1..65536", o.Shards)
	}
	if o.EventsMaxLen <= 0 {
		o.EventsMaxLen = max(1, 1_000_000/int64(o.Shards))
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	s := &Store{db: db, shards: o.Shards, maxLen: uint64(o.EventsMaxLen), now: o.Now, log: o.Logger,
		grace: o.GatewayGrace.Milliseconds(), recheck: cmp.Or(o.GatewayRecheck, time.Second).Milliseconds(),
		horizon: o.GatewayHorizon.Milliseconds(), lostAfter: o.GatewayLost.Milliseconds(),
		reapGap: o.ReapGap.Milliseconds(), reaped: make([]int64, o.Shards), gapEnd: make([]int64, o.Shards)}
	s.openedMs = s.nowMs()
	err := db.Update(func(tx *bolt.Tx) error {
		meta, err := tx.CreateBucketIfNotExists(bucketMeta)
		if err != nil {
			return err
		}
		if err := checkMeta(meta, uint64(o.Shards)); err != nil {
			return err
		}
		if _, err := tx.CreateBucketIfNotExists(bucketEpochs); err != nil {
			return err
		}
		for n := range o.Shards {
			b, err := tx.CreateBucketIfNotExists(shardBucket(n))
			if err != nil {
				return err
			}
			for _, name := range [][]byte{bucketDev, bucketExp, bucketEv} {
				if _, err := b.CreateBucketIfNotExists(name); err != nil {
					return err
				}
			}
		}
		// a file the migrations to formats 4 and 6 did not see (a bolt
		// file opened without internal/statefile, shards new to it)
		if err := countShards(tx); err != nil {
			return err
		}
		return indexShards(tx)
	})
	if err != nil {
		return nil, fmt.Errorf("embedded: open: %w", err)
	}
	s.log.Info("embedded store opened", "path", db.Path(), "shards", o.Shards, "events_max_len", o.EventsMaxLen)
	return s, nil
}

// checkMeta records shards and schema in a new file and compares them in
// an existing one.
func checkMeta(meta *bolt.Bucket, shards uint64) error {
	have := meta.Get(keyShards)
	if have == nil {
		if err := meta.Put(keyShards, u64(shards)); err != nil {
			return err
		}
		return meta.Put(keySchema, u64(schema))
	}
	n, err := decodeU64(have)
	if err != nil {
		return fmt.Errorf("meta shards: %w", err)
	}
	v, err := decodeU64(meta.Get(keySchema))
	if err != nil {
		return fmt.Errorf("meta schema: %w", err)
	}
	if n != shards || v != schema {
		return fmt.Errorf("file has %d shards, schema %d; want %d shards, schema %d: %w",
			n, v, shards, schema, gateway.ErrShardMismatch)
	}
	return nil
}

// Shards is the shard count the store was opened with.
func (s *Store) Shards() int { return s.shards }

// Close makes every later call fail; the bbolt file stays open (the
// gateway owns it).
func (s *Store) Close() error {
	s.closed.Store(true)
	s.wake.signal()
	return nil
}

func (s *Store) ready(ctx context.Context) error {
	if s.closed.Load() {
		return errClosed
	}
	return ctx.Err()
}

func (s *Store) checkShard(ctx context.Context, shard int) error {
	if err := s.ready(ctx); err != nil {
		return err
	}
	if shard < 0 || shard >= s.shards {
		return fmt.Errorf("shard %d of %d: %w", shard, s.shards, gateway.ErrBadShard)
	}
	return nil
}

// shard is the bucket of one shard in a transaction.
type shard struct {
	n    int
	root *bolt.Bucket
	dev  *bolt.Bucket
	exp  *bolt.Bucket
	ev   *bolt.Bucket
	chg  *bolt.Bucket
}

func openShard(tx *bolt.Tx, n int) (shard, error) {
	root := tx.Bucket(shardBucket(n))
	if root == nil {
		return shard{}, fmt.Errorf("shard %d: bucket missing", n)
	}
	sh := shard{n: n, root: root, dev: root.Bucket(bucketDev), exp: root.Bucket(bucketExp), ev: root.Bucket(bucketEv), chg: root.Bucket(bucketChg)}
	if sh.dev == nil || sh.exp == nil || sh.ev == nil || sh.chg == nil {
		return shard{}, fmt.Errorf("shard %d: nested bucket missing", n)
	}
	return sh, nil
}

func (sh shard) record(d gateway.DeviceID) (record, bool, error) {
	v := sh.dev.Get([]byte(d))
	if v == nil {
		return record{}, false, nil
	}
	r, err := decodeRecord(v)
	if err != nil {
		return record{}, false, fmt.Errorf("device %s: %w", d, err)
	}
	return r, true, nil
}
