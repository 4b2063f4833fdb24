// Package mqttpub publishes presence events to an upstream MQTT broker
// (docs/design.md §6.12, docs/events.md) with eclipse/paho.golang's autopaho:
// every event on <prefix>/events/<device> and the device's current
// state, retained, on <prefix>/presence/<device>, both as the JSON
// envelope of gateway.Envelope; and each gateway event (lost, back: shard
// 0's log) as the gateway's current state, retained, on
// <prefix>/gateways/<gateway>.
// A forgotten device's removed event clears its retained presence (an
// empty retained message).
//
// Delivery is at-least-once: a shard's publisher reads the shard's log
// after its saved position (gateway.EventLog), publishes a batch, and
// saves the position after the broker has acknowledged every message of
// it (PUBACK at QoS 1). A restart, a broker outage or a takeover by
// another process resumes at the saved position, so a message may be
// published twice, never lost; consumers drop duplicates by
// (device, ver). The messages of one device are published one after the
// other, so their order holds; devices are published in parallel.
//
// One publisher per shard across processes: a shard is published only
// by the holder of its publisher lease in the store, so enabling the
// publisher in every gateway and runner is safe. A shard without a
// saved position, or whose position cannot be served any more (trimmed
// or another incarnation of the store), is started from a snapshot: the
// current state of each of its devices is published on the presence
// topic, then the events after the snapshot.
//
// A message the broker refuses (a PUBACK or PUBREC reason code of 0x80
// or more, such as 0x87 not authorized by an ACL; a message larger than
// the broker's maximum packet size; a QoS or retain flag the broker does
// not support) is sent RefusalTries times, then skipped: logged with its
// device and ver, counted (fleetgate_publisher_skipped_total), and the
// position moves on. A failure of the connection is no refusal: the
// message waits for the broker, however long.
//
// The publisher only reads the store, on the store's own reader
// connections; a slow or absent broker makes it wait, holding at most
// one batch per shard, and never touches the devices' path.
package mqttpub

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"log/slog"
	"net/url"
	"sync"
	"sync/atomic"
	"time"

	"github.com/eclipse/paho.golang/autopaho"
	"github.com/eclipse/paho.golang/paho"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"

	"github.com/fleetgate/fleetgate/gateway"
	"github.com/fleetgate/fleetgate/internal/ctxsleep"
)

// Defaults of Options.
const (
	DefaultTopicPrefix = "fleetgate"
	DefaultLockTTL     = 15 * time.Second
	DefaultBatch       = 500
	DefaultInFlight    = 64
	// RefusalTries is how many times a message the broker refuses is
	// sent before it is skipped: a refusal may pass (a quota, an ACL
	// being reloaded), but one that lasts must not stall its shard.
	RefusalTries = 5
)

// Options configures a Publisher.
type Options struct {
	// URL is the broker: mqtt://host:1883, or mqtts:// (tls://) with TLS.
	URL string
	// ClientID is the MQTT client ID; it must be unique per process on
	// the broker (default "fleetgate-" + Owner).
	ClientID string
	Username string
	Password string
	// TLS is used for mqtts:// and tls:// URLs (nil: system roots).
	TLS *tls.Config
	// TopicPrefix is the topics' first level(s); default "fleetgate".
	TopicPrefix string
	// QoS of every message: 0, 1 or 2. At 0 nothing is acknowledged and
	// delivery is at-most-once.
	QoS byte
	// RetainState publishes the presence and gateways topics retained.
	RetainState bool
	// OfflineDelay, when positive, holds an offline event back that
	// long: if the device's next online event comes within it, neither
	// is published (flap damping).
	OfflineDelay time.Duration
	// Owner names this process in the publisher leases ("<gateway>/<epoch>").
	Owner string
	// LockTTL is the shard lease, renewed every LockTTL/3.
	LockTTL time.Duration
	// Batch is the events read from a shard and published at once.
	Batch int
	// InFlight bounds the devices being published at once per shard.
	InFlight int
	// ConnectTimeout bounds a connection attempt (default 10s).
	ConnectTimeout time.Duration
	// Logger defaults to discarding.
	Logger *slog.Logger
	// Registerer receives the publisher's metrics; nil registers none.
	Registerer prometheus.Registerer
	// OnPublished, if set, is called with every event once the broker
	// acknowledged its messages (or they were skipped), from the shard's
	// goroutine: it must not block.
	OnPublished func(gateway.Event)
}

