package coap

import (
	"context"
	"slices"
	"sync"
	"time"

	"github.com/fleetgate/fleetgate/gateway"
)

// The data path's collaborators in these tests. The real DataSink and
// Commands are the bridge's, over the queues, and a front end must not
// import them (protocols import only gateway and internal). These two
// are the one exception to the project's rule against fakes: they are
// the front end's collaborators, not what is tested, and they only record
// what they are handed and keep the contract's visible behaviour (a
// Publish that can be made to wait or fail; pending commands in a slice,
// oldest first, removed by Ack, never returned once expired).

// sink is a recording gateway.DataSink.
type sink struct {
	mu   sync.Mutex
	msgs []gateway.Message
	err  error
	gate chan struct{} // non-nil: Publish waits for it to close, or for ctx
}

var _ gateway.DataSink = (*sink)(nil)

// Publish waits while the sink is held, then records msgs or returns the
// error set by fail.
func (k *sink) Publish(ctx context.Context, msgs []gateway.Message) error {
	k.mu.Lock()
	gate := k.gate
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
	for _, m := range msgs {
		m.Payload = slices.Clone(m.Payload)
		k.msgs = append(k.msgs, m)
	}
	return nil
}

// hold makes Publish wait (a slow disk) until the returned func is
// called (once or more).
func (k *sink) hold() (release func()) {
	gate := make(chan struct{})
	k.mu.Lock()
	k.gate = gate
	k.mu.Unlock()
	return sync.OnceFunc(func() {
		k.mu.Lock()
		k.gate = nil
		k.mu.Unlock()
		close(gate)
	})
}

// fail makes Publish return err (nil: take messages again).
func (k *sink) fail(err error) {
	k.mu.Lock()
	k.err = err
	k.mu.Unlock()
}

// messages is a copy of what was published, in order.
func (k *sink) messages() []gateway.Message {
	k.mu.Lock()
	defer k.mu.Unlock()
	return slices.Clone(k.msgs)
}

// take returns what was published and forgets it.
func (k *sink) take() []gateway.Message {
	k.mu.Lock()
	defer k.mu.Unlock()
	msgs := k.msgs
	k.msgs = nil
	return msgs
}

// commandList is a gateway.Commands over a slice.
type commandList struct {
	mu     sync.Mutex
	cmds   []gateway.Command
	lastID uint64
	acks   []ackCall
	ackErr error
}

// ackCall is one call of Ack.
type ackCall struct {
	device gateway.DeviceID
	id     uint64
}

var _ gateway.Commands = (*commandList)(nil)

// Submit appends m as a command expiring in an hour after m.Received.
func (c *commandList) Submit(_ context.Context, m gateway.Message) (gateway.Command, error) {
	return c.add(m, m.Received.Add(time.Hour)), nil
}

// add appends m as a command expiring at expires and returns it.
func (c *commandList) add(m gateway.Message, expires time.Time) gateway.Command {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.lastID++
	cmd := gateway.Command{ID: c.lastID, Message: m, Expires: expires}
	c.cmds = append(c.cmds, cmd)
	return cmd
}

// Pending returns up to n of device's commands not expired at now,
// oldest first.
func (c *commandList) Pending(device gateway.DeviceID, now time.Time, n int) []gateway.Command {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []gateway.Command
	for _, cmd := range c.cmds {
		if len(out) < n && cmd.Device == device && now.Before(cmd.Expires) {
			out = append(out, cmd)
		}
	}
	return out
}

// Ack records the call and removes command id of device, unless an
// error is set by failAcks.
func (c *commandList) Ack(device gateway.DeviceID, id uint64) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.ackErr != nil {
		return c.ackErr
	}
	c.acks = append(c.acks, ackCall{device, id})
	c.cmds = slices.DeleteFunc(c.cmds, func(cmd gateway.Command) bool { return cmd.Device == device && cmd.ID == id })
	return nil
}

// Wait is never called by the CoAP front end, which holds no connection
// to a device to deliver on: its nil channel is never ready.
func (c *commandList) Wait(gateway.DeviceID) <-chan struct{} { return nil }

// failAcks makes Ack return err (nil: acknowledge again).
func (c *commandList) failAcks(err error) {
	c.mu.Lock()
	c.ackErr = err
	c.mu.Unlock()
}

// pending is a copy of every command held, in order.
func (c *commandList) pending() []gateway.Command {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.cmds)
}

// acked is a copy of the Ack calls, in order.
func (c *commandList) acked() []ackCall {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.acks)
}

// reset replaces the commands with cmds and forgets the Ack calls.
func (c *commandList) reset(cmds []gateway.Command) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.cmds, c.acks = slices.Clone(cmds), nil
}
