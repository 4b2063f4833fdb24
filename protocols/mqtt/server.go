// Package mqtt is fleetgate's MQTT front end (docs/design.md §6.8): an embedded
// mochi-mqtt broker for the site, MQTT 3.1.1 and 5 over TCP and TLS,
// whose one hook (presence) turns connections and packets into
// gateway.Evidence for a gateway.Observer. Devices publish and subscribe
// as with any broker, each under its own topic subtree.
//
// Admission. The user name is the device ID, or without one the client
// ID (claimedID; the connection's client ID becomes the device ID): an
// invalid one gets CONNACK "client identifier not valid" (0x85; 0x02 in
// 3.1.1). A device with a password is checked against the Credentials;
// one without is admitted only with AllowAnonymous, and only when the
// device is not listed in the Credentials (a listed device must always
// authenticate). A user name that names a local client (local.go) makes
// the client that local client. Any failure,
// including a will topic outside the device's subtree (or, with
// Commands, in its command subtree), gets "not authorized" (0x87; 0x05 in
// 3.1.1) and never says which part was wrong. Too many clients, an
// overloaded gateway, or Credentials that report gateway.ErrOverloaded
// (no password check slot) get "server busy" (0x89; 3.1.1: 0x03 "server
// unavailable"). A device that already has limits.max_sessions_per_device
// sessions gets "quota exceeded" (0x97; 3.1.1: 0x03). Anonymous
// devices are bounded apart: AnonymousConnectsPerSecond per source
// network (0x9F; 3.1.1: 0x03), and the session table's
// MaxAnonymousDevices (gateway.ErrAnonymousLimit: 0x97; 3.1.1: 0x03).
//
// Retained messages are bounded per device and in all (retained.go).
//
// The data path. With a DataSink, a device's PUBLISH goes up (data.go);
// with Commands, its pending commands come down to it while it is
// connected (commands.go). Local clients, MQTT clients of the site that
// are not devices, are admitted by name and held to their topic lists
// (local.go). Without them the broker works as a local broker only.
//
// Revocation. SetCredentials (a reload of the devices file) disconnects
// every connection whose device's credentials changed or went away (MQTT
// 5 clients get DISCONNECT "not authorized"), and anonymous ones whose
// device became listed.
//
// Keep-alive. A client asking for no keep-alive or for more than the
// heartbeat interval is held to the heartbeat interval (whole seconds,
// rounded up): MQTT 5 clients are told so with Server Keep Alive in
// CONNACK; MQTT 3.1.1 has no way to tell them, so a 3.1.1 client that
// stays silent for longer than 1.5× the heartbeat interval (mochi: k +
// k/2 in whole seconds) is disconnected (no Leave: its lease decides).
// Shorter keep-alives are kept. A heartbeat interval of 2 s or more leaves
// devices a grace period; 1 s leaves none.
//
// Limits. MaxPacketSize ends a connection that sends a larger packet;
// MaxClients refuses further CONNECTs; ConnectsPerSecond limits the
// CONNECTs of one device (CONNACK "connection rate exceeded", 0x9F;
// 3.1.1: 0x03), and 250 times as many TCP connects per source address,
// which the devices behind a NAT share (excess connections are closed at
// accept, before any CONNECT is read); connections that have not sent
// CONNECT yet are bounded per source address (32), per source network
// (256 per /24 or /64) and in all (4096), beyond which a new one is
// closed at accept; MaxPendingWrites bounds the packets queued
// for a client, which is disconnected when it overflows; MaxInflight
// bounds the QoS 1/2 messages held for a client (sent and not
// acknowledged, or queued for its persistent session). A connection
// must finish TLS and send CONNECT within 10 s. A session left by an
// MQTT 5 client with a session expiry interval, or by a 3.1.1 client
// without clean session, is kept at most maxSessionExpiry.
package mqtt

import (
	"cmp"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	mochi "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/packets"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/fleetgate/fleetgate/gateway"
	"github.com/fleetgate/fleetgate/internal/ratelimit"
)