// Publisher publishes the events of the shards whose lease it holds.
type Publisher struct {
	store  gateway.PublisherLog
	o      Options
	url    *url.URL
	log    *slog.Logger
	cm     *autopaho.ConnectionManager
	shards []shardState
	// maxPacket is the broker's maximum packet size (CONNACK), 0 when it
	// names none.
	maxPacket atomic.Uint32
	m         metrics
	mu        sync.Mutex
	stats     Stats
}

// Stats is the publisher's part of /v1/status.
type Stats struct {
	Shards    []int  `json:"shards"`
	Published uint64 `json:"published"`
	Damped    uint64 `json:"damped"`
	// Skipped counts the messages the broker refused RefusalTries times.
	Skipped   uint64 `json:"skipped"`
	Connected bool   `json:"connected"`
}

type shardState struct {
	cancel func()
	done   chan struct{}
	until  time.Time // local end of the lease
}

// New checks o and returns a publisher; Run connects and publishes.
func New(store gateway.PublisherLog, o Options) (*Publisher, error) {
	u, err := url.Parse(o.URL)
	if err != nil || u.Host == "" {
		return nil, fmt.Errorf("mqttpub: url %q: want mqtt://host:port or mqtts://host:port", o.URL)
	}
	switch u.Scheme {
	case "mqtt", "tcp":
		u.Scheme = "mqtt"
	case "mqtts", "tls", "ssl":
		u.Scheme = "tls"
	default:
		return nil, fmt.Errorf("mqttpub: url %q: scheme %q: want mqtt or mqtts", o.URL, u.Scheme)
	}
	if o.QoS > 2 {
		return nil, fmt.Errorf("mqttpub: qos %d: want 0, 1 or 2", o.QoS)
	}
	if o.Owner == "" {
		return nil, errors.New("mqttpub: an owner is required")
	}
	if o.TopicPrefix == "" {
		o.TopicPrefix = DefaultTopicPrefix
	}
	if o.ClientID == "" {
		o.ClientID = "fleetgate-" + o.Owner
	}
	if o.LockTTL <= 0 {
		o.LockTTL = DefaultLockTTL
	}
	if o.Batch <= 0 {
		o.Batch = DefaultBatch
	}
	if o.InFlight <= 0 {
		o.InFlight = DefaultInFlight
	}
	if o.ConnectTimeout <= 0 {
		o.ConnectTimeout = 10 * time.Second
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	return &Publisher{store: store, o: o, url: u, log: o.Logger.With("component", "mqttpub"),
		shards: make([]shardState, store.Shards()), m: newMetrics(o.Registerer),
	}, nil
}

// metrics are the publisher's Prometheus metrics.
type metrics struct {
	skipped   prometheus.Counter
	published prometheus.Counter
	failed    prometheus.Counter
	lag       prometheus.Histogram
	connected prometheus.Gauge
}

func newMetrics(reg prometheus.Registerer) metrics {
	f := promauto.With(reg)
	return metrics{
		skipped: f.NewCounter(prometheus.CounterOpts{
			Name: "fleetgate_publisher_skipped_total",
			Help: "Messages to the upstream broker skipped after it refused them RefusalTries times (an ACL, a size or QoS limit).",
		}),
		published: f.NewCounter(prometheus.CounterOpts{
			Name: "fleetgate_publisher_published_total",
			Help: "Events published to the upstream broker (every message of the event acknowledged, or skipped).",
		}),
		failed: f.NewCounter(prometheus.CounterOpts{
			Name: "fleetgate_publisher_failed_total",
			Help: "Publish attempts that failed for the connection's sake (no acknowledgement; sent again once connected).",
		}),
		lag: f.NewHistogram(prometheus.HistogramOpts{
			Name:    "fleetgate_publisher_lag_seconds",
			Help:    "Time from an event's store time to the broker's acknowledgement of its messages (events of a snapshot are not observed).",
			Buckets: prometheus.ExponentialBuckets(0.001, 2, 18), // 1ms .. 131s
		}),
		connected: f.NewGauge(prometheus.GaugeOpts{
			Name: "fleetgate_publisher_connected",
			Help: "1 while the publisher is connected to the upstream broker.",
		}),
	}
}

// Stats reports what the publisher holds and has published.
func (p *Publisher) Stats() Stats {
	p.mu.Lock()
	defer p.mu.Unlock()
	s := p.stats
	s.Shards = nil
	for i, st := range p.shards {
		if st.cancel != nil {
			s.Shards = append(s.Shards, i)
		}
	}
	return s
}

// Run connects to the broker and publishes the shards it can lease
// until ctx ends; then it stops its shard publishers, releases their
// leases (keeping the saved positions) and disconnects.
func (p *Publisher) Run(ctx context.Context) error {
	cfg := autopaho.ClientConfig{
		ServerUrls:                    []*url.URL{p.url},
		TlsCfg:                        p.o.TLS,
		KeepAlive:                     30,
		CleanStartOnInitialConnection: true,
		ConnectRetryDelay:             time.Second,
		ReconnectBackoff:              autopaho.NewExponentialBackoff(100*time.Millisecond, 5*time.Second, 500*time.Millisecond, 2),
		ConnectTimeout:                p.o.ConnectTimeout,
		ConnectUsername:               p.o.Username,
		ConnectPassword:               []byte(p.o.Password),
		OnConnectionUp: func(_ *autopaho.ConnectionManager, ca *paho.Connack) {
			var maxPacket uint32
			if ca.Properties != nil && ca.Properties.MaximumPacketSize != nil {
				maxPacket = *ca.Properties.MaximumPacketSize
			}
			p.maxPacket.Store(maxPacket)
			p.setConnected(true)
			p.log.Info("connected to the broker", "url", p.url.Redacted())
		},
		OnConnectionDown: func() bool {
			p.setConnected(false)
			p.log.Warn("broker connection lost; reconnecting", "url", p.url.Redacted())
			return true
		},
		OnConnectError: func(err error) { p.log.Warn("broker connection failed", "url", p.url.Redacted(), "err", err) },
		ClientConfig:   paho.ClientConfig{ClientID: p.o.ClientID},
	}
	if p.o.TLS == nil && p.url.Scheme == "tls" {
		cfg.TlsCfg = &tls.Config{MinVersion: tls.VersionTLS12}
	}
	cctx, cancelConn := context.WithCancel(context.WithoutCancel(ctx))
	defer cancelConn()
	cm, err := autopaho.NewConnection(cctx, cfg)
	if err != nil {
		return fmt.Errorf("mqttpub: connect %s: %w", p.url.Redacted(), err)
	}
	p.cm = cm
	p.leaseLoop(ctx)
	p.stopAll()
	dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
	defer cancel()
	_ = cm.Disconnect(dctx)
	return nil
}

func (p *Publisher) setConnected(v bool) {
	if v {
		p.m.connected.Set(1)
	} else {
		p.m.connected.Set(0)
	}
	p.mu.Lock()
	p.stats.Connected = v
	p.mu.Unlock()
}

// leaseLoop takes and renews the shard leases every LockTTL/3 until ctx
// ends, starting a shard publisher for every lease taken and stopping
// the one of every lease lost.
func (p *Publisher) leaseLoop(ctx context.Context) {
	order := rotation(p.o.Owner, len(p.shards))
	t := time.NewTimer(0)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		for _, shard := range order {
			if ctx.Err() != nil {
				return
			}
			p.leaseShard(ctx, shard)
		}
		t.Reset(p.o.LockTTL / 3)
	}
}

