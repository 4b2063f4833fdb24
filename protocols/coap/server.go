// Package coap is fleetgate's CoAP front end (DESIGN §4): devices send
// POST /hb to renew their presence and DELETE /hb to leave; the front end
// turns each request into gateway.Evidence for a gateway.Observer and
// answers 2.04 Changed with Max-Age = the heartbeat interval the gateway
// wants, or a 4.xx/5.xx code with a short diagnostic payload.
//
// Plain UDP is served with anonymous devices named by the query
// d=<device> (auth.allow_anonymous). The request handling is shared by
// every go-coap datagram transport through Server.processor, so that DTLS
// with PSK identities slots in as a second transport.
package coap

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net"
	"sync"
	"sync/atomic"
	"time"

	coapNet "github.com/plgd-dev/go-coap/v3/net"
	"github.com/plgd-dev/go-coap/v3/net/blockwise"
	"github.com/plgd-dev/go-coap/v3/options"
	"github.com/plgd-dev/go-coap/v3/udp"
	udpClient "github.com/plgd-dev/go-coap/v3/udp/client"
	udpServer "github.com/plgd-dev/go-coap/v3/udp/server"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/fleetgate/fleetgate/gateway"
)

// Per-peer state. go-coap keeps a connection (about 14 KB and a goroutine)
// for every remote address it hears from. The front end needs none of it
// once a request is answered (see processor), so a peer's connection is
// closed after peerIdleTimeout without datagrams and released by the
// sweep that runs every sweepInterval: a peer's state lives at most
// peerIdleTimeout + 2×sweepInterval after its last datagram.
const (
	peerIdleTimeout = 2 * time.Second
	sweepInterval   = time.Second
)

// Options configure a Server.
type Options struct {
	// Addr is the UDP listen address, e.g. ":5683" or "127.0.0.1:0".
	Addr string
	// AllowAnonymous accepts devices named by the query d=<device>
	// without credentials (auth.allow_anonymous).
	AllowAnonymous bool
	// HeartbeatInterval is the Max-Age of a 2.04 answer, in whole
	// seconds rounded up; it must be positive.
	HeartbeatInterval time.Duration
	// Clock stamps evidence (ObservedAt); nil means gateway.SystemClock.
	Clock gateway.Clock
	// Logger receives refusals (debug) and internal errors; nil discards.
	Logger *slog.Logger
	// Registerer receives the front end's metrics; nil registers none.
	Registerer prometheus.Registerer
}

// Server is the CoAP over UDP front end. Create it with New, run it with
// Serve, and end it with Close.
type Server struct {
	obs       gateway.Observer
	clock     gateway.Clock
	log       *slog.Logger
	metrics   *metrics
	allowAnon bool
	maxAge    atomic.Uint32 // seconds

	conn *coapNet.UDPConn
	udp  *udpServer.Server

	// mu guards closed; work counts request handlers and the sweep
	// goroutine, serving counts running Serve calls. Neither is added to
	// once closed is set, so Close can wait for both.
	mu       sync.Mutex
	closed   bool
	work     sync.WaitGroup
	serving  sync.WaitGroup
	done     chan struct{}
	stopOnce sync.Once
	cancel   context.CancelFunc
}

// New binds the UDP socket at o.Addr and prepares the server; requests
// are answered once Serve runs.
func New(obs gateway.Observer, o Options) (*Server, error) {
	if obs == nil {
		return nil, errors.New("coap: nil observer")
	}
	if o.HeartbeatInterval <= 0 {
		return nil, fmt.Errorf("coap: heartbeat interval %v must be positive", o.HeartbeatInterval)
	}
	m, err := newMetrics(o.Registerer)
	if err != nil {
		return nil, fmt.Errorf("coap: %w", err)
	}
	s := &Server{
		obs:       obs,
		clock:     o.Clock,
		log:       o.Logger,
		metrics:   m,
		allowAnon: o.AllowAnonymous,
		done:      make(chan struct{}),
	}
	if s.clock == nil {
		s.clock = gateway.SystemClock{}
	}
	if s.log == nil {
		s.log = slog.New(slog.DiscardHandler)
	}
	s.log = s.log.With("component", "coap")
	s.maxAge.Store(maxAgeSeconds(o.HeartbeatInterval))

	s.conn, err = coapNet.NewListenUDP("udp", o.Addr)
	if err != nil {
		return nil, fmt.Errorf("coap: listen %s: %w", o.Addr, err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	s.cancel = cancel
	s.udp = udp.NewServer(
		options.WithContext(ctx),
		options.WithProcessReceivedMessageFunc(s.processor(anonymous)),
		options.WithHandlerFunc(ignore),
		options.WithInactivityMonitor(peerIdleTimeout, func(cc *udpClient.Conn) { _ = cc.Close() }),
		options.WithPeriodicRunner(s.sweep),
		// Heartbeats fit one datagram; no peer gets block-wise state.
		options.WithBlockwise(false, blockwise.SZX1024, 0),
		options.WithErrors(func(err error) { s.log.Debug("coap transport", "err", err) }),
	)
	return s, nil
}

// Serve answers requests until ctx is done or Close is called, and
// returns once every request handler has returned. It returns nil after
// such a shutdown.
func (s *Server) Serve(ctx context.Context) error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.serving.Add(1)
	s.mu.Unlock()
	defer s.serving.Done()

	stop := context.AfterFunc(ctx, s.stop)
	defer stop()
	err := s.udp.Serve(s.conn)
	s.stop()
	s.work.Wait()
	if err != nil {
		return fmt.Errorf("coap: serve %s: %w", s.Addr(), err)
	}
	return nil
}

// Addr is the bound UDP address.
func (s *Server) Addr() net.Addr { return s.conn.LocalAddr() }

// Close stops the server, waits for Serve and the request handlers to
// return (so the Observer is not called after Close), and closes the
// socket.
func (s *Server) Close() error {
	s.stop()
	s.serving.Wait()
	s.work.Wait()
	if err := s.conn.Close(); err != nil && !errors.Is(err, net.ErrClosed) {
		return fmt.Errorf("coap: close: %w", err)
	}
	return nil
}

// SetHeartbeatInterval changes the Max-Age of later 2.04 answers (config
// reload). A non-positive d is refused with a warning.
func (s *Server) SetHeartbeatInterval(d time.Duration) {
	if d <= 0 {
		s.log.Warn("heartbeat interval must be positive; keeping the old one", "interval", d)
		return
	}
	s.maxAge.Store(maxAgeSeconds(d))
}

// stop refuses new work and tells go-coap to stop; it does not wait.
func (s *Server) stop() {
	s.stopOnce.Do(func() {
		s.mu.Lock()
		s.closed = true
		s.mu.Unlock()
		close(s.done)
		s.cancel()
		s.udp.Stop()
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

// sweep is go-coap's periodic runner: every sweepInterval it calls f,
// which closes idle peer connections and releases closed ones, until f
// reports the server stopped or Close is called.
func (s *Server) sweep(f func(now time.Time) bool) {
	if !s.enter() {
		return
	}
	go func() {
		defer s.work.Done()
		t := time.NewTicker(sweepInterval)
		defer t.Stop()
		for {
			select {
			case <-s.done:
				return
			case now := <-t.C:
				if !f(now) {
					return
				}
			}
		}
	}()
}

// maxAgeSeconds is d in whole seconds, rounded up, as a Max-Age value.
func maxAgeSeconds(d time.Duration) uint32 {
	sec := (d + time.Second - 1) / time.Second
	if sec > math.MaxUint32 {
		return math.MaxUint32
	}
	return uint32(sec)
}
