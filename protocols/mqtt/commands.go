package mqtt

import (
	"fmt"
	"reflect"
	"sync"
	"sync/atomic"
	"time"

	mochi "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/packets"

	"github.com/fleetgate/fleetgate/gateway"
)

// Commands down to MQTT devices (docs/design.md §6.8). With
// Options.Commands, the commands pending for a connected device are
// published through the broker to "<root>/cmd[/<rest>]" at QoS 1 (with
// the command's content type and user properties, and its remaining
// lifetime as the MQTT 5 message expiry interval) and acknowledged
// (Commands.Ack) once the device acknowledged them (PUBACK), or, for a
// subscription at QoS 0, once the broker took them:
//
//   - A command is offered only to a device subscribed to its topic (its
//     own subtree, a filter such as "<root>/cmd/#"); until it is, the
//     command stays pending. Every reader of the topic (a local client on
//     "devices/#") gets it too.
//   - Taken means: placed in the session's QoS 1 state (mochi's
//     inflight: written to the client, and resent on a reconnect of a
//     persistent session until its PUBACK), or, for a subscription at QoS
//     0, queued to the open connection. A command the broker could not
//     take (the client's pending writes overflowed and it is
//     disconnected, or it went away) stays pending.
//   - A command taken at QoS 1 stays in Commands until the device's
//     PUBACK (inflightCmds): the broker's sessions live in memory, so a
//     gateway that stops, or a session that ends, before the PUBACK
//     leaves it pending, and it is delivered again. One the broker drops
//     from the session (its message expiry passed) is pending again.
//   - Delivery runs when the device connects (also a sleepy device's
//     reconnect: what was submitted while it slept is pending, and its
//     subscriptions are kept by its session), when it subscribes, when
//     Commands.Wait reports a new command, and when a PUBACK makes room.
//     Nothing is published to a device that is not connected: commands
//     wait in Commands (bounded by bridge.commands.max_pending_per_device,
//     durable) rather than in the broker's memory.
//   - At most limits.mqtt_max_inflight messages are held for a client;
//     beyond that room commands wait in Commands, in order, and go as
//     PUBACKs free it. A command that expires before it goes is dropped
//     by Commands.
//   - Commands are delivered at least once: a failed Ack, or a session
//     taken over during a delivery, sends a command again.
//
// Waiting for Commands.Wait costs no goroutine per device: the connected
// devices' wait channels are watched in groups of up to groupSize, one
// goroutine each (reflect.Select), which exits when its last device goes.
// A delivery runs on the goroutine that started it (the device's own, or
// its group's), one at a time per connection.

// commandsClientID is the broker client commands are published as (the
// Origin of their packets); not a device ID, so no device can be it.
const commandsClientID = "$fleetgate/commands"

// dataClientID is the broker client PublishLocal publishes as.
const dataClientID = "$fleetgate/data"

// groupSize bounds the devices whose wait channels one goroutine selects
// on: a wake-up costs O(groupSize).
const groupSize = 128

// pendingScan is how many commands beyond the room a delivery looks at,
// so that commands the device is not subscribed to do not hold up those
// it is.
const pendingScan = 64

// delivery is the command delivery to one device's connection.
type delivery struct {
	srv        *Server
	device     gateway.DeviceID
	cl         *mochi.Client
	root       string
	persistent bool

	// kicks counts the calls to trigger not yet served; the caller that
	// takes it from 0 delivers until it is 0 again.
	kicks atomic.Int32
	// closed: the connection ended.
	closed atomic.Bool
	// starved: pending commands were left for want of room.
	starved atomic.Bool
	// taken and dropped are set by the hooks while a command is injected
	// (synchronously, on the delivering goroutine); offering is the ID
	// of that command, and takenID the packet ID the broker gave it in
	// the session.
	taken, dropped atomic.Bool
	offering       atomic.Uint64
	takenID        atomic.Uint32
	// group watches the device's wait channel (guarded by watchers.mu).
	group *watchGroup
}

