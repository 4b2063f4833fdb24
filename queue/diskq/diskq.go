// Package diskq is the data path's durable queue: a gateway.Queue in a
// bbolt file. A Put returns once its messages are committed and
// fsynced, and an Ack once the removal is: neither is undone by a crash.
// The gateway keeps it in its own file, <state_dir>/bridge.db, so that
// its fsyncs never wait behind the presence outbox's.
//
// Puts from many goroutines share commits (group commit): one
// goroutine per queue takes every Put, Ack and drop that arrived since
// the last commit and writes them in one bbolt transaction, one fsync,
// in the order they arrived, each as if it ran alone. With
// Options.CommitInterval it commits at most once per interval, so that
// a burst of messages costs one fsync per interval; a Put then waits at
// most about the interval and one commit.
//
// Messages older than MaxAge are dropped (gateway.DropExpired) when
// Read comes to them and, at the head of the queue, when a Put is
// committed: a queue that is written and never read keeps to its max
// age too. A queue that is neither written nor read keeps its expired
// messages until the next Put or Read.
//
// A message whose value is damaged (codec.go) is dropped when Read or
// a Put making room comes to it, counted under gateway.DropCorrupt and logged;
// decoding checks the value's checksum, then every length against what
// is left of the value, so a damaged value is never a crash or a hang.
//
// Messages come back as they were put, Received at millisecond
// precision in UTC. Stats.Oldest is the Received of the message with
// the lowest ID.
//
// One file may hold several queues, each in its own bucket (the bridge
// keeps its pending commands beside the messages going up): open the
// file once (OpenFile) and call OpenDB for each.
package diskq

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"sync"
	"sync/atomic"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/fleetgate/fleetgate/gateway"
)

// DefaultBucket is the bucket of a queue whose Options name none.
const DefaultBucket = "queue"

// LockTimeout is how long Open waits for the file's lock, held by
// another process with the same file open.
const LockTimeout = 2 * time.Second

// ErrNewerFormat is returned by Open and OpenDB for a queue written by
// a newer release (codec.go); the file is left as it is.
var ErrNewerFormat = errors.New("queue written by a newer fleetgate release")

// Options configure Open and OpenDB.
type Options struct {
	// Path is the bbolt file Open opens or creates; OpenDB ignores it.
	Path string
	// Bucket is the top-level bucket of the queue in the file (default
	// DefaultBucket); two queues in one file need two names.
	Bucket string
	// MaxBytes bounds the messages held (Message.Size summed); required.
	MaxBytes int64
	// MaxAge drops messages received longer ago than it; 0 keeps them
	// however old.
	MaxAge time.Duration
	// CommitInterval is the least time from the start of one commit to
	// the start of the next, on the real clock (it paces the disk). 0
	// commits as soon as the last commit ended, with what arrived
	// meanwhile.
	CommitInterval time.Duration
	// Clock is the clock ages are measured on (default
	// gateway.SystemClock).
	Clock gateway.Clock
	// Logger defaults to discarding.
	Logger *slog.Logger
}

// Queue is the durable queue. It is safe for concurrent use; Read is
// meant for one reader.
type Queue struct {
	db     *bolt.DB
	ownsDB bool
	bucket []byte
	max    int64
	maxAge time.Duration
	every  time.Duration
	clock  gateway.Clock
	log    *slog.Logger

	// commits counts the transactions committed (tests and benchmarks
	// read it: messages per commit).
	commits atomic.Uint64

	// pmu guards the ops waiting for the committer and closing.
	pmu     sync.Mutex
	pending []*op
	closing bool
	kick    chan struct{} // a token: there are ops pending
	stop    chan struct{} // closed by Close: commit what is pending and end
	stopped chan struct{} // closed by the committer when it ended

	// mu guards what the last commit left, for Stats and Read.
	mu      sync.Mutex
	state   meta
	oldest  time.Time
	dropped map[gateway.DropReason]uint64
	closed  bool
	// wake is closed (and replaced) by a commit that put messages, and
	// by Close: a waiting Read looks again.
	wake chan struct{}
}

