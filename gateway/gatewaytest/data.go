package gatewaytest

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/fleetgate/fleetgate/gateway"
)

// DataSink is a gateway.DataSink that records the messages it takes,
// holding to the contract in gateway/data.go as far as a front end can
// see it: it refuses an invalid message and takes one device's messages
// per call. A test makes it wait (Hold) or fail (Fail). The zero value is
// ready to use.
type DataSink struct {
	mu      sync.Mutex
	taken   []gateway.Message
	invalid []gateway.Message
	err     error
	holds   map[gateway.DeviceID]chan struct{} // key "": every device's
	began   chan gateway.Message
}

var _ gateway.DataSink = (*DataSink)(nil)

// beganBuffer is how many messages Began keeps unread.
const beganBuffer = 256

// Publish takes msgs, one device's messages (several devices' in one
// call are a front end's bug: it panics). It hands each message to
// Began, refuses the first invalid one with gateway.ValidateMessage's
// error (see TakeInvalid), waits while Hold holds the device (or until
// ctx ends: ctx's error), then returns the error set by Fail, or records
// msgs and returns nil. It keeps a copy of each payload: a front end may
// reuse its buffers once Publish returned.
func (k *DataSink) Publish(ctx context.Context, msgs []gateway.Message) error {
	if len(msgs) == 0 {
		return nil
	}
	device := msgs[0].Device
	for _, m := range msgs {
		if m.Device != device {
			panic(fmt.Sprintf("gatewaytest: Publish of messages of %s and %s in one call", device, m.Device))
		}
	}
	began := k.beganChan()
	for _, m := range msgs {
		select {
		case began <- m:
		default:
		}
		if err := gateway.ValidateMessage(m); err != nil {
			k.mu.Lock()
			k.invalid = append(k.invalid, m)
			k.mu.Unlock()
			return err
		}
	}
	k.mu.Lock()
	holds := []chan struct{}{k.holds[""], k.holds[device]}
	k.mu.Unlock()
	for _, h := range holds {
		if h == nil {
			continue
		}
		select {
		case <-h:
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
		k.taken = append(k.taken, m)
	}
	return nil
}

// Hold makes Publish wait (a slow disk) with the messages of devices, or
// of every device when none is named, until release is called (once or
// more). A later Hold of the same devices takes its place.
func (k *DataSink) Hold(devices ...gateway.DeviceID) (release func()) {
	if len(devices) == 0 {
		devices = []gateway.DeviceID{""}
	}
	gate := make(chan struct{})
	k.mu.Lock()
	if k.holds == nil {
		k.holds = make(map[gateway.DeviceID]chan struct{})
	}
	for _, d := range devices {
		k.holds[d] = gate
	}
	k.mu.Unlock()
	return sync.OnceFunc(func() {
		k.mu.Lock()
		for _, d := range devices {
			if k.holds[d] == gate {
				delete(k.holds, d)
			}
		}
		k.mu.Unlock()
		close(gate)
	})
}

// Fail makes Publish return err instead of taking messages (nil: take
// them again).
func (k *DataSink) Fail(err error) {
	k.mu.Lock()
	k.err = err
	k.mu.Unlock()
}

// Began receives each message handed to Publish as the call begins,
// before it is validated or held; the 256 oldest unread are kept, later
// ones dropped.
func (k *DataSink) Began() <-chan gateway.Message { return k.beganChan() }

// beganChan is Began's channel, made on first use.
func (k *DataSink) beganChan() chan gateway.Message {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.began == nil {
		k.began = make(chan gateway.Message, beganBuffer)
	}
	return k.began
}

// Messages is a copy of what Publish took, in order.
func (k *DataSink) Messages() []gateway.Message {
	k.mu.Lock()
	defer k.mu.Unlock()
	return slices.Clone(k.taken)
}

// Take returns what Publish took and forgets it.
func (k *DataSink) Take() []gateway.Message {
	k.mu.Lock()
	defer k.mu.Unlock()
	msgs := k.taken
	k.taken = nil
	return msgs
}

// TakeInvalid returns the messages Publish refused as invalid
// (gateway.ValidateMessage), in order, and forgets them: a front end
// that checks its messages before handing them over hands none.
func (k *DataSink) TakeInvalid() []gateway.Message {
	k.mu.Lock()
	defer k.mu.Unlock()
	msgs := k.invalid
	k.invalid = nil
	return msgs
}

// Commands is a gateway.Commands in memory that records what a front end
// does with it, holding to the contract in gateway/data.go: Submit
// refuses a message that is not a valid command, Pending returns a
// device's commands oldest first and never an expired one, Ack of an
// unknown id is ignored, and Wait's channel is closed by the device's
// next command. A test adds commands (Add, Reset), makes Submit or Ack
// fail (FailSubmit, FailAck) and looks at what happened (Held,
// Submitted, Acks, Waiters). The zero value is ready to use.
type Commands struct {
	// TTL is the lifetime of a submitted command from its Received time
	// (0: it never expires). Set it before the first Submit.
	TTL time.Duration

	mu        sync.Mutex
	lastID    uint64
	held      []gateway.Command // oldest first
	waits     map[gateway.DeviceID][]chan struct{}
	submitted []gateway.Message
	acks      []AckCall
	submitErr error
	ackErr    error
}

var _ gateway.Commands = (*Commands)(nil)

// AckCall is one call of Commands.Ack.
type AckCall struct {
	Device gateway.DeviceID
	ID     uint64
}

// Submit refuses m if it is not a valid command (gateway.ValidateMessage,
// a topic "cmd" or "cmd/<rest>": errors wrapping
// gateway.ErrInvalidMessage or gateway.ErrTooLarge), then returns the
// error set by FailSubmit, or records m and makes it a pending command
// expiring TTL after m.Received, the newest, closing the device's Wait
// channels.
func (c *Commands) Submit(_ context.Context, m gateway.Message) (gateway.Command, error) {
	if err := validCommand(m); err != nil {
		return gateway.Command{}, err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.submitErr != nil {
		return gateway.Command{}, c.submitErr
	}
	var expires time.Time
	if c.TTL > 0 {
		expires = m.Received.Add(c.TTL)
	}
	c.submitted = append(c.submitted, m)
	return c.add(m, expires), nil
}

// Add makes m a pending command expiring at expires (zero: never), as
// one submitted from elsewhere (the upstream broker, a local client):
// the newest, closing the device's Wait channels, but not recorded as
// submitted, and FailSubmit does not apply. It panics if m is not a
// valid command (the test's mistake).
func (c *Commands) Add(m gateway.Message, expires time.Time) gateway.Command {
	if err := validCommand(m); err != nil {
		panic("gatewaytest: Add: " + err.Error())
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.add(m, expires)
}

// add holds m as the newest command, with the next ID, and closes the
// device's Wait channels. c.mu is held.
func (c *Commands) add(m gateway.Message, expires time.Time) gateway.Command {
	c.lastID++
	cmd := gateway.Command{ID: c.lastID, Message: m, Expires: expires}
	c.held = append(c.held, cmd)
	for _, ch := range c.waits[m.Device] {
		close(ch)
	}
	delete(c.waits, m.Device)
	return cmd
}

// validCommand checks m as Submit does.
func validCommand(m gateway.Message) error {
	if err := gateway.ValidateMessage(m); err != nil {
		return err
	}
	if m.Topic != "cmd" && !strings.HasPrefix(m.Topic, "cmd/") {
		return fmt.Errorf("%w: topic %q is not cmd or cmd/<rest>", gateway.ErrInvalidMessage, m.Topic)
	}
	return nil
}

// Pending returns up to n of device's commands held and not expired at
// now (a zero Expires never expires), oldest first.
func (c *Commands) Pending(device gateway.DeviceID, now time.Time, n int) []gateway.Command {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []gateway.Command
	for _, cmd := range c.held {
		if len(out) >= n {
			break
		}
		if cmd.Device == device && (cmd.Expires.IsZero() || now.Before(cmd.Expires)) {
			out = append(out, cmd)
		}
	}
	return out
}

// Ack returns the error set by FailAck, or records the call and removes
// command id of device (an unknown id, another device's among them, is
// ignored).
func (c *Commands) Ack(device gateway.DeviceID, id uint64) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.ackErr != nil {
		return c.ackErr
	}
	c.acks = append(c.acks, AckCall{Device: device, ID: id})
	c.held = slices.DeleteFunc(c.held, func(cmd gateway.Command) bool { return cmd.Device == device && cmd.ID == id })
	return nil
}

// Wait returns a channel closed by the device's next command (Submit or
// Add).
func (c *Commands) Wait(device gateway.DeviceID) <-chan struct{} {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.waits == nil {
		c.waits = make(map[gateway.DeviceID][]chan struct{})
	}
	ch := make(chan struct{})
	c.waits[device] = append(c.waits[device], ch)
	return ch
}

// Reset makes cmds, as they are (IDs, expiries, order), the commands
// held, and forgets the Submit and Ack calls recorded. Later commands get
// IDs above theirs.
func (c *Commands) Reset(cmds []gateway.Command) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.held, c.submitted, c.acks = slices.Clone(cmds), nil, nil
	for _, cmd := range cmds {
		c.lastID = max(c.lastID, cmd.ID)
	}
}

// FailSubmit makes Submit return err for a valid command (nil: take
// commands again).
func (c *Commands) FailSubmit(err error) {
	c.mu.Lock()
	c.submitErr = err
	c.mu.Unlock()
}

// FailAck makes Ack return err, removing nothing (nil: acknowledge
// again).
func (c *Commands) FailAck(err error) {
	c.mu.Lock()
	c.ackErr = err
	c.mu.Unlock()
}

// Held is a copy of device's commands held: not acknowledged, expired
// ones too, oldest first.
func (c *Commands) Held(device gateway.DeviceID) []gateway.Command {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []gateway.Command
	for _, cmd := range c.held {
		if cmd.Device == device {
			out = append(out, cmd)
		}
	}
	return out
}

// Submitted is a copy of the messages Submit took, in order.
func (c *Commands) Submitted() []gateway.Message {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.submitted)
}

// Acks is a copy of the Ack calls that FailAck did not fail, in order.
func (c *Commands) Acks() []AckCall {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.acks)
}

// Waiters counts the channels Wait returned that no command closed yet.
func (c *Commands) Waiters() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for _, chs := range c.waits {
		n += len(chs)
	}
	return n
}
