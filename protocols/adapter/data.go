package adapter

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/fleetgate/fleetgate/gateway"
	pb "github.com/fleetgate/fleetgate/plugins/proto"
)

// Bounds of the data path through the host.
const (
	// PublishTimeout bounds one DataSink.Publish call; a call that takes
	// longer fails its items (settled FAILED).
	PublishTimeout = 10 * time.Second
	// SettleTimeout bounds one Settle call to the adapter.
	SettleTimeout = 5 * time.Second
	// publishers bounds the Publish calls of one frame in flight at once
	// (one per device of the frame).
	publishers = 16
)

// dataCounts are the data counters of an adapter, or of one frame.
type dataCounts struct {
	published, rejected, refused, dropped, failed, discarded atomic.Uint64
}

// add adds a frame's counts to p's and to the metrics.
func (d *dataCounts) add(f *dataCounts, m adapterCounters) {
	for _, c := range []struct {
		to, from *atomic.Uint64
		metric   interface{ Add(float64) }
	}{
		{&d.published, &f.published, m.dataPublished},
		{&d.rejected, &f.rejected, m.dataRejected},
		{&d.refused, &f.refused, m.dataRefused},
		{&d.dropped, &f.dropped, m.dataDropped},
		{&d.failed, &f.failed, m.dataFailed},
		{&d.discarded, &f.discarded, m.dataDiscarded},
	} {
		if n := c.from.Load(); n > 0 {
			c.to.Add(n)
			c.metric.Add(float64(n))
		}
	}
}

// deviceBatch is one device's messages of a frame, in order, with the
// settlement id of each (0 for QoS 0).
type deviceBatch struct {
	msgs []gateway.Message
	ids  []uint64
}

// frameData is what a frame's data comes to: the accepted messages by
// device (in the order of their first item), the settlements of its QoS 1
// items and the counts.
type frameData struct {
	batches []deviceBatch
	index   map[gateway.DeviceID]int
	mu      sync.Mutex // guards settled while the batches are published
	settled []*pb.Settlement
	counts  dataCounts
}

// add queues msg (of settlement id) for publishing.
func (f *frameData) add(msg gateway.Message, id uint64) {
	if f.index == nil {
		f.index = make(map[gateway.DeviceID]int)
	}
	i, ok := f.index[msg.Device]
	if !ok {
		i = len(f.batches)
		f.index[msg.Device] = i
		f.batches = append(f.batches, deviceBatch{})
	}
	f.batches[i].msgs = append(f.batches[i].msgs, msg)
	f.batches[i].ids = append(f.batches[i].ids, id)
}

// settle records the outcome of item e when it carries data: counted, and
// settled when it has an id (QoS 1).
func (f *frameData) settle(e *pb.Evidence, outcome pb.Outcome, reason string) {
	d := e.GetData()
	if d == nil {
		return
	}
	f.count(outcome, 1)
	if d.GetId() != 0 {
		f.mu.Lock()
		f.settled = append(f.settled, &pb.Settlement{Id: d.GetId(), Outcome: outcome, Reason: reason})
		f.mu.Unlock()
	}
}

// count counts n items of outcome.
func (f *frameData) count(outcome pb.Outcome, n uint64) {
	switch outcome {
	case pb.Outcome_OUTCOME_DURABLE:
		f.counts.published.Add(n)
	case pb.Outcome_OUTCOME_REJECTED:
		f.counts.rejected.Add(n)
	case pb.Outcome_OUTCOME_REFUSED:
		f.counts.refused.Add(n)
	case pb.Outcome_OUTCOME_DROPPED:
		f.counts.dropped.Add(n)
	case pb.Outcome_OUTCOME_FAILED:
		f.counts.failed.Add(n)
	case pb.Outcome_OUTCOME_DISCARDED:
		f.counts.discarded.Add(n)
	}
}

// message is d, the data of evidence ev, as a message of the data path,
// validated: an item of kind leave carries none, and the message passes
// gateway.ValidateMessage. Its Received time is when the device said it
// (the evidence's ObservedAt), its Source the adapter's name.
func (p *proc) message(ev gateway.Evidence, d *pb.Data) (gateway.Message, error) {
	if ev.Kind == gateway.Leave {
		return gateway.Message{}, errors.New("data on a leave")
	}
	if d.GetQos() > 1 {
		return gateway.Message{}, fmt.Errorf("data qos %d: want 0 or 1", d.GetQos())
	}
	m := gateway.Message{
		Device: ev.Device, Topic: d.GetTopic(), Payload: d.GetPayload(), ContentType: d.GetContentType(),
		QoS: byte(d.GetQos()), Received: ev.ObservedAt, Source: p.spec.Name,
	}
	if props := d.GetProperties(); len(props) > 0 {
		m.Properties = make([]gateway.Property, len(props))
		for i, pr := range props {
			m.Properties[i] = gateway.Property{Key: pr.GetKey(), Value: pr.GetValue()}
		}
	}
	if err := gateway.ValidateMessage(m); err != nil {
		return gateway.Message{}, fmt.Errorf("data: %w", err)
	}
	return m, nil
}

// publish hands each device's batch of f to the data sink, up to
// publishers devices at once (a durable queue commits concurrent puts
// together), each within PublishTimeout, and records the outcomes:
// published (durable, for QoS 1) on success; rejected when the sink will
// never take the messages; failed otherwise.
func (p *proc) publish(ctx context.Context, f *frameData) {
	var g errgroup.Group
	g.SetLimit(publishers)
	for i := range f.batches {
		b := &f.batches[i]
		g.Go(func() error {
			pctx, cancel := context.WithTimeout(ctx, PublishTimeout)
			err := p.h.o.Data.Publish(pctx, b.msgs)
			cancel()
			outcome, reason := pb.Outcome_OUTCOME_DURABLE, ""
			switch {
			case err == nil:
			case errors.Is(err, gateway.ErrInvalidMessage) || errors.Is(err, gateway.ErrTooLarge):
				outcome, reason = pb.Outcome_OUTCOME_REJECTED, err.Error()
			default:
				outcome, reason = pb.Outcome_OUTCOME_FAILED, err.Error()
				if ctx.Err() == nil {
					p.log.Warn("data not published", "device", b.msgs[0].Device, "messages", len(b.msgs), "err", err)
				}
			}
			f.count(outcome, uint64(len(b.msgs)))
			for _, id := range b.ids {
				if id != 0 {
					f.mu.Lock()
					f.settled = append(f.settled, &pb.Settlement{Id: id, Outcome: outcome, Reason: reason})
					f.mu.Unlock()
				}
			}
			return nil
		})
	}
	_ = g.Wait()
}

// settle sends the frame's settlements to the adapter. A failed call is
// logged and not repeated: the adapter's waiting items end with its
// stream, and their sources send them again.
func (p *proc) settle(ctx context.Context, client pb.AdapterClient, settled []*pb.Settlement) {
	sctx, cancel := context.WithTimeout(ctx, SettleTimeout)
	defer cancel()
	if _, err := client.Settle(sctx, &pb.SettleRequest{Settlements: settled}); err != nil && ctx.Err() == nil {
		p.log.Warn("settlements not delivered to the adapter", "items", len(settled), "err", err)
	}
}
