package coap

import (
	"net"
	"net/netip"
	"time"

	piondtls "github.com/pion/dtls/v3"

	"github.com/fleetgate/fleetgate/gateway"
)

// A DTLS session idle for Options.DTLSIdleTimeout is closed, but its
// state is parked: pion's exported connection state (the cipher suite,
// the master secret, both sequence numbers; a few hundred bytes instead of
// the tens of kilobytes of a live session), keyed by the peer's address
// and port. A device that keeps its session and sends again from the same
// address and port resumes it with its first record: the gate restores a
// connection from the parked state (piondtls.Resume) and hands it that
// record, without a handshake. A device that shakes hands again drops
// its parked state.
//
// A parked state is used at most once: it leaves the map when it is
// resumed or replaced, and the connection it came from is silenced (it
// neither reads nor sends, so its close_notify never leaves) before its
// state is taken, so no record number is used twice. Records the device
// sent before the state was taken are refused after the resumption, as
// pion refuses any record numbered below the highest it received (the
// exported state carries it). A parked state is kept for at most
// parkTTL, and at most Options.DTLSMaxParked of them, the oldest dropped
// first; a devices file reload drops the parked states of the devices it
// revoked, and a resumption checks the credentials revision again.
const parkTTL = 24 * time.Hour

// parkedSession is a DTLS session closed for idleness, ready to resume.
type parkedSession struct {
	state  piondtls.State
	device gateway.DeviceID
	rev    string // the device's credentials revision at its handshake
	at     time.Time
}

// resumption is a parked session to resume at peer, whose first record
// waits in the peer's buffer.
type resumption struct {
	peer    *peer
	session parkedSession
}

// parkedEntry is a parked session in the gate's parking order.
type parkedEntry struct {
	addr    netip.AddrPort
	session parkedSession
}

// isSessionRecord reports whether datagram b starts with a record of an
// established session: application data or an alert under epoch 1
// (RFC 6347 §4.1).
func isSessionRecord(b []byte) bool {
	const contentAlert, contentApplicationData = 21, 23
	return len(b) >= recordHeaderLen && (b[0] == contentApplicationData || b[0] == contentAlert) &&
		b[3] == 0 && b[4] == 1
}

// park keeps session s of the peer at addr for a later resumption, unless
// parking is off. Called without g.mu.
func (g *gate) park(addr netip.AddrPort, s parkedSession) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.maxParked <= 0 || g.closing {
		return
	}
	g.unpark(addr)
	g.parked[addr] = g.order.PushBack(&parkedEntry{addr: addr, session: s})
	g.metrics.dtlsParked.Inc()
	g.pruneParked(s.at)
}

// pruneParked drops the parked sessions older than parkTTL at now and the
// oldest beyond g.maxParked. Called with g.mu held.
func (g *gate) pruneParked(now time.Time) {
	for e := g.order.Front(); e != nil; e = g.order.Front() {
		pe := e.Value.(*parkedEntry)
		if len(g.parked) <= g.maxParked && now.Sub(pe.session.at) < parkTTL {
			return
		}
		g.unpark(pe.addr)
	}
}

// unpark removes and returns the parked session of addr. Called with g.mu
// held.
func (g *gate) unpark(addr netip.AddrPort) (parkedSession, bool) {
	e, ok := g.parked[addr]
	if !ok {
		return parkedSession{}, false
	}
	delete(g.parked, addr)
	g.order.Remove(e)
	g.metrics.dtlsParked.Dec()
	return e.Value.(*parkedEntry).session, true
}

// dropParked removes the parked sessions for which drop reports true.
func (g *gate) dropParked(drop func(parkedSession) bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	for addr, e := range g.parked {
		if drop(e.Value.(*parkedEntry).session) {
			g.unpark(addr)
		}
	}
}

// repark puts session s of addr back at the front of the parking order
// (it keeps its age). Called with g.mu held.
func (g *gate) repark(addr netip.AddrPort, s parkedSession) {
	g.parked[addr] = g.order.PushFront(&parkedEntry{addr: addr, session: s})
	g.metrics.dtlsParked.Inc()
}

// resume makes a peer of the parked session s of addr, whose datagram b
// (a record of the session) starts it, and queues it for the listener.
// Like a new peer it needs a free slot; without one the datagram is
// dropped and s parked again, for the device's retransmission. Called
// with g.mu held.
func (g *gate) resume(from netip.AddrPort, s parkedSession, b []byte) bool {
	select {
	case g.slots <- struct{}{}:
	default:
		g.repark(from, s)
		return false
	}
	g.refs++
	g.metrics.dtlsPeers.Inc()
	p := &peer{g: g, remote: from, raddr: net.UDPAddrFromAddrPort(from), buf: newPeerBuffer(), handshook: true, resumed: true}
	_, _ = p.buf.Write(b, nil)
	g.peers[from] = p
	select {
	case g.resumes <- resumption{peer: p, session: s}:
		g.metrics.dtlsResumed.Inc()
		return true
	default:
		delete(g.peers, from)
		g.repark(from, s)
		go func() { _ = p.Close() }() // Close takes g.mu
		return false
	}
}
