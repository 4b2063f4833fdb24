// Package bridge is the data path's core (docs/design.md §6.14): it takes
// the devices' messages from the front ends (gateway.DataSink), hands
// them to the gateway's local MQTT broker for local consumers, and
// forwards those its up filters select to an upstream MQTT broker
// through store-and-forward queues; and it holds the commands for the
// devices (gateway.Commands), from the upstream broker or local clients.
//
// Up. Publish validates a device's messages, puts the QoS 1 ones into the
// durable queue (it returns once they are on disk) and the QoS 0 ones
// into the memory queue, and calls Local for each message that did not
// come through the local broker already (Source "mqtt"). It never waits
// for the upstream broker: a full queue drops its oldest messages. A
// forwarder per queue publishes the messages on
// <TopicPrefix>/devices/<device>[/<rest>] at their QoS (MQTT 5: with
// their content type and user properties), each device's in the queue's
// order, devices in parallel (Lanes, by a hash of the device, one
// message in flight per lane), and removes them from the queue once the
// broker acknowledged them (PUBACK at QoS 1; written at QoS 0). A
// message not acknowledged is sent again after a lost connection or a
// restart before the device's later ones: delivery is at least once, and
// a consumer that drops duplicates sees each device's messages in order.
// A message the broker refuses (a reason code of 0x80 or more; larger
// than its maximum packet size) is sent RefusalTries times, then dropped,
// logged with its device and counted; its lane goes on.
//
// Down. With Down, the bridge subscribes <TopicPrefix>/devices/+/cmd/# at
// QoS 1 in a session the broker keeps (CommandTTL) and acknowledges a
// command to the broker only once it is in the commands queue, on disk:
// a crash before that gets it delivered again. Commands, from upstream or
// submitted locally, are pending per device until a front end
// acknowledges them, they expire (CommandTTL after Received), or the
// device has MaxPendingPerDevice newer ones.
//
// Metrics (fleetgate_bridge_*, no device label): messages and payload
// bytes in and out by direction and source; each queue's depth, bytes
// and oldest age; drops by queue and reason; refusals; the upstream
// connection (gauge) and its connects; the latency from a QoS 1
// message's Received to its PUBACK. Status is the part of /v1/status.
package bridge

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/fleetgate/fleetgate/gateway"
	"github.com/fleetgate/fleetgate/internal/ctxsleep"
)

// Defaults of Options.
const (
	DefaultLocalPrefix         = "devices"
	DefaultCommandTTL          = time.Hour
	DefaultMaxPendingPerDevice = 32
	DefaultLanes               = 64
	DefaultWindow              = 1024
	DefaultConnectTimeout      = 10 * time.Second
)

