package bridge

import (
	"container/heap"
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/fleetgate/fleetgate/gateway"
)

// waitSlots is the number of Wait channels: a device's channel is the one
// of its hash, shared with the devices of the same hash, so the memory of
// Wait is bounded whatever the number of devices that wait.
const waitSlots = 4096

// commands is the bridge's gateway.Commands: the commands queue (durable)
// holds them, an index in memory serves them per device. The index is
// rebuilt from the queue at start; the queue's IDs are the commands'
// (those its Put returns).
type commands struct {
	b   *Bridge
	q   gateway.Queue
	ttl time.Duration
	max int

	mu       sync.Mutex
	byDevice map[gateway.DeviceID][]gateway.Command
	pending  int
	expiries expiryHeap
	waiters  [waitSlots]chan struct{}
	// sweep is signalled when a command's expiry may come before the
	// sweeper's next wake.
	sweep chan struct{}
}

// errNotCommand refuses a message submitted as a command whose topic is
// not "cmd" or "cmd/<rest>".
var errNotCommand = errors.New("a command's topic is cmd or cmd/<rest>")

// isCommandTopic reports whether rest is a command's topic below a
// device's root.
func isCommandTopic(rest string) bool {
	return rest == "cmd" || strings.HasPrefix(rest, "cmd/")
}

func newCommands(b *Bridge, q gateway.Queue, ttl time.Duration, max int) *commands {
	return &commands{b: b, q: q, ttl: ttl, max: max, byDevice: map[gateway.DeviceID][]gateway.Command{},
		sweep: make(chan struct{}, 1)}
}

// load reads the queue into the index: every message it holds, but for
// those expired or beyond a device's bound, which it removes. It runs
// before the first submit.
func (c *commands) load(ctx context.Context) error {
	want := c.q.Stats().Messages
	var read int
	var after uint64
	var drop []uint64
	for read < want {
		// the queue may hold fewer than it said (it drops expired
		// messages when they are read): a Read that waits is the end
		rctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
		msgs, err := c.q.Read(rctx, after, 256)
		cancel()
		if errors.Is(err, context.DeadlineExceeded) && ctx.Err() == nil {
			break
		}
		if err != nil {
			return fmt.Errorf("bridge: read the commands queue: %w", err)
		}
		if len(msgs) == 0 {
			break
		}
		read += len(msgs)
		after = msgs[len(msgs)-1].ID
		drop = append(drop, c.index(msgs)...)
	}
	if len(drop) > 0 {
		if err := c.q.Ack(drop); err != nil {
			return fmt.Errorf("bridge: remove dropped commands: %w", err)
		}
	}
	return nil
}

// submit makes msgs (valid commands, in order) pending commands once
// durable, and returns them (fewer when the queue dropped the first of
// them to make room: a batch larger than the queue). Submits do not wait
// for each other: concurrent ones share the queue's commits.
//
// When ctx ends while the Put waits for its commit, submit returns
// ctx's error, and the Put goes on without it: the commands it commits
// are pending all the same (they are in the queue), and indexed as soon
// as the queue returns their IDs. Close waits for such a Put.
func (c *commands) submit(ctx context.Context, msgs []gateway.Message) ([]gateway.Command, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	msgs = slices.Clone(msgs)
	for i := range msgs {
		msgs[i] = own(msgs[i])
	}
	if c.b.beforeDurable != nil {
		c.b.beforeDurable(msgs)
	}
	type result struct {
		cmds []gateway.Command
		err  error
	}
	res := make(chan result, 1)
	if !c.b.startPut() {
		return nil, fmt.Errorf("bridge: %w", gateway.ErrQueueClosed)
	}
	go func() {
		defer c.b.puts.Done()
		ids, err := c.q.Put(context.WithoutCancel(ctx), msgs)
		if err != nil {
			res <- result{err: err}
			return
		}
		res <- result{cmds: c.add(msgs, ids)}
	}()
	select {
	case r := <-res:
		return r.cmds, r.err
	case <-ctx.Done():
		select {
		case r := <-res: // done as well: its result is the truer
			return r.cmds, r.err
		default:
			return nil, ctx.Err()
		}
	}
}

