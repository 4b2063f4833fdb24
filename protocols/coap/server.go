// Package coap is fleetgate's CoAP front end (docs/design.md §6.7): devices send
// POST /hb to renew their presence and DELETE /hb to leave; the front end
// turns each request into gateway.Evidence for a gateway.Observer and
// answers 2.04 Changed with Max-Age = the heartbeat interval the gateway
// wants, or a 4.xx/5.xx code with a short diagnostic payload.
//
// With a gateway.DataSink, POST /d/<topic> renews too and carries a
// message of the device up the data path; with gateway.Commands, the
// answers to a device's renewals carry its pending commands, which it
// acknowledges with a=<id> on a later request (command.go). The data
// path's requests are served by data workers (data.go), so that a slow
// disk never holds up the reading of the socket.
//
// Plain UDP serves anonymous devices named by the query d=<device>
// (auth.allow_anonymous). Its sources are unproven (a source address can
// be spoofed), so no answer is larger than its request and a datagram
// beyond a rate limit gets none. It is a loop of the front end's own over
// one socket that decodes and encodes with go-coap's message codec and
// keeps no state per peer: both heartbeat operations are idempotent, so a
// retransmitted CON is answered again instead of from a response cache
// (RFC 7252 §4.5), and the only tables are the bounded ones of the rate
// limits (per source endpoint, per source address, per device).
//
// DTLS with PSK (optional) is served by go-coap's DTLS server with
// pion/dtls: the PSK identity names the device through
// gateway.Credentials, and a handshake with an unknown identity or a
// wrong key fails, so it never becomes evidence.
package coap

import (
	"cmp"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/fleetgate/fleetgate/gateway"
	"github.com/fleetgate/fleetgate/internal/ratelimit"
)

// Defaults of the limits, also the configs package's (limits.*).
const (
	DefaultMaxMessageSize    = 1152
	DefaultRequestsPerSecond = 20
	DefaultHandshakeTimeout  = 10 * time.Second
	DefaultMaxDTLSPeers      = 4096
	DefaultDTLSIdleTimeout   = time.Second
	DefaultMaxDTLSParked     = 100_000
)

// receiveBuffer is the SO_RCVBUF the UDP socket asks for. Linux grants
// twice the request (capped by net.core.rmem_max) and charges about 1 KB
// per small datagram, so 4 MiB holds some 8,000 queued heartbeats: a
// tenth of a second at the capacity of one CPU.
const receiveBuffer = 4 << 20

// Options configure a Server.
type Options struct {
	// Addr is the UDP listen address, e.g. ":5683" or "127.0.0.1:0"
	// (listen.coap.udp); "" serves no plain UDP.
	Addr string
	// DTLS is the DTLS listen address, e.g. ":5684" (listen.coap.dtls);
	// "" serves no DTLS. DTLS needs Credentials.
	DTLS string
	// Credentials name the device of a DTLS PSK identity and give its
	// key; SetCredentials replaces them (reload).
	Credentials gateway.Credentials
	// AllowAnonymous accepts devices named by the query d=<device>
	// without credentials over plain UDP (auth.allow_anonymous).
	AllowAnonymous bool
	// HeartbeatInterval is the Max-Age of a 2.04 answer, in whole
	// seconds rounded up; it must be positive.
	HeartbeatInterval time.Duration
	// Lease (presence.lease, default gateway.DefaultLease) and MaxLease
	// (presence.max_lease): a device may ask for a lease up to MaxLease
	// per request (l=<seconds>) and is answered with a Max-Age to match
	// (gateway.Timing).
	Lease, MaxLease time.Duration
	// MaxMessageSize bounds a CoAP message in bytes
	// (limits.coap_max_message_size); a request beyond it gets 4.13,
	// anything else beyond it is dropped. 0 means DefaultMaxMessageSize.
	MaxMessageSize int
	// RequestsPerSecond bounds the datagrams of one source endpoint
	// (address and port) and the requests of one device, each with a
	// burst of as many (limits.coap_requests_per_second); one source
	// address, all its ports together, may send ratelimit.AddressFactor
	// times as many (devices behind a NAT share it). Plain UDP datagrams
	// and DTLS traffic (handshakes of sources that returned the cookie,
	// requests of sessions) are counted apart, so that datagrams with a
	// spoofed source never spend the budget of DTLS devices. A datagram
	// beyond a limit gets no answer over plain UDP (its source is
	// unproven) and is counted; a DTLS request gets 4.29 with Max-Age =
	// the seconds to wait. 0 means DefaultRequestsPerSecond.
	RequestsPerSecond int
	// HandshakeTimeout bounds a DTLS handshake
	// (limits.dtls_handshake_timeout). 0 means DefaultHandshakeTimeout.
	HandshakeTimeout time.Duration
	// MaxDTLSPeers bounds the DTLS peers being served or in a handshake at
	// once (limits.dtls_max_peers); a peer takes a slot once it has
	// returned the gate's cookie, and beyond them it is dropped until its
	// client retransmits. 0 means DefaultMaxDTLSPeers.
	MaxDTLSPeers int
	// DTLSIdleTimeout closes a DTLS session without datagrams for that
	// long (limits.dtls_idle_timeout). 0 means DefaultDTLSIdleTimeout.
	DTLSIdleTimeout time.Duration
	// MaxDTLSParked bounds the DTLS sessions parked after their idle
	// timeout for a resumption without a handshake (park.go;
	// limits.dtls_max_parked). 0 means DefaultMaxDTLSParked; a negative
	// value parks none.
	MaxDTLSParked int
	// Clock stamps evidence (ObservedAt) and drives the rate limit; nil
	// means gateway.SystemClock.
	Clock gateway.Clock
	// Logger receives refusals (debug) and internal errors; nil discards.
	Logger *slog.Logger
	// Registerer receives the front end's metrics; nil registers none.
	Registerer prometheus.Registerer
	// Refusals takes every refusal of a device (a request refused, a
	// DTLS handshake that failed after naming its PSK identity, a
	// revocation); nil discards them.
	Refusals gateway.Refusals
	// Sink takes the devices' messages (POST /d); nil: there is no /d
	// (4.04).
	Sink gateway.DataSink
	// Commands holds the commands pending for devices, which the answers
	// to their renewals carry; nil: none are sent, and a= is a query like
	// any other (ignored).
	Commands gateway.Commands
}

