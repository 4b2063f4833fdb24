package coap

import (
	"bytes"
	"container/list"
	"crypto/rand"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"reflect"
	"sync"
	"time"
	"unsafe"

	piondtls "github.com/pion/dtls/v3"
	dtlsnet "github.com/pion/dtls/v3/pkg/net"
	"github.com/pion/transport/v5/packetio"

	"github.com/fleetgate/fleetgate/internal/ratelimit"
)

// The DTLS gate (docs/security.md) owns the DTLS UDP socket and demultiplexes it
// for pion. A datagram from an address and port without a peer is read
// only as a ClientHello (cookie.go):
//
//   - without a cookie that verifies, it is answered with a stateless
//     HelloVerifyRequest and dropped: no state, no goroutine, no slot;
//   - with one, the source has proven that it receives at its address and
//     port. It becomes a peer if its address has fewer than
//     maxHandshakesPerAddr handshakes in flight, its network
//     (ratelimit.Prefix: its /24 or /64) fewer than 1/prefixShare of the
//     peer slots, and a peer slot (limits.dtls_max_peers) is free;
//     otherwise it is dropped, counted, and the client's retransmission
//     tries again.
//
// pion/dtls v3 has no stateless cookie exchange of its own and always
// starts with one (its server accepts a cookie-bearing ClientHello only as
// message 1, after its own HelloVerifyRequest with a random cookie). So
// the gate replays the exchange to pion: it feeds pion the client's
// ClientHello without the cookie as message 0, swallows pion's
// HelloVerifyRequest, sets pion's expected cookie to the client's (the
// one write into pion's unexported state, setPionCookie), and then feeds
// the client's ClientHello as it came. pion's transcript then holds
// exactly the client's messages, and its ServerHello is message 1, as the
// client expects after a HelloVerifyRequest.
const (
	// maxHandshakesPerAddr bounds the handshakes in flight per source IP.
	maxHandshakesPerAddr = 4
	// prefixShare bounds the handshakes in flight per source network
	// (ratelimit.Prefix) to this fraction of the peer slots, and to no
	// fewer than maxHandshakesPerAddr: one /24 or /64 holds at most 64 of
	// the default 4,096 slots in stalled handshakes, so filling them takes
	// 64 networks rather than 1,024 addresses (or one IPv6 host).
	prefixShare = 64
	// acceptBacklog bounds the proven peers not yet accepted.
	acceptBacklog = 256
	// receiveMTU is the largest datagram read.
	receiveMTU = 8192
	// peerBufferBytes bounds the datagrams queued for one peer.
	peerBufferBytes = 64 << 10
)

// pionCookieOffset is the offset of the handshake's expected cookie
// (Conn.state.cookie) in a piondtls.Conn, checked against pion's types at
// start: a pion release that moves it fails newGate and the tests rather
// than writing elsewhere.
var pionCookieOffset, errPionLayout = func() (uintptr, error) {
	state, err := fieldOffset(reflect.TypeFor[piondtls.Conn](), "state", reflect.TypeFor[piondtls.State]())
	if err != nil {
		return 0, err
	}
	cookie, err := fieldOffset(reflect.TypeFor[piondtls.State](), "cookie", reflect.TypeFor[[]byte]())
	if err != nil {
		return 0, err
	}
	return state + cookie, nil
}()

// fieldOffset is the offset of field name of type want in struct t. The
// field must be t's own: a field promoted from an embedded struct has
// its offset in that struct, not in t, and is refused like a missing one.
func fieldOffset(t reflect.Type, name string, want reflect.Type) (uintptr, error) {
	f, ok := t.FieldByName(name)
	switch {
	case !ok:
		return 0, fmt.Errorf("dtls gate: %v has no field %s", t, name)
	case len(f.Index) != 1:
		return 0, fmt.Errorf("dtls gate: %v.%s is promoted from an embedded struct", t, name)
	case f.Type != want:
		return 0, fmt.Errorf("dtls gate: %v.%s is a %v, not a %v", t, name, f.Type, want)
	}
	return f.Offset, nil
}

// setPionCookie sets the cookie pion's server expects in the ClientHello
// that follows its HelloVerifyRequest. It is called from pion's handshake
// goroutine (in the write of that HelloVerifyRequest), the only one that
// reads or writes the cookie.
func setPionCookie(dc *piondtls.Conn, cookie []byte) {
	*(*[]byte)(unsafe.Add(unsafe.Pointer(dc), pionCookieOffset)) = bytes.Clone(cookie)
}

