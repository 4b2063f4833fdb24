package mqtt

import (
	"context"
	"slices"
	"sync"
	"time"

	"github.com/fleetgate/fleetgate/gateway"
)

// The data path's collaborators in these tests: a gateway.DataSink and a
// gateway.Commands that record what the front end hands them. The real
// ones are the bridge's, which the front end must not import (protocols
// import only gateway and internal). They are the front end's
// collaborators, not the system under test, and the one exception to "no
// fakes" in this package's tests: each does what the contract in
// gateway/data.go says, in memory, and no more, plus the knobs a test
// turns (block, fail).

// sink is a DataSink that validates and records every message.
type sink struct {
	mu    sync.Mutex
	msgs  []gateway.Message
	err   error
	gates map[gateway.DeviceID]chan struct{}
	// began receives each message as a call with it begins (dropped when
	// full).
	began chan gateway.Message
}

var _ gateway.DataSink = (*sink)(nil)

func newSink() *sink {
	return &sink{gates: make(map[gateway.DeviceID]chan struct{}), began: make(chan gateway.Message, 256)}
}

// Publish takes msgs in order: it refuses an invalid message as the
// contract says, waits while the device is blocked, and fails while fail
// set an error.
func (k *sink) Publish(ctx context.Context, msgs []gateway.Message) error {
	for _, m := range msgs {
		select {
		case k.began <- m:
		default:
		}
		if err := gateway.ValidateMessage(m); err != nil {
			return err
		}
	}
	k.mu.Lock()
	gate := k.gates[msgs[0].Device]
	k.mu.Unlock()
	if gate != nil {
		select {
		case <-gate:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.err != nil {
		return k.err
	}
	k.msgs = append(k.msgs, msgs...)
	return nil
}

// block makes Publish wait for device's messages until release is called.
func (k *sink) block(device gateway.DeviceID) (release func()) {
	gate := make(chan struct{})
	k.mu.Lock()
	k.gates[device] = gate
	k.mu.Unlock()
	return func() {
		k.mu.Lock()
		delete(k.gates, device)
		k.mu.Unlock()
		close(gate)
	}
}

// fail makes Publish return err (nil: succeed again).
func (k *sink) fail(err error) {
	k.mu.Lock()
	k.err = err
	k.mu.Unlock()
}

// taken is what Publish took, in order.
func (k *sink) taken() []gateway.Message {
	k.mu.Lock()
	defer k.mu.Unlock()
	return slices.Clone(k.msgs)
}

// commandBox is a Commands holding commands in memory.
type commandBox struct {
	// ttl is a command's lifetime from its Received time (0: none).
	ttl time.Duration

	mu        sync.Mutex
	next      uint64
	err       error
	pending   map[gateway.DeviceID][]gateway.Command
	acked     []uint64
	submitted []gateway.Message
	waits     map[gateway.DeviceID][]chan struct{}
}

var _ gateway.Commands = (*commandBox)(nil)

func newCommandBox() *commandBox {
	return &commandBox{pending: make(map[gateway.DeviceID][]gateway.Command), waits: make(map[gateway.DeviceID][]chan struct{})}
}

// Submit validates m (a command's topic is "cmd" or "cmd/<rest>"), makes
// it pending and wakes the device's waiters.
func (b *commandBox) Submit(_ context.Context, m gateway.Message) (gateway.Command, error) {
	if err := gateway.ValidateMessage(m); err != nil {
		return gateway.Command{}, err
	}
	if !isCommand(m.Topic) {
		return gateway.Command{}, gateway.ErrInvalidMessage
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.err != nil {
		return gateway.Command{}, b.err
	}
	b.next++
	c := gateway.Command{ID: b.next, Message: m}
	if b.ttl > 0 {
		c.Expires = m.Received.Add(b.ttl)
	}
	b.pending[m.Device] = append(b.pending[m.Device], c)
	b.submitted = append(b.submitted, m)
	for _, ch := range b.waits[m.Device] {
		close(ch)
	}
	delete(b.waits, m.Device)
	return c, nil
}

// Pending returns up to n of device's commands not expired at now.
func (b *commandBox) Pending(device gateway.DeviceID, now time.Time, n int) []gateway.Command {
	b.mu.Lock()
	defer b.mu.Unlock()
	var out []gateway.Command
	for _, c := range b.pending[device] {
		if len(out) == n {
			break
		}
		if c.Expires.IsZero() || now.Before(c.Expires) {
			out = append(out, c)
		}
	}
	return out
}

// Ack removes command id of device; unknown ids are ignored.
func (b *commandBox) Ack(device gateway.DeviceID, id uint64) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.pending[device] = slices.DeleteFunc(b.pending[device], func(c gateway.Command) bool { return c.ID == id })
	b.acked = append(b.acked, id)
	return nil
}

// Wait returns a channel closed by the device's next Submit.
func (b *commandBox) Wait(device gateway.DeviceID) <-chan struct{} {
	b.mu.Lock()
	defer b.mu.Unlock()
	ch := make(chan struct{})
	b.waits[device] = append(b.waits[device], ch)
	return ch
}

// submit is a command from elsewhere (the upstream broker, say).
func (b *commandBox) submit(device gateway.DeviceID, rest string, payload string) gateway.Command {
	c, err := b.Submit(context.Background(), gateway.Message{Device: device, Topic: rest, Payload: []byte(payload), QoS: 1, Received: time.Now(), Source: "upstream"})
	if err != nil {
		panic(err)
	}
	return c
}

// fail makes Submit return err (nil: succeed again).
func (b *commandBox) fail(err error) {
	b.mu.Lock()
	b.err = err
	b.mu.Unlock()
}

// state is what was submitted, which ids were acknowledged, and how many
// commands of device are pending.
func (b *commandBox) state(device gateway.DeviceID) (submitted []gateway.Message, acked []uint64, pending int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return slices.Clone(b.submitted), slices.Clone(b.acked), len(b.pending[device])
}

// waiters counts the channels Wait handed out that no Submit closed yet.
func (b *commandBox) waiters() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	n := 0
	for _, chs := range b.waits {
		n += len(chs)
	}
	return n
}