// Server is the CoAP front end over UDP and DTLS. Create it with New, run
// it with Serve, and end it with Close.
type Server struct {
	obs       gateway.Observer
	sink      gateway.DataSink // nil without /d
	cmds      gateway.Commands // nil without commands
	clock     gateway.Clock
	log       *slog.Logger
	refusals  gateway.Refusals
	metrics   *metrics
	allowAnon bool
	maxSize   int
	// The rate limits (ratelimit.go): per source endpoint and address of
	// plain UDP datagrams (unproven) and of DTLS handshakes and requests
	// (proven), and per device.
	unproven sourceLimits
	proven   sourceLimits
	devices  *ratelimit.Limiter[gateway.DeviceID]
	timing   atomic.Pointer[gateway.Timing]
	creds    atomic.Pointer[credentials]
	mid      atomic.Uint32 // Message IDs of NON answers
	// decoy keys the PSK given to unknown identities (dtls.go psk).
	decoy [32]byte

	udp  *net.UDPConn // nil without plain UDP
	dtls *dtlsFront   // nil without DTLS

	// shards are the data workers' queues (data.go), nil without a data
	// path; dataDone waits for the workers.
	shards   []chan *job
	dataDone sync.WaitGroup

	// unregister removes the collectors tied to this server's socket.
	unregister func()

	// ctx is cancelled by stop; the Observer's contexts derive from it.
	ctx    context.Context
	cancel context.CancelFunc

	// mu guards closed and serving; work counts DTLS request handlers and
	// the DTLS sweep, and is not added to once closed is set.
	mu       sync.Mutex
	closed   bool
	serving  bool
	work     sync.WaitGroup
	served   sync.WaitGroup
	stopOnce sync.Once
	closeErr error // set by stop
}

// credentials holds a gateway.Credentials so that it can be swapped
// atomically (an interface value cannot).
type credentials struct{ gateway.Credentials }