func (p *Publisher) leaseShard(ctx context.Context, shard int) {
	start := time.Now()
	pos, ok, err := p.store.AcquirePublisher(ctx, shard, p.o.Owner, p.o.LockTTL)
	p.mu.Lock()
	st := &p.shards[shard]
	running := st.cancel != nil
	if running {
		select {
		case <-st.done: // ended on its own (lost its lease on a save)
			st.cancel()
			st.cancel, running = nil, false
		default:
		}
	}
	p.mu.Unlock()
	switch {
	case err != nil:
		if running && time.Now().After(st.until) {
			p.log.Warn("publisher lease ran out: the store did not answer", "shard", shard, "err", err)
			p.stop(shard)
		}
	case !ok:
		if running {
			p.log.Info("publisher lease taken by another process", "shard", shard)
			p.stop(shard)
		}
	default:
		p.mu.Lock()
		st.until = start.Add(p.o.LockTTL)
		if !running {
			sctx, cancel := context.WithCancel(ctx)
			st.cancel, st.done = cancel, make(chan struct{})
			done := st.done
			go func() {
				defer close(done)
				p.runShard(sctx, shard, pos)
			}()
			p.log.Info("publishing shard", "shard", shard, "from", pos.String())
		}
		p.mu.Unlock()
	}
}