// Defaults for the zero values of the Options limits; they match the
// shipped configuration.
const (
	DefaultMaxPacketSize          = 65536
	DefaultMaxClients             = 100000
	DefaultConnectsPerSecond      = 20
	DefaultMaxPendingWrites       = 64
	DefaultMaxInflight            = 32
	DefaultRetainedPerDevice      = 16
	DefaultRetainedBytesPerDevice = 64 << 10
	DefaultRetainedBytes          = 64 << 20
	// DefaultAnonymousConnectsPerSecond is
	// limits.anonymous_connects_per_second.
	DefaultAnonymousConnectsPerSecond = 100
)

// Fixed broker tuning. Device traffic is small packets, so the buffers
// are small (mochi's defaults cost tens of KB per connection; see
// docs/benchmarks.md).
const (
	readBufferSize  = 512
	writeBufferSize = 512
	// maxSessionExpiry bounds how long a disconnected MQTT session
	// (subscriptions, QoS state) is kept, in seconds.
	maxSessionExpiry = 10 * 60
	// receiveMaximum bounds unacknowledged QoS 1/2 PUBLISHes per client.
	receiveMaximum = 64
	// topicAliasMaximum bounds the topic aliases a client may set.
	topicAliasMaximum = 16
	// sysTopicInterval: the $SYS topics (which no device may read) are
	// refreshed rarely.
	sysTopicInterval = 3600
)

// Options configure a Server.
type Options struct {
	// TCP and TLS are the listen addresses ("" = off), e.g. ":1883" or
	// "127.0.0.1:0". At least one must be set.
	TCP, TLS string
	// TLSConfig serves the TLS listener; required with TLS.
	TLSConfig *tls.Config
	// Gateway and Epoch name the sessions: "<gateway>/<epoch>/<n>".
	Gateway string
	Epoch   uint64
	// AllowAnonymous admits devices without a password.
	AllowAnonymous bool
	// Credentials check device passwords; nil only with AllowAnonymous.
	Credentials gateway.Credentials
	// TopicPrefix: a device may publish and subscribe only under
	// <TopicPrefix>/<device>/# ("" means <device>/#).
	TopicPrefix string
	// HeartbeatInterval is the keep-alive clamp; it must be positive.
	HeartbeatInterval time.Duration
	// Lease is presence.lease, the lease a connection is admitted under
	// (see leaseOf); default gateway.DefaultLease.
	Lease time.Duration
	// MaxLease is presence.max_lease: a device's own lease (Credentials
	// that are gateway.LeaseCredentials: the devices file's lease) is
	// granted up to it (gateway.Timing.Grant).
	MaxLease time.Duration
	// Limits; zero means the Default… constant, negative is an error.
	MaxPacketSize, MaxClients, ConnectsPerSecond, MaxPendingWrites int
	// MaxInflight bounds the QoS 1/2 messages the broker holds for one
	// client: sent and not acknowledged, or queued for a persistent
	// session while its client is away; beyond it a message to the
	// client is dropped (at most 65535).
	MaxInflight int
	// RetainedPerDevice and RetainedBytesPerDevice bound one device's
	// retained messages, RetainedBytes all devices' (retained.go).
	RetainedPerDevice, RetainedBytesPerDevice, RetainedBytes int
	// AnonymousConnectsPerSecond bounds the CONNECTs admitted without a
	// password from one source network (ratelimit.Prefix: /24, /64),
	// with bursts of as many; beyond it CONNACK "connection rate
	// exceeded" (0x9F; 3.1.1: 0x03).
	AnonymousConnectsPerSecond int
	// Clock stamps evidence and drives the connect rate limit; nil means
	// gateway.SystemClock.
	Clock gateway.Clock
	// Logger receives refusals (debug) and internal errors; nil discards.
	// Mochi's own info and warning records are logged at debug level.
	Logger *slog.Logger
	// Registerer receives the front end's metrics; nil registers none.
	Registerer prometheus.Registerer
	// Refusals takes every refusal of a device (a CONNECT, a PUBLISH or
	// SUBSCRIBE outside its subtree, a revocation); nil discards them.
	Refusals gateway.Refusals

	// Sink takes the devices' messages (data.go); nil: they stay in the
	// broker.
	Sink gateway.DataSink
	// Commands holds the devices' pending commands, delivered to the
	// connected devices (commands.go); a local client's PUBLISH to a
	// device's command subtree is submitted to it (local.go). nil: no
	// commands, and such a PUBLISH is an ordinary message.
	Commands gateway.Commands
	// Clients are the local clients (local.go), recognised by their MQTT
	// user name. ClientPasswords checks their passwords by name
	// (gateway.DeviceID(name); auth.NewPasswords), and is required with
	// Clients.
	Clients         []LocalClient
	ClientPasswords gateway.Credentials
}