// startDelivery begins the command delivery to device connection c of
// client cl, whose session is established.
func (s *Server) startDelivery(cl *mochi.Client, c *conn) {
	d := &delivery{srv: s, device: c.device, cl: cl, root: c.root, persistent: c.persistent.Load()}
	s.inflight.reconcile(cl)
	c.delivery.Store(d)
	s.watchers.add(d)
	d.trigger()
}

// stopDelivery ends the delivery of a connection that ended. The
// session of a connection that was not persistent ends with it, and the
// commands it held and the device did not acknowledge are pending again.
func (s *Server) stopDelivery(c *conn) {
	if d := c.delivery.Load(); d != nil {
		d.closed.Store(true)
		s.watchers.remove(d)
		if !d.persistent {
			s.inflight.dropOwner(d.cl.ID, d)
		}
	}
}

// trigger delivers the pending commands, now or, when a delivery is
// running, once it is done.
func (d *delivery) trigger() {
	if d.kicks.Add(1) != 1 {
		return
	}
	for {
		n := d.kicks.Load()
		d.deliver()
		if d.kicks.Add(-n) == 0 {
			return
		}
	}
}

// deliver offers the device its pending commands, oldest first, as far
// as there is room, and acknowledges those the broker took.
func (d *delivery) deliver() {
	s := d.srv
	if d.closed.Load() {
		return
	}
	// Wait before Pending: a command submitted after Pending closes the
	// channel. One that has not fired yet still serves.
	if !s.watchers.waiting(d) {
		s.watchers.watch(d, s.cmds.Wait(d.device))
	}
	room := s.maxInflight - d.cl.State.Inflight.Len()
	if room <= 0 {
		d.starved.Store(true)
		return
	}
	now := s.clock.Now()
	// the commands in the session wait for their PUBACK: pending, not
	// to be offered again
	held := s.inflight.held(d.cl.ID)
	pending := s.cmds.Pending(d.device, now, room+len(held)+pendingScan)
	d.starved.Store(false)
	for _, cmd := range pending {
		if d.closed.Load() {
			return
		}
		if _, ok := held[cmd.ID]; ok {
			continue
		}
		if room == 0 {
			d.starved.Store(true)
			return
		}
		inSession, ok := d.offer(cmd, now)
		if !ok {
			continue
		}
		room--
		s.metrics.commandsDelivered.Inc()
		if !inSession {
			s.ackCommand(d.device, cmd.ID)
		}
	}
}

// ackCommand acknowledges a delivered command to Commands.
func (s *Server) ackCommand(device gateway.DeviceID, id uint64) {
	if err := s.cmds.Ack(device, id); err != nil {
		s.log.Warn("command delivered but not acknowledged: it will be delivered again", "device", string(device), "id", id, "err", err)
	}
}

// offer publishes cmd through the broker when the device is subscribed
// to its topic, and reports whether the broker took it for the device
// (ok), and whether in the session's QoS 1 state, where it waits for
// the device's PUBACK (inSession).
func (d *delivery) offer(cmd gateway.Command, now time.Time) (inSession, ok bool) {
	s := d.srv
	topic := d.root + "/" + cmd.Topic
	sub, ok := s.broker.Topics.Subscribers(topic).Subscriptions[d.cl.ID]
	if !ok {
		return false, false
	}
	pk := packets.Packet{
		FixedHeader: packets.FixedHeader{Type: packets.Publish, Qos: 1},
		TopicName:   topic,
		Payload:     cmd.Payload,
		PacketID:    1, // checked for validity; mochi numbers the copy per client
		Properties:  packets.Properties{ContentType: cmd.ContentType},
	}
	if !cmd.Expires.IsZero() {
		left := (cmd.Expires.Sub(now) + time.Second - 1) / time.Second
		if left <= 0 {
			return false, false
		}
		pk.Properties.MessageExpiryInterval = uint32(min(left, 1<<32-1))
	}
	for _, p := range cmd.Properties {
		pk.Properties.User = append(pk.Properties.User, packets.UserProperty{Key: p.Key, Val: p.Value})
	}
	d.taken.Store(false)
	d.dropped.Store(false)
	d.offering.Store(cmd.ID)
	err := s.broker.InjectPacket(s.cmdClient, pk)
	d.offering.Store(0)
	taken := d.taken.Load()
	switch {
	case err != nil:
		s.log.Warn("command not published", "device", string(d.device), "id", cmd.ID, "err", err)
	case d.dropped.Load():
	case sub.Qos > 0:
		if taken && (d.persistent || !d.cl.Closed()) {
			return true, true
		}
	default:
		return false, !d.cl.Closed()
	}
	if taken {
		s.inflight.drop(d.cl.ID, uint16(d.takenID.Load()))
	}
	return false, false
}