// Options configures a Bridge.
type Options struct {
	// GatewayID names the gateway in the defaults of ClientID and
	// TopicPrefix.
	GatewayID string
	// URL is the upstream broker: mqtt://host:1883, or mqtts:// (tls://,
	// ssl://) with TLS; "" for none (local consumers and commands still
	// work).
	URL string
	// ClientID is the MQTT client ID (default
	// "fleetgate-<GatewayID>-bridge"); the broker keeps the commands
	// session under it.
	ClientID string
	Username string
	Password string
	// TLS is used for TLS URLs (nil: the system roots).
	TLS *tls.Config
	// ProtocolVersion is 5 (default; paho.golang autopaho) or 4 (MQTT
	// 3.1.1; paho.mqtt.golang: no content type, user properties or
	// reason codes).
	ProtocolVersion byte
	// TopicPrefix is the upstream topics' first levels (default
	// "fleetgate/<GatewayID>").
	TopicPrefix string
	// Up are the MQTT topic filters of the messages forwarded, matched
	// against their local topic <LocalPrefix>/<device>[/<rest>]; nil
	// forwards every message (<LocalPrefix>/#), an empty list none.
	Up []string
	// Down subscribes the commands upstream.
	Down bool
	// LocalPrefix is the local broker's root of the devices'
	// topics (auth.topic_prefix; default "devices").
	LocalPrefix string

	// Durable holds the QoS 1 messages to forward, Memory the QoS 0 ones
	// (both required with a URL). Commands, durable, holds the pending
	// commands (required). The bridge uses them but does not close them.
	Durable, Memory, Commands gateway.Queue
	// CommandTTL is how long a command stays pending (default 1h).
	CommandTTL time.Duration
	// MaxPendingPerDevice bounds a device's pending commands; the oldest
	// is dropped to make room (default 32).
	MaxPendingPerDevice int

	// Local publishes a device's message into the local MQTT broker on
	// topic; nil for none. Its error is logged and counted (dropped,
	// queue local), never returned to the device.
	Local func(topic string, m gateway.Message) error

	// Lanes is the number of devices forwarded in parallel per queue
	// (default 64); Window the messages a forwarder holds read ahead of
	// their acknowledgement (default 1024; and at most about 16 MiB of
	// them).
	Lanes, Window int
	// ConnectTimeout bounds a connection attempt (default 10s).
	ConnectTimeout time.Duration
	// Clock is the time of Received, the commands' expiry and the
	// metrics' ages (default gateway.SystemClock).
	Clock gateway.Clock
	// Logger defaults to discarding.
	Logger *slog.Logger
	// Registerer receives the metrics (fleetgate_bridge_*); nil registers
	// none. Close unregisters them.
	Registerer prometheus.Registerer

	// beforeDurable, when set (by the tests), is called before commands
	// are put into the commands queue.
	beforeDurable func([]gateway.Message)
}

// Bridge is the data path: a gateway.DataSink and gateway.Commands.
type Bridge struct {
	o             Options
	url           *url.URL // nil without an upstream
	log           *slog.Logger
	clock         gateway.Clock
	m             *metrics
	up            upstream
	cmds          *commands
	beforeDurable func([]gateway.Message)

	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup
	inbox  chan inbound
	closed atomic.Bool
	once   sync.Once
	// puts are the command Puts that outlive their Submit (its context
	// ended first); Close waits for them. putMu orders their start
	// before Close's wait.
	putMu sync.Mutex
	puts  sync.WaitGroup

	nForwarded atomic.Uint64
	mu         sync.Mutex
	connected  bool
	subscribed bool
	connects   uint64
	since      time.Time
}

var (
	_ gateway.DataSink = (*Bridge)(nil)
	_ gateway.Commands = (*Bridge)(nil)
)

// New checks o, loads the pending commands from o.Commands and starts
// the bridge: the connection to the upstream broker (kept up, in the
// background, until Close) and its forwarders.
func New(ctx context.Context, o Options) (*Bridge, error) {
	if err := o.defaults(); err != nil {
		return nil, err
	}
	b := &Bridge{o: o, log: o.Logger.With("component", "bridge"), clock: o.Clock, beforeDurable: o.beforeDurable}
	if o.URL != "" {
		u, err := parseURL(o.URL)
		if err != nil {
			return nil, err
		}
		b.url = u
	}
	b.m = newMetrics(b)
	if err := b.m.register(o.Registerer); err != nil {
		b.unregister()
		return nil, fmt.Errorf("bridge: %w", err)
	}
	b.cmds = newCommands(b, o.Commands, o.CommandTTL, o.MaxPendingPerDevice)
	if err := b.cmds.load(ctx); err != nil {
		b.unregister()
		return nil, err
	}
	b.ctx, b.cancel = context.WithCancel(context.Background())
	b.wg.Go(func() { b.cmds.runSweeper(b.ctx) })
	if b.url == nil {
		return b, nil
	}
	lc := linkConfig{url: b.url, clientID: o.ClientID, username: o.Username, password: o.Password, tls: o.TLS,
		connectTimeout: o.ConnectTimeout, log: b.log, onUp: b.onUp, onDown: b.onDown, onSubscribed: b.onSubscribed,
		onCommand: b.onCommand}
	if b.url.Scheme == "tls" && lc.tls == nil {
		lc.tls = &tls.Config{MinVersion: tls.VersionTLS12}
	}
	if o.Down {
		lc.down = o.TopicPrefix + "/devices/+/cmd/#"
		lc.sessionExpiry = uint32(max(time.Minute, o.CommandTTL) / time.Second)
		b.inbox = make(chan inbound, readBatch)
		b.wg.Go(func() { b.runInbox(b.ctx) })
	}
	if o.ProtocolVersion == 4 {
		b.up = dial311(b.ctx, lc)
	} else {
		up, err := dial5(b.ctx, lc)
		if err != nil {
			b.Close()
			return nil, fmt.Errorf("bridge: connect %s: %w", b.url.Redacted(), err)
		}
		b.up = up
	}
	for _, q := range []namedQueue{{"durable", o.Durable}, {"memory", o.Memory}} {
		f := newForwarder(b, q.name, q.q, o.Lanes, o.Window)
		b.wg.Go(func() { f.run(b.ctx) })
	}
	return b, nil
}

