package coap

import (
	"context"
	"net"
	"net/netip"
	"sync"
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
	c, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	tap := &tapConn{UDPConn: c}
	dc, err := piondtls.Client(tap, s.DTLSAddr(), &piondtls.Config{
		PSK:             func([]byte) ([]byte, error) { return testDevices[identity].key, nil },
		PSKIdentityHint: []byte(identity),
		CipherSuites:    []piondtls.CipherSuiteID{piondtls.TLS_PSK_WITH_AES_128_CCM_8},
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
// parked and is resumed by its record, with no handshake (no new
// HelloVerifyRequest), and it frees its peer slot meanwhile.
func TestDTLSParkedSessionResumes(t *testing.T) {
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
	for i := range 3 {
		if r := request(t, cc, message.Confirmable, codes.POST, "/hb"); r.code != codes.Changed {
			t.Fatalf("heartbeat %d after the silence: %v", i, r.code)
		}
		if i == 0 {
			waitParked(t, s, 1) // silent again: parked again
		}
	}
	if got := counterValue(s.metrics.helloVerify); got != hellos {
		t.Fatalf("%v HelloVerifyRequests after the silence, want none (no new handshake)", got-hellos)
	}
	if got := counterValue(s.metrics.dtlsResumed); got != 2 {
		t.Fatalf("%v resumptions, want 2", got)
	}
	if evs := rec.Evidence(); len(evs) != 4 || evs[3].Device != "dev-1" || evs[3].Kind != gateway.Renew {
		t.Fatalf("evidence %+v", evs)
	}
}

// A record captured before the session was parked and sent again after
// it (a replay from the device's address) is no evidence: the resumed
// session refuses every record numbered below the highest it received.
// The device's own next record is still answered.
func TestDTLSParkedSessionRefusesAReplay(t *testing.T) {
	rec := &recorder{}
	s := startDTLS(t, rec, Options{DTLSIdleTimeout: 200 * time.Millisecond})
	cc, tap := keptSession(t, s, "id-1")
	if r := request(t, cc, message.NonConfirmable, codes.POST, "/hb"); r.code != codes.Changed {
		t.Fatalf("heartbeat: %v", r.code)
	}
	captured := tap.lastSent()
	waitParked(t, s, 1)
	if _, err := tap.UDPConn.WriteTo(captured, s.DTLSAddr()); err != nil {
		t.Fatal(err)
	}
	eventually(t, 5*time.Second, "the replay to resume the session", func() bool { return counterValue(s.metrics.dtlsResumed) == 1 })
	time.Sleep(300 * time.Millisecond)
	if evs := rec.Evidence(); len(evs) != 1 {
		t.Fatalf("evidence after the replay %+v, want the first heartbeat only", evs)
	}
	if r := request(t, cc, message.Confirmable, codes.POST, "/hb"); r.code != codes.Changed {
		t.Fatalf("the device's next heartbeat: %v", r.code)
	}
	if evs := rec.Evidence(); len(evs) != 2 {
		t.Fatalf("evidence %+v, want two heartbeats", evs)
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
	if n := counterValue(s.metrics.dtlsResumed); n != 1 {
		t.Fatalf("%v resumptions, want 1 (the kept device's)", n)
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