// Server is the MQTT front end. Create it with New, run it with Serve,
// and end it with Close.
type Server struct {
	obs       gateway.Observer
	clock     gateway.Clock
	log       *slog.Logger
	metrics   *metrics
	refusals  gateway.Refusals
	broker    *mochi.Server
	gatewayID string
	epoch     uint64
	prefix    string
	allowAnon bool
	creds     atomic.Pointer[credentials]
	keepAlive atomic.Uint32                        // seconds, 1..65535
	lease     atomic.Int64                         // presence.lease in force
	maxLease  atomic.Int64                         // presence.max_lease in force
	rate      *ratelimit.Limiter[netip.Addr]       // connects per source address
	devRate   *ratelimit.Limiter[gateway.DeviceID] // CONNECTs per device
	anonRate  *ratelimit.Limiter[netip.Prefix]     // anonymous CONNECTs per source network
	pend      *pendingConns
	retained  *retainedQuota
	maxConns  int64
	conns     atomic.Int64 // admitted connections (max_clients slots)
	connSeq   atomic.Uint64
	tcp, tls  net.Listener

	// The data path: sink and cmds may be nil. cmdClient is the broker
	// client commands are published as; watchers wait for new commands;
	// maxInflight is the room a client has for them.
	sink      gateway.DataSink
	cmds      gateway.Commands
	cmdClient *mochi.Client
	// dataClient is the broker client PublishLocal publishes as.
	dataClient  *mochi.Client
	watchers    *watchers
	inflight    inflightCmds
	maxInflight int
	// local are the local clients in force.
	local atomic.Pointer[localSet]

	// liveMu guards live: the admitted connections with the credentials
	// revision they were admitted with, for revocation.
	liveMu sync.Mutex
	live   map[*conn]admission

	// ctx is the context of Observe calls; cancelled by stop.
	ctx    context.Context
	cancel context.CancelFunc

	// mu guards closed and started; work counts accept loops and
	// connection goroutines and is not added to once closed is set.
	mu       sync.Mutex
	closed   bool
	started  bool
	work     sync.WaitGroup
	serving  sync.WaitGroup
	done     chan struct{}
	stopOnce sync.Once
}

// credentials boxes a gateway.Credentials for atomic replacement.
type credentials struct{ c gateway.Credentials }