// New binds the UDP and DTLS sockets and prepares the server; requests
// are answered once Serve runs.
func New(obs gateway.Observer, o Options) (*Server, error) {
	if obs == nil {
		return nil, errors.New("coap: nil observer")
	}
	if o.HeartbeatInterval <= 0 {
		return nil, fmt.Errorf("coap: heartbeat interval %v must be positive", o.HeartbeatInterval)
	}
	if o.Addr == "" && o.DTLS == "" {
		return nil, errors.New("coap: no UDP or DTLS address")
	}
	if o.DTLS != "" && o.Credentials == nil {
		return nil, errors.New("coap: DTLS needs credentials")
	}
	if o.MaxMessageSize < 0 || o.RequestsPerSecond < 0 || o.HandshakeTimeout < 0 || o.MaxDTLSPeers < 0 || o.DTLSIdleTimeout < 0 {
		return nil, errors.New("coap: negative limit")
	}
	m, err := newMetrics(o.Registerer)
	if err != nil {
		return nil, fmt.Errorf("coap: %w", err)
	}
	s := &Server{
		obs:       obs,
		sink:      o.Sink,
		cmds:      o.Commands,
		clock:     o.Clock,
		log:       o.Logger,
		metrics:   m,
		refusals:  o.Refusals,
		allowAnon: o.AllowAnonymous,
		maxSize:   cmp.Or(o.MaxMessageSize, DefaultMaxMessageSize),
	}
	rate := cmp.Or(o.RequestsPerSecond, DefaultRequestsPerSecond)
	s.unproven, s.proven = newSourceLimits(rate), newSourceLimits(rate)
	s.devices = ratelimit.NewBounded[gateway.DeviceID](rate, maxRateSources)
	if s.clock == nil {
		s.clock = gateway.SystemClock{}
	}
	if s.refusals == nil {
		s.refusals = gateway.NoRefusals{}
	}
	if _, err := rand.Read(s.decoy[:]); err != nil {
		return nil, fmt.Errorf("coap: decoy key: %w", err)
	}
	if s.log == nil {
		s.log = slog.New(slog.DiscardHandler)
	}
	s.log = s.log.With("component", "coap")
	if o.Lease <= 0 {
		o.Lease = gateway.DefaultLease
	}
	s.timing.Store(&gateway.Timing{Lease: o.Lease, HeartbeatInterval: o.HeartbeatInterval, MaxLease: o.MaxLease})
	if o.Credentials != nil {
		s.creds.Store(&credentials{o.Credentials})
	}
	s.newData()
	s.ctx, s.cancel = context.WithCancel(context.Background())

	if o.Addr != "" {
		if s.udp, err = listenUDP(o.Addr); err != nil {
			s.cancel()
			return nil, fmt.Errorf("coap: %w", err)
		}
		granted, err := receiveBufferSize(s.udp)
		if err != nil {
			s.log.Warn("cannot read the UDP receive buffer size", "err", err)
		}
		m.rcvbuf.Set(float64(granted))
		s.registerSocketDrops(o.Registerer)
	}
	if o.DTLS != "" {
		s.dtls, err = s.newDTLS(o.DTLS, cmp.Or(o.HandshakeTimeout, DefaultHandshakeTimeout),
			cmp.Or(o.DTLSIdleTimeout, DefaultDTLSIdleTimeout), cmp.Or(o.MaxDTLSPeers, DefaultMaxDTLSPeers),
			max(cmp.Or(o.MaxDTLSParked, DefaultMaxDTLSParked), 0))
		if err != nil {
			s.stop() // closes the UDP socket and unregisters its collector
			return nil, fmt.Errorf("coap: %w", err)
		}
	}
	return s, nil
}

// registerSocketDrops exports the kernel's receive-buffer drops of the
// UDP socket, labelled with its address, until Close.
func (s *Server) registerSocketDrops(reg prometheus.Registerer) {
	if reg == nil {
		return
	}
	d, err := newSocketDrops(s.udp)
	if err != nil {
		s.log.Warn("cannot count the UDP socket's drops", "err", err)
		return
	}
	c := prometheus.NewCounterFunc(prometheus.CounterOpts{
		Name:        "fleetgate_coap_socket_drops_total",
		Help:        "Datagrams the kernel dropped for the CoAP UDP socket because its receive buffer was full.",
		ConstLabels: prometheus.Labels{"addr": s.udp.LocalAddr().String()},
	}, d.count)
	if err := reg.Register(c); err != nil {
		s.log.Warn("cannot register the UDP socket's drops", "err", err)
		return
	}
	s.unregister = func() { reg.Unregister(c) }
}

// listenUDP binds addr with a receive buffer of receiveBuffer bytes, or
// what the kernel grants (net.core.rmem_max).
func listenUDP(addr string) (*net.UDPConn, error) {
	ua, err := net.ResolveUDPAddr("udp", addr)
	if err != nil {
		return nil, fmt.Errorf("listen %s: %w", addr, err)
	}
	c, err := net.ListenUDP("udp", ua)
	if err != nil {
		return nil, fmt.Errorf("listen %s: %w", addr, err)
	}
	if err := c.SetReadBuffer(receiveBuffer); err != nil {
		_ = c.Close()
		return nil, fmt.Errorf("listen %s: receive buffer: %w", addr, err)
	}
	return c, nil
}