// gate is the DTLS socket's demultiplexer and its bounds.
type gate struct {
	sock  *net.UDPConn
	slots chan struct{}
	// perPrefix bounds the handshakes in flight of one source network.
	perPrefix int
	metrics   *metrics
	refused   func() // counts a proven peer dropped at a bound
	now       func() time.Time

	accept chan *peer
	done   chan struct{} // closed by the listener's Close

	mu      sync.Mutex
	keys    cookieKeys
	closing bool
	refs    int // the listener and the peers keep the socket open
	// byAddr and byPrefix count the handshakes in flight per source
	// address and per source network.
	byAddr   map[netip.Addr]int
	byPrefix map[netip.Prefix]int
	peers    map[netip.AddrPort]*peer

	// maxParked bounds parked (park.go), which finds each parked
	// session's entry in order, the parking order. resumes hands the
	// resumed peers to the listener, records the parked sessions'
	// records to the record layer (parked.go).
	maxParked int
	parked    map[netip.AddrPort]*list.Element // of order
	order     *list.List                       // of *parkedEntry, oldest first
	resumes   chan resumption
	records   chan parkedRecord
}

// newGate binds addr and starts reading it.
func newGate(addr string, maxPeers, maxParked int, m *metrics, refused func(), now func() time.Time) (*gate, error) {
	if errPionLayout != nil {
		return nil, errPionLayout
	}
	ua, err := net.ResolveUDPAddr("udp", addr)
	if err != nil {
		return nil, err
	}
	sock, err := net.ListenUDP("udp", ua)
	if err != nil {
		return nil, err
	}
	g := &gate{
		sock:      sock,
		slots:     make(chan struct{}, maxPeers),
		perPrefix: max(maxHandshakesPerAddr, maxPeers/prefixShare),
		metrics:   m,
		refused:   refused,
		now:       now,
		accept:    make(chan *peer, acceptBacklog),
		done:      make(chan struct{}),
		refs:      1,
		byAddr:    make(map[netip.Addr]int),
		byPrefix:  make(map[netip.Prefix]int),
		peers:     make(map[netip.AddrPort]*peer),
		maxParked: maxParked,
		parked:    make(map[netip.AddrPort]*list.Element),
		order:     list.New(),
		resumes:   make(chan resumption, acceptBacklog),
		records:   make(chan parkedRecord, acceptBacklog),
	}
	if err := g.keys.rotate(now(), rand.Reader); err != nil {
		_ = sock.Close()
		return nil, err
	}
	go g.read()
	return g, nil
}

// read dispatches the socket's datagrams until it is closed.
func (g *gate) read() {
	buf := make([]byte, receiveMTU)
	for {
		n, from, err := g.sock.ReadFromUDPAddrPort(buf)
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			continue
		}
		from = netip.AddrPortFrom(from.Addr().Unmap(), from.Port())
		g.dispatch(from, buf[:n])
	}
}

// dispatch hands datagram b from a peer to it, or gates it as a
// ClientHello of a new peer.
func (g *gate) dispatch(from netip.AddrPort, b []byte) {
	g.mu.Lock()
	p := g.peers[from]
	g.mu.Unlock()
	if p != nil {
		p.deliver(b)
		return
	}
	if isSessionRecord(b) {
		g.sessionRecord(from, b)
		return
	}
	h, err := parseClientHello(b)
	if err != nil {
		return
	}
	g.mu.Lock()
	if g.closing {
		g.mu.Unlock()
		return
	}
	if err := g.keys.rotate(g.now(), rand.Reader); err != nil {
		g.mu.Unlock()
		return
	}
	if !g.keys.verify(from, h) {
		cookie := helloCookie(g.keys.cur[:], from, h)
		g.mu.Unlock()
		if _, err := g.sock.WriteToUDPAddrPort(helloVerifyRequest(h, cookie), from); err == nil {
			g.metrics.helloVerify.Inc()
		}
		return
	}
	p, ok := g.admit(from, h, b)
	queued := false
	if ok {
		// Under g.mu, so that the listener's Close, once closing is set,
		// finds every queued peer.
		select {
		case g.accept <- p:
			queued = true
		default:
		}
	}
	g.mu.Unlock()
	if !queued {
		g.refused()
	}
	if ok && !queued {
		_ = p.Close()
	}
}