// New binds the listeners and prepares the broker; connections are
// accepted once Serve runs.
func New(obs gateway.Observer, o Options) (*Server, error) {
	if obs == nil {
		return nil, errors.New("mqtt: nil observer")
	}
	if err := o.check(); err != nil {
		return nil, fmt.Errorf("mqtt: %w", err)
	}
	s := &Server{
		obs:       obs,
		clock:     o.Clock,
		log:       o.Logger,
		gatewayID: o.Gateway,
		epoch:     o.Epoch,
		prefix:    o.TopicPrefix,
		allowAnon: o.AllowAnonymous,
		refusals:  o.Refusals,
		rate:      ratelimit.New[netip.Addr](ratelimit.AddressFactor * cmp.Or(o.ConnectsPerSecond, DefaultConnectsPerSecond)),
		devRate:   ratelimit.New[gateway.DeviceID](cmp.Or(o.ConnectsPerSecond, DefaultConnectsPerSecond)),
		pend:      newPendingConns(maxPendingPerAddr, maxPendingPerPrefix, maxPending),
		maxConns:  int64(cmp.Or(o.MaxClients, DefaultMaxClients)),
		done:      make(chan struct{}),
		live:      make(map[*conn]admission),

		sink:        o.Sink,
		cmds:        o.Commands,
		maxInflight: cmp.Or(o.MaxInflight, DefaultMaxInflight),
	}
	s.watchers = &watchers{srv: s}
	set, err := newLocalSet(o.Clients, o.ClientPasswords)
	if err != nil {
		return nil, fmt.Errorf("mqtt: %w", err)
	}
	s.local.Store(set)
	s.anonRate = ratelimit.New[netip.Prefix](cmp.Or(o.AnonymousConnectsPerSecond, DefaultAnonymousConnectsPerSecond))
	s.retained = newRetainedQuota(cmp.Or(o.RetainedPerDevice, DefaultRetainedPerDevice),
		cmp.Or(o.RetainedBytesPerDevice, DefaultRetainedBytesPerDevice), cmp.Or(o.RetainedBytes, DefaultRetainedBytes))
	m, err := newMetrics(o.Registerer, s.retained.usage)
	if err != nil {
		return nil, fmt.Errorf("mqtt: %w", err)
	}
	s.metrics = m
	if s.clock == nil {
		s.clock = gateway.SystemClock{}
	}
	if s.refusals == nil {
		s.refusals = gateway.NoRefusals{}
	}
	if s.log == nil {
		s.log = slog.New(slog.DiscardHandler)
	}
	s.log = s.log.With("component", "mqtt")
	s.creds.Store(&credentials{o.Credentials})
	s.keepAlive.Store(keepAliveSeconds(o.HeartbeatInterval))
	if o.Lease <= 0 {
		o.Lease = gateway.DefaultLease
	}
	s.lease.Store(int64(o.Lease))
	s.maxLease.Store(int64(o.MaxLease))
	s.ctx, s.cancel = context.WithCancel(context.Background())

	caps := mochi.NewDefaultServerCapabilities()
	caps.MaximumPacketSize = uint32(cmp.Or(o.MaxPacketSize, DefaultMaxPacketSize))
	caps.MaximumClientWritesPending = int32(cmp.Or(o.MaxPendingWrites, DefaultMaxPendingWrites))
	caps.MaximumSessionExpiryInterval = maxSessionExpiry
	caps.ReceiveMaximum = receiveMaximum
	caps.MaximumInflight = uint16(cmp.Or(o.MaxInflight, DefaultMaxInflight))
	caps.TopicAliasMaximum = topicAliasMaximum
	// An acknowledgement carries no properties of the PUBLISH it answers
	// (mochi echoes its user properties by default, and then writes its
	// reason code "granted QoS 1", 0x01, which PUBACK does not have).
	caps.Compatibilities.NoInheritedPropertiesOnAck = true
	s.broker = mochi.New(&mochi.Options{
		Capabilities:             caps,
		ClientNetReadBufferSize:  readBufferSize,
		ClientNetWriteBufferSize: writeBufferSize,
		SysTopicResendInterval:   sysTopicInterval,
		Logger:                   slog.New(quiet{s.log.Handler()}),
	})
	if err := s.broker.AddHook(&presence{srv: s}, nil); err != nil {
		return nil, fmt.Errorf("mqtt: add hook: %w", err)
	}
	s.cmdClient = s.broker.NewClient(nil, mochi.LocalListener, commandsClientID, true)
	s.dataClient = s.broker.NewClient(nil, mochi.LocalListener, dataClientID, true)
	if err := s.listen(o); err != nil {
		s.cancel()
		return nil, err
	}
	return s, nil
}

func (o *Options) check() error {
	switch {
	case o.TCP == "" && o.TLS == "":
		return errors.New("no listen address")
	case o.TLS != "" && o.TLSConfig == nil:
		return errors.New("TLS listener without a TLS config")
	case o.HeartbeatInterval <= 0:
		return fmt.Errorf("heartbeat interval %v must be positive", o.HeartbeatInterval)
	case o.Credentials == nil && !o.AllowAnonymous:
		return errors.New("no credentials and anonymous devices not allowed")
	case o.MaxPacketSize < 0, o.MaxClients < 0, o.ConnectsPerSecond < 0, o.MaxPendingWrites < 0, o.MaxInflight < 0,
		o.RetainedPerDevice < 0, o.RetainedBytesPerDevice < 0, o.RetainedBytes < 0, o.AnonymousConnectsPerSecond < 0:
		return errors.New("negative limit")
	case o.MaxPendingWrites > math.MaxInt32:
		return fmt.Errorf("max pending writes %d too large", o.MaxPendingWrites)
	case o.MaxInflight > math.MaxUint16:
		return fmt.Errorf("max inflight %d too large", o.MaxInflight)
	case o.MaxPacketSize > 268435460: // MQTT's largest packet
		return fmt.Errorf("max packet size %d too large", o.MaxPacketSize)
	}
	if err := gateway.ValidGatewayID(o.Gateway); err != nil {
		return err
	}
	return nil
}