// stop ends shard's publisher and waits for it.
func (p *Publisher) stop(shard int) {
	p.mu.Lock()
	st := &p.shards[shard]
	cancel, done := st.cancel, st.done
	st.cancel = nil
	p.mu.Unlock()
	if cancel != nil {
		cancel()
		<-done
	}
}

// stopAll ends every shard publisher and releases its lease.
func (p *Publisher) stopAll() {
	for shard := range p.shards {
		p.mu.Lock()
		held := p.shards[shard].cancel != nil
		p.mu.Unlock()
		if !held {
			continue
		}
		p.stop(shard)
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		if err := p.store.ReleasePublisher(ctx, shard, p.o.Owner); err != nil {
			p.log.Warn("release publisher lease", "shard", shard, "err", err)
		}
		cancel()
	}
}

// rotation is the shard order of owner: rotated by a hash of it, so that
// processes starting together take different shards first.
func rotation(owner string, shards int) []int {
	h := fnv.New32a()
	h.Write([]byte(owner))
	start := int(h.Sum32() % uint32(shards))
	out := make([]int, shards)
	for i := range out {
		out[i] = (start + i) % shards
	}
	return out
}

// message is one MQTT message to publish, of the event (or snapshot
// entry) of device at ver.
type message struct {
	topic   string
	payload []byte
	retain  bool
	device  gateway.DeviceID
	ver     uint64
}

// runShard publishes shard from pos until ctx ends or the lease is lost.
func (p *Publisher) runShard(ctx context.Context, shard int, pos gateway.Position) {
	log := p.log.With("shard", shard)
	var catchUp *catchUp
	if pos == (gateway.Position{}) {
		var ok bool
		if pos, catchUp, ok = p.snapshot(ctx, shard, log); !ok {
			return
		}
	}
	damp := newDamper(p.o.OfflineDelay)
	backoff := 100 * time.Millisecond
	for ctx.Err() == nil {
		wait := time.Second
		if d, ok := damp.nextDue(); ok {
			wait = max(time.Millisecond, min(wait, time.Until(d)))
		}
		evs, err := p.store.ReadEvents(ctx, shard, pos, p.o.Batch, wait)
		if ctx.Err() != nil {
			return
		}
		if errors.Is(err, gateway.ErrResyncRequired) {
			log.Warn("publisher position cannot be served; publishing a snapshot", "from", pos.String(), "err", err)
			var ok bool
			if pos, catchUp, ok = p.snapshot(ctx, shard, log); !ok {
				return
			}
			damp = newDamper(p.o.OfflineDelay)
			continue
		}
		if err != nil {
			log.Warn("read events", "err", err)
			if !ctxsleep.Sleep(ctx, backoff) {
				return
			}
			backoff = min(2*backoff, 5*time.Second)
			continue
		}
		backoff = 100 * time.Millisecond
		var prev string
		if len(evs) > 0 {
			prev = pos.ID
			pos.ID = evs[len(evs)-1].ID
		}
		out, damped := damp.offer(evs, prev, time.Now())
		out = append(out, damp.due(time.Now())...)
		msgs := make([][]message, 0, len(out))
		byDevice := map[gateway.DeviceID]int{}
		for _, e := range out {
			ms := p.messages(e, catchUp)
			i, ok := byDevice[e.Device]
			if !ok {
				i = len(msgs)
				byDevice[e.Device] = i
				msgs = append(msgs, nil)
			}
			msgs[i] = append(msgs[i], ms...)
		}
		if !p.publish(ctx, msgs) {
			return
		}
		acked := time.Now()
		for _, e := range out {
			p.m.lag.Observe(acked.Sub(e.At).Seconds())
			if p.o.OnPublished != nil {
				p.o.OnPublished(e)
			}
		}
		p.m.published.Add(float64(len(out)))
		p.mu.Lock()
		p.stats.Published += uint64(len(out))
		p.stats.Damped += uint64(damped)
		p.mu.Unlock()
		if catchUp != nil && gateway.CompareLogIDs(pos.ID, catchUp.until) >= 0 {
			catchUp = nil
		}
		if len(evs) == 0 && len(out) == 0 {
			continue
		}
		save := pos
		if held, ok := damp.safe(); ok {
			save.ID = held // never past an event still held back
		}
		if err := p.store.SavePublisher(ctx, shard, p.o.Owner, save); err != nil {
			if errors.Is(err, gateway.ErrNotHolder) {
				log.Warn("publisher lease lost; stopping the shard", "err", err)
				return
			}
			log.Warn("save publisher position; will save with the next batch", "err", err)
		}
	}
}

