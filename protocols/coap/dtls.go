package coap

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"errors"
	"fmt"
	"math"
	"net"
	"sync"
	"sync/atomic"
	"time"

	piondtls "github.com/pion/dtls/v3"
	"github.com/plgd-dev/go-coap/v3/dtls"
	dtlsServer "github.com/plgd-dev/go-coap/v3/dtls/server"
	"github.com/plgd-dev/go-coap/v3/message"
	"github.com/plgd-dev/go-coap/v3/message/codes"
	"github.com/plgd-dev/go-coap/v3/message/pool"
	coapNet "github.com/plgd-dev/go-coap/v3/net"
	"github.com/plgd-dev/go-coap/v3/net/blockwise"
	"github.com/plgd-dev/go-coap/v3/net/responsewriter"
	"github.com/plgd-dev/go-coap/v3/options"
	"github.com/plgd-dev/go-coap/v3/options/config"
	udpClient "github.com/plgd-dev/go-coap/v3/udp/client"
	"github.com/plgd-dev/go-coap/v3/udp/coder"

	"github.com/fleetgate/fleetgate/gateway"
)

// A DTLS session costs a handshake (three round trips and the PSK key
// schedule) and tens of kilobytes while it lives, so it is kept live only
// briefly: a session without datagrams for Options.DTLSIdleTimeout is
// closed by the sweep that runs every sweepInterval, and parked (park.go)
// for the device's next record to resume it without a handshake.
const sweepInterval = time.Second

// dtlsFront is the DTLS transport: go-coap's DTLS server on a listener
// that bounds the peers (gate.go).
type dtlsFront struct {
	server   *dtlsServer.Server
	listener *peerListener
}

// newDTLS binds the DTLS listener at addr, with PSK cipher suites only and
// the identity checked by the credentials during the handshake.
func (s *Server) newDTLS(addr string, handshakeTimeout, idleTimeout time.Duration, maxPeers, maxParked int) (*dtlsFront, error) {
	session := []piondtls.Option{
		piondtls.WithPSK(s.psk),
		piondtls.WithCipherSuites(piondtls.TLS_PSK_WITH_AES_128_CCM_8, piondtls.TLS_PSK_WITH_AES_128_GCM_SHA256),
	}
	ln, g, err := listenGated(addr, maxPeers, maxParked, s.metrics, func() { s.metrics.drop(dropDTLSBusy) }, s.clock.Now,
		session[0], session[1], piondtls.WithOnConnectionAttempt(s.handshakeAttempt))
	if err != nil {
		return nil, fmt.Errorf("listen dtls %s: %w", addr, err)
	}
	pl := &peerListener{Listener: ln, gate: g, metrics: s.metrics, peers: make(map[*peerConn]struct{}), creds: s.credentials,
		refusals: s.refusals, now: s.clock.Now, resumeOpts: session, accepted: make(chan accepted)}
	go pl.pump()
	s.answerParkedRecords(g)
	srv := dtls.NewServer(
		options.WithContext(s.ctx),
		options.WithProcessReceivedMessageFunc(s.dtlsProcessor()),
		options.WithHandlerFunc(ignore),
		options.WithDTLSHandshakeTimeout(handshakeTimeout),
		options.WithInactivityMonitor(idleTimeout, pl.park),
		options.WithPeriodicRunner(s.sweep),
		// Heartbeats fit one datagram; no peer gets block-wise state.
		options.WithBlockwise(false, blockwise.SZX1024, 0),
		options.WithErrors(func(err error) { s.log.Debug("coap dtls transport", "err", err) }),
	)
	return &dtlsFront{server: srv, listener: pl}, nil
}

// psk is pion's PSK callback: the key of the device named by the client's
// PSK identity. An unknown identity gets a decoy key (an HMAC of the
// identity under a key of this server), so that its handshake fails
// exactly as one with a known identity and a wrong key does: the server
// cannot verify the client's Finished and stays silent until the
// handshake times out. An immediate alert would tell which identities
// exist. Either way no request is ever read, so it never becomes
// evidence.
func (s *Server) psk(identity []byte) ([]byte, error) {
	if c := s.creds.Load(); c != nil {
		if _, key, err := c.PSK(identity); err == nil {
			return key, nil
		}
	}
	m := hmac.New(sha256.New, s.decoy[:])
	m.Write(identity)
	return m.Sum(nil)[:16], nil
}