// listen binds the TCP and TLS listeners and attaches them to the broker.
func (s *Server) listen(o Options) error {
	closeAll := func() {
		for _, ln := range []net.Listener{s.tcp, s.tls} {
			if ln != nil {
				_ = ln.Close()
			}
		}
	}
	var err error
	if o.TCP != "" {
		if s.tcp, err = net.Listen("tcp", o.TCP); err != nil {
			return fmt.Errorf("mqtt: listen tcp %s: %w", o.TCP, err)
		}
		if err = s.broker.AddListener(newListener("tcp", s.tcp, s)); err != nil {
			closeAll()
			return fmt.Errorf("mqtt: add listener: %w", err)
		}
	}
	if o.TLS != "" {
		ln, err := net.Listen("tcp", o.TLS)
		if err != nil {
			closeAll()
			return fmt.Errorf("mqtt: listen tls %s: %w", o.TLS, err)
		}
		s.tls = tls.NewListener(ln, o.TLSConfig)
		if err = s.broker.AddListener(newListener("tls", s.tls, s)); err != nil {
			closeAll()
			return fmt.Errorf("mqtt: add listener: %w", err)
		}
	}
	return nil
}

// Serve accepts connections until ctx is done or Close is called, and
// returns once every connection has ended. It returns nil after such a
// shutdown.
func (s *Server) Serve(ctx context.Context) error {
	s.mu.Lock()
	if s.closed || s.started {
		s.mu.Unlock()
		return nil
	}
	s.started = true
	s.serving.Add(1)
	err := s.broker.Serve()
	s.mu.Unlock()
	defer s.serving.Done()
	if err != nil {
		s.stop()
		s.work.Wait()
		return fmt.Errorf("mqtt: serve: %w", err)
	}
	select {
	case <-ctx.Done():
	case <-s.done:
	}
	s.stop()
	s.work.Wait()
	return nil
}

// Addrs are the bound addresses (nil when that listener is off).
func (s *Server) Addrs() (tcp, tls net.Addr) {
	if s.tcp != nil {
		tcp = s.tcp.Addr()
	}
	if s.tls != nil {
		tls = s.tls.Addr()
	}
	return tcp, tls
}

// Close stops the server: MQTT 5 clients get DISCONNECT "server shutting
// down", every connection is closed (no Leave: sessions are left to
// their leases, so a restart within the lease emits nothing), and Close
// returns once Serve and every connection goroutine have returned, so the
// Observer is not called after Close.
func (s *Server) Close() error {
	s.stop()
	s.serving.Wait()
	s.work.Wait()
	return nil
}

// SetTiming takes the presence timing of a config reload: the
// keep-alive clamp of later CONNECTs and the lease in force. A
// connection admitted before keeps pinging at the keep-alive it was
// granted; while that exceeds the new clamp its evidence keeps the lease
// it was admitted under, if longer (leaseOf), until the client
// reconnects, so a shorter heartbeat or lease never flaps it. A
// non-positive interval or lease is refused with a warning.
func (s *Server) SetTiming(t gateway.Timing) {
	if t.HeartbeatInterval <= 0 || t.Lease <= 0 {
		s.log.Warn("heartbeat interval and lease must be positive; keeping the old ones", "interval", t.HeartbeatInterval, "lease", t.Lease)
		return
	}
	s.keepAlive.Store(keepAliveSeconds(t.HeartbeatInterval))
	s.lease.Store(int64(t.Lease))
	s.maxLease.Store(int64(t.MaxLease))
}

