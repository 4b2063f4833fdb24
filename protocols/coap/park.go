package coap

import (
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

// parkedOrder is an entry of the gate's parking order: the address and
// the time it was parked (an entry whose time is not the parked session's
// is stale: that session was resumed or replaced since).
type parkedOrder struct {
	addr netip.AddrPort
	at   time.Time
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
	if _, ok := g.parked[addr]; !ok {
		g.metrics.dtlsParked.Inc()
	}
	g.parked[addr] = s
	g.order = append(g.order, parkedOrder{addr: addr, at: s.at})
	g.pruneParked(s.at)
}

// pruneParked drops the parked sessions older than parkTTL at now and the
// oldest beyond g.maxParked, and compacts the order. Called with g.mu held.
func (g *gate) pruneParked(now time.Time) {
	for len(g.order) > 0 {
		o := g.order[0]
		s, ok := g.parked[o.addr]
		current := ok && s.at.Equal(o.at)
		if current && len(g.parked) <= g.maxParked && now.Sub(o.at) < parkTTL {
			break
		}
		g.order = g.order[1:]
		if current {
			delete(g.parked, o.addr)
			g.metrics.dtlsParked.Dec()
		}
	}
	if cap(g.order) > 64 && len(g.order) < cap(g.order)/4 {
		g.order = append(make([]parkedOrder, 0, 2*len(g.order)), g.order...)
	}
}

// unpark removes and returns the parked session of addr. Called with g.mu
// held.
func (g *gate) unpark(addr netip.AddrPort) (parkedSession, bool) {
	s, ok := g.parked[addr]
	if ok {
		delete(g.parked, addr)
		g.metrics.dtlsParked.Dec()
	}
	return s, ok
}

// dropParked removes the parked sessions for which drop reports true and
// returns how many.
func (g *gate) dropParked(drop func(parkedSession) bool) int {
	g.mu.Lock()
	defer g.mu.Unlock()
	n := 0
	for addr, s := range g.parked {
		if drop(s) {
			delete(g.parked, addr)
			g.metrics.dtlsParked.Dec()
			n++
		}
	}
	return n
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
		g.parked[from] = s
		g.metrics.dtlsParked.Inc()
		return false
	}
	g.refs++
	g.metrics.dtlsPeers.Inc()
	p := &peer{g: g, remote: from, raddr: netAddr(from), buf: newPeerBuffer(), handshook: true, resumed: true}
	_, _ = p.buf.Write(b, nil)
	g.peers[from] = p
	select {
	case g.resumes <- resumption{peer: p, session: s}:
		g.metrics.dtlsResumed.Inc()
		return true
	default:
		delete(g.peers, from)
		g.parked[from] = s
		g.metrics.dtlsParked.Inc()
		go func() { _ = p.Close() }() // Close takes g.mu
		return false
	}
}