// Serve answers requests until ctx is done or Close is called, and
// returns once every request handler has returned. It returns nil after
// such a shutdown. A Server is served once.
func (s *Server) Serve(ctx context.Context) error {
	s.mu.Lock()
	switch {
	case s.closed:
		s.mu.Unlock()
		return nil
	case s.serving:
		s.mu.Unlock()
		return errors.New("coap: already serving")
	}
	s.serving = true
	s.served.Add(1)
	s.mu.Unlock()
	defer s.served.Done()

	stop := context.AfterFunc(ctx, s.stop)
	defer stop()

	s.startData()
	var wg sync.WaitGroup
	if s.udp != nil {
		for range udpReaders() {
			wg.Go(s.readLoop)
		}
	}
	var dtlsErr error
	if s.dtls != nil {
		wg.Go(func() {
			if dtlsErr = s.dtls.server.Serve(s.dtls.listener); dtlsErr != nil {
				s.stop()
			}
		})
	}
	wg.Wait()
	s.stop()
	s.work.Wait()
	// No reader or DTLS peer hands the data workers a request any more.
	s.stopData()
	if dtlsErr != nil {
		return fmt.Errorf("coap: serve dtls %s: %w", s.DTLSAddr(), dtlsErr)
	}
	return nil
}

// udpReaders is the number of goroutines reading the UDP socket: one per
// CPU handles the load, and a few more keep answering while some wait
// for an Observer that applies backpressure (observeTimeout).
func udpReaders() int { return 4 * runtime.GOMAXPROCS(0) }

// Addr is the bound UDP address, nil without plain UDP.
func (s *Server) Addr() net.Addr {
	if s.udp == nil {
		return nil
	}
	return s.udp.LocalAddr()
}

// DTLSAddr is the bound DTLS address, nil without DTLS.
func (s *Server) DTLSAddr() net.Addr {
	if s.dtls == nil {
		return nil
	}
	return s.dtls.listener.Addr()
}

// Close stops the server, closes the sockets, and waits for Serve and
// the request handlers to return (so the Observer is not called after
// Close).
func (s *Server) Close() error {
	s.stop()
	s.served.Wait()
	s.work.Wait()
	if s.closeErr != nil {
		return fmt.Errorf("coap: %w", s.closeErr)
	}
	return nil
}

// SetTiming takes the presence timing of a config reload: later
// requests are granted leases and answered Max-Ages by it. A device
// learns the new heartbeat interval from its next answer; the evidence it
// sent before keeps its lease (it travels with the evidence), so a
// shorter lease or heartbeat flaps no device. A non-positive interval or
// lease is refused with a warning.
func (s *Server) SetTiming(t gateway.Timing) {
	if t.HeartbeatInterval <= 0 || t.Lease <= 0 {
		s.log.Warn("heartbeat interval and lease must be positive; keeping the old ones", "interval", t.HeartbeatInterval, "lease", t.Lease)
		return
	}
	s.timing.Store(&t)
}

// SetCredentials replaces the credentials (devices file reload; c may be
// the same Reloadable as before, reloaded): later DTLS handshakes and
// requests use c, and the DTLS sessions of devices whose Revision changed
// (removed, another key) are closed (revoked); a
// device removed from the file also gets 4.01 on any request before that.
// A nil c is refused with a warning.
func (s *Server) SetCredentials(c gateway.Credentials) {
	if c == nil {
		s.log.Warn("nil credentials; keeping the old ones")
		return
	}
	s.creds.Store(&credentials{c})
	if s.dtls == nil {
		return
	}
	if n := s.dtls.listener.revoke(c); n > 0 {
		s.log.Info("dtls sessions revoked by a devices file reload", "sessions", n)
	}
}

// stop refuses new work, cancels the Observer's contexts and closes the
// sockets so that the loops end; it does not wait.
func (s *Server) stop() {
	s.stopOnce.Do(func() {
		s.mu.Lock()
		s.closed = true
		s.mu.Unlock()
		s.cancel()
		var errs []error
		if s.udp != nil {
			if err := s.udp.Close(); err != nil && !errors.Is(err, net.ErrClosed) {
				errs = append(errs, fmt.Errorf("close udp: %w", err))
			}
		}
		if s.dtls != nil {
			s.dtls.server.Stop()
			if err := s.dtls.listener.Close(); err != nil {
				errs = append(errs, fmt.Errorf("close dtls: %w", err))
			}
		}
		s.closeErr = errors.Join(errs...)
		if s.unregister != nil {
			s.unregister()
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

// maxAgeSeconds is d in whole seconds, rounded up, as a Max-Age value.
func maxAgeSeconds(d time.Duration) uint32 {
	sec := (d + time.Second - 1) / time.Second
	if sec > math.MaxUint32 {
		return math.MaxUint32
	}
	return uint32(sec)
}
