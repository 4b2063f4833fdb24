package diskq

import (
	"fmt"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/fleetgate/fleetgate/gateway"
)

// opKind says what an op does.
type opKind int

const (
	// opPut appends vals (encoded messages of sizes).
	opPut opKind = iota
	// opAck removes ids.
	opAck
	// opDrop removes ids for reasons, counting those still held.
	opDrop
)

// op is one call's change, waiting for a commit; done receives the
// commit's error. A put's commit writes the IDs it gave vals into
// assigned (0 for one it dropped), which its caller reads once done
// said nil.
type op struct {
	kind     opKind
	vals     [][]byte
	sizes    []int64
	assigned []uint64
	ids      []uint64
	reasons  []gateway.DropReason
	done     chan error
}

// submit hands o to the committer, or fails with ErrQueueClosed.
func (q *Queue) submit(o *op) error {
	o.done = make(chan error, 1)
	q.pmu.Lock()
	if q.closing {
		q.pmu.Unlock()
		return gateway.ErrQueueClosed
	}
	q.pending = append(q.pending, o)
	q.pmu.Unlock()
	select {
	case q.kick <- struct{}{}:
	default:
	}
	return nil
}

// commitLoop is the committer: it commits what is pending, at most once
// per CommitInterval, until Close, and then what is still pending.
func (q *Queue) commitLoop() {
	defer close(q.stopped)
	var last time.Time // start of the last commit
	for {
		stopping := false
		select {
		case <-q.kick:
		case <-q.stop:
			stopping = true
		}
		if wait := time.Until(last.Add(q.every)); q.every > 0 && wait > 0 && !stopping {
			t := time.NewTimer(wait)
			select {
			case <-t.C:
			case <-q.stop:
				t.Stop()
				stopping = true
			}
		}
		q.pmu.Lock()
		ops := q.pending
		q.pending = nil
		q.pmu.Unlock()
		if len(ops) > 0 {
			last = time.Now()
			err := q.commit(ops)
			for _, o := range ops {
				o.done <- err
			}
		}
		if stopping {
			return
		}
	}
}

// commit writes ops in one transaction, in order, as if each ran alone:
// a put first drops the expired messages at the head, then appends its
// messages one by one, dropping the oldest while the queue is over
// MaxBytes. The in-memory state changes only when the transaction
// committed.
func (q *Queue) commit(ops []*op) error {
	q.mu.Lock()
	st := q.state
	q.mu.Unlock()
	dropped := map[gateway.DropReason]uint64{}
	var first time.Time
	put := false
	err := q.db.Update(func(tx *bolt.Tx) error {
		msgs, err := q.msgs(tx)
		if err != nil {
			return err
		}
		// Appends go at the end of the bucket: full pages split less.
		msgs.FillPercent = 0.95
		now := q.clock.Now()
		ts := &txState{q: q, msgs: msgs, st: &st, dropped: dropped}
		for _, o := range ops {
			switch o.kind {
			case opPut:
				if err := ts.trim(now); err != nil {
					return err
				}
				first := st.last + 1
				for i, v := range o.vals {
					st.last++
					o.assigned[i] = st.last
					if err := msgs.Put(idKey(st.last), v); err != nil {
						return err
					}
					st.count++
					st.bytes += uint64(o.sizes[i])
					for st.bytes > uint64(q.max) {
						id, err := ts.dropHead(gateway.DropFull)
						if err != nil {
							return err
						}
						if id >= first {
							o.assigned[id-first] = 0 // its own: never there to read
						}
					}
				}
				put = put || len(o.vals) > 0
			case opAck:
				for _, id := range o.ids {
					ts.remove(id, "")
				}
			case opDrop:
				for i, id := range o.ids {
					ts.remove(id, o.reasons[i])
				}
			}
			if err := ts.err; err != nil {
				return err
			}
		}
		if st.count == 0 {
			st.bytes = 0
		}
		first = oldest(msgs)
		return tx.Bucket(q.bucket).Put(keyMeta, st.encode())
	})
	if err != nil {
		q.log.Error("queue commit failed", "ops", len(ops), "err", err)
		return fmt.Errorf("diskq: commit: %w", err)
	}
	q.commits.Add(1)
	q.mu.Lock()
	q.state, q.oldest = st, first
	for r, n := range dropped {
		q.dropped[r] += n
	}
	if put {
		close(q.wake)
		q.wake = make(chan struct{})
	}
	q.mu.Unlock()
	return nil
}

// txState is a commit's transaction with the queue's state in it.
type txState struct {
	q       *Queue
	msgs    *bolt.Bucket
	st      *meta
	dropped map[gateway.DropReason]uint64
	err     error
}

// trim drops the expired messages at the head.
func (t *txState) trim(now time.Time) error {
	if t.q.maxAge <= 0 {
		return nil
	}
	for {
		_, v := t.msgs.Cursor().First()
		if v == nil {
			return nil
		}
		f, err := parse(v)
		if err != nil || !t.q.expired(f.received, now) {
			// A damaged head is Read's to drop (gateway.DropCorrupt), or a
			// Put's that needs its room.
			return nil
		}
		if _, err := t.dropHead(gateway.DropExpired); err != nil {
			return err
		}
	}
}

// dropHead drops the oldest message for reason r (gateway.DropCorrupt when it
// is damaged) and returns its ID (0 when there was none, or its key is
// not an ID).
func (t *txState) dropHead(r gateway.DropReason) (uint64, error) {
	c := t.msgs.Cursor()
	k, v := c.First()
	if k == nil {
		// The meta record counted bytes the bucket does not hold.
		t.st.count, t.st.bytes = 0, 0
		return 0, nil
	}
	id, _ := keyID(k)
	if _, err := parse(v); err != nil {
		r = gateway.DropCorrupt
		t.q.log.Error("damaged message dropped", "key", fmt.Sprintf("%x", k), "err", err)
	}
	t.take(valueSize(v))
	t.dropped[r]++
	return id, c.Delete()
}

// remove removes message id if it is held, counting it under reason r
// unless r is "" (acknowledged).
func (t *txState) remove(id uint64, r gateway.DropReason) {
	if t.err != nil {
		return
	}
	k := idKey(id)
	v := t.msgs.Get(k)
	if v == nil {
		return
	}
	t.take(valueSize(v))
	if r != "" {
		t.dropped[r]++
	}
	t.err = t.msgs.Delete(k)
}

// take counts one message of size bytes out.
func (t *txState) take(size int64) {
	t.st.count -= min(t.st.count, 1)
	t.st.bytes -= min(t.st.bytes, uint64(size))
}