func (o *Options) defaults() error {
	if o.ProtocolVersion == 0 {
		o.ProtocolVersion = 5
	}
	if o.ProtocolVersion != 4 && o.ProtocolVersion != 5 {
		return fmt.Errorf("bridge: protocol version %d: want 5 or 4 (3.1.1)", o.ProtocolVersion)
	}
	if o.LocalPrefix == "" {
		o.LocalPrefix = DefaultLocalPrefix
	}
	if !gateway.ValidTopicRest(o.LocalPrefix) {
		return fmt.Errorf("bridge: local prefix %q: want topic levels without wildcards", o.LocalPrefix)
	}
	if o.TopicPrefix == "" && o.GatewayID != "" {
		o.TopicPrefix = "fleetgate/" + o.GatewayID
	}
	if o.ClientID == "" && o.GatewayID != "" {
		o.ClientID = "fleetgate-" + o.GatewayID + "-bridge"
	}
	if o.URL != "" {
		switch {
		case o.TopicPrefix == "" || o.ClientID == "":
			return errors.New("bridge: an upstream needs a gateway ID or a topic prefix and a client ID")
		case !gateway.ValidTopicRest(o.TopicPrefix):
			return fmt.Errorf("bridge: topic prefix %q: want topic levels without wildcards", o.TopicPrefix)
		case o.Durable == nil || o.Memory == nil:
			return errors.New("bridge: an upstream needs the durable and the memory queue")
		}
	}
	if o.Up == nil {
		o.Up = []string{o.LocalPrefix + "/#"}
	}
	for _, f := range o.Up {
		if !gateway.ValidTopicFilter(f) {
			return fmt.Errorf("bridge: up filter %q is not an MQTT topic filter", f)
		}
	}
	if o.Commands == nil {
		return errors.New("bridge: the commands queue is required")
	}
	if o.CommandTTL <= 0 {
		o.CommandTTL = DefaultCommandTTL
	}
	if o.MaxPendingPerDevice <= 0 {
		o.MaxPendingPerDevice = DefaultMaxPendingPerDevice
	}
	if o.Lanes <= 0 {
		o.Lanes = DefaultLanes
	}
	if o.Window <= 0 {
		o.Window = DefaultWindow
	}
	if o.ConnectTimeout <= 0 {
		o.ConnectTimeout = DefaultConnectTimeout
	}
	if o.Clock == nil {
		o.Clock = gateway.SystemClock{}
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	return nil
}

// parseURL checks an upstream URL and returns it with the scheme the
// clients take: mqtt or tls.
func parseURL(s string) (*url.URL, error) {
	u, err := url.Parse(s)
	if err != nil || u.Host == "" {
		return nil, fmt.Errorf("bridge: url %q: want mqtt://host:port or mqtts://host:port", s)
	}
	switch u.Scheme {
	case "mqtt", "tcp":
		u.Scheme = "mqtt"
	case "mqtts", "tls", "ssl":
		u.Scheme = "tls"
	default:
		return nil, fmt.Errorf("bridge: url %q: scheme %q: want mqtt or mqtts", u.Redacted(), u.Scheme)
	}
	return u, nil
}

// Publish implements gateway.DataSink: msgs, one device's in order, are
// validated (one invalid refuses all), the QoS 1 ones an up filter
// selects are durable in the durable queue and the QoS 0 ones in the
// memory queue when it returns nil, and each message not from the local
// broker (Source "mqtt") went to Local.
func (b *Bridge) Publish(ctx context.Context, msgs []gateway.Message) error {
	if b.closed.Load() {
		return fmt.Errorf("bridge: %w", gateway.ErrQueueClosed)
	}
	for i, m := range msgs {
		if err := gateway.ValidateMessage(m); err != nil {
			return fmt.Errorf("bridge: message %d of %s: %w", i, m.Device, err)
		}
	}
	var qos1, qos0 []gateway.Message
	topics := make([]string, len(msgs))
	for i, m := range msgs {
		topics[i] = deviceTopic(b.o.LocalPrefix, m.Device, m.Topic)
		if b.url == nil || !b.selected(topics[i]) {
			continue
		}
		if m.QoS == 1 {
			qos1 = append(qos1, m)
		} else {
			qos0 = append(qos0, m)
		}
	}
	// the QoS 0 messages first: they do not wait for the disk
	if len(qos0) > 0 {
		if _, err := b.o.Memory.Put(ctx, qos0); err != nil {
			return fmt.Errorf("bridge: memory queue: %w", err)
		}
	}
	if len(qos1) > 0 {
		if _, err := b.o.Durable.Put(ctx, qos1); err != nil {
			return fmt.Errorf("bridge: durable queue: %w", err)
		}
	}
	for i, m := range msgs {
		b.received("up", m)
		if m.Source == "mqtt" || b.o.Local == nil {
			continue
		}
		if err := b.o.Local(topics[i], m); err != nil {
			b.drop("local", "failed", 1)
			b.log.Warn("publish to the local broker", "device", m.Device, "topic", topics[i], "err", err)
		}
	}
	return nil
}

// selected reports whether an up filter matches topic.
func (b *Bridge) selected(topic string) bool {
	for _, f := range b.o.Up {
		if matchFilter(f, topic) {
			return true
		}
	}
	return false
}

// Submit implements gateway.Commands: m (Topic "cmd" or "cmd/<rest>";
// Received, when zero, is now) is a pending command once durable.
func (b *Bridge) Submit(ctx context.Context, m gateway.Message) (gateway.Command, error) {
	if b.closed.Load() {
		return gateway.Command{}, fmt.Errorf("bridge: %w", gateway.ErrQueueClosed)
	}
	return b.cmds.Submit(ctx, m)
}

// Pending implements gateway.Commands.
func (b *Bridge) Pending(device gateway.DeviceID, now time.Time, n int) []gateway.Command {
	return b.cmds.Pending(device, now, n)
}

// Ack implements gateway.Commands.
func (b *Bridge) Ack(device gateway.DeviceID, id uint64) error { return b.cmds.Ack(device, id) }

// Wait implements gateway.Commands. The channel may also close for a
// command of another device (one channel serves the devices of a hash):
// the caller then finds nothing new in Pending and waits again.
func (b *Bridge) Wait(device gateway.DeviceID) <-chan struct{} { return b.cmds.Wait(device) }

// onCommand hands a command from upstream to runInbox.
func (b *Bridge) onCommand(in inbound) {
	select {
	case b.inbox <- in:
	case <-b.ctx.Done():
	}
}

// runInbox makes the commands from upstream pending, a batch at a time
// (one commit), and acknowledges them upstream once durable, until ctx
// ends (what it holds then is not acknowledged: the broker delivers it
// again).
func (b *Bridge) runInbox(ctx context.Context) {
	for {
		var batch []inbound
		select {
		case in := <-b.inbox:
			batch = append(batch, in)
		case <-ctx.Done():
			return
		}
	gather:
		for len(batch) < readBatch {
			select {
			case in := <-b.inbox:
				batch = append(batch, in)
			default:
				break gather
			}
		}
		now := b.clock.Now()
		var msgs []gateway.Message
		for _, in := range batch {
			m, err := b.commandOf(in, now)
			if err != nil {
				b.drop("commands", "invalid", 1)
				b.log.Warn("a command from upstream refused; dropped", "topic", in.topic, "err", err)
				continue
			}
			msgs = append(msgs, m)
		}
		backoff := 100 * time.Millisecond
		for len(msgs) > 0 {
			_, err := b.cmds.submit(ctx, msgs)
			if err == nil {
				for _, m := range msgs {
					b.received("down", m)
				}
				break
			}
			if ctx.Err() != nil {
				return
			}
			if errors.Is(err, gateway.ErrTooLarge) {
				b.drop("commands", "too_large", len(msgs))
				b.log.Warn("commands from upstream larger than the commands queue; dropped", "commands", len(msgs), "err", err)
				break
			}
			b.log.Warn("commands from upstream not durable; trying again", "commands", len(msgs), "err", err)
			if !ctxsleep.Sleep(ctx, backoff) {
				return
			}
			backoff = min(2*backoff, 5*time.Second)
		}
		for _, in := range batch {
			in.ack()
		}
	}
}

// commandOf is the command of a message from upstream.
func (b *Bridge) commandOf(in inbound, now time.Time) (gateway.Message, error) {
	device, rest, err := parseCommandTopic(b.o.TopicPrefix, in.topic)
	if err != nil {
		return gateway.Message{}, err
	}
	m := gateway.Message{Device: device, Topic: rest, Payload: in.payload, ContentType: in.contentType,
		Properties: in.props, QoS: min(in.qos, 1), Received: now, Source: "upstream"}
	return m, gateway.ValidateMessage(m)
}

func (b *Bridge) onUp() {
	b.m.connected.Set(1)
	b.m.connects.Inc()
	b.mu.Lock()
	b.connected, b.since = true, b.clock.Now()
	b.connects++
	b.mu.Unlock()
}

func (b *Bridge) onDown() {
	b.m.connected.Set(0)
	b.mu.Lock()
	b.connected, b.subscribed, b.since = false, false, b.clock.Now()
	b.mu.Unlock()
}

func (b *Bridge) onSubscribed() {
	b.mu.Lock()
	b.subscribed = true
	b.mu.Unlock()
}

// received counts a message taken.
func (b *Bridge) received(direction string, m gateway.Message) {
	src := sourceLabel(direction, m.Source)
	b.m.in.WithLabelValues(direction, src).Inc()
	b.m.inBytes.WithLabelValues(direction, src).Add(float64(len(m.Payload)))
}

// forwarded counts a message the upstream broker acknowledged.
func (b *Bridge) forwarded(m gateway.Message) {
	b.nForwarded.Add(1)
	b.m.out.WithLabelValues("up", m.Source).Inc()
	b.m.outBytes.WithLabelValues("up", m.Source).Add(float64(len(m.Payload)))
	if m.QoS == 1 {
		b.m.latency.Observe(max(0, b.clock.Now().Sub(m.Received).Seconds()))
	}
}

// delivered counts a command a front end acknowledged.
func (b *Bridge) delivered(m gateway.Message) {
	src := sourceLabel("down", m.Source)
	b.m.out.WithLabelValues("down", src).Inc()
	b.m.outBytes.WithLabelValues("down", src).Add(float64(len(m.Payload)))
}

// drop counts n messages the bridge dropped from queue for reason.
func (b *Bridge) drop(queue, reason string, n int) { b.m.queues.add(queue, reason, n) }

// queues are the bridge's queues with their metrics' labels.
func (b *Bridge) queues() []namedQueue {
	qs := []namedQueue{{"commands", b.o.Commands}}
	if b.url != nil {
		qs = append(qs, namedQueue{"durable", b.o.Durable}, namedQueue{"memory", b.o.Memory})
	}
	return qs
}

// Status is the bridge's part of /v1/status.
type Status struct {
	Upstream UpstreamStatus `json:"upstream"`
	Queues   []QueueStatus  `json:"queues"`
	// PendingCommands are the commands pending (acknowledged, expired
	// and dropped ones not), for PendingDevices devices.
	PendingCommands int `json:"pending_commands"`
	PendingDevices  int `json:"pending_devices"`
}

// UpstreamStatus is the upstream connection's state.
type UpstreamStatus struct {
	// URL is the broker's, without its password; "" without an upstream.
	URL       string `json:"url,omitempty"`
	Connected bool   `json:"connected"`
	// Subscribed: the broker acknowledged the commands subscription on
	// this connection (Down).
	Subscribed bool `json:"subscribed"`
	// Connects counts the connections made; Since is when the connection
	// last went up or down (zero before the first).
	Connects uint64    `json:"connects"`
	Since    time.Time `json:"since,omitzero"`
	// Forwarded counts the messages the broker acknowledged.
	Forwarded uint64 `json:"forwarded"`
}

// QueueStatus is one queue's gateway.QueueStats.
type QueueStatus struct {
	Name     string            `json:"name"`
	Messages int               `json:"messages"`
	Bytes    int64             `json:"bytes"`
	Oldest   time.Time         `json:"oldest,omitzero"`
	Dropped  map[string]uint64 `json:"dropped,omitempty"`
}

// Status reports the upstream connection, the queues and the commands.
func (b *Bridge) Status() Status {
	var s Status
	b.mu.Lock()
	s.Upstream = UpstreamStatus{Connected: b.connected, Subscribed: b.subscribed, Connects: b.connects, Since: b.since, Forwarded: b.nForwarded.Load()}
	b.mu.Unlock()
	if b.url != nil {
		s.Upstream.URL = b.url.Redacted()
	}
	for _, q := range b.queues() {
		st := q.q.Stats()
		qs := QueueStatus{Name: q.name, Messages: st.Messages, Bytes: st.Bytes, Oldest: st.Oldest}
		for r, n := range st.Dropped {
			if qs.Dropped == nil {
				qs.Dropped = map[string]uint64{}
			}
			qs.Dropped[string(r)] += n
		}
		s.Queues = append(s.Queues, qs)
	}
	s.PendingCommands, s.PendingDevices = b.cmds.stats()
	return s
}

// Close stops the bridge: its forwarders (acknowledging in the queues
// what the broker acknowledged), the commands it was taking from
// upstream (not acknowledged upstream unless durable), the connection,
// and unregisters its metrics. It does not close the queues. Publish and
// Submit then fail with gateway.ErrQueueClosed.
func (b *Bridge) Close() error {
	b.once.Do(func() {
		b.putMu.Lock()
		b.closed.Store(true)
		b.putMu.Unlock()
		b.cancel()
		b.wg.Wait()
		b.puts.Wait()
		if b.up != nil {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			b.up.close(ctx)
			cancel()
		}
		b.unregister()
	})
	return nil
}

// startPut registers a command Put for Close to wait for; false once
// Close began.
func (b *Bridge) startPut() bool {
	b.putMu.Lock()
	defer b.putMu.Unlock()
	if b.closed.Load() {
		return false
	}
	b.puts.Add(1)
	return true
}

func (b *Bridge) unregister() {
	if b.o.Registerer == nil {
		return
	}
	for _, c := range []prometheus.Collector{b.m.in, b.m.inBytes, b.m.out, b.m.outBytes, b.m.refused, b.m.connected, b.m.connects, b.m.latency, b.m.queues} {
		b.o.Registerer.Unregister(c)
	}
}