// catchUp is the snapshot's device vers while the publisher reads the
// events between the snapshot's cursor and its last page: an event at
// or below the snapshot's ver of its device is older than the retained
// state already published, so it goes to the events topic only.
type catchUp struct {
	vers  map[gateway.DeviceID]uint64
	until string
}

// messages are the MQTT messages of one event. A gateway event is its
// gateway's current state: one message on <prefix>/gateways/<id>,
// retained as the presence topics are. A removed event (a
// forgotten device) clears the device's retained presence: an empty
// retained message deletes it on the broker (MQTT 5, 3.3.1.3); without
// RetainState the removed envelope goes there as any event does.
func (p *Publisher) messages(e gateway.Event, cu *catchUp) []message {
	b, _ := json.Marshal(gateway.EnvelopeOf(e))
	if e.IsGateway() {
		return []message{{topic: p.o.TopicPrefix + "/gateways/" + e.Gateway, payload: b, retain: p.o.RetainState, ver: e.Ver}}
	}
	out := []message{{topic: p.o.TopicPrefix + "/events/" + string(e.Device), payload: b, device: e.Device, ver: e.Ver}}
	if cu != nil && e.Ver <= cu.vers[e.Device] {
		return out
	}
	presence := message{topic: p.o.TopicPrefix + "/presence/" + string(e.Device), payload: b, retain: p.o.RetainState, device: e.Device, ver: e.Ver}
	if e.State == gateway.Removed && p.o.RetainState {
		presence.payload = nil
	}
	return append(out, presence)
}

// snapshot publishes the presence of every device of shard and returns
// the position the snapshot was taken at.
func (p *Publisher) snapshot(ctx context.Context, shard int, log *slog.Logger) (gateway.Position, *catchUp, bool) {
	for attempt := 0; ctx.Err() == nil; attempt++ {
		if attempt > 0 && !ctxsleep.Sleep(ctx, time.Second) {
			break
		}
		head, err := p.store.SnapshotShard(ctx, shard, "", 0)
		if err != nil {
			log.Warn("snapshot position", "err", err)
			continue
		}
		cu := &catchUp{vers: map[gateway.DeviceID]uint64{}, until: head.At.ID}
		page, n, failed := "", 0, false
		for {
			sp, err := p.store.SnapshotShard(ctx, shard, page, p.o.Batch)
			if err != nil {
				log.Warn("snapshot page", "err", err)
				failed = true
				break
			}
			var msgs [][]message
			for _, d := range sp.Devices {
				b, _ := json.Marshal(gateway.SnapshotEnvelope(d))
				msgs = append(msgs, []message{{topic: p.o.TopicPrefix + "/presence/" + string(d.Device), payload: b, retain: p.o.RetainState, device: d.Device, ver: d.Ver}})
				cu.vers[d.Device] = d.Ver
			}
			if !p.publish(ctx, msgs) {
				return gateway.Position{}, nil, false
			}
			n += len(sp.Devices)
			if gateway.CompareLogIDs(sp.At.ID, cu.until) > 0 {
				cu.until = sp.At.ID
			}
			if page = sp.Next; page == "" {
				break
			}
		}
		if failed {
			continue
		}
		if err := p.store.SavePublisher(ctx, shard, p.o.Owner, head.At); err != nil {
			if errors.Is(err, gateway.ErrNotHolder) {
				return gateway.Position{}, nil, false
			}
			log.Warn("save publisher position after the snapshot", "err", err)
		}
		log.Info("published the shard's snapshot", "devices", n, "at", head.At.String())
		return head.At, cu, true
	}
	return gateway.Position{}, nil, false
}

