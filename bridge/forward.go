package bridge

import (
	"context"
	"errors"
	"hash/fnv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fleetgate/fleetgate/gateway"
	"github.com/fleetgate/fleetgate/internal/ctxsleep"
)

// RefusalTries is how many times a message the upstream broker refuses
// is sent before it is dropped: a refusal may pass (a quota, an ACL
// being reloaded), but one that lasts must not stall its lane.
const RefusalTries = 5

// readBatch bounds the messages one Read of a queue returns.
const readBatch = 64

// forwarder publishes one queue's messages upstream: a reader hands
// them, in the queue's order, to lanes chosen by device; each lane
// publishes one message at a time and goes on once it is acknowledged
// (PUBACK at QoS 1, written at QoS 0), so a device's messages reach the
// broker in order while devices go in parallel; an acker removes the
// forwarded messages from the queue in batches. A message stays in its
// lane until acknowledged: after a lost connection it is sent again
// first. At most window messages, and about windowBytes (Message.Size),
// are held between the reader and the acker.
type forwarder struct {
	b     *Bridge
	name  string // "durable" or "memory"
	q     gateway.Queue
	lanes []*lane
	// slots holds one token per message the forwarder may hold more.
	slots chan struct{}
	// held is the size of the messages held; the reader reads no more
	// while it is windowBytes or more, until released is signalled.
	held     atomic.Int64
	released chan struct{}
	// acks carries the messages done with (forwarded or dropped) to the
	// acker.
	acks chan done
}

// lane is one lane's messages, oldest first.
type lane struct {
	mu   sync.Mutex
	msgs []gateway.QueuedMessage
	wake chan struct{} // signalled when msgs was empty and got one
}

// windowBytes bounds the size of the messages a forwarder holds (it may
// pass it by a Read of messages larger than those of the Read before).
const windowBytes = 16 << 20

// done is a message a lane is done with.
type done struct {
	id   uint64
	size int
}

func newForwarder(b *Bridge, name string, q gateway.Queue, lanes, window int) *forwarder {
	f := &forwarder{b: b, name: name, q: q, lanes: make([]*lane, lanes),
		slots: make(chan struct{}, window), released: make(chan struct{}, 1), acks: make(chan done, window)}
	for i := range f.lanes {
		f.lanes[i] = &lane{wake: make(chan struct{}, 1)}
	}
	for range window {
		f.slots <- struct{}{}
	}
	return f
}

// run forwards until ctx ends; then it acknowledges what was forwarded
// and returns.
func (f *forwarder) run(ctx context.Context) {
	var lanes sync.WaitGroup
	for _, l := range f.lanes {
		lanes.Go(func() { f.runLane(ctx, l) })
	}
	acker := make(chan struct{})
	go func() {
		defer close(acker)
		f.runAcker()
	}()
	f.read(ctx)
	lanes.Wait()
	close(f.acks)
	<-acker
}

// read hands the queue's messages to the lanes until ctx ends.
func (f *forwarder) read(ctx context.Context) {
	var after uint64
	var mean int64 // of the messages of the last Read
	backoff := 50 * time.Millisecond
	for {
		for f.held.Load() >= windowBytes {
			select {
			case <-f.released:
			case <-ctx.Done():
				return
			}
		}
		select {
		case <-f.slots:
		case <-ctx.Done():
			return
		}
		// as many as fit the bytes left, at the last Read's mean size
		// (one at first)
		limit := 1
		if mean > 0 {
			limit = int(max(1, min(readBatch, (windowBytes-f.held.Load())/mean)))
		}
		n := 1
	more:
		for n < limit {
			select {
			case <-f.slots:
				n++
			default:
				break more
			}
		}
		msgs, err := f.q.Read(ctx, after, n)
		for range n - len(msgs) {
			f.slots <- struct{}{}
		}
		if err != nil {
			if ctx.Err() != nil || errors.Is(err, gateway.ErrQueueClosed) {
				return
			}
			f.b.log.Warn("read the queue", "queue", f.name, "err", err)
			if !ctxsleep.Sleep(ctx, backoff) {
				return
			}
			backoff = min(2*backoff, 5*time.Second)
			continue
		}
		backoff = 50 * time.Millisecond
		var size int64
		for _, m := range msgs {
			size += int64(m.Size())
			f.lanes[laneOf(m.Device, len(f.lanes))].push(m)
		}
		f.held.Add(size)
		if len(msgs) > 0 {
			after = msgs[len(msgs)-1].ID
			mean = size / int64(len(msgs))
		}
	}
}

