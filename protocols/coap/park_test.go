package coap

import (
	"bytes"
	"context"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	piondtls "github.com/pion/dtls/v3"
	"github.com/plgd-dev/go-coap/v3/dtls"
	"github.com/plgd-dev/go-coap/v3/message"
	"github.com/plgd-dev/go-coap/v3/message/codes"
	"github.com/plgd-dev/go-coap/v3/options"
	"github.com/plgd-dev/go-coap/v3/pkg/runner/periodic"
	"github.com/plgd-dev/go-coap/v3/udp/client"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/fleetgate/fleetgate/gateway"
)

// tapConn is a client's UDP socket that keeps a copy of every datagram
// it sends, for a replay.
type tapConn struct {
	*net.UDPConn
	mu   sync.Mutex
	sent [][]byte
}

func (c *tapConn) WriteTo(b []byte, addr net.Addr) (int, error) {
	c.mu.Lock()
	c.sent = append(c.sent, append([]byte(nil), b...))
	c.mu.Unlock()
	return c.UDPConn.WriteTo(b, addr)
}

// lastSent is the last datagram the client sent.
func (c *tapConn) lastSent() []byte {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.sent[len(c.sent)-1]
}

// keptSession is a device that keeps its DTLS session however long it is
// silent (as constrained devices do): a pion client on its own socket,
// with go-coap over it and no keep-alive of its own.
func keptSession(t *testing.T, s *Server, identity string) (*client.Conn, *tapConn) {
	t.Helper()
	return keptSessionWith(t, s, identity, piondtls.TLS_PSK_WITH_AES_128_CCM_8)
}