// inflightCmds are the commands in the devices' sessions at QoS 1 that
// the devices have not acknowledged, by client ID and the packet ID the
// broker gave each in that client's session. Entries come from
// OnQosPublish (before the PUBLISH is written, so before its PUBACK can
// come) and leave at the PUBACK (the command is acknowledged to
// Commands), when the broker drops the message, when the session ends,
// and when a new session does not hold them.
type inflightCmds struct {
	mu       sync.Mutex
	byClient map[string]map[uint16]inflightCmd
}

// inflightCmd is one command in a session.
type inflightCmd struct {
	device gateway.DeviceID
	id     uint64
	owner  *delivery // the connection it was offered on
}

func (f *inflightCmds) add(client string, pid uint16, c inflightCmd) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.byClient == nil {
		f.byClient = make(map[string]map[uint16]inflightCmd)
	}
	m := f.byClient[client]
	if m == nil {
		m = make(map[uint16]inflightCmd)
		f.byClient[client] = m
	}
	m[pid] = c
}

// take removes and returns the entry of client's packet pid.
func (f *inflightCmds) take(client string, pid uint16) (inflightCmd, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	c, ok := f.byClient[client][pid]
	if ok {
		f.removeLocked(client, pid)
	}
	return c, ok
}

func (f *inflightCmds) drop(client string, pid uint16) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.removeLocked(client, pid)
}

func (f *inflightCmds) removeLocked(client string, pid uint16) {
	m := f.byClient[client]
	delete(m, pid)
	if len(m) == 0 {
		delete(f.byClient, client)
	}
}

// dropClient forgets the commands of client's session (it expired).
func (f *inflightCmds) dropClient(client string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.byClient, client)
}

// dropOwner forgets the commands offered on connection d of client.
func (f *inflightCmds) dropOwner(client string, d *delivery) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for pid, c := range f.byClient[client] {
		if c.owner == d {
			f.removeLocked(client, pid)
		}
	}
}

// held returns the IDs of the commands in client's session.
func (f *inflightCmds) held(client string) map[uint64]struct{} {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := make(map[uint64]struct{}, len(f.byClient[client]))
	for _, c := range f.byClient[client] {
		out[c.id] = struct{}{}
	}
	return out
}

// reconcile keeps, of cl's entries, those its session established now
// holds: a clean start, or a session the broker did not keep, leaves
// its commands pending.
func (f *inflightCmds) reconcile(cl *mochi.Client) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for pid := range f.byClient[cl.ID] {
		if pk, ok := cl.State.Inflight.Get(pid); !ok || pk.Origin != commandsClientID {
			f.removeLocked(cl.ID, pid)
		}
	}
}

// watchers watch the Commands.Wait channels of the connected devices, up
// to groupSize per goroutine.
type watchers struct {
	srv *Server

	mu sync.Mutex
	// open are the groups with room, the last one filled first.
	open []*watchGroup
}

// watchGroup is one goroutine's devices and their wait channels (nil
// until the device's first delivery set one, and once it fired).
type watchGroup struct {
	w       *watchers
	kick    chan struct{}
	members map[*delivery]<-chan struct{}
}