// leaseOf is the lease the evidence of connection c holds its session
// for: 0 (the table's: the lease in force, or the learned one) while c's
// keep-alive is within the clamp in force and its device has no lease of
// its own; else the longest of the lease c was admitted under and the
// one in force (a keep-alive beyond the clamp), and of the device's own
// lease in the credentials in force (the devices file's lease), granted
// up to max_lease.
func (s *Server) leaseOf(c *conn) time.Duration {
	var l time.Duration
	if uint32(c.keepAlive) > s.keepAlive.Load() {
		l = max(c.lease, time.Duration(s.lease.Load()))
	}
	if c.anon {
		return l
	}
	if own := gateway.DeviceLease(s.creds.Load().c, c.device); own > 0 {
		tm := gateway.Timing{Lease: time.Duration(s.lease.Load()), MaxLease: time.Duration(s.maxLease.Load())}
		l = max(l, tm.Grant(own))
	}
	return l
}

// SetCredentials replaces the device credentials for later CONNECTs
// (SIGHUP reload of the devices file; c may be the same Reloadable as
// before, reloaded) and disconnects the connections they revoke: those
// whose device's Revision changed (removed, new password) or, for
// anonymous ones, became listed. The retained messages of a removed
// device, and those an anonymous device sent before it became listed,
// are dropped (DropRetained). A nil c is refused with a warning, as
// the CoAP server does.
func (s *Server) SetCredentials(c gateway.Credentials) {
	if c == nil {
		s.log.Warn("nil credentials; keeping the old ones")
		return
	}
	box := &credentials{c}
	s.creds.Store(box)
	s.liveMu.Lock()
	var revoked []admission
	for _, a := range s.live {
		if !a.local && box.revision(a.device) != a.rev {
			revoked = append(revoked, a)
		}
	}
	s.liveMu.Unlock()
	for _, a := range revoked {
		s.refusals.Refuse(gateway.Refusal{Protocol: "mqtt", Device: string(a.device), Reason: gateway.RefusedRevoked,
			Detail: "a devices file reload removed the device or changed its password", Remote: a.client.Net.Remote, At: s.clock.Now()})
		s.revoke(a.client, "devices file")
	}
	s.dropChanged(box)
}

// revision is the Revision of device, "" without credentials.
func (b *credentials) revision(device gateway.DeviceID) string {
	if b.c == nil {
		return ""
	}
	return b.c.Revision(device)
}

// checkPassword checks device's password from address from, with the
// address when the credentials take it.
func (b *credentials) checkPassword(device gateway.DeviceID, from netip.Addr, password []byte) error {
	if sc, ok := b.c.(gateway.SourceCredentials); ok {
		return sc.CheckPasswordFrom(device, from, password)
	}
	return b.c.CheckPassword(device, password)
}

// admission is what a connection was admitted with: a device, or a
// local client (local; device is then its name).
type admission struct {
	client *mochi.Client
	device gateway.DeviceID
	rev    string
	local  bool
}

// admit records c as admitted for device at revision rev under the
// credentials box, and reports false when a reload replaced box meanwhile
// and revoked it (SetCredentials did not see c yet).
func (s *Server) admit(c *conn, cl *mochi.Client, device gateway.DeviceID, rev string, box *credentials) bool {
	s.liveMu.Lock()
	s.live[c] = admission{client: cl, device: device, rev: rev}
	s.liveMu.Unlock()
	if cur := s.creds.Load(); cur != box && cur.revision(device) != rev {
		return false
	}
	return true
}

// forget drops c from the admitted connections.
func (s *Server) forget(c *conn) {
	s.liveMu.Lock()
	delete(s.live, c)
	s.liveMu.Unlock()
}

// revoke disconnects a client whose credentials a reload of what (the
// devices file, the local clients) revoked: MQTT 5 clients are told "not
// authorized" first.
func (s *Server) revoke(cl *mochi.Client, what string) {
	s.metrics.refuse(reasonRevoked)
	s.log.Info("connection revoked by a reload", "reload", what, "client", cl.ID)
	if cl.Properties.ProtocolVersion == 5 {
		// A client that reads nothing must not hold up the reload.
		if cl.Net.Conn != nil {
			_ = cl.Net.Conn.SetWriteDeadline(time.Now().Add(shutdownWriteTimeout))
		}
		_ = s.broker.DisconnectClient(cl, packets.ErrNotAuthorized)
		return
	}
	cl.Stop(errRevoked)
}