// keptSessionWith is keptSession under cipher suite suite.
func keptSessionWith(t *testing.T, s *Server, identity string, suite piondtls.CipherSuiteID) (*client.Conn, *tapConn) {
	t.Helper()
	c, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	tap := &tapConn{UDPConn: c}
	dc, err := piondtls.Client(tap, s.DTLSAddr(), &piondtls.Config{
		PSK:             func([]byte) ([]byte, error) { return testDevices[identity].key, nil },
		PSKIdentityHint: []byte(identity),
		CipherSuites:    []piondtls.CipherSuiteID{suite},
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := dc.HandshakeContext(ctx); err != nil {
		t.Fatalf("handshake: %v", err)
	}
	stop := make(chan struct{})
	cc := dtls.Client(dc, options.WithPeriodicRunner(periodic.New(stop, time.Second)), options.WithErrors(func(error) {}),
		options.WithCloseSocket())
	t.Cleanup(func() { _ = cc.Close(); close(stop) })
	return cc, tap
}

func counterValue(c prometheus.Counter) float64 {
	var m dto.Metric
	if err := c.Write(&m); err != nil {
		return -1
	}
	return m.GetCounter().GetValue()
}

// waitParked waits until n sessions are parked.
func waitParked(t *testing.T, s *Server, n float64) {
	t.Helper()
	eventually(t, 10*time.Second, "the idle session to be parked", func() bool { return testutilGauge(s.metrics.dtlsParked) == n })
}

// A device that keeps its session through a silence longer than the idle
// timeout is answered at once when it sends again: its session was
// parked (freeing its peer slot), and its heartbeats, several in a row,
// are answered by the parked session itself with the parked keys: no
// handshake (no new HelloVerifyRequest), no resumption, no peer slot.
func TestDTLSParkedSessionAnswers(t *testing.T) {
	rec := &recorder{}
	s := startDTLS(t, rec, Options{DTLSIdleTimeout: 200 * time.Millisecond})
	cc, _ := keptSession(t, s, "id-1")
	if r := request(t, cc, message.Confirmable, codes.POST, "/hb"); r.code != codes.Changed {
		t.Fatalf("first heartbeat: %v", r.code)
	}
	waitParked(t, s, 1)
	// the session is parked before its connection's close frees the slot
	eventually(t, 5*time.Second, "the parked session's peer slot to be freed", func() bool { return testutilGauge(s.metrics.dtlsPeers) == 0 })
	hellos := counterValue(s.metrics.helloVerify)
	for i, typ := range []message.Type{message.Confirmable, message.NonConfirmable, message.Confirmable} {
		if r := request(t, cc, typ, codes.POST, "/hb"); r.code != codes.Changed || r.maxAge <= 0 {
			t.Fatalf("heartbeat %d after the silence: %v, Max-Age %d", i, r.code, r.maxAge)
		}
	}
	if got := counterValue(s.metrics.helloVerify); got != hellos {
		t.Fatalf("%v HelloVerifyRequests after the silence, want none (no new handshake)", got-hellos)
	}
	if got := counterValue(s.metrics.dtlsResumed); got != 0 {
		t.Fatalf("%v resumptions, want none", got)
	}
	eventually(t, 5*time.Second, "three parked answers", func() bool { return counterValue(s.metrics.parkedAnswered) == 3 })
	if n, peers := testutilGauge(s.metrics.dtlsParked), testutilGauge(s.metrics.dtlsPeers); n != 1 || peers != 0 {
		t.Fatalf("%v parked, %v peers; want the session still parked, no peer", n, peers)
	}
	if evs := rec.Evidence(); len(evs) != 4 || evs[3].Device != "dev-1" || evs[3].Kind != gateway.Renew {
		t.Fatalf("evidence %+v", evs)
	}
}

// The other suite the server allows, AES-128-GCM, is answered parked
// too.
func TestDTLSParkedSessionAnswersGCM(t *testing.T) {
	rec := &recorder{}
	s := startDTLS(t, rec, Options{DTLSIdleTimeout: 200 * time.Millisecond})
	cc, _ := keptSessionWith(t, s, "id-1", piondtls.TLS_PSK_WITH_AES_128_GCM_SHA256)
	if r := request(t, cc, message.Confirmable, codes.POST, "/hb"); r.code != codes.Changed {
		t.Fatalf("first heartbeat: %v", r.code)
	}
	waitParked(t, s, 1)
	for range 2 {
		if r := request(t, cc, message.Confirmable, codes.POST, "/hb"); r.code != codes.Changed {
			t.Fatalf("heartbeat on the parked session: %v", r.code)
		}
	}
	if n, m := counterValue(s.metrics.parkedAnswered), counterValue(s.metrics.dtlsResumed); n != 2 || m != 0 {
		t.Fatalf("%v parked answers, %v resumptions; want 2, none", n, m)
	}
}

// armedObserver blocks the evidence of one device, once armed, until
// released; all evidence goes to rec.
type armedObserver struct {
	rec     *recorder
	device  gateway.DeviceID
	armed   atomic.Bool
	entered chan struct{}
	release chan struct{}
}

func (o *armedObserver) Observe(ctx context.Context, ev gateway.Evidence) error {
	if o.armed.Load() && ev.Device == o.device {
		o.entered <- struct{}{}
		select {
		case <-o.release:
		case <-ctx.Done():
		}
	}
	return o.rec.Observe(ctx, ev)
}

// A parked heartbeat whose Observer blocks holds one of the record
// layer's workers, not the DTLS socket's reader: another device's parked
// heartbeat is answered meanwhile, and the blocked one when the Observer
// returns.
func TestDTLSParkedAnswerDoesNotBlockTheReader(t *testing.T) {
	obs := &armedObserver{rec: &recorder{}, device: "dev-2", entered: make(chan struct{}, 1), release: make(chan struct{})}
	s := startDTLS(t, obs, Options{DTLSIdleTimeout: 200 * time.Millisecond})
	slow, _ := keptSession(t, s, "id-2")
	fast, _ := keptSession(t, s, "id-1")
	for _, cc := range []*client.Conn{slow, fast} {
		if r := request(t, cc, message.Confirmable, codes.POST, "/hb"); r.code != codes.Changed {
			t.Fatalf("heartbeat: %v", r.code)
		}
	}
	waitParked(t, s, 2)
	obs.armed.Store(true)
	slowDone := make(chan codes.Code, 1)
	go func() {
		code, _ := tryRequest(slow, 10*time.Second, codes.POST)
		slowDone <- code
	}()
	<-obs.entered
	begin := time.Now()
	if r := request(t, fast, message.Confirmable, codes.POST, "/hb"); r.code != codes.Changed {
		t.Fatalf("the other device's heartbeat: %v", r.code)
	}
	if took := time.Since(begin); took > observeTimeout/2 {
		t.Fatalf("the other device answered after %v, behind the blocked Observer", took)
	}
	close(obs.release)
	if code := <-slowDone; code != codes.Changed {
		t.Fatalf("the blocked heartbeat: %v", code)
	}
}

// A record sent again from the device's address (a replay) is no
// evidence: neither one captured before the session was parked nor one
// the parked session already answered. The parked session refuses both
// (numbered below the highest it received), counts them, resumes
// nothing, and still answers the device's own next record.
func TestDTLSParkedSessionRefusesAReplay(t *testing.T) {
	rec := &recorder{}
	s := startDTLS(t, rec, Options{DTLSIdleTimeout: 200 * time.Millisecond})
	cc, tap := keptSession(t, s, "id-1")
	if r := request(t, cc, message.NonConfirmable, codes.POST, "/hb"); r.code != codes.Changed {
		t.Fatalf("heartbeat: %v", r.code)
	}
	live := tap.lastSent()
	waitParked(t, s, 1)
	if r := request(t, cc, message.NonConfirmable, codes.POST, "/hb"); r.code != codes.Changed {
		t.Fatalf("heartbeat on the parked session: %v", r.code)
	}
	parked := tap.lastSent()
	eventually(t, 5*time.Second, "the session to be parked again", func() bool { return testutilGauge(s.metrics.dtlsParked) == 1 })
	for i, b := range [][]byte{live, parked, parked} {
		if _, err := tap.UDPConn.WriteTo(b, s.DTLSAddr()); err != nil {
			t.Fatal(err)
		}
		eventually(t, 5*time.Second, "the replay to be refused", func() bool {
			return counterValue(s.metrics.parkedRefused[parkedReplayed]) == float64(i+1)
		})
	}
	if evs := rec.Evidence(); len(evs) != 2 {
		t.Fatalf("evidence after the replays %+v, want the two heartbeats only", evs)
	}
	if n := counterValue(s.metrics.dtlsResumed); n != 0 {
		t.Fatalf("%v resumptions by replays, want none", n)
	}
	if r := request(t, cc, message.Confirmable, codes.POST, "/hb"); r.code != codes.Changed {
		t.Fatalf("the device's next heartbeat: %v", r.code)
	}
	if evs := rec.Evidence(); len(evs) != 3 {
		t.Fatalf("evidence %+v, want three heartbeats", evs)
	}
}

// A forged record from a parked session's address (its tag does not
// authenticate) is refused and counted; the session stays parked and
// answers the device.
func TestDTLSParkedSessionRefusesAForgery(t *testing.T) {
	rec := &recorder{}
	s := startDTLS(t, rec, Options{DTLSIdleTimeout: 200 * time.Millisecond})
	cc, tap := keptSession(t, s, "id-1")
	if r := request(t, cc, message.Confirmable, codes.POST, "/hb"); r.code != codes.Changed {
		t.Fatalf("heartbeat: %v", r.code)
	}
	waitParked(t, s, 1)
	forged := bytes.Clone(tap.lastSent())
	forged[10] += 10 // a later record number
	forged[len(forged)-1] ^= 1
	if _, err := tap.UDPConn.WriteTo(forged, s.DTLSAddr()); err != nil {
		t.Fatal(err)
	}
	eventually(t, 5*time.Second, "the forgery to be refused", func() bool {
		return counterValue(s.metrics.parkedRefused[parkedUnauthentic]) == 1
	})
	if r := request(t, cc, message.Confirmable, codes.POST, "/hb"); r.code != codes.Changed {
		t.Fatalf("the device's next heartbeat: %v", r.code)
	}
	if evs := rec.Evidence(); len(evs) != 2 || counterValue(s.metrics.dtlsResumed) != 0 {
		t.Fatalf("evidence %+v, %v resumptions; want two heartbeats, none", evs, counterValue(s.metrics.dtlsResumed))
	}
}

// A request a parked session does not answer itself (here GET /hb,
// after two parked heartbeats) resumes it: pion's connection is rebuilt
// from the parked state with the record numbers the parked answers
// advanced, so the device's pion client, whose replay detection drops a
// record number it has seen, takes the resumed session's answers; and the
// session keeps working both ways, then parks again.
func TestDTLSParkedSessionFallsBackToResumption(t *testing.T) {
	rec := &recorder{}
	s := startDTLS(t, rec, Options{DTLSIdleTimeout: 300 * time.Millisecond})
	cc, _ := keptSession(t, s, "id-1")
	if r := request(t, cc, message.Confirmable, codes.POST, "/hb"); r.code != codes.Changed {
		t.Fatalf("heartbeat: %v", r.code)
	}
	waitParked(t, s, 1)
	for range 2 {
		if r := request(t, cc, message.Confirmable, codes.POST, "/hb"); r.code != codes.Changed {
			t.Fatalf("parked heartbeat: %v", r.code)
		}
	}
	if r := request(t, cc, message.Confirmable, codes.GET, "/hb"); r.code != codes.MethodNotAllowed {
		t.Fatalf("GET /hb on the parked session: %v, want 4.05", r.code)
	}
	if n := counterValue(s.metrics.dtlsResumed); n != 1 {
		t.Fatalf("%v resumptions, want 1", n)
	}
	for range 2 { // on the resumed live session
		if r := request(t, cc, message.NonConfirmable, codes.POST, "/hb"); r.code != codes.Changed {
			t.Fatalf("heartbeat on the resumed session: %v", r.code)
		}
	}
	if n := counterValue(s.metrics.parkedAnswered); n != 2 {
		t.Fatalf("%v parked answers, want the 2 before the resumption", n)
	}
	waitParked(t, s, 1)
	if r := request(t, cc, message.Confirmable, codes.POST, "/hb"); r.code != codes.Changed {
		t.Fatalf("heartbeat parked again: %v", r.code)
	}
	if n := counterValue(s.metrics.parkedAnswered); n != 3 {
		t.Fatalf("%v parked answers, want 3", n)
	}
	if evs := rec.Evidence(); len(evs) != 6 {
		t.Fatalf("evidence %+v, want six heartbeats", evs)
	}
}

// A device whose credentials changed after its session was parked is
// refused by the parked session even before the reload's revocation
// reaches the parked sessions: no answer, no evidence, a refusal
// reported, and the session is not parked again.
func TestDTLSParkedSessionChecksRevision(t *testing.T) {
	rec, refusals := &recorder{}, &refusalLog{}
	s := startDTLS(t, rec, Options{DTLSIdleTimeout: 200 * time.Millisecond, Refusals: refusals})
	cc, _ := keptSession(t, s, "id-1")
	if r := request(t, cc, message.Confirmable, codes.POST, "/hb"); r.code != codes.Changed {
		t.Fatalf("heartbeat: %v", r.code)
	}
	waitParked(t, s, 1)
	// the new key, without the revocation SetCredentials would run
	s.creds.Store(&credentials{pskTable{"id-1": {device: "dev-1", key: []byte("a new key, 16 b.")}}})
	if code, err := tryRequest(cc, time.Second, codes.POST); err == nil {
		t.Fatalf("revoked device on its parked session: %v, want no answer", code)
	}
	if r := refusals.wait(t, "dev-1", 5*time.Second); r.Reason != gateway.RefusedRevoked {
		t.Fatalf("refusal %+v, want revoked", r)
	}
	if n, evs := testutilGauge(s.metrics.dtlsParked), rec.Evidence(); n != 0 || len(evs) != 1 {
		t.Fatalf("%v parked, evidence %+v; want none parked, the first heartbeat only", n, evs)
	}
}

// A devices file reload that removes a device (or changes its key) drops
// its parked session too: its next record resumes nothing.
func TestDTLSParkedSessionRevoked(t *testing.T) {
	rec := &recorder{}
	s := startDTLS(t, rec, Options{DTLSIdleTimeout: 200 * time.Millisecond})
	gone, _ := keptSession(t, s, "id-2")
	kept, _ := keptSession(t, s, "id-1")
	for _, cc := range []*client.Conn{gone, kept} {
		if r := request(t, cc, message.Confirmable, codes.POST, "/hb"); r.code != codes.Changed {
			t.Fatalf("heartbeat: %v", r.code)
		}
	}
	waitParked(t, s, 2)
	s.SetCredentials(pskTable{"id-1": testDevices["id-1"]})
	if n := testutilGauge(s.metrics.dtlsParked); n != 1 {
		t.Fatalf("%v parked sessions after the reload, want 1", n)
	}
	if code, err := tryRequest(gone, 2*time.Second, codes.POST); err == nil {
		t.Fatalf("removed device on its parked session: %v, want no answer", code)
	}
	if r := request(t, kept, message.Confirmable, codes.POST, "/hb"); r.code != codes.Changed {
		t.Fatalf("kept device: %v", r.code)
	}
	if n := counterValue(s.metrics.parkedAnswered); n != 1 {
		t.Fatalf("%v parked answers, want 1 (the kept device's)", n)
	}
}

// With parking off (limits.dtls_max_parked: 0) an idle session is closed
// for good, as before: a device that kept it gets no answer and must
// shake hands again.
func TestDTLSParkingOff(t *testing.T) {
	s := startDTLS(t, &recorder{}, Options{DTLSIdleTimeout: 200 * time.Millisecond, MaxDTLSParked: -1})
	cc, _ := keptSession(t, s, "id-1")
	if r := request(t, cc, message.Confirmable, codes.POST, "/hb"); r.code != codes.Changed {
		t.Fatalf("heartbeat: %v", r.code)
	}
	eventually(t, 10*time.Second, "the idle session to close", func() bool { return testutilGauge(s.metrics.dtlsPeers) == 0 })
	if code, err := tryRequest(cc, 2*time.Second, codes.POST); err == nil {
		t.Fatalf("heartbeat on a closed session: %v, want no answer", code)
	}
	if n, m := counterValue(s.metrics.parkedAnswered), counterValue(s.metrics.dtlsResumed); n != 0 || m != 0 {
		t.Fatalf("%v parked answers, %v resumptions with parking off", n, m)
	}
}

// The parked sessions are bounded: beyond maxParked the oldest leaves,
// and one older than parkTTL is not resumed (pure bookkeeping, on the
// gate's maps).
func TestParkedBounds(t *testing.T) {
	m, err := newMetrics(prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	g, err := newGate("127.0.0.1:0", 16, 2, m, func() {}, time.Now)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = gatedListener{g}.Close() })
	at := time.Unix(1_700_000_000, 0)
	addr := func(port uint16) netip.AddrPort { return netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), port) }
	for i, port := range []uint16{1, 2, 3} {
		g.park(addr(port), parkedSession{device: "d", at: at.Add(time.Duration(i) * time.Second)})
	}
	g.mu.Lock()
	_, oldest := g.parked[addr(1)]
	n := len(g.parked)
	g.mu.Unlock()
	if oldest || n != 2 {
		t.Fatalf("%d parked, the oldest kept %v; want 2, the oldest dropped", n, oldest)
	}
	g.park(addr(2), parkedSession{device: "d", at: at.Add(parkTTL + 3*time.Second)}) // parked again, later
	g.mu.Lock()
	_, three := g.parked[addr(3)]
	_, two := g.parked[addr(2)]
	n = len(g.parked)
	g.mu.Unlock()
	if three || !two || n != 1 {
		t.Fatalf("after parkTTL: %d parked (3: %v, 2: %v), want only the one parked again", n, three, two)
	}
	if v := testutilGauge(m.dtlsParked); v != 1 {
		t.Fatalf("gauge %v, want 1", v)
	}
}