// add makes d watched. During shutdown it is not (nothing is delivered).
func (w *watchers) add(d *delivery) {
	w.mu.Lock()
	defer w.mu.Unlock()
	var g *watchGroup
	if n := len(w.open); n > 0 {
		g = w.open[n-1]
	} else {
		if !w.srv.enter() {
			return
		}
		g = &watchGroup{w: w, kick: make(chan struct{}, 1), members: make(map[*delivery]<-chan struct{}, groupSize)}
		w.open = append(w.open, g)
		go g.run()
	}
	g.members[d] = nil
	d.group = g
	if len(g.members) == groupSize {
		w.open = w.open[:len(w.open)-1]
	}
	g.wake()
}

// remove stops watching d; its group's goroutine ends with its last
// device.
func (w *watchers) remove(d *delivery) {
	w.mu.Lock()
	defer w.mu.Unlock()
	g := d.group
	if g == nil {
		return
	}
	d.group = nil
	if len(g.members) == groupSize {
		w.open = append(w.open, g)
	}
	delete(g.members, d)
	g.wake()
}

// waiting reports whether d's wait channel is set and has not fired.
func (w *watchers) waiting(d *delivery) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return d.group != nil && d.group.members[d] != nil
}

// watch sets d's wait channel.
func (w *watchers) watch(d *delivery, ch <-chan struct{}) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if g := d.group; g != nil {
		g.members[d] = ch
		g.wake()
	}
}

// wake makes the group's goroutine read its members again.
func (g *watchGroup) wake() {
	select {
	case g.kick <- struct{}{}:
	default:
	}
}

// run waits for the members' channels and triggers the delivery of the
// device whose channel fired, until the group is empty or the server
// stops.
func (g *watchGroup) run() {
	w := g.w
	defer w.srv.work.Done()
	cases := []reflect.SelectCase{
		{Dir: reflect.SelectRecv, Chan: reflect.ValueOf(w.srv.done)},
		{Dir: reflect.SelectRecv, Chan: reflect.ValueOf(g.kick)},
	}
	var who []*delivery
	for {
		w.mu.Lock()
		if len(g.members) == 0 {
			w.retire(g)
			w.mu.Unlock()
			return
		}
		cases, who = cases[:2], who[:0]
		for d, ch := range g.members {
			if ch != nil {
				cases = append(cases, reflect.SelectCase{Dir: reflect.SelectRecv, Chan: reflect.ValueOf(ch)})
				who = append(who, d)
			}
		}
		w.mu.Unlock()
		i, _, _ := reflect.Select(cases)
		switch i {
		case 0:
			return
		case 1:
			continue
		}
		d := who[i-2]
		w.mu.Lock()
		if d.group == g {
			g.members[d] = nil // fired; the delivery sets the next one
		}
		w.mu.Unlock()
		d.trigger()
	}
}

// retire drops the empty group g from the open ones; the caller holds
// w.mu.
func (w *watchers) retire(g *watchGroup) {
	for i, o := range w.open {
		if o == g {
			w.open = append(w.open[:i], w.open[i+1:]...)
			return
		}
	}
}

// PublishLocal publishes m, a device's message that did not come through
// this broker (CoAP, an adapter), to the local subscribers of topic (its
// local topic <prefix>/<device>[/<rest>]) at QoS 0, with its content type
// and user properties: the data path's way to local consumers. It is not
// retained and not sent up again.
func (s *Server) PublishLocal(topic string, m gateway.Message) error {
	pk := packets.Packet{
		FixedHeader: packets.FixedHeader{Type: packets.Publish},
		TopicName:   topic,
		Payload:     m.Payload,
		Properties:  packets.Properties{ContentType: m.ContentType},
	}
	for _, p := range m.Properties {
		pk.Properties.User = append(pk.Properties.User, packets.UserProperty{Key: p.Key, Val: p.Value})
	}
	if err := s.broker.InjectPacket(s.dataClient, pk); err != nil {
		return fmt.Errorf("mqtt: publish locally on %s: %w", topic, err)
	}
	return nil
}