// admit makes a peer of the proven ClientHello h (datagram b) from addr,
// unless its address has maxHandshakesPerAddr handshakes in flight, its
// network g.perPrefix, or no peer slot is free. Called with g.mu held.
func (g *gate) admit(from netip.AddrPort, h clientHello, b []byte) (*peer, bool) {
	addr, prefix := from.Addr(), ratelimit.Prefix(from.Addr())
	if h.recordSeq == maxRecordSeq || g.byAddr[addr] >= maxHandshakesPerAddr || g.byPrefix[prefix] >= g.perPrefix {
		return nil, false
	}
	select {
	case g.slots <- struct{}{}:
	default:
		return nil, false
	}
	g.byAddr[addr]++
	g.byPrefix[prefix]++
	g.refs++
	g.metrics.dtlsPeers.Inc()
	g.unpark(from) // a new handshake replaces a parked session
	p := &peer{
		g:      g,
		remote: from,
		raddr:  net.UDPAddrFromAddrPort(from),
		buf:    newPeerBuffer(),
		cookie: bytes.Clone(h.cookie),
		// pion's epoch-0 records follow its swallowed HelloVerifyRequest:
		// numbered above the client's ClientHello, they stay above the
		// gate's HelloVerifyRequest, which took an earlier ClientHello's.
		outShift: h.recordSeq,
	}
	// The client's epoch-0 records are numbered one up, so that the
	// ClientHello without cookie fed first is record 0 and older.
	p.hello = bytes.Clone(b)
	shiftRecordSeqs(p.hello, 1)
	_, _ = p.buf.Write(withoutCookie(h, 0), nil)
	g.peers[from] = p
	return p, true
}

// newPeerBuffer is a peer's queue of datagrams for pion.
func newPeerBuffer() *packetio.Buffer {
	b := packetio.NewBuffer()
	b.SetLimitSize(peerBufferBytes)
	return b
}

// peer finds the peer at remote address a.
func (g *gate) peer(a net.Addr) (*peer, bool) {
	ua, ok := a.(*net.UDPAddr)
	if !ok {
		return nil, false
	}
	ap := ua.AddrPort()
	g.mu.Lock()
	defer g.mu.Unlock()
	p, ok := g.peers[netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port())]
	return p, ok
}

// unref drops one reference to the socket; the last closes it.
func (g *gate) unref() error {
	g.mu.Lock()
	g.refs--
	last := g.refs == 0
	g.mu.Unlock()
	if last {
		return g.sock.Close()
	}
	return nil
}

// peer is one DTLS peer's side of the socket: the net.PacketConn under
// its pion connection.
type peer struct {
	g        *gate
	remote   netip.AddrPort
	raddr    *net.UDPAddr
	buf      *packetio.Buffer
	cookie   []byte // the client's, which pion must expect
	outShift uint64

	mu sync.Mutex
	// hello is the client's ClientHello with the cookie, fed to pion
	// after its HelloVerifyRequest; nil once fed.
	hello     []byte
	dc        *piondtls.Conn
	handshook bool // endHandshake called
	closed    bool
	// resumed: the peer is a parked session resumed (park.go), whose
	// records need no renumbering; silenced: its session is being
	// parked, and it neither reads nor sends any more.
	resumed  bool
	silenced bool
}

var _ net.PacketConn = (*peer)(nil)

// deliver queues datagram b (the reader's buffer) for pion, with its
// epoch-0 records numbered one up. Until the client's ClientHello is fed
// to pion, whatever comes is a copy of it (a duplicate, a retransmission)
// and is dropped: pion then parses the rebuilt first ClientHello before
// any cookie-bearing one, whatever its order of reading and parsing (a
// cookie-bearing one parsed first would stall its handshake).
func (p *peer) deliver(b []byte) {
	p.mu.Lock()
	waiting, silenced, resumed := p.hello != nil, p.silenced, p.resumed
	p.mu.Unlock()
	if waiting || silenced {
		return
	}
	if !resumed {
		shiftRecordSeqs(b, 1)
	}
	_, _ = p.buf.Write(b, nil) // a full queue drops, as a socket would
}

// attach records pion's connection of the peer.
func (p *peer) attach(dc *piondtls.Conn) {
	p.mu.Lock()
	p.dc = dc
	p.mu.Unlock()
}

// ReadFrom returns the next datagram for pion.
func (p *peer) ReadFrom(b []byte) (int, net.Addr, error) {
	n, _, err := p.buf.Read(b, nil)
	return n, p.raddr, err
}