// Parking one address again and again, behind an old parked session,
// keeps one entry per parked session: the parking order does not grow
// with the re-parkings (100,000 devices parking every heartbeat).
func TestParkedOrderStaysBounded(t *testing.T) {
	m, err := newMetrics(prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	g, err := newGate("127.0.0.1:0", 16, 10, m, func() {}, time.Now)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = gatedListener{g}.Close() })
	at := time.Unix(1_700_000_000, 0)
	lo := netip.MustParseAddr("127.0.0.1")
	g.park(netip.AddrPortFrom(lo, 1), parkedSession{device: "sleepy", at: at})
	for i := range 1000 {
		g.park(netip.AddrPortFrom(lo, 2), parkedSession{device: "busy", at: at.Add(time.Duration(i) * time.Second)})
	}
	g.mu.Lock()
	n, order := len(g.parked), g.order.Len()
	g.mu.Unlock()
	if n != 2 || order != 2 {
		t.Fatalf("%d parked, %d in the parking order; want 2 and 2", n, order)
	}
}

// A session still answering a request when its idle timeout comes (a
// data request waiting for the disk to commit, here 1.3 s: past a sweep
// and the 100-ms idle timeout, inside dataTimeout) stays live until the
// answer has left: the answer goes on it, with no resumption and the
// message published once, and the session is parked after.
func TestDTLSBusySessionNotParked(t *testing.T) {
	s, k, _ := startData(t, &recorder{}, Options{DTLS: "127.0.0.1:0", Credentials: testDevices, DTLSIdleTimeout: 100 * time.Millisecond})
	cc, _ := keptSession(t, s, "id-1")
	release := k.Hold()
	held := time.AfterFunc(1300*time.Millisecond, release)
	defer held.Stop()
	if a := post(t, cc, message.Confirmable, codes.POST, "/d/x", []byte("1"), noCF); a.code != codes.Changed {
		t.Fatalf("data request answered %v", a.code)
	}
	if got := counterValue(s.metrics.dtlsResumed); got != 0 {
		t.Fatalf("%v resumptions: the session was parked while its request was being answered", got)
	}
	if msgs := k.Take(); len(msgs) != 1 {
		t.Fatalf("published %d messages, want 1", len(msgs))
	}
	waitParked(t, s, 1)
}