// laneOf is the lane of device's messages.
func laneOf(device gateway.DeviceID, lanes int) int {
	h := fnv.New32a()
	h.Write([]byte(device))
	return int(h.Sum32() % uint32(lanes))
}

func (l *lane) push(m gateway.QueuedMessage) {
	l.mu.Lock()
	l.msgs = append(l.msgs, m)
	first := len(l.msgs) == 1
	l.mu.Unlock()
	if first {
		select {
		case l.wake <- struct{}{}:
		default:
		}
	}
}

// next returns the lane's oldest message, waiting for one until ctx
// ends.
func (l *lane) next(ctx context.Context) (gateway.QueuedMessage, bool) {
	for {
		l.mu.Lock()
		if len(l.msgs) > 0 {
			m := l.msgs[0]
			l.msgs[0] = gateway.QueuedMessage{}
			l.msgs = l.msgs[1:]
			if len(l.msgs) == 0 {
				l.msgs = nil
			}
			l.mu.Unlock()
			return m, true
		}
		l.mu.Unlock()
		select {
		case <-l.wake:
		case <-ctx.Done():
			return gateway.QueuedMessage{}, false
		}
	}
}

func (f *forwarder) runLane(ctx context.Context, l *lane) {
	for {
		m, ok := l.next(ctx)
		if !ok || !f.forward(ctx, m) {
			return
		}
		f.acks <- done{m.ID, m.Size()}
	}
}

// forward publishes m until the broker acknowledges it, or has refused
// it RefusalTries times (then it is dropped and counted); false only
// when ctx ended first.
func (f *forwarder) forward(ctx context.Context, m gateway.QueuedMessage) bool {
	o := &outgoing{topic: upstreamTopic(f.b.o.TopicPrefix, m.Device, m.Topic), qos: m.QoS,
		payload: m.Payload, contentType: m.ContentType, props: m.Properties}
	backoff := 50 * time.Millisecond
	refusals := 0
	for attempt := 0; ; attempt++ {
		if err := f.b.up.awaitConnection(ctx); err != nil {
			return false
		}
		err := f.b.up.publish(o)
		if err == nil {
			f.b.forwarded(m.Message)
			return true
		}
		if ctx.Err() != nil {
			return false
		}
		var refused *refusedError
		if errors.As(err, &refused) {
			f.b.m.refused.Inc()
			if refusals++; refusals == RefusalTries {
				f.b.log.Warn("the upstream broker refused a message; dropped", "queue", f.name, "device", m.Device,
					"topic", o.topic, "id", m.ID, "tries", RefusalTries, "reason", refused.why)
				f.b.drop(f.name, "refused", 1)
				return true
			}
		} else {
			if attempt%10 == 0 {
				f.b.log.Debug("publish upstream failed; sending again", "queue", f.name, "device", m.Device, "attempt", attempt+1, "err", err)
			}
			backoff = 10 * time.Millisecond // the connection's failure: awaitConnection waits for the next
		}
		if !ctxsleep.Sleep(ctx, backoff) {
			return false
		}
		backoff = min(2*backoff, 2*time.Second)
	}
}

// runAcker acknowledges the messages done with, in batches (one commit
// of a durable queue for what gathered during the last), until acks is
// closed.
func (f *forwarder) runAcker() {
	ids := make([]uint64, 0, readBatch)
	for d := range f.acks {
		ids = append(ids[:0], d.id)
		size := d.size
	gather:
		for len(ids) < cap(f.acks) {
			select {
			case d, ok := <-f.acks:
				if !ok {
					break gather
				}
				ids = append(ids, d.id)
				size += d.size
			default:
				break gather
			}
		}
		if err := f.q.Ack(ids); err != nil {
			// they stay in the queue and are sent again after a restart
			f.b.log.Warn("acknowledge forwarded messages in the queue", "queue", f.name, "messages", len(ids), "err", err)
		}
		for range ids {
			f.slots <- struct{}{}
		}
		f.held.Add(-int64(size))
		select {
		case f.released <- struct{}{}:
		default:
		}
	}
}