// own is the copy of m the index keeps, as the queue returns it: its
// own payload and properties, Received at millisecond precision in UTC
// (so that a command's Expires is the same after a restart).
func own(m gateway.Message) gateway.Message {
	m.Payload = slices.Clone(m.Payload)
	m.Properties = slices.Clone(m.Properties)
	m.Received = time.UnixMilli(m.Received.UnixMilli()).UTC()
	return m
}

// add indexes msgs, put with IDs ids (0 for one the queue dropped at
// once), removes from the queue those the index dropped, and returns
// the commands of those the queue kept.
func (c *commands) add(msgs []gateway.Message, ids []uint64) []gateway.Command {
	kept := make([]gateway.QueuedMessage, 0, len(msgs))
	for i, m := range msgs {
		if ids[i] != 0 {
			kept = append(kept, gateway.QueuedMessage{ID: ids[i], Message: m})
		}
	}
	if drop := c.index(kept); len(drop) > 0 {
		if err := c.q.Ack(drop); err != nil {
			c.b.log.Warn("remove dropped commands from the queue", "commands", len(drop), "err", err)
		}
	}
	out := make([]gateway.Command, len(kept))
	for i, q := range kept {
		out[i] = gateway.Command{ID: q.ID, Message: q.Message, Expires: q.Received.Add(c.ttl)}
	}
	return out
}

// index adds msgs to the index, wakes their devices' waiters, and
// returns the IDs to remove from the queue: commands expired already and
// those dropped to keep a device's bound. A device's commands stay in ID
// order also when concurrent submits index theirs out of it: the oldest
// is dropped, also when it is one of msgs.
func (c *commands) index(msgs []gateway.QueuedMessage) []uint64 {
	now := c.b.clock.Now()
	c.mu.Lock()
	defer c.mu.Unlock()
	var drop []uint64
	var expired, full int
	earliest := len(c.expiries) == 0
	for _, m := range msgs {
		cmd := gateway.Command{ID: m.ID, Message: m.Message, Expires: m.Received.Add(c.ttl)}
		if !now.Before(cmd.Expires) {
			drop = append(drop, m.ID)
			expired++
			continue
		}
		list := c.byDevice[m.Device]
		at := len(list)
		for at > 0 && list[at-1].ID > cmd.ID {
			at--
		}
		list = slices.Insert(list, at, cmd)
		c.pending++
		if len(list) > c.max {
			drop = append(drop, list[0].ID)
			full++
			list[0] = gateway.Command{}
			list = list[1:]
			c.pending--
		}
		c.byDevice[m.Device] = list
		if len(c.expiries) > 0 && cmd.Expires.Before(c.expiries[0].at) {
			earliest = true
		}
		heap.Push(&c.expiries, expiry{at: cmd.Expires, id: m.ID, device: m.Device})
		if w := &c.waiters[waitSlot(m.Device)]; *w != nil {
			close(*w)
			*w = nil
		}
	}
	if earliest {
		select {
		case c.sweep <- struct{}{}:
		default:
		}
	}
	if expired > 0 {
		c.b.drop("commands", "expired", expired)
	}
	if full > 0 {
		c.b.drop("commands", "device_full", full)
		c.b.log.Warn("commands dropped: more pending for a device than its bound", "commands", full, "max_pending_per_device", c.max)
	}
	return drop
}

func waitSlot(device gateway.DeviceID) int {
	h := fnv.New32a()
	h.Write([]byte(device))
	return int(h.Sum32() % waitSlots)
}

// Submit implements gateway.Commands.
func (c *commands) Submit(ctx context.Context, m gateway.Message) (gateway.Command, error) {
	if err := gateway.ValidateMessage(m); err != nil {
		return gateway.Command{}, err
	}
	if !isCommandTopic(m.Topic) {
		return gateway.Command{}, errors.Join(gateway.ErrInvalidMessage, errNotCommand)
	}
	if m.Received.IsZero() {
		m.Received = c.b.clock.Now()
	}
	cmds, err := c.submit(ctx, []gateway.Message{m})
	if err != nil {
		return gateway.Command{}, err
	}
	if len(cmds) != 1 { // a message that fits is never dropped by its own Put
		return gateway.Command{}, errors.New("bridge: the commands queue dropped the command it took")
	}
	c.b.received("down", m)
	return cmds[0], nil
}