// WriteTo sends pion's datagram b to the peer. pion's HelloVerifyRequest
// is not sent: the client had the gate's. Its write sets the cookie pion
// expects to the client's, and feeds pion the client's ClientHello.
func (p *peer) WriteTo(b []byte, _ net.Addr) (int, error) {
	if isHelloVerifyRequest(b) {
		p.mu.Lock()
		defer p.mu.Unlock()
		if p.hello != nil && p.dc != nil {
			setPionCookie(p.dc, p.cookie)
			_, _ = p.buf.Write(p.hello, nil)
			p.hello = nil
		}
		return len(b), nil
	}
	p.mu.Lock()
	silenced := p.silenced
	p.mu.Unlock()
	if silenced {
		return len(b), nil // dropped: the parked state owns the record numbers
	}
	out := b
	if len(b) >= recordHeaderLen && b[3] == 0 && b[4] == 0 {
		out = bytes.Clone(b)
		shiftRecordSeqs(out, p.outShift)
	}
	if _, err := p.g.sock.WriteToUDPAddrPort(out, p.remote); err != nil {
		return 0, err
	}
	return len(b), nil
}

// silence stops the peer's reads and writes: from now on its datagrams
// are dropped both ways (park.go).
func (p *peer) silence() {
	p.mu.Lock()
	p.silenced = true
	p.mu.Unlock()
}

// endHandshake counts the peer's handshake as no longer in flight.
func (p *peer) endHandshake() {
	p.mu.Lock()
	done := p.handshook
	p.handshook = true
	p.mu.Unlock()
	if done {
		return
	}
	g := p.g
	g.mu.Lock()
	defer g.mu.Unlock()
	decrement(g.byAddr, p.remote.Addr())
	decrement(g.byPrefix, ratelimit.Prefix(p.remote.Addr()))
}

// decrement takes one from the count of k in m, and forgets k at zero.
func decrement[K comparable](m map[K]int, k K) {
	if n := m[k] - 1; n > 0 {
		m[k] = n
	} else {
		delete(m, k)
	}
}

// Close frees what the peer holds: its slot, its handshake count, its
// address in the demultiplexer.
func (p *peer) Close() error {
	p.mu.Lock()
	closed := p.closed
	p.closed = true
	p.mu.Unlock()
	if closed {
		return nil
	}
	p.endHandshake()
	g := p.g
	g.mu.Lock()
	if g.peers[p.remote] == p {
		delete(g.peers, p.remote)
	}
	g.mu.Unlock()
	<-g.slots
	g.metrics.dtlsPeers.Dec()
	_ = p.buf.Close()
	return g.unref()
}

// LocalAddr is the socket's address.
func (p *peer) LocalAddr() net.Addr { return p.g.sock.LocalAddr() }

// SetDeadline sets the read deadline (writes do not block).
func (p *peer) SetDeadline(t time.Time) error { return p.SetReadDeadline(t) }

// SetReadDeadline bounds ReadFrom.
func (p *peer) SetReadDeadline(t time.Time) error { return p.buf.SetReadDeadline(t) }

// SetWriteDeadline does nothing: writes to the UDP socket do not block.
func (p *peer) SetWriteDeadline(time.Time) error { return nil }

// gatedListener hands pion the gate's admitted peers.
type gatedListener struct{ g *gate }

var _ dtlsnet.PacketListener = gatedListener{}

// Accept returns the next admitted peer.
func (l gatedListener) Accept() (net.PacketConn, net.Addr, error) {
	select {
	case p := <-l.g.accept:
		return p, p.raddr, nil
	case <-l.g.done:
		return nil, nil, net.ErrClosed
	}
}

// Close stops admitting peers; the socket stays open for the peers that
// live until they are closed.
func (l gatedListener) Close() error {
	g := l.g
	g.mu.Lock()
	if g.closing {
		g.mu.Unlock()
		return nil
	}
	g.closing = true
	close(g.done)
	g.metrics.dtlsParked.Sub(float64(len(g.parked)))
	clear(g.parked)
	g.order.Init()
	g.mu.Unlock()
	for {
		select {
		case p := <-g.accept:
			_ = p.Close()
		case r := <-g.resumes:
			_ = r.peer.Close()
		default:
			return g.unref()
		}
	}
}

// Addr is the socket's address.
func (l gatedListener) Addr() net.Addr { return l.g.sock.LocalAddr() }

// listenGated binds addr behind a gate and returns pion's DTLS listener
// over it.
func listenGated(addr string, maxPeers, maxParked int, m *metrics, refused func(), now func() time.Time, opts ...piondtls.ServerOption) (net.Listener, *gate, error) {
	g, err := newGate(addr, maxPeers, maxParked, m, refused, now)
	if err != nil {
		return nil, nil, err
	}
	dl, err := piondtls.NewListenerWithOptions(gatedListener{g}, opts...)
	if err != nil {
		_ = gatedListener{g}.Close()
		return nil, nil, fmt.Errorf("dtls listener: %w", err)
	}
	return dl, g, nil
}