// errHandshakeRateLimited refuses a new DTLS peer beyond its source's rate.
var errHandshakeRateLimited = errors.New("dtls: handshakes beyond the source's rate")

// handshakeAttempt is pion's hook for a new DTLS peer, which has
// returned the gate's cookie: a handshake takes a token of the proven
// sources' rate limit, like a request of a session, so that one source
// cannot make the server shake hands (and run the PSK key schedule)
// faster than it may send requests.
func (s *Server) handshakeAttempt(peer net.Addr) error {
	if ok, _ := s.proven.allow(endpointOf(peer), s.clock.Now()); !ok {
		s.metrics.drop(dropRateLimited)
		return errHandshakeRateLimited
	}
	return nil
}

// peerListener is pion's DTLS listener over the gate (gate.go), which
// admits only peers that have returned its cookie, each with a slot.
type peerListener struct {
	net.Listener
	gate    *gate
	metrics *metrics
	closed  atomic.Bool

	creds func() gateway.Credentials // the current ones
	// refusals and now report the failed handshakes and revocations.
	refusals gateway.Refusals
	now      func() time.Time

	mu    sync.Mutex
	peers map[*peerConn]struct{} // for revocation

	// resumeOpts are the session options of a resumed connection;
	// accepted carries pion's accepted connections (pump).
	resumeOpts []piondtls.Option
	accepted   chan accepted
}

// accepted is a connection pion's listener accepted, or its error.
type accepted struct {
	c   net.Conn
	err error
}

// pump hands the connections pion's listener accepts to AcceptWithContext
// until the listener is closed.
func (l *peerListener) pump() {
	for {
		c, err := l.Listener.Accept()
		select {
		case l.accepted <- accepted{c, err}:
		case <-l.gate.done:
			if c != nil {
				_ = c.Close()
			}
			return
		}
	}
}

