package coap

import (
	"bytes"
	"context"
	"errors"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	piondtls "github.com/pion/dtls/v3"
	dtlsnet "github.com/pion/dtls/v3/pkg/net"
	"github.com/pion/transport/v5/udp"
)

// The DTLS gate (issue 10). A spoofed or silent ClientHello must not hold
// what real devices need, so a new DTLS peer is unproven until it has
// returned the cookie of the server's HelloVerifyRequest (RFC 6347
// §4.2.1), which proves that it receives at its source address:
//
//   - an unproven peer holds no peer slot (limits.dtls_max_peers); it
//     takes one when its ClientHello comes back with the cookie, waiting
//     for one at most the handshake timeout;
//   - an unproven peer that has not proven itself within cookieTimeout is
//     dropped (not after the whole handshake timeout);
//   - a source address has at most maxHandshakesPerAddr handshakes in
//     flight, and all addresses together at most as many unproven peers
//     as there are peer slots; beyond them a new peer is dropped at
//     accept.
//
// pion/dtls v3 keeps the cookie exchange inside its per-peer handshake,
// and a stateless exchange in front of it cannot be joined to pion's
// handshake (the server's message_seq and the handshake transcript would
// differ), so an unproven peer still costs pion's connection state and
// one handshake goroutine, for at most cookieTimeout, within the bounds
// above. docs/security.md has the figures.
const (
	// cookieTimeout bounds the cookie round trip: a device answers a
	// HelloVerifyRequest at once (its retransmission timer is 1 s).
	cookieTimeout = 2 * time.Second
	// maxHandshakesPerAddr bounds the handshakes in flight per source IP.
	maxHandshakesPerAddr = 4
	// acceptBacklog is the UDP demultiplexer's queue of new peers.
	acceptBacklog = 256
)

// DTLS record and handshake framing (RFC 6347 §4.1, §4.2.2).
const (
	recordHeaderLen    = 13
	handshakeHeaderLen = 12
	contentHandshake   = 22
	typeClientHello    = 1
	typeHelloVerify    = 3
)

// handshakeBody returns the body of the first record of datagram b when
// it is an unfragmented epoch-0 handshake message of type typ.
func handshakeBody(b []byte, typ byte) ([]byte, bool) {
	if len(b) < recordHeaderLen+handshakeHeaderLen || b[0] != contentHandshake || b[3] != 0 || b[4] != 0 {
		return nil, false
	}
	h := b[recordHeaderLen:]
	if h[0] != typ {
		return nil, false
	}
	n := int(h[1])<<16 | int(h[2])<<8 | int(h[3])
	off := int(h[6])<<16 | int(h[7])<<8 | int(h[8])
	frag := int(h[9])<<16 | int(h[10])<<8 | int(h[11])
	body := h[handshakeHeaderLen:]
	if off != 0 || frag != n || len(body) < n {
		return nil, false
	}
	return body[:n], true
}

// helloVerifyCookie is the cookie of a HelloVerifyRequest datagram.
func helloVerifyCookie(b []byte) ([]byte, bool) {
	body, ok := handshakeBody(b, typeHelloVerify)
	if !ok || len(body) < 3 || len(body) < 3+int(body[2]) {
		return nil, false
	}
	return body[3 : 3+int(body[2])], true
}

// clientHelloCookie is the cookie of a ClientHello datagram: client
// version (2), random (32), session ID (1 + n), cookie (1 + n).
func clientHelloCookie(b []byte) ([]byte, bool) {
	body, ok := handshakeBody(b, typeClientHello)
	if !ok || len(body) < 35 {
		return nil, false
	}
	i := 35 + int(body[34])
	if len(body) < i+1 || len(body) < i+1+int(body[i]) {
		return nil, false
	}
	return body[i+1 : i+1+int(body[i])], true
}

// isClientHello is the demultiplexer's accept filter: only a ClientHello
// makes a new peer.
func isClientHello(b []byte) bool {
	_, ok := handshakeBody(b, typeClientHello)
	return ok
}

// gate bounds the DTLS peers: the slots of proven ones, and the unproven
// ones per source address and in all.
type gate struct {
	slots       chan struct{}
	slotWait    time.Duration
	maxUnproven int64
	unproven    atomic.Int64
	metrics     *metrics

	mu     sync.Mutex
	byAddr map[netip.Addr]int // handshakes in flight
	// byRemote finds a peer's gatedConn from pion's connection (the
	// demultiplexer keys peers by remote address too).
	byRemote map[string]*gatedConn
}

func newGate(maxPeers int, slotWait time.Duration, m *metrics) *gate {
	return &gate{
		slots:       make(chan struct{}, maxPeers),
		slotWait:    slotWait,
		maxUnproven: int64(maxPeers),
		metrics:     m,
		byAddr:      make(map[netip.Addr]int),
		byRemote:    make(map[string]*gatedConn),
	}
}

// admit registers a new unproven peer from addr, or reports false when
// its address or all unproven peers are at their bound.
func (g *gate) admit(addr netip.Addr) bool {
	if g.unproven.Add(1) > g.maxUnproven {
		g.unproven.Add(-1)
		return false
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.byAddr[addr] >= maxHandshakesPerAddr {
		g.unproven.Add(-1)
		return false
	}
	g.byAddr[addr]++
	return true
}

// handshakeDone counts one handshake of addr less.
func (g *gate) handshakeDone(addr netip.Addr) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if n := g.byAddr[addr] - 1; n > 0 {
		g.byAddr[addr] = n
	} else {
		delete(g.byAddr, addr)
	}
}

