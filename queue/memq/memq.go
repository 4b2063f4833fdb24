// Package memq is the data path's memory queue (for QoS 0 messages): a
// gateway.Queue that holds its messages in one slice, bounded in bytes
// and in age, and drops its oldest messages to make room. It keeps
// nothing across a restart; otherwise it has the durable queue's
// semantics (queue/diskq), checked by the same suite (queue/queuetest).
//
// Put copies the messages it takes (payload and properties), and keeps
// Received at millisecond precision, in UTC, as the durable queue does.
// Read returns the messages it holds without copying them again: the
// caller must not change a read message's Payload or Properties.
// Stats.Oldest is the Received of the message with the lowest ID.
//
// Messages older than MaxAge are dropped (DropExpired) when Read comes
// to them and, at the head of the queue, when Put appends: a queue that
// is written and never read keeps to its max age too.
package memq

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/fleetgate/fleetgate/gateway"
)

// Options configure New.
type Options struct {
	// MaxBytes bounds the messages held (Message.Size summed); required.
	MaxBytes int64
	// MaxAge drops messages received longer ago than it; 0 keeps them
	// however old.
	MaxAge time.Duration
	// Clock is the clock ages are measured on (default
	// gateway.SystemClock).
	Clock gateway.Clock
}

// Queue is the memory queue. It is safe for concurrent use; Read is
// meant for one reader.
type Queue struct {
	maxBytes int64
	maxAge   time.Duration
	clock    gateway.Clock

	mu     sync.Mutex
	closed bool
	// items[head:] are the messages handed out and not yet known gone,
	// in ID order; a slot acknowledged or dropped in the middle stays
	// (gone, its message released) until the head passes it or a
	// compaction removes it.
	items   []slot
	head    int
	live    int   // slots not gone
	bytes   int64 // their Size summed
	last    uint64
	dropped map[gateway.DropReason]uint64
	// wake is closed when messages are put (and replaced) or the queue
	// is closed: a waiting Read looks again. waiting says a Read found
	// nothing since it was last replaced: a Put with no Read waiting
	// leaves it.
	wake    chan struct{}
	waiting bool
}

// slot is one message with its ID and Size.
type slot struct {
	id   uint64
	size int64
	gone bool
	msg  gateway.Message
}

var _ gateway.Queue = (*Queue)(nil)

// New returns an empty queue.
func New(o Options) (*Queue, error) {
	if o.MaxBytes <= 0 {
		return nil, fmt.Errorf("memq: max bytes %d, want > 0", o.MaxBytes)
	}
	if o.MaxAge < 0 {
		return nil, fmt.Errorf("memq: max age %v, want ≥ 0", o.MaxAge)
	}
	if o.Clock == nil {
		o.Clock = gateway.SystemClock{}
	}
	return &Queue{maxBytes: o.MaxBytes, maxAge: o.MaxAge, clock: o.Clock,
		dropped: map[gateway.DropReason]uint64{}, wake: make(chan struct{})}, nil
}