// AcceptWithContext returns the next peer that the gate admitted: a new
// one past its cookie, or a parked session resumed.
func (l *peerListener) AcceptWithContext(ctx context.Context) (net.Conn, error) {
	for {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		if l.closed.Load() {
			return nil, coapNet.ErrListenerIsClosed
		}
		select {
		case a := <-l.accepted:
			if a.err != nil {
				return nil, a.err
			}
			return l.admitted(a.c)
		case r := <-l.gate.resumes:
			if pc := l.resume(r); pc != nil {
				return pc, nil
			}
		case <-l.gate.done:
			return nil, coapNet.ErrListenerIsClosed
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}

// admitted is the peer connection of c, which pion accepted.
func (l *peerListener) admitted(c net.Conn) (net.Conn, error) {
	dc, ok := c.(*piondtls.Conn)
	p, found := l.gate.peer(c.RemoteAddr())
	if !ok || !found {
		_ = c.Close()
		return nil, fmt.Errorf("dtls accept: unexpected connection %T from %v", c, c.RemoteAddr())
	}
	p.attach(dc)
	pc := &peerConn{Conn: dc, gated: p, metrics: l.metrics, l: l, creds: l.creds}
	l.mu.Lock()
	l.peers[pc] = struct{}{}
	l.mu.Unlock()
	return pc, nil
}

// resume restores the parked session of r into a connection, unless its
// device's credentials changed since its handshake (then it is refused,
// as revoked, and nil returned).
func (l *peerListener) resume(r resumption) *peerConn {
	s := r.session
	if refuseRevoked(l.refusals, l.creds(), s, r.peer.raddr.String(), l.now()) {
		_ = r.peer.Close()
		return nil
	}
	st, err := s.state.pion()
	if err != nil {
		_ = r.peer.Close()
		return nil
	}
	dc, err := piondtls.ResumeWithOptions(st, r.peer, r.peer.raddr, l.resumeOpts...)
	if err != nil {
		_ = r.peer.Close()
		return nil
	}
	r.peer.attach(dc)
	pc := &peerConn{Conn: dc, gated: r.peer, metrics: l.metrics, l: l, creds: l.creds}
	l.mu.Lock()
	pc.shook, pc.device, pc.rev = true, s.device, s.rev
	l.peers[pc] = struct{}{}
	l.mu.Unlock()
	return pc
}

// refuseRevoked reports parked session s, of the peer at remote, to
// refusals as revoked if its device's credentials revision under cr
// (nil: none) is no longer the one it shook hands with, and says so.
func refuseRevoked(refusals gateway.Refusals, cr gateway.Credentials, s parkedSession, remote string, now time.Time) bool {
	if cr != nil && cr.Revision(s.device) == s.rev {
		return false
	}
	refusals.Refuse(gateway.Refusal{Protocol: "coap", Device: string(s.device), Reason: gateway.RefusedRevoked,
		Detail: "a devices file reload removed the device or changed its key", Remote: remote, At: now})
	return true
}

// park is the idle timeout of peer cc: it closes the connection and,
// for a session past its handshake, keeps its state for a resumption.
// The peer is silenced first, so that nothing the closing connection
// would read or send (its close_notify) uses a record number of the
// parked state.
func (l *peerListener) park(cc *udpClient.Conn) {
	if pc, ok := cc.NetConn().(*peerConn); ok {
		if pc.busy.Load() > 0 {
			return // answering: parked at a later check, once idle
		}
		l.mu.Lock()
		shook, device, rev := pc.shook, pc.device, pc.rev
		l.mu.Unlock()
		if shook {
			pc.gated.silence()
			if st, ok := pc.ConnectionState(); ok {
				if ps, err := newParkedSession(&st, device, rev, l.now()); err == nil {
					l.gate.park(pc.gated.remote, ps)
				}
			}
		}
	}
	_ = cc.Close()
}

// revoke closes the DTLS sessions whose device's credentials revision
// under cur differs from the one they shook hands with (a devices file
// reload removed the device or changed its key), live or parked; it
// returns how many live ones.
func (l *peerListener) revoke(cur gateway.Credentials) int {
	l.gate.dropParked(func(s parkedSession) bool { return cur.Revision(s.device) != s.rev })
	l.mu.Lock()
	var revoked []*peerConn
	for pc := range l.peers {
		if pc.shook && cur.Revision(pc.device) != pc.rev {
			revoked = append(revoked, pc)
		}
	}
	l.mu.Unlock()
	for _, pc := range revoked {
		l.refusals.Refuse(gateway.Refusal{Protocol: "coap", Device: string(pc.device), Reason: gateway.RefusedRevoked,
			Detail: "a devices file reload removed the device or changed its key", Remote: pc.RemoteAddr().String(), At: l.now()})
		_ = pc.Close()
	}
	return len(revoked)
}

// handshakeRefused reports a DTLS handshake that failed with err after
// the client named its PSK identity: unknown (not in the devices file,
// or without a key there) or, for a device with a key, most likely a
// wrong key (the server cannot tell it from a client that went away
// after its key exchange). One that failed before is only counted.
func (l *peerListener) handshakeRefused(dc *piondtls.Conn, err error) {
	st, ok := dc.ConnectionState()
	if !ok || len(st.IdentityHint) == 0 {
		return
	}
	r := gateway.Refusal{Protocol: "coap", Device: string(st.IdentityHint), Remote: dc.RemoteAddr().String(), At: l.now(),
		Reason: gateway.RefusedUnknownDevice, Detail: "DTLS PSK identity not in the devices file"}
	cr := l.creds()
	keyed := false
	if cr != nil {
		_, _, kerr := cr.PSK(st.IdentityHint)
		keyed = kerr == nil
	}
	switch {
	case keyed:
		r.Reason, r.Detail = gateway.RefusedBadCredentials, "DTLS handshake failed after the PSK identity (wrong key?): "+err.Error()
	case cr != nil && cr.Revision(gateway.DeviceID(st.IdentityHint)) != "":
		r.Reason, r.Detail = gateway.RefusedBadCredentials, "DTLS handshake of a device without a psk in the devices file"
	}
	l.refusals.Refuse(r)
}

// pskIdentity is the PSK identity DTLS peer cc shook hands with, nil
// before its handshake.
func pskIdentity(cc *udpClient.Conn) []byte {
	if pc, ok := cc.NetConn().(*peerConn); ok {
		if st, ok := pc.ConnectionState(); ok {
			return st.IdentityHint
		}
	}
	return nil
}

// Close stops accepting.
func (l *peerListener) Close() error {
	l.closed.Store(true)
	return l.Listener.Close()
}

// peerConn is a DTLS peer; its gate peer holds its slot until closed.
type peerConn struct {
	*piondtls.Conn
	gated   *peer
	metrics *metrics
	l       *peerListener
	creds   func() gateway.Credentials
	// shook, device and rev (guarded by l.mu): the handshake's device and
	// its credentials revision then, for revocation.
	shook  bool
	device gateway.DeviceID
	rev    string
	// busy counts the requests being answered: the idle timeout leaves
	// the session live until they are (a data request waits up to
	// dataTimeout for the disk, longer than a short idle timeout), and
	// its next check parks it.
	busy atomic.Int32
}

// Close closes the connection (and so its gate peer).
func (c *peerConn) Close() error {
	c.l.mu.Lock()
	delete(c.l.peers, c)
	c.l.mu.Unlock()
	return c.Conn.Close()
}

// HandshakeContext runs the handshake (go-coap bounds ctx with the
// handshake timeout) and counts a failure.
func (c *peerConn) HandshakeContext(ctx context.Context) error {
	err := c.Conn.HandshakeContext(ctx)
	c.gated.endHandshake()
	if err != nil {
		c.metrics.drop(dropHandshake)
		c.l.handshakeRefused(c.Conn, err)
		return fmt.Errorf("dtls handshake: %w", err)
	}
	if st, ok := c.ConnectionState(); ok {
		if cr := c.creds(); cr != nil {
			if dev, _, err := cr.PSK(st.IdentityHint); err == nil {
				c.l.mu.Lock()
				c.shook, c.device, c.rev = true, dev, cr.Revision(dev)
				c.l.mu.Unlock()
			}
		}
	}
	return nil
}

// sweep is go-coap's periodic runner for the DTLS server: every
// sweepInterval it calls f, which closes idle peer connections and
// releases closed ones, until f reports the server stopped or Close is
// called.
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
			case <-s.ctx.Done():
				return
			case now := <-t.C:
				if !f(now) {
					return
				}
			}
		}
	}()
}

