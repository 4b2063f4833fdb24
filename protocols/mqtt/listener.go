package mqtt

import (
	"errors"
	"log/slog"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/mochi-mqtt/server/v2/listeners"
	"github.com/mochi-mqtt/server/v2/packets"

	"github.com/fleetgate/fleetgate/gateway"
	"github.com/fleetgate/fleetgate/internal/ratelimit"
)

// connectTimeout bounds how long an accepted connection may take to
// finish its TLS handshake and send CONNECT. Mochi sets no deadline
// before CONNECT, so without it a silent socket would be held for ever.
const connectTimeout = 10 * time.Second

// shutdownWriteTimeout bounds the writes of a shutdown.
const shutdownWriteTimeout = time.Second

// handlerWaitTimeout bounds how long Close waits for the connection
// goroutines once their connections are closed.
const handlerWaitTimeout = 5 * time.Second

// conn is an accepted connection with the presence state of the device
// on it. Mochi keeps it as Client.Net.Conn, so the hook finds the state
// with a type assertion instead of a locked map. Every field is used by
// the connection's own goroutine only (mochi runs CONNECT, packet reads
// and the disconnect of a client on one goroutine).
type conn struct {
	net.Conn
	device  gateway.DeviceID
	session gateway.SessionID
	// root is "<prefix>/<device>": the topic subtree the device owns.
	root string
	// admitted: CONNECT passed every check and holds a max_clients slot.
	admitted bool
	// leaving: the device sent a normal DISCONNECT that ends its session.
	leaving bool
	// anon: the device was admitted without a password.
	anon bool
	// persistent: the client asked for a session that outlives the
	// connection (sleepy.go); read by a later connection of the client.
	persistent atomic.Bool
	// pending: the connection counts among those that have not sent
	// CONNECT yet (from accept to OnConnect).
	pending bool
	// keepAlive (seconds) and lease are what CONNECT was granted: the
	// keep-alive after the clamp and the lease in force (Server.leaseOf).
	keepAlive uint16
	lease     time.Duration
	ip        netip.Addr
	// local is the local client admitted on the connection (nil: a
	// device, or not admitted).
	local *localClient
	// delivery delivers commands to the device (commands.go); set once
	// its session is established, read by the delivering goroutines.
	delivery atomic.Pointer[delivery]
}

// listener is a mochi listener over a bound net.Listener (TCP, or TLS on
// top of it). Unlike mochi's own, it rate-limits connects per source
// address, bounds the time to CONNECT, survives temporary accept errors,
// and on Close ends every connection it accepted, including the ones that
// never sent CONNECT.
type listener struct {
	id  string
	ln  net.Listener
	srv *Server

	mu     sync.Mutex
	closed bool
	conns  map[*conn]struct{}
	// handlers counts the connection goroutines (track to untrack).
	// Close waits for them: mochi's Close waits for its clients with a
	// WaitGroup that a goroutine still on its way into mochi's
	// EstablishConnection would Add to concurrently (a data race, and a
	// client attached after the wait).
	handlers sync.WaitGroup
}

var _ listeners.Listener = (*listener)(nil)

func newListener(id string, ln net.Listener, srv *Server) *listener {
	return &listener{id: id, ln: ln, srv: srv, conns: make(map[*conn]struct{})}
}

func (l *listener) ID() string                { return l.id }
func (l *listener) Address() string           { return l.ln.Addr().String() }
func (l *listener) Protocol() string          { return l.id }
func (l *listener) Init(_ *slog.Logger) error { return nil }

// Serve accepts connections until the listener is closed and hands each
// to establish (mochi's connection handler) on its own goroutine.
func (l *listener) Serve(establish listeners.EstablishFn) {
	s := l.srv
	if !s.enter() {
		return
	}
	defer s.work.Done()
	var backoff time.Duration
	for {
		nc, err := l.ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) || !s.pause(&backoff, err) {
				return
			}
			continue
		}
		backoff = 0
		if ok, _ := s.rate.Allow(remoteIP(nc), s.clock.Now()); !ok {
			s.metrics.refuse(reasonRate)
			s.log.Debug("connect rate exceeded", "remote", nc.RemoteAddr().String())
			_ = nc.Close()
			continue
		}
		c := &conn{Conn: nc, ip: remoteIP(nc)}
		if !s.pend.add(c.ip) {
			s.metrics.refuse(reasonPending)
			s.log.Debug("too many connections without CONNECT", "remote", nc.RemoteAddr().String())
			_ = nc.Close()
			continue
		}
		c.pending = true
		if !l.track(c) {
			s.pend.done(c)
			_ = nc.Close()
			return
		}
		_ = nc.SetDeadline(time.Now().Add(connectTimeout))
		go func() {
			defer s.work.Done()
			defer l.untrack(c)
			if err := establish(l.id, c); err != nil {
				s.log.Debug("connection ended", "device", string(c.device), "session", string(c.session), "remote", c.RemoteAddr().String(), "err", err)
			}
			s.pend.done(c)
			s.release(c)
		}()
	}
}

