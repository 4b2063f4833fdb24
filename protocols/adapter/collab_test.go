package adapter_test

import (
	"context"
	"slices"
	"sync"
	"time"

	"github.com/fleetgate/fleetgate/gateway"
)

// The host's collaborators on the data path, minimal and recording. The
// real DataSink and Commands are the bridge's (package bridge), which
// protocols/adapter may not import (layering); these stand in for them
// as the one exception to "no fakes" in these tests: they are what the
// host talks to, not what is tested, and they keep the contract of
// gateway/data.go as far as the host can see it.

// recordingSink is a gateway.DataSink that records what it is handed.
// Publish fails with err when set, and waits for gate (a slow disk) when
// it is set.
type recordingSink struct {
	mu    sync.Mutex
	msgs  []gateway.Message
	calls int
	err   error
	gate  chan struct{}
}

var _ gateway.DataSink = (*recordingSink)(nil)

func (s *recordingSink) Publish(ctx context.Context, msgs []gateway.Message) error {
	s.mu.Lock()
	gate, err := s.gate, s.err
	s.calls++
	s.mu.Unlock()
	if gate != nil {
		select {
		case <-gate:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	if err != nil {
		return err
	}
	for _, m := range msgs {
		if m.Device != msgs[0].Device {
			panic("Publish takes one device's messages")
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.msgs = append(s.msgs, msgs...)
	return nil
}

func (s *recordingSink) set(err error, gate chan struct{}) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.err, s.gate = err, gate
}

func (s *recordingSink) messages() []gateway.Message {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.msgs)
}

// recordingCommands is a gateway.Commands over a map, on a clock (for
// expiry): it records acknowledgements and how often Pending was asked.
type recordingCommands struct {
	clock   gateway.Clock
	mu      sync.Mutex
	next    uint64
	pending map[gateway.DeviceID][]gateway.Command
	waiters map[gateway.DeviceID][]chan struct{}
	acked   []uint64
	asked   int
}

var _ gateway.Commands = (*recordingCommands)(nil)

func newRecordingCommands(clock gateway.Clock) *recordingCommands {
	return &recordingCommands{clock: clock, pending: make(map[gateway.DeviceID][]gateway.Command), waiters: make(map[gateway.DeviceID][]chan struct{})}
}

func (c *recordingCommands) Submit(_ context.Context, m gateway.Message) (gateway.Command, error) {
	return c.submit(m, time.Time{}), nil
}

// submit adds m, expiring at expires (zero: never).
func (c *recordingCommands) submit(m gateway.Message, expires time.Time) gateway.Command {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.next++
	cmd := gateway.Command{ID: c.next, Message: m, Expires: expires}
	c.pending[m.Device] = append(c.pending[m.Device], cmd)
	for _, w := range c.waiters[m.Device] {
		close(w)
	}
	delete(c.waiters, m.Device)
	return cmd
}

func (c *recordingCommands) Pending(device gateway.DeviceID, now time.Time, n int) []gateway.Command {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.asked++
	var out []gateway.Command
	for _, cmd := range c.pending[device] {
		if len(out) < n && (cmd.Expires.IsZero() || now.Before(cmd.Expires)) {
			out = append(out, cmd)
		}
	}
	return out
}

func (c *recordingCommands) Ack(device gateway.DeviceID, id uint64) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.pending[device] = slices.DeleteFunc(c.pending[device], func(cmd gateway.Command) bool { return cmd.ID == id })
	c.acked = append(c.acked, id)
	return nil
}

func (c *recordingCommands) Wait(device gateway.DeviceID) <-chan struct{} {
	c.mu.Lock()
	defer c.mu.Unlock()
	w := make(chan struct{})
	c.waiters[device] = append(c.waiters[device], w)
	return w
}

func (c *recordingCommands) ackedIDs() []uint64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.acked)
}

func (c *recordingCommands) pendingOf(device gateway.DeviceID) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.pending[device])
}