// dtlsProcessor returns the go-coap hook through which the DTLS transport
// hands received messages to the front end. Requests are answered here
// directly rather than through go-coap's default path, which answers a
// NON request with a CON and caches every response per peer for
// EXCHANGE_LIFETIME (247 s); as over UDP, a duplicate of an idempotent
// heartbeat is processed again. Everything that is not a request (stray
// responses, ACKs) takes go-coap's path to ignore.
func (s *Server) dtlsProcessor() config.ProcessReceivedMessageFunc[*udpClient.Conn] {
	return func(req *pool.Message, cc *udpClient.Conn, next config.HandlerFunc[*udpClient.Conn]) {
		h := header{typ: req.Type(), code: req.Code()}
		if !h.isRequest() {
			cc.ProcessReceivedMessageWithHandler(req, next)
			return
		}
		if !s.enter() {
			cc.ReleaseMessage(req)
			return
		}
		defer s.work.Done()
		if pc, ok := cc.NetConn().(*peerConn); ok {
			pc.busy.Add(1)
			defer pc.busy.Add(-1)
		}
		cc.ProcessReceivedMessageWithHandler(req, func(w *responsewriter.ResponseWriter[*udpClient.Conn], r *pool.Message) {
			respondDTLS(s, w, r, cc.RemoteAddr(), pskIdentity(cc), cc.GetMessageID)
		})
	}
}

// ignore is go-coap's handler for what dtlsProcessor passes on: messages
// that are not requests. Leaving the answer unset makes go-coap send
// nothing, or an empty ACK for a CON, instead of its default handler's
// 4.04 sent as a CON.
func ignore(*responsewriter.ResponseWriter[*udpClient.Conn], *pool.Message) {}

// respondDTLS fills in the answer to request r of the DTLS session with
// PSK identity psk (nil before the handshake) at peer: piggybacked on
// the ACK of a CON request, a NON numbered by mid for a NON request. A
// DTLS peer is proven: its answer may be larger than its request, up to
// the largest message (a command). A live session's go-coap connection
// and a parked session's record layer (parked.go) both answer here.
func respondDTLS[C responsewriter.Client](s *Server, w *responsewriter.ResponseWriter[C], r *pool.Message, peer net.Addr, psk []byte, mid func() int32) {
	now := s.clock.Now()
	a := s.answerDTLS(r, peer, psk, now)
	s.metrics.answered(a.code)
	resp := w.Message()
	// SetResponse refuses codes the request's No-Response option (RFC
	// 7967) suppresses; a CON request then still gets an empty ACK.
	if w.SetResponse(a.code, message.TextPlain, nil) != nil {
		if r.Type() == message.NonConfirmable {
			return
		}
		resp.SetCode(codes.Empty)
		resp.SetToken(nil)
	} else {
		m := message.Message{Token: r.Token()}
		s.metrics.carried(a.build(&m, s.maxSize, &scratch{}))
		resp.ResetOptionsTo(m.Options)
		if len(m.Payload) > 0 {
			resp.SetBody(bytes.NewReader(m.Payload))
		}
	}
	if r.Type() == message.Confirmable {
		resp.SetType(message.Acknowledgement)
		resp.SetMessageID(r.MessageID())
		return
	}
	resp.SetType(message.NonConfirmable)
	resp.SetMessageID(mid())
}

