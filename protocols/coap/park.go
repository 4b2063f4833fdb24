package coap

import (
	"bytes"
	"net"
	"net/netip"
	"time"

	piondtls "github.com/pion/dtls/v3"

	"github.com/fleetgate/fleetgate/gateway"
)

// A DTLS session idle for Options.DTLSIdleTimeout is closed, but its
// state is parked: pion's exported connection state decoded (the cipher
// suite, the master secret, both sequence numbers) and its traffic keys,
// derived once (record.go); a few hundred bytes instead of the tens of
// kilobytes of a live session, keyed by the peer's address and port. A
// device that keeps its session and sends again from the same address
// and port is answered without a handshake:
//
//   - a heartbeat (POST /hb) in one application-data record is answered
//     by the parked session itself (parked.go): the record is decrypted
//     and authenticated with the parked keys, refused unless numbered
//     above every record the session accepted, answered through the same
//     path as on a live session, and the answer encrypted with the
//     server's next record number; the session stays parked with both
//     numbers advanced;
//   - anything else of the session (another request, an alert, several
//     records in one datagram) resumes it: the gate restores a pion
//     connection from the parked state, with the numbers the parked
//     answers advanced (piondtls.Resume), and hands it that record.
//
// A device that shakes hands again drops its parked state.
//
// A parked state is used by one record at a time: it leaves the map
// while a record of it is answered (a record of the peer arriving
// meanwhile finds nothing parked and is dropped, for the device's
// retransmission) and comes back with its numbers advanced, or leaves
// for good when it is resumed or replaced. The connection it came from
// is silenced (it neither reads nor sends, so its close_notify never
// leaves) before its state is taken, so no record number is used twice:
// the server's records, parked or resumed, continue the session's
// numbering. Records the device sent before are refused, by the parked
// session and by pion after a resumption, as both refuse any record
// numbered below the highest received. A parked state is kept for at
// most parkTTL since it was parked or last answered a record, and at
// most Options.DTLSMaxParked of them, the oldest dropped first; a
// devices file reload drops the parked states of the devices it
// revoked, and an answer or a resumption checks the credentials
// revision again.
const parkTTL = 24 * time.Hour

// parkedSession is a DTLS session closed for idleness, ready to answer
// a heartbeat or to resume.
type parkedSession struct {
	state  sessionState
	keys   recordKeys
	device gateway.DeviceID
	rev    string    // the device's credentials revision at its handshake
	at     time.Time // parked, or last answered a record
}

// newParkedSession is the parked session of pion's state st, of device
// with credentials revision rev, parked at at. A state the record layer
// cannot serve (another cipher suite, connection IDs) is not parked.
func newParkedSession(st *piondtls.State, device gateway.DeviceID, rev string, at time.Time) (parkedSession, error) {
	s, err := decodeState(st)
	if err != nil {
		return parkedSession{}, err
	}
	keys, err := deriveKeys(&s)
	if err != nil {
		return parkedSession{}, err
	}
	return parkedSession{state: s, keys: keys, device: device, rev: rev, at: at}, nil
}

// parkedRecord is an application-data record from the peer of a parked
// session, for the record layer; the session is out of the parking
// while it is answered.
type parkedRecord struct {
	from     netip.AddrPort
	session  parkedSession
	datagram []byte // a copy: the gate's read buffer is reused
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

// The content types of DTLS records (RFC 6347 §4.1).
const contentAlert, contentApplicationData = 21, 23

// isSessionRecord reports whether datagram b starts with a record of an
// established session: application data or an alert under epoch 1
// (RFC 6347 §4.1).
func isSessionRecord(b []byte) bool {
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
	g.pushParked(addr, s)
}

// pushParked parks session s of addr as the newest. Called with g.mu
// held, addr not parked.
func (g *gate) pushParked(addr netip.AddrPort, s parkedSession) {
	g.parked[addr] = g.order.PushBack(&parkedEntry{addr: addr, session: s})
	g.metrics.dtlsParked.Inc()
	g.pruneParked(s.at)
}

// sessionRecord takes datagram b from addr, a record of an established
// session, to the session parked at addr, if any: application data to
// the record layer (parked.go), through a bounded queue (full: the
// session stays parked and the record is dropped, for the device's
// retransmission), anything else to a resumption.
func (g *gate) sessionRecord(from netip.AddrPort, b []byte) {
	g.mu.Lock()
	defer g.mu.Unlock()
	s, ok := g.unpark(from)
	if !ok || g.closing || g.now().Sub(s.at) >= parkTTL {
		return
	}
	if b[0] != contentApplicationData {
		if !g.resume(from, s, b) {
			g.refused() // no slot: parked again, for the retransmission
		}
		return
	}
	select {
	case g.records <- parkedRecord{from: from, session: s, datagram: bytes.Clone(b)}:
	default:
		g.repark(from, s)
		g.refused()
	}
}

// putBack parks session s of from again after the record layer took a
// record of it: as the newest if it answered the record, at the front
// (keeping its age) if it refused it. Not if the gate is closing or the
// peer shook hands (or was parked) meanwhile: then s is outdated.
func (g *gate) putBack(from netip.AddrPort, s parkedSession, answered bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.maxParked <= 0 || g.closing || g.peers[from] != nil || g.parked[from] != nil {
		return
	}
	if answered {
		g.pushParked(from, s)
		return
	}
	g.repark(from, s)
}

// fallBack resumes session s of from with its record b, which the record
// layer took and leaves to pion (as resume; unless putBack would not
// park s again).
func (g *gate) fallBack(from netip.AddrPort, s parkedSession, b []byte) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.closing || g.peers[from] != nil || g.parked[from] != nil {
		return
	}
	if !g.resume(from, s, b) {
		g.refused()
	}
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