var _ gateway.Queue = (*Queue)(nil)

// Open opens (or creates) the bbolt file at o.Path with OpenFile and
// the queue in it; Close closes the file. For two queues in one file,
// call OpenFile once and OpenDB for each.
func Open(o Options) (*Queue, error) {
	db, err := OpenFile(o.Path)
	if err != nil {
		return nil, err
	}
	q, err := OpenDB(db, o)
	if err != nil {
		return nil, errors.Join(err, db.Close())
	}
	q.ownsDB = true
	return q, nil
}

// OpenFile opens (or creates) a bbolt file for queues, waiting at most
// LockTimeout for its lock. The file's free list is not written by each
// commit (bbolt's NoFreelistSync, its hash map free list): a file that
// held a backlog keeps its pages as free pages, and their list, 8 bytes
// a page, grows with the backlog: written by every commit, it cost a
// queue emptied of 200,000 messages (45 MB, 84 KB of list) 5–30 % of
// its Put rate (BenchmarkPutAfterBacklog), and would cost more at the
// default 256 MiB. bbolt rebuilds the list at open instead, from the
// tree: about 0.1 s for a file of 45 MB in the page cache, where
// reading a written list takes 2 ms (BenchmarkOpen). A gateway that
// checks the file after an unclean stop and moves a damaged one aside
// opens it with internal/statefile instead.
func OpenFile(path string) (*bolt.DB, error) {
	db, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: LockTimeout, NoFreelistSync: true, FreelistType: bolt.FreelistMapType})
	if err != nil {
		return nil, fmt.Errorf("diskq: open %s: %w", path, err)
	}
	return db, nil
}