// answerDTLS decides the answer to request r of the DTLS session with
// PSK identity psk at peer: the rate limit of proven sources (the
// session's keys prove r's source), the size limit, then the device of
// the session's PSK identity (asked again, so that a device removed by a
// reload is refused at once), then the request; a data path request
// waits for its data worker.
func (s *Server) answerDTLS(r *pool.Message, peer net.Addr, psk []byte, now time.Time) answer {
	if ok, wait := s.proven.allow(endpointOf(peer), now); !ok {
		return answer{code: codes.TooManyRequests, diag: "too many requests, retry after Max-Age",
			opt: uintOption{message.MaxAge, uint32((wait + time.Second - 1) / time.Second)}}
	}
	if requestSize(r) > s.maxSize {
		return answer{code: codes.RequestEntityTooLarge, diag: fmt.Sprintf("message larger than %d bytes", s.maxSize),
			opt: uintOption{message.Size1, uint32(s.maxSize)}}
	}
	device, err := s.identity(psk)
	if err != nil {
		s.logRefusal(codes.Unauthorized, intent{}, string(psk), peer.String(), err)
		return answer{code: codes.Unauthorized, diag: "unauthorized"}
	}
	var path []string
	for _, o := range r.Options() {
		if o.ID == message.URIPath {
			path = append(path, string(o.Value))
		}
	}
	queries, err := r.Queries()
	if err != nil && !errors.Is(err, message.ErrOptionNotFound) {
		return answer{code: codes.BadRequest, diag: "malformed Uri-Query"}
	}
	rq, err := s.admit(r.Code(), path, queries, device, now)
	if err != nil {
		a := refusal(err)
		s.logRefusal(a.code, rq, device, peer.String(), err)
		return a
	}
	ctx, cancel := context.WithTimeout(s.ctx, observeTimeout)
	defer cancel()
	if s.viaWorkers(rq, now) {
		done := make(chan answer, 1)
		j := &job{rq: rq, now: now, deadline: time.Now().Add(dataTimeout), src: endpointOf(peer), done: done}
		if rq.data {
			payload, err := r.ReadBody()
			if err != nil {
				return answer{code: codes.BadRequest, diag: "unreadable payload"}
			}
			cf, cfErr := r.GetOptionUint32(message.ContentFormat)
			j.msg = dataMessage(rq, r.Type(), payload, cf, cfErr == nil, now)
			if err := gateway.ValidateMessage(j.msg); err != nil {
				a, reason := publishRefusal(err)
				s.metrics.refused(reason)
				s.logRefusal(a.code, rq, "", peer.String(), err)
				return a
			}
		}
		if a := s.dispatch(ctx, j); a != nil {
			return *a
		}
		return <-done
	}
	a, err := s.serve(ctx, rq, nil, false, now, false)
	if err != nil {
		s.logRefusal(a.code, rq, "", peer.String(), err)
	}
	return a
}

// requestSize is the encoded size of request r: what it took in the DTLS
// record.
func requestSize(r *pool.Message) int {
	n, err := coder.DefaultCoder.Size(message.Message{Token: r.Token(), Options: r.Options()})
	if err != nil {
		return math.MaxInt
	}
	if body, err := r.BodySize(); err == nil && body > 0 {
		n += 1 + int(body) // payload marker and payload
	}
	return n
}

// identity is the device of the PSK identity psk a DTLS session shook
// hands with (nil: none yet), according to the current credentials.
func (s *Server) identity(psk []byte) (string, error) {
	if psk == nil {
		return "", errors.New("identity: handshake not done")
	}
	c := s.creds.Load()
	if c == nil {
		return "", fmt.Errorf("identity: %w", gateway.ErrUnauthorized)
	}
	dev, _, err := c.PSK(psk)
	if err != nil {
		return "", fmt.Errorf("identity: %w", err)
	}
	return string(dev), nil
}

// credentials are the current credentials, nil without any.
func (s *Server) credentials() gateway.Credentials {
	if c := s.creds.Load(); c != nil {
		return c.Credentials
	}
	return nil
}