// gatedConn is the UDP side of one DTLS peer, under pion: it watches the
// cookie round trip and holds the peer's slot once proven.
type gatedConn struct {
	net.Conn
	g    *gate
	addr netip.Addr

	mu       sync.Mutex
	cookie   []byte // of the HelloVerifyRequest sent
	proven   bool
	slot     bool
	done     bool // handshakeDone called
	closed   bool
	closedCh chan struct{}
}

var errNoPeerSlot = errors.New("dtls: no free peer slot")

// Write notes the cookie of the HelloVerifyRequest pion sends.
func (c *gatedConn) Write(b []byte) (int, error) {
	if cookie, ok := helloVerifyCookie(b); ok && len(cookie) > 0 {
		c.mu.Lock()
		if !c.proven {
			c.cookie = bytes.Clone(cookie)
		}
		c.mu.Unlock()
	}
	return c.Conn.Write(b)
}

// Read proves the peer when its ClientHello returns the cookie, and then
// waits for a peer slot, at most slotWait (the peer is refused then).
func (c *gatedConn) Read(b []byte) (int, error) {
	n, err := c.Conn.Read(b)
	if err != nil || n == 0 {
		return n, err
	}
	c.mu.Lock()
	if c.proven || c.cookie == nil {
		c.mu.Unlock()
		return n, nil
	}
	if cookie, ok := clientHelloCookie(b[:n]); !ok || !bytes.Equal(cookie, c.cookie) {
		c.mu.Unlock()
		return n, nil
	}
	c.proven = true
	c.g.unproven.Add(-1)
	c.mu.Unlock()

	t := time.NewTimer(c.g.slotWait)
	defer t.Stop()
	select {
	case c.g.slots <- struct{}{}:
	case <-t.C:
		return 0, errNoPeerSlot
	case <-c.closedCh:
		return 0, net.ErrClosed
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		<-c.g.slots
		return 0, net.ErrClosed
	}
	c.slot = true
	c.g.metrics.dtlsPeers.Inc()
	return n, nil
}

// isProven reports whether the cookie came back.
func (c *gatedConn) isProven() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.proven
}

// endHandshake counts the handshake as no longer in flight.
func (c *gatedConn) endHandshake() {
	c.mu.Lock()
	done := c.done
	c.done = true
	c.mu.Unlock()
	if !done {
		c.g.handshakeDone(c.addr)
	}
}

// Close frees what the peer holds.
func (c *gatedConn) Close() error {
	c.endHandshake()
	c.mu.Lock()
	if !c.closed {
		c.closed = true
		close(c.closedCh)
		if !c.proven {
			c.g.unproven.Add(-1)
		}
		if c.slot {
			<-c.g.slots
			c.g.metrics.dtlsPeers.Dec()
		}
	}
	c.mu.Unlock()
	c.g.mu.Lock()
	if c.g.byRemote[c.RemoteAddr().String()] == c {
		delete(c.g.byRemote, c.RemoteAddr().String())
	}
	c.g.mu.Unlock()
	return c.Conn.Close()
}

// gatedListener is the demultiplexed UDP socket under pion: each new
// peer is admitted by the gate or closed at once.
type gatedListener struct {
	net.Listener // pion/transport's UDP demultiplexer
	g            *gate
	refused      func()
}

var _ dtlsnet.PacketListener = (*gatedListener)(nil)

// Accept returns the next admitted peer.
func (l *gatedListener) Accept() (net.PacketConn, net.Addr, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, nil, err
		}
		addr := addrOf(c.RemoteAddr())
		if !l.g.admit(addr) {
			l.refused()
			_ = c.Close()
			continue
		}
		gc := &gatedConn{Conn: c, g: l.g, addr: addr, closedCh: make(chan struct{})}
		l.g.mu.Lock()
		l.g.byRemote[c.RemoteAddr().String()] = gc
		l.g.mu.Unlock()
		return dtlsnet.PacketConnFromConn(gc), c.RemoteAddr(), nil
	}
}

// listenGated binds addr behind the gate and returns pion's DTLS listener
// over it.
func listenGated(addr string, g *gate, refused func(), opts ...piondtls.ServerOption) (net.Listener, error) {
	ua, err := net.ResolveUDPAddr("udp", addr)
	if err != nil {
		return nil, err
	}
	lc := udp.ListenConfig{Backlog: acceptBacklog, AcceptFilter: isClientHello}
	ln, err := lc.Listen("udp", ua)
	if err != nil {
		return nil, err
	}
	dl, err := piondtls.NewListenerWithOptions(&gatedListener{Listener: ln, g: g, refused: refused}, opts...)
	if err != nil {
		_ = ln.Close()
		return nil, err
	}
	return dl, nil
}

// gated finds the gatedConn of the peer at remote address a.
func (g *gate) gated(a net.Addr) (*gatedConn, bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	gc, ok := g.byRemote[a.String()]
	return gc, ok
}

// peers returns the gatedConns of the peers.
func (g *gate) peers() []*gatedConn {
	g.mu.Lock()
	defer g.mu.Unlock()
	out := make([]*gatedConn, 0, len(g.byRemote))
	for _, gc := range g.byRemote {
		out = append(out, gc)
	}
	return out
}

// cookieContext is ctx, cancelled after cookieTimeout unless gc is proven
// by then.
func cookieContext(ctx context.Context, gc *gatedConn) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancel(ctx)
	t := time.AfterFunc(cookieTimeout, func() {
		if !gc.isProven() {
			cancel()
		}
	})
	return ctx, func() {
		t.Stop()
		cancel()
	}
}