// Close is called by mochi on shutdown: it disconnects the established
// clients (a DISCONNECT "server shutting down" to MQTT 5 clients, written
// within shutdownWriteTimeout so that a client that reads nothing cannot
// hold it up), stops accepting, and closes every connection still open,
// so that mochi's wait for its clients ends.
//
// It does not call mochi's closeClients: that reads the client list with
// Clients.GetByListener, which takes the list's read lock twice (it calls
// Len inside). A client ending at the same moment waits for the write
// lock in between (Clients.Delete), and Go's RWMutex then blocks the
// second read lock behind it: shutdown hung for good (seen in CI,
// mochi v2.7.9). disconnectClients reads the list once.
func (l *listener) Close(_ listeners.CloseFn) {
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return
	}
	l.closed = true
	deadline := time.Now().Add(shutdownWriteTimeout)
	for c := range l.conns {
		_ = c.SetWriteDeadline(deadline)
	}
	l.mu.Unlock()

	l.disconnectClients()
	_ = l.ln.Close()

	l.mu.Lock()
	for c := range l.conns {
		_ = c.Close()
	}
	l.mu.Unlock()

	done := make(chan struct{})
	go func() {
		l.handlers.Wait()
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(handlerWaitTimeout):
		l.srv.log.Warn("connection handlers still running after close", "listener", l.id, "waited", handlerWaitTimeout)
	}
}

// disconnectClients sends the shutdown DISCONNECT to every client of the
// listener that is still open (what mochi's closeListenerClients does,
// with one read lock of the client list).
func (l *listener) disconnectClients() {
	b := l.srv.broker
	for _, cl := range b.Clients.GetAll() {
		if cl.Net.Listener == l.id && !cl.Closed() {
			_ = b.DisconnectClient(cl, packets.ErrServerShuttingDown)
		}
	}
}

// track registers c and one unit of server work for its goroutine; it
// refuses once the listener or the server is closing.
func (l *listener) track(c *conn) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed || !l.srv.enter() {
		return false
	}
	l.conns[c] = struct{}{}
	l.handlers.Add(1)
	return true
}

func (l *listener) untrack(c *conn) {
	l.mu.Lock()
	delete(l.conns, c)
	l.mu.Unlock()
	l.handlers.Done()
}

func remoteIP(c net.Conn) netip.Addr {
	if a, ok := c.RemoteAddr().(*net.TCPAddr); ok {
		return a.AddrPort().Addr().Unmap()
	}
	return netip.Addr{}
}

// Bounds of the connections that have not sent CONNECT yet (docs/security.md): a
// socket that is silent, or slow through TLS, holds a goroutine and its
// buffers for up to connectTimeout, so one address may hold at most
// maxPendingPerAddr of them, one network (ratelimit.Prefix: /24, /64)
// maxPendingPerPrefix, and all addresses together maxPending; beyond them
// a new connection is closed at accept. An attacker needs
// maxPending/maxPendingPerPrefix networks to fill them all.
const (
	maxPendingPerAddr   = 32
	maxPendingPerPrefix = 256
	maxPending          = 4096
)

// pendingConns counts the connections that have not sent CONNECT yet,
// per source address, per source network and in all.
type pendingConns struct {
	perAddr, perPrefix, total int

	mu       sync.Mutex
	n        int
	byAddr   map[netip.Addr]int
	byPrefix map[netip.Prefix]int
}

func newPendingConns(perAddr, perPrefix, total int) *pendingConns {
	return &pendingConns{
		perAddr: perAddr, perPrefix: perPrefix, total: total,
		byAddr: make(map[netip.Addr]int), byPrefix: make(map[netip.Prefix]int),
	}
}

// add counts a new connection from ip, or reports false beyond a bound.
func (p *pendingConns) add(ip netip.Addr) bool {
	nw := ratelimit.Prefix(ip)
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.n >= p.total || p.byAddr[ip] >= p.perAddr || p.byPrefix[nw] >= p.perPrefix {
		return false
	}
	p.n++
	p.byAddr[ip]++
	p.byPrefix[nw]++
	return true
}

// done uncounts c once: it sent CONNECT, or ended. Only c's goroutine
// calls it after the accept loop handed c over.
func (p *pendingConns) done(c *conn) {
	if !c.pending {
		return
	}
	c.pending = false
	nw := ratelimit.Prefix(c.ip)
	p.mu.Lock()
	defer p.mu.Unlock()
	p.n--
	uncount(p.byAddr, c.ip)
	uncount(p.byPrefix, nw)
}

// uncount takes one from m[k] and drops the key at zero.
func uncount[K comparable](m map[K]int, k K) {
	if n := m[k] - 1; n > 0 {
		m[k] = n
	} else {
		delete(m, k)
	}
}