// Put appends msgs in order, all or nothing, and returns their IDs: it
// fails with gateway.ErrTooLarge, putting none, when one is larger than
// MaxBytes, and with ctx's error when ctx has ended already. It first
// drops the expired messages at the head, then appends each message,
// dropping the oldest while the queue holds more than MaxBytes (a batch
// larger than the queue keeps its newest messages; the ID of one it
// drops is 0). It never waits.
func (q *Queue) Put(ctx context.Context, msgs []gateway.Message) ([]uint64, error) {
	for i, m := range msgs {
		if n := m.Size(); int64(n) > q.maxBytes {
			return nil, fmt.Errorf("memq: message %d of %d bytes, the queue holds %d: %w", i, n, q.maxBytes, gateway.ErrTooLarge)
		}
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.closed {
		return nil, gateway.ErrQueueClosed
	}
	if len(msgs) == 0 {
		return []uint64{}, nil
	}
	now := q.clock.Now()
	for q.live > 0 && q.expired(q.items[q.head].msg, now) {
		q.dropAt(q.head, gateway.DropExpired)
	}
	ids := make([]uint64, len(msgs))
	first := q.last + 1
	for i, m := range msgs {
		q.last++
		ids[i] = q.last
		s := slot{id: q.last, size: int64(m.Size()), msg: keep(m)}
		q.items = append(q.items, s)
		q.live++
		q.bytes += s.size
		for q.bytes > q.maxBytes {
			if id := q.items[q.head].id; id >= first {
				ids[id-first] = 0 // one of ours: never there to read
			}
			q.dropAt(q.head, gateway.DropFull)
		}
	}
	q.tidy()
	if q.waiting {
		close(q.wake)
		q.wake, q.waiting = make(chan struct{}), false
	}
	return ids, nil
}

// keep is the copy of m the queue holds.
func keep(m gateway.Message) gateway.Message {
	m.Payload = slices.Clone(m.Payload)
	m.Properties = slices.Clone(m.Properties)
	m.Received = time.UnixMilli(m.Received.UnixMilli()).UTC()
	return m
}

func (q *Queue) expired(m gateway.Message, now time.Time) bool {
	return q.maxAge > 0 && now.Sub(m.Received) > q.maxAge
}

// Read returns up to n messages with IDs above after, oldest first,
// dropping the expired ones it comes to. When there are none it waits
// for a Put, the end of ctx (its error) or Close (ErrQueueClosed); a
// done ctx does not keep it from returning messages that are there.
func (q *Queue) Read(ctx context.Context, after uint64, n int) ([]gateway.QueuedMessage, error) {
	if n < 1 {
		return nil, fmt.Errorf("memq: read %d messages, want ≥ 1", n)
	}
	for {
		out, wake, err := q.look(after, n)
		if err != nil || len(out) > 0 {
			return out, err
		}
		select {
		case <-wake:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}

// look is one pass of Read: what is there now, and the channel that
// says when to look again.
func (q *Queue) look(after uint64, n int) ([]gateway.QueuedMessage, <-chan struct{}, error) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.closed {
		return nil, nil, gateway.ErrQueueClosed
	}
	now := q.clock.Now()
	var out []gateway.QueuedMessage
	for i := q.find(after + 1); i < len(q.items) && len(out) < n; i++ {
		s := &q.items[i]
		switch {
		case s.gone || s.id <= after: // after+1 wrapped at the largest ID
		case q.expired(s.msg, now):
			q.dropAt(i, gateway.DropExpired)
		default:
			out = append(out, gateway.QueuedMessage{ID: s.id, Message: s.msg})
		}
	}
	q.tidy()
	if len(out) == 0 {
		q.waiting = true
	}
	return out, q.wake, nil
}

// find is the index in items of the first slot at or after head with
// an ID of at least id.
func (q *Queue) find(id uint64) int {
	i, _ := slices.BinarySearchFunc(q.items[q.head:], id, func(s slot, id uint64) int {
		switch {
		case s.id < id:
			return -1
		case s.id > id:
			return 1
		}
		return 0
	})
	return q.head + i
}

// dropAt drops the message in slot i (not gone) for reason r.
func (q *Queue) dropAt(i int, r gateway.DropReason) {
	q.remove(i)
	q.dropped[r]++
}

// remove marks slot i gone, releases its message and moves the head
// past the gone slots. Indexes into items stay valid until tidy.
func (q *Queue) remove(i int) {
	s := &q.items[i]
	s.gone, s.msg = true, gateway.Message{}
	q.live--
	q.bytes -= s.size
	for q.head < len(q.items) && q.items[q.head].gone {
		q.head++
	}
}

// tidy gives back the room of the gone slots: all of them when they are
// more than twice the live ones, else those before the head when they
// are more than half of items; a large slice emptied is let go. Each
// slot is moved O(1) times on average.
func (q *Queue) tidy() {
	switch held := len(q.items) - q.head; {
	case held == 0 && cap(q.items) > 4096:
		q.items, q.head = nil, 0
	case held == 0:
		q.items, q.head = q.items[:0], 0
	case held > 64 && held > 2*q.live:
		q.items = slices.DeleteFunc(append(q.items[:0], q.items[q.head:]...), func(s slot) bool { return s.gone })
		q.head = 0
	case q.head > 64 && q.head > len(q.items)/2:
		q.items = slices.Delete(q.items, 0, q.head)
		q.head = 0
	}
}

// Ack removes the messages with these IDs; IDs not held are ignored.
func (q *Queue) Ack(ids []uint64) error {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.closed {
		return gateway.ErrQueueClosed
	}
	for _, id := range ids {
		if i := q.find(id); i < len(q.items) && q.items[i].id == id && !q.items[i].gone {
			q.remove(i)
		}
	}
	q.tidy()
	return nil
}

// Stats reports what the queue holds and what it dropped since New.
func (q *Queue) Stats() gateway.QueueStats {
	q.mu.Lock()
	defer q.mu.Unlock()
	s := gateway.QueueStats{Messages: q.live, Bytes: q.bytes, Dropped: maps.Clone(q.dropped)}
	if q.live > 0 {
		s.Oldest = q.items[q.head].msg.Received
	}
	return s
}

// Close drops what the queue holds and ends a waiting Read; every later
// Put, Read and Ack fails with ErrQueueClosed. Closing again does
// nothing.
func (q *Queue) Close() error {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.closed {
		return nil
	}
	q.closed = true
	q.items, q.head, q.live, q.bytes = nil, 0, 0, 0
	close(q.wake)
	return nil
}