// OpenDB opens the queue in bucket o.Bucket of db, creating it if
// needed; Close leaves db open. It reads the queue's size from the
// bucket's meta record, refuses a queue of a newer format, and rebuilds
// the record with a scan of the messages when it is unreadable or
// behind the last message (logged).
func OpenDB(db *bolt.DB, o Options) (*Queue, error) {
	if o.MaxBytes <= 0 {
		return nil, fmt.Errorf("diskq: max bytes %d, want > 0", o.MaxBytes)
	}
	if o.MaxAge < 0 || o.CommitInterval < 0 {
		return nil, fmt.Errorf("diskq: max age %v, commit interval %v: want ≥ 0", o.MaxAge, o.CommitInterval)
	}
	if o.Clock == nil {
		o.Clock = gateway.SystemClock{}
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	q := &Queue{
		db: db, bucket: []byte(cmp.Or(o.Bucket, DefaultBucket)),
		max: o.MaxBytes, maxAge: o.MaxAge, every: o.CommitInterval, clock: o.Clock,
		kick: make(chan struct{}, 1), stop: make(chan struct{}), stopped: make(chan struct{}),
		dropped: map[gateway.DropReason]uint64{}, wake: make(chan struct{}),
	}
	q.log = o.Logger.With("queue", string(q.bucket))
	err := db.Update(func(tx *bolt.Tx) error {
		b, err := tx.CreateBucketIfNotExists(q.bucket)
		if err != nil {
			return err
		}
		msgs, err := b.CreateBucketIfNotExists(bucketMsgs)
		if err != nil {
			return err
		}
		v := b.Get(keyMeta)
		m, err := decodeMeta(v)
		if errors.Is(err, ErrNewerFormat) {
			return err
		}
		lastKey, _ := msgs.Cursor().Last()
		lastID, _ := keyID(lastKey)
		switch {
		case v == nil && lastKey == nil:
			m = meta{}
		case err != nil || m.last < lastID:
			q.log.Warn("queue meta record unreadable or behind its messages: counting them", "err", err, "last", m.last, "last_key", lastID)
			m = rebuild(msgs, max(m.last, lastID))
		}
		q.state = m
		q.oldest = oldest(msgs)
		return b.Put(keyMeta, m.encode())
	})
	if err != nil {
		return nil, fmt.Errorf("diskq: open queue %q in %s: %w", q.bucket, db.Path(), err)
	}
	go q.commitLoop()
	return q, nil
}

// rebuild counts the messages in msgs; a damaged one counts as its
// length plus 64 bytes.
func rebuild(msgs *bolt.Bucket, last uint64) meta {
	m := meta{last: last}
	c := msgs.Cursor()
	for k, v := c.First(); k != nil; k, v = c.Next() {
		m.count++
		m.bytes += uint64(valueSize(v))
	}
	return m
}

// valueSize is the Message.Size of the message in v, or, when v is
// damaged, its length plus 64.
func valueSize(v []byte) int64 {
	f, err := parse(v)
	if err != nil {
		return int64(len(v)) + headerSize
	}
	return f.size()
}

// oldest is the Received of the first message in msgs (zero when it is
// empty or damaged).
func oldest(msgs *bolt.Bucket) time.Time {
	_, v := msgs.Cursor().First()
	if v == nil {
		return time.Time{}
	}
	f, err := parse(v)
	if err != nil {
		return time.Time{}
	}
	return time.UnixMilli(f.received).UTC()
}

// Put appends msgs in order, all or nothing, and returns their IDs once
// they are committed to disk. It fails at once with
// gateway.ErrTooLarge, putting none, when one is larger than MaxBytes,
// and with ctx's error when ctx has ended before the call. Its commit
// assigns the IDs: it first drops the expired messages at the head,
// then appends each message, dropping the oldest while the queue holds
// more than MaxBytes (a batch larger than the queue keeps its newest
// messages; the ID of one it drops is 0). When ctx ends while Put waits
// for the commit, it returns ctx's error and the messages may be
// committed.
func (q *Queue) Put(ctx context.Context, msgs []gateway.Message) ([]uint64, error) {
	for i, m := range msgs {
		if n := m.Size(); int64(n) > q.max {
			return nil, fmt.Errorf("diskq: message %d of %d bytes, the queue holds %d: %w", i, n, q.max, gateway.ErrTooLarge)
		}
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if len(msgs) == 0 {
		if err := q.live(); err != nil {
			return nil, err
		}
		return []uint64{}, nil
	}
	o := &op{kind: opPut, vals: make([][]byte, len(msgs)), sizes: make([]int64, len(msgs)), assigned: make([]uint64, len(msgs))}
	for i, m := range msgs {
		o.vals[i], o.sizes[i] = encode(m), int64(m.Size())
	}
	if err := q.submit(o); err != nil {
		return nil, err
	}
	select {
	case err := <-o.done:
		if err != nil {
			return nil, err
		}
		return o.assigned, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// Read returns up to n messages with IDs above after, oldest first, as
// committed. The expired and damaged messages it comes to are dropped,
// in a commit Read waits for. When there are none it waits for a
// commit that puts messages, the end of ctx (its error) or Close
// (ErrQueueClosed); a done ctx does not keep it from returning messages
// that are there.
func (q *Queue) Read(ctx context.Context, after uint64, n int) ([]gateway.QueuedMessage, error) {
	if n < 1 {
		return nil, fmt.Errorf("diskq: read %d messages, want ≥ 1", n)
	}
	for {
		q.mu.Lock()
		closed, wake := q.closed, q.wake
		q.mu.Unlock()
		if closed {
			return nil, gateway.ErrQueueClosed
		}
		out, drop, more, err := q.scan(after, n)
		if err != nil {
			return nil, err
		}
		if len(drop.ids) > 0 {
			if err := q.submit(drop); err != nil {
				return nil, err
			}
			if err := <-drop.done; err != nil {
				return nil, err
			}
		}
		if len(out) > 0 {
			return out, nil
		}
		if more {
			continue
		}
		select {
		case <-wake:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}

// scanDrops bounds the messages one pass of Read drops: the rest wait
// for the next pass, so that one commit stays short.
const scanDrops = 1024

// scan is one pass of Read in a read transaction: the messages to
// return, the drop op of the expired and damaged ones it came to, and
// whether it stopped at scanDrops.
func (q *Queue) scan(after uint64, n int) ([]gateway.QueuedMessage, *op, bool, error) {
	var out []gateway.QueuedMessage
	drop := &op{kind: opDrop}
	more := false
	now := q.clock.Now()
	err := q.db.View(func(tx *bolt.Tx) error {
		msgs, err := q.msgs(tx)
		if err != nil {
			return err
		}
		c := msgs.Cursor()
		for k, v := c.Seek(idKey(after + 1)); k != nil && len(out) < n; k, v = c.Next() {
			id, ok := keyID(k)
			if !ok || id <= after { // after+1 wrapped at the largest ID
				continue
			}
			if len(drop.ids) == scanDrops {
				more = true
				break
			}
			f, err := parse(v)
			switch {
			case err != nil:
				q.log.Error("damaged message dropped", "id", id, "err", err)
				drop.ids, drop.reasons = append(drop.ids, id), append(drop.reasons, gateway.DropCorrupt)
			case q.expired(f.received, now):
				drop.ids, drop.reasons = append(drop.ids, id), append(drop.reasons, gateway.DropExpired)
			default:
				out = append(out, gateway.QueuedMessage{ID: id, Message: f.message()})
			}
		}
		return nil
	})
	if err != nil {
		q.mu.Lock()
		closed := q.closed
		q.mu.Unlock()
		if closed {
			return nil, nil, false, gateway.ErrQueueClosed
		}
		return nil, nil, false, fmt.Errorf("diskq: read: %w", err)
	}
	return out, drop, more, nil
}

// expired reports whether a message received at ms is older than the
// max age at now.
func (q *Queue) expired(ms int64, now time.Time) bool {
	return q.maxAge > 0 && now.Sub(time.UnixMilli(ms)) > q.maxAge
}

// msgs is the queue's message bucket in tx.
func (q *Queue) msgs(tx *bolt.Tx) (*bolt.Bucket, error) {
	b := tx.Bucket(q.bucket)
	if b == nil {
		return nil, fmt.Errorf("bucket %q missing", q.bucket)
	}
	msgs := b.Bucket(bucketMsgs)
	if msgs == nil {
		return nil, fmt.Errorf("bucket %q/%s missing", q.bucket, bucketMsgs)
	}
	return msgs, nil
}

// Ack removes the messages with these IDs and returns once that is
// committed to disk; IDs not held are ignored.
func (q *Queue) Ack(ids []uint64) error {
	if len(ids) == 0 {
		return q.live()
	}
	o := &op{kind: opAck, ids: ids}
	if err := q.submit(o); err != nil {
		return err
	}
	return <-o.done
}

// live returns ErrQueueClosed once Close has begun, else nil.
func (q *Queue) live() error {
	q.pmu.Lock()
	defer q.pmu.Unlock()
	if q.closing {
		return gateway.ErrQueueClosed
	}
	return nil
}

// Stats reports what the queue holds, as committed, and what it dropped
// since it was opened.
func (q *Queue) Stats() gateway.QueueStats {
	q.mu.Lock()
	defer q.mu.Unlock()
	return gateway.QueueStats{
		Messages: int(q.state.count),
		Bytes:    int64(q.state.bytes),
		Oldest:   q.oldest,
		Dropped:  maps.Clone(q.dropped),
	}
}

// Close commits the Puts and Acks already taken, ends a waiting Read,
// and makes every later Put, Read and Ack fail with ErrQueueClosed; a
// queue from Open closes its file. Closing again does nothing.
func (q *Queue) Close() error {
	q.pmu.Lock()
	if q.closing {
		q.pmu.Unlock()
		return nil
	}
	q.closing = true
	q.pmu.Unlock()
	close(q.stop)
	<-q.stopped
	q.mu.Lock()
	q.closed = true
	close(q.wake)
	q.mu.Unlock()
	if q.ownsDB {
		if err := q.db.Close(); err != nil {
			return fmt.Errorf("diskq: close %s: %w", q.db.Path(), err)
		}
	}
	return nil
}