// publish sends each device's messages in order, devices in parallel
// (at most InFlight at once), and returns once every message was
// acknowledged (false only when ctx ended first). A message the broker
// did not acknowledge is sent again once the connection is up.
func (p *Publisher) publish(ctx context.Context, perDevice [][]message) bool {
	if len(perDevice) == 0 {
		return true
	}
	sem := make(chan struct{}, p.o.InFlight)
	var wg sync.WaitGroup
	for _, ms := range perDevice {
		select {
		case sem <- struct{}{}:
		case <-ctx.Done():
			wg.Wait()
			return false
		}
		wg.Go(func() {
			defer func() { <-sem }()
			for _, m := range ms {
				if !p.publishOne(ctx, m) {
					return
				}
			}
		})
	}
	wg.Wait()
	return ctx.Err() == nil
}

// publishOne sends m until the broker acknowledges it, or has refused it
// RefusalTries times (then it is skipped and counted); false only when
// ctx ended first.
func (p *Publisher) publishOne(ctx context.Context, m message) bool {
	pub := &paho.Publish{Topic: m.topic, QoS: p.o.QoS, Retain: m.retain, Payload: m.payload,
		Properties: &paho.PublishProperties{ContentType: "application/json"}}
	size, _ := pub.Packet().WriteTo(io.Discard)
	backoff := 50 * time.Millisecond
	refusals := 0
	for attempt := 0; ctx.Err() == nil; attempt++ {
		if err := p.cm.AwaitConnection(ctx); err != nil {
			return false
		}
		why, err := p.send(ctx, pub, size)
		switch {
		case why == "" && err == nil:
			return true
		case ctx.Err() != nil:
			return false
		case why == "":
			p.m.failed.Inc()
			if attempt%10 == 0 {
				p.log.Warn("publish failed; retrying", "topic", m.topic, "attempt", attempt+1, "err", err)
			}
		default:
			if refusals++; refusals == RefusalTries {
				p.skip(m, why)
				return true
			}
		}
		if !ctxsleep.Sleep(ctx, backoff) {
			return false
		}
		backoff = min(2*backoff, 2*time.Second)
	}
	return false
}

// send publishes pub (size bytes long) once. It returns "" and nil when
// the broker acknowledged it, why the broker refused it, or the error of
// the connection.
func (p *Publisher) send(ctx context.Context, pub *paho.Publish, size int64) (string, error) {
	if limit := p.maxPacket.Load(); limit > 0 && size > int64(limit) {
		return fmt.Sprintf("%d bytes, more than the broker's maximum packet size %d", size, limit), nil
	}
	pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	resp, err := p.cm.Publish(pctx, pub)
	if why := refusal(resp, err); why != "" {
		return why, nil
	}
	return "", err
}

// skip gives m up after the broker refused it RefusalTries times.
func (p *Publisher) skip(m message, why string) {
	p.log.Warn("the broker refused a message; skipped", "device", m.device, "ver", m.ver, "topic", m.topic, "tries", RefusalTries, "reason", why)
	p.m.skipped.Inc()
	p.mu.Lock()
	p.stats.Skipped++
	p.mu.Unlock()
}

// refusal says why the broker refused a publish (a reason code of 0x80
// or more, or arguments this connection cannot carry), or "" when it
// failed for the connection's sake, and sending it again may succeed.
func refusal(resp *paho.PublishResponse, err error) string {
	switch {
	case resp != nil && resp.ReasonCode >= 0x80:
		why := fmt.Sprintf("reason code 0x%02x", resp.ReasonCode)
		if resp.Properties != nil && resp.Properties.ReasonString != "" {
			why += " (" + resp.Properties.ReasonString + ")"
		}
		return why
	case errors.Is(err, paho.ErrInvalidArguments):
		return err.Error()
	}
	return ""
}