// errRevoked ends a connection whose credentials a reload revoked.
var errRevoked = errors.New("credentials revoked")

// stop refuses new work, cancels Observe calls and closes the broker
// (listeners and connections); it does not wait for the goroutines.
func (s *Server) stop() {
	s.stopOnce.Do(func() {
		s.mu.Lock()
		s.closed = true
		s.mu.Unlock()
		close(s.done)
		s.cancel()
		if err := s.broker.Close(); err != nil {
			s.log.Warn("close broker", "err", err)
		}
	})
}

// enter registers one unit of work unless the server is closed.
func (s *Server) enter() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return false
	}
	s.work.Add(1)
	return true
}

// pause sleeps after a failed Accept (out of file descriptors, say) with
// a backoff from 5 ms to 1 s; it reports false when the server closed.
func (s *Server) pause(backoff *time.Duration, err error) bool {
	*backoff = min(max(2**backoff, 5*time.Millisecond), time.Second)
	s.log.Warn("accept", "err", err, "retry_in", *backoff)
	t := time.NewTimer(*backoff)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-s.done:
		return false
	}
}

// reserve takes a max_clients slot.
func (s *Server) reserve() bool {
	if s.conns.Add(1) > s.maxConns {
		s.conns.Add(-1)
		return false
	}
	s.metrics.connections.Inc()
	return true
}

// release gives back the slot of an ended connection.
func (s *Server) release(c *conn) {
	s.forget(c)
	if c.admitted {
		c.admitted = false
		s.conns.Add(-1)
		s.metrics.connections.Dec()
		if c.local != nil {
			s.metrics.localClients.Dec()
		}
	}
}

// errNotAuthorized refuses a CONNECT's credentials.
var errNotAuthorized = errors.New("not authorized")

// authorize checks a CONNECT's credentials for device, sent from address
// from (the backoff of wrong passwords is kept per address when the
// Credentials take it), with the credentials box it returns: nil, or
// errNotAuthorized (a *denied telling why), or
// gateway.ErrOverloaded when the Credentials are (no password check slot:
// the Credentials bound the bcrypt work, see auth). A device without a
// password is admitted only with AllowAnonymous and only when it is not
// listed: anonymous access never covers a device of the devices file.
func (s *Server) authorize(device gateway.DeviceID, from netip.Addr, pk packets.Packet) (string, *credentials, error) {
	box := s.creds.Load()
	rev := box.revision(device)
	if !pk.Connect.PasswordFlag || box.c == nil {
		switch {
		case s.allowAnon && rev == "":
			return "", box, nil
		case rev == "":
			return "", box, deniedUnknown
		}
		return "", box, deniedNoPassword
	}
	if err := box.checkPassword(device, from, pk.Connect.Password); err != nil {
		switch {
		case errors.Is(err, gateway.ErrOverloaded):
			return "", box, fmt.Errorf("password check: %w", err)
		case rev == "":
			return "", box, deniedUnknown
		}
		return "", box, deniedPassword
	}
	return rev, box, nil
}

// topicRoot is the topic subtree device owns.
func (s *Server) topicRoot(device gateway.DeviceID) string {
	if s.prefix == "" {
		return string(device)
	}
	return s.prefix + "/" + string(device)
}

// observe hands one piece of evidence to the Observer and counts it; anon
// says the device was admitted without a password.
func (s *Server) observe(d gateway.DeviceID, sess gateway.SessionID, k gateway.Kind, lease time.Duration, anon bool) error {
	err := s.obs.Observe(s.ctx, gateway.Evidence{
		Device:     d,
		Session:    sess,
		Kind:       k,
		ObservedAt: s.clock.Now(),
		Protocol:   "mqtt",
		Lease:      lease,
		Anonymous:  anon,
	})
	if err == nil {
		s.metrics.accepted(k)
	}
	return err
}

// keepAliveSeconds is d in whole seconds, rounded up, within 1..65535.
func keepAliveSeconds(d time.Duration) uint32 {
	sec := (d + time.Second - 1) / time.Second
	return uint32(min(max(sec, 1), math.MaxUint16))
}