// Pending implements gateway.Commands.
func (c *commands) Pending(device gateway.DeviceID, now time.Time, n int) []gateway.Command {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []gateway.Command
	for _, cmd := range c.byDevice[device] {
		if len(out) == n {
			break
		}
		if now.Before(cmd.Expires) {
			out = append(out, cmd)
		}
	}
	return out
}

// Ack implements gateway.Commands.
func (c *commands) Ack(device gateway.DeviceID, id uint64) error {
	c.mu.Lock()
	list := c.byDevice[device]
	i := slices.IndexFunc(list, func(cmd gateway.Command) bool { return cmd.ID == id })
	if i < 0 {
		c.mu.Unlock()
		return nil
	}
	cmd := list[i]
	c.removeLocked(device, i)
	c.mu.Unlock()
	c.b.delivered(cmd.Message)
	return c.q.Ack([]uint64{id})
}

// removeLocked takes the i-th command of device out of the index.
func (c *commands) removeLocked(device gateway.DeviceID, i int) {
	list := slices.Delete(c.byDevice[device], i, i+1)
	if len(list) == 0 {
		delete(c.byDevice, device)
	} else {
		c.byDevice[device] = list
	}
	c.pending--
}

// Wait implements gateway.Commands. The channel is shared by the devices
// of one hash (of waitSlots): it may also close for another's command,
// and the caller then finds nothing new in Pending.
func (c *commands) Wait(device gateway.DeviceID) <-chan struct{} {
	c.mu.Lock()
	defer c.mu.Unlock()
	w := &c.waiters[waitSlot(device)]
	if *w == nil {
		*w = make(chan struct{})
	}
	return *w
}

// stats reports the pending commands and the devices they are for.
func (c *commands) stats() (pending, devices int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.pending, len(c.byDevice)
}

// runSweeper removes expired commands from the index and the queue when
// they expire (on the bridge's clock), until ctx ends.
func (c *commands) runSweeper(ctx context.Context) {
	for {
		c.mu.Lock()
		var wait gateway.Timer
		if len(c.expiries) > 0 {
			wait = c.b.clock.NewTimer(c.expiries[0].at.Sub(c.b.clock.Now()))
		}
		c.mu.Unlock()
		var fired <-chan time.Time
		if wait != nil {
			fired = wait.C()
		}
		select {
		case <-ctx.Done():
			if wait != nil {
				wait.Stop()
			}
			return
		case <-c.sweep:
			if wait != nil {
				wait.Stop()
			}
		case <-fired:
			c.expire()
		}
	}
}

// expire removes the commands expired now.
func (c *commands) expire() {
	now := c.b.clock.Now()
	var ids []uint64
	c.mu.Lock()
	for len(c.expiries) > 0 && !now.Before(c.expiries[0].at) {
		e := heap.Pop(&c.expiries).(expiry)
		list := c.byDevice[e.device]
		if i := slices.IndexFunc(list, func(cmd gateway.Command) bool { return cmd.ID == e.id }); i >= 0 {
			c.removeLocked(e.device, i)
			ids = append(ids, e.id)
		}
	}
	c.mu.Unlock()
	if len(ids) == 0 {
		return
	}
	c.b.drop("commands", "expired", len(ids))
	if err := c.q.Ack(ids); err != nil {
		c.b.log.Warn("remove expired commands from the queue", "commands", len(ids), "err", err)
	}
}

// expiry is when one command expires; the heap holds one per command
// indexed (also after it is acknowledged or dropped, until then).
type expiry struct {
	at     time.Time
	id     uint64
	device gateway.DeviceID
}

type expiryHeap []expiry

func (h expiryHeap) Len() int { return len(h) }
func (h expiryHeap) Less(i, j int) bool {
	if !h[i].at.Equal(h[j].at) {
		return h[i].at.Before(h[j].at)
	}
	return h[i].id < h[j].id
}
func (h expiryHeap) Swap(i, j int) { h[i], h[j] = h[j], h[i] }
func (h *expiryHeap) Push(x any)   { *h = append(*h, x.(expiry)) }
func (h *expiryHeap) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}
