package coap

import (
	"bytes"
	"context"
	"net"
	"testing"
	"time"

	piondtls "github.com/pion/dtls/v3"
	dtlsnet "github.com/pion/dtls/v3/pkg/net"
	"github.com/plgd-dev/go-coap/v3/dtls"
	"github.com/plgd-dev/go-coap/v3/message"
	"github.com/plgd-dev/go-coap/v3/message/codes"
	"github.com/plgd-dev/go-coap/v3/options"
	"github.com/plgd-dev/go-coap/v3/pkg/runner/periodic"
	udpClient "github.com/plgd-dev/go-coap/v3/udp/client"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/fleetgate/fleetgate/gateway"
	"github.com/fleetgate/fleetgate/gateway/clocktest"
)

// pskEntry is a device's entry in the test's devices table.
type pskEntry struct {
	device gateway.DeviceID
	key    []byte
}

// pskTable is the test's gateway.Credentials: PSK identity → device and key.
type pskTable map[string]pskEntry

var _ gateway.Credentials = pskTable(nil)

func (pskTable) CheckPassword(gateway.DeviceID, []byte) error { return gateway.ErrUnauthorized }

// Revision is the key of device, "" when no identity names it.
func (p pskTable) Revision(device gateway.DeviceID) string {
	for _, e := range p {
		if e.device == device {
			return string(e.key)
		}
	}
	return ""
}

func (p pskTable) PSK(identity []byte) (gateway.DeviceID, []byte, error) {
	e, ok := p[string(identity)]
	if !ok {
		return "", nil, gateway.ErrUnauthorized
	}
	return e.device, e.key, nil
}

var testDevices = pskTable{
	"id-1": {device: "dev-1", key: []byte("sixteen byte key")},
	"id-2": {device: "dev-2", key: []byte("another key here")},
}

// startDTLS runs a server with plain UDP and DTLS on free loopback ports.
func startDTLS(t testing.TB, obs gateway.Observer, o Options) *Server {
	t.Helper()
	o.DTLS = "127.0.0.1:0"
	if o.Credentials == nil {
		o.Credentials = testDevices
	}
	return startServer(t, obs, o)
}

// handshake shakes hands with s's DTLS port as a device with a PSK
// identity and key, within timeout.
func handshake(t testing.TB, s *Server, identity string, key []byte, timeout time.Duration) (*piondtls.Conn, error) {
	t.Helper()
	c, err := net.DialUDP("udp", nil, s.DTLSAddr().(*net.UDPAddr))
	if err != nil {
		t.Fatalf("dial: %v", err)
	}
	dc, err := piondtls.Client(dtlsnet.PacketConnFromConn(c), c.RemoteAddr(), &piondtls.Config{
		PSK:             func([]byte) ([]byte, error) { return key, nil },
		PSKIdentityHint: []byte(identity),
		CipherSuites:    []piondtls.CipherSuiteID{piondtls.TLS_PSK_WITH_AES_128_CCM_8},
	})
	if err != nil {
		_ = c.Close()
		t.Fatalf("dtls client: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	if err := dc.HandshakeContext(ctx); err != nil {
		_ = dc.Close()
		_ = c.Close()
		return nil, err
	}
	return dc, nil
}

// dialDTLS opens a go-coap DTLS client to s with a PSK identity and key
// (which must be good) whose background goroutines end with the test.
func dialDTLS(t testing.TB, s *Server, identity string, key []byte) *udpClient.Conn {
	t.Helper()
	dc, err := handshake(t, s, identity, key, 10*time.Second)
	if err != nil {
		t.Fatalf("handshake as %s: %v", identity, err)
	}
	stop := make(chan struct{})
	cc := dtls.Client(dc,
		options.WithPeriodicRunner(periodic.New(stop, time.Second)),
		options.WithErrors(func(error) {}),
		options.WithCloseSocket())
	t.Cleanup(func() {
		_ = cc.Close()
		close(stop)
	})
	return cc
}

// tryRequest is request without failing the test on a transport error.
func tryRequest(cc *udpClient.Conn, timeout time.Duration, code codes.Code, queries ...string) (codes.Code, error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	req := cc.AcquireMessage(ctx)
	defer cc.ReleaseMessage(req)
	token, err := cc.GetToken()
	if err != nil {
		return 0, err
	}
	req.SetCode(code)
	req.SetToken(token)
	req.SetType(message.Confirmable)
	if err := req.SetPath("/hb"); err != nil {
		return 0, err
	}
	for _, q := range queries {
		req.AddQuery(q)
	}
	resp, err := cc.Do(req)
	if err != nil {
		return 0, err
	}
	defer cc.ReleaseMessage(resp)
	return resp.Code(), nil
}

func TestDTLSHeartbeats(t *testing.T) {
	rec := &recorder{}
	// Anonymous devices are off: over DTLS the PSK identity names them.
	s := startDTLS(t, rec, Options{HeartbeatInterval: 20 * time.Second})
	cc := dialDTLS(t, s, "id-1", testDevices["id-1"].key)

	r := request(t, cc, message.Confirmable, codes.POST, "/hb")
	if r.code != codes.Changed || r.maxAge != 20 || r.typ != message.Acknowledgement {
		t.Fatalf("connect: %v Max-Age %d type %v", r.code, r.maxAge, r.typ)
	}
	if r = request(t, cc, message.NonConfirmable, codes.POST, "/hb", "s=radio2", "d=dev-1"); r.code != codes.Changed || r.typ != message.NonConfirmable {
		t.Fatalf("NON heartbeat naming itself: %v type %v", r.code, r.typ)
	}
	if r = request(t, cc, message.Confirmable, codes.POST, "/hb", "d=dev-2"); r.code != codes.Forbidden {
		t.Fatalf("heartbeat for another device: %v %q, want 4.03", r.code, r.payload)
	}
	if r = request(t, cc, message.Confirmable, codes.DELETE, "/hb"); r.code != codes.Changed {
		t.Fatalf("leave: %v", r.code)
	}
	want := []gateway.Evidence{
		{Device: "dev-1", Session: "coap/default", Kind: gateway.Renew},
		{Device: "dev-1", Session: "coap/radio2", Kind: gateway.Renew},
		{Device: "dev-1", Session: "coap/default", Kind: gateway.Leave},
	}
	evs := rec.Evidence()
	if len(evs) != len(want) {
		t.Fatalf("evidence %+v, want %+v", evs, want)
	}
	for i, ev := range evs {
		ev.ObservedAt = time.Time{}
		want[i].Protocol = "coap"
		if ev != want[i] {
			t.Fatalf("evidence %d: %+v, want %+v", i, ev, want[i])
		}
	}

	// Plain UDP still refuses anonymous devices.
	if r = request(t, dial(t, s), message.Confirmable, codes.POST, "/hb", "d=dev-1"); r.code != codes.Unauthorized {
		t.Fatalf("anonymous UDP heartbeat: %v", r.code)
	}
}

func TestDTLSBadCredentials(t *testing.T) {
	rec := &recorder{}
	reg := prometheus.NewRegistry()
	// A wrong key shows when the server cannot decrypt the client's
	// Finished, which DTLS drops as a bad record: that handshake ends by
	// the timeout.
	s := startDTLS(t, rec, Options{AllowAnonymous: true, Registerer: reg, HandshakeTimeout: time.Second})
	cases := []struct {
		name     string
		identity string
		key      []byte
	}{
		{"wrong key", "id-1", []byte("not the real key")},
		{"unknown identity", "id-9", []byte("sixteen byte key")},
		{"other device's key", "id-1", testDevices["id-2"].key},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if dc, err := handshake(t, s, tc.identity, tc.key, 2*time.Second); err == nil {
				_ = dc.Close()
				t.Fatal("handshake succeeded")
			}
		})
	}
	eventually(t, 10*time.Second, "failed handshakes counted", func() bool {
		// At least one each: a client's retransmitted flight can look
		// like a new peer's handshake to the server, and fail too.
		return gather(t, reg)[`fleetgate_coap_dropped_total{reason="handshake"}`] >= float64(len(cases))
	})
	if evs := rec.Evidence(); len(evs) != 0 {
		t.Fatalf("bad credentials made evidence: %+v", evs)
	}
	// The right key still works.
	if r := request(t, dialDTLS(t, s, "id-1", testDevices["id-1"].key), message.Confirmable, codes.POST, "/hb"); r.code != codes.Changed {
		t.Fatalf("good credentials after bad ones: %v", r.code)
	}
}

func TestDTLSCredentialsReload(t *testing.T) {
	rec := &recorder{}
	s := startDTLS(t, rec, Options{})
	cc := dialDTLS(t, s, "id-2", testDevices["id-2"].key)
	kept := dialDTLS(t, s, "id-1", testDevices["id-1"].key)
	for _, c := range []*udpClient.Conn{cc, kept} {
		if r := request(t, c, message.Confirmable, codes.POST, "/hb"); r.code != codes.Changed {
			t.Fatalf("before reload: %v", r.code)
		}
	}
	s.SetCredentials(pskTable{"id-1": testDevices["id-1"]})
	s.SetCredentials(nil) // refused, keeps the reloaded table
	// The removed device's session is closed by the reload (revocation,
	// docs/security.md): its next request finds no session.
	if code, err := tryRequest(cc, 2*time.Second, codes.POST); err == nil {
		t.Fatalf("removed device on its old session: %v, want no answer", code)
	}
	// New handshakes use the new table.
	if dc, err := handshake(t, s, "id-2", testDevices["id-2"].key, 2*time.Second); err == nil {
		_ = dc.Close()
		t.Fatal("removed device shook hands")
	}
	// The kept device keeps its session.
	if r := request(t, kept, message.Confirmable, codes.POST, "/hb"); r.code != codes.Changed {
		t.Fatalf("kept device: %v", r.code)
	}
	if evs := rec.Evidence(); len(evs) != 3 || evs[0].Device != "dev-2" || evs[1].Device != "dev-1" || evs[2].Device != "dev-1" {
		t.Fatalf("evidence %+v", evs)
	}
}

// clientHello captures the first flight of a pion DTLS client (its
// ClientHello), to replay as a peer that never completes a handshake.
func pionClientHello(t testing.TB) []byte {
	t.Helper()
	sink, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	defer sink.Close()
	conn, err := net.DialUDP("udp", nil, sink.LocalAddr().(*net.UDPAddr))
	if err != nil {
		t.Fatal(err)
	}
	client, err := piondtls.Client(dtlsnet.PacketConnFromConn(conn), sink.LocalAddr(), &piondtls.Config{
		PSK:             func([]byte) ([]byte, error) { return []byte("k"), nil },
		PSKIdentityHint: []byte("id-1"),
		CipherSuites:    []piondtls.CipherSuiteID{piondtls.TLS_PSK_WITH_AES_128_CCM_8},
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = client.HandshakeContext(ctx)
	}()
	defer func() {
		cancel()
		<-done
		_ = client.Close()
	}()
	buf := make([]byte, 2048)
	if err := sink.SetReadDeadline(time.Now().Add(5 * time.Second)); err != nil {
		t.Fatal(err)
	}
	n, err := sink.Read(buf)
	if err != nil {
		t.Fatalf("no ClientHello: %v", err)
	}
	return buf[:n]
}

// provenHello does the cookie round trip of a client on c that then goes
// silent: it sends ClientHello hello, and returns the HelloVerifyRequest's
// cookie in the second ClientHello.
func provenHello(t testing.TB, c *net.UDPConn, hello []byte) {
	t.Helper()
	h, err := parseClientHello(hello)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Write(hello); err != nil {
		t.Fatal(err)
	}
	hvr, ok := readDatagram(t, c, 5*time.Second)
	if !ok || !isHelloVerifyRequest(hvr) {
		t.Fatalf("no HelloVerifyRequest: %x", hvr)
	}
	cookie := hvr[recordHeaderLen+handshakeHeaderLen+3:]
	if len(cookie) != cookieLen || int(hvr[recordHeaderLen+handshakeHeaderLen+2]) != cookieLen {
		t.Fatalf("HelloVerifyRequest %x", hvr)
	}
	if _, err := c.Write(withCookie(h, cookie, h.recordSeq+1)); err != nil {
		t.Fatal(err)
	}
}

func TestDTLSHandshakeTimeoutFreesPeerSlot(t *testing.T) {
	reg := prometheus.NewRegistry()
	const timeout = 500 * time.Millisecond
	s := startDTLS(t, &recorder{}, Options{MaxDTLSPeers: 1, HandshakeTimeout: timeout, Registerer: reg})

	// A peer that returns the cookie and goes silent takes the only slot
	// until the handshake timeout.
	staller, err := net.DialUDP("udp", nil, s.DTLSAddr().(*net.UDPAddr))
	if err != nil {
		t.Fatal(err)
	}
	defer staller.Close()
	provenHello(t, staller, pionClientHello(t))
	eventually(t, 5*time.Second, "the proven peer to take the slot", func() bool {
		return gather(t, reg)["fleetgate_coap_dtls_peers{}"] == 1
	})
	eventually(t, 10*time.Second, "the stalled handshake to time out", func() bool {
		return gather(t, reg)[`fleetgate_coap_dropped_total{reason="handshake"}`] == 1
	})
	// The slot is free again: a real device gets through.
	cc := dialDTLS(t, s, "id-1", testDevices["id-1"].key)
	if code, err := tryRequest(cc, 10*time.Second, codes.POST); err != nil || code != codes.Changed {
		t.Fatalf("device after a stalled peer: %v %v", code, err)
	}
}

// TestDTLSIdleTimeoutFreesPeerSlot: a session without datagrams for
// DTLSIdleTimeout is closed, so with one peer slot a second device gets
// through once the first has been idle that long (and well before the
// 5 s default would let it).
func TestDTLSIdleTimeoutFreesPeerSlot(t *testing.T) {
	s := startDTLS(t, &recorder{}, Options{MaxDTLSPeers: 1, DTLSIdleTimeout: 200 * time.Millisecond})
	first := dialDTLS(t, s, "id-1", testDevices["id-1"].key)
	if code, err := tryRequest(first, 10*time.Second, codes.POST); err != nil || code != codes.Changed {
		t.Fatalf("first device: %v %v", code, err)
	}
	// The first device keeps its DTLS connection open but stays silent.
	start := time.Now()
	dc, err := handshake(t, s, "id-2", testDevices["id-2"].key, 4*time.Second)
	if err != nil {
		t.Fatalf("second device while the first is idle: %v after %v", err, time.Since(start))
	}
	_ = dc.Close()
}

func TestDTLSHostileDatagrams(t *testing.T) {
	rec := &recorder{}
	s := startDTLS(t, rec, Options{})
	c, err := net.DialUDP("udp", nil, s.DTLSAddr().(*net.UDPAddr))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	hello := pionClientHello(t)
	garbage := hostileDatagrams(t, 99)
	// Also mangled ClientHellos, which get past pion's accept filter.
	for i := range 200 {
		b := append([]byte(nil), hello...)
		b[13+i%(len(b)-13)] ^= byte(1 + i)
		garbage = append(garbage, b, hello[:i%len(hello)])
	}
	for _, b := range garbage {
		if _, err := c.Write(b); err != nil {
			t.Fatal(err)
		}
	}
	cc := dialDTLS(t, s, "id-1", testDevices["id-1"].key)
	if code, err := tryRequest(cc, 10*time.Second, codes.POST); err != nil || code != codes.Changed {
		t.Fatalf("after hostile input: %v %v", code, err)
	}
	if evs := rec.Evidence(); len(evs) != 1 {
		t.Fatalf("evidence %+v", evs)
	}
}

func TestDTLSOnly(t *testing.T) {
	rec := &recorder{}
	reg := prometheus.NewRegistry()
	// The clock stands still: the rate limit's tokens never come back.
	s := startServer(t, rec, Options{
		Addr: noUDP, DTLS: "127.0.0.1:0", Credentials: testDevices, AllowAnonymous: true,
		RequestsPerSecond: 2, Clock: clocktest.New(start), Registerer: reg,
	})
	if s.Addr() != nil {
		t.Fatalf("UDP address %v without plain UDP", s.Addr())
	}
	// The handshake takes a token, the heartbeat the other.
	cc := dialDTLS(t, s, "id-2", testDevices["id-2"].key)
	if r := request(t, cc, message.Confirmable, codes.POST, "/hb"); r.code != codes.Changed {
		t.Fatalf("heartbeat: %v", r.code)
	}
	if r := request(t, cc, message.Confirmable, codes.POST, "/hb"); r.code != codes.TooManyRequests || r.maxAge < 1 {
		t.Fatalf("heartbeat beyond the rate: %v Max-Age %d, want 4.29", r.code, r.maxAge)
	}
	// Handshakes take tokens of their source endpoint too: beyond its
	// rate one is refused. (A new client socket is a new endpoint, as a
	// device behind a NAT is, so pion's hook is called directly.)
	peer := &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 4242}
	for i := range 3 {
		if err := s.handshakeAttempt(peer); (err != nil) != (i == 2) {
			t.Fatalf("handshake %d from one endpoint: %v", i, err)
		}
	}
	if got := gather(t, reg)[`fleetgate_coap_dropped_total{reason="rate_limited"}`]; got < 1 {
		t.Fatalf("refused handshakes counted %v times", got)
	}
	if evs := rec.Evidence(); len(evs) != 1 || evs[0].Device != "dev-2" {
		t.Fatalf("evidence %+v", evs)
	}
}

func TestDTLSMessageSizeLimit(t *testing.T) {
	rec := &recorder{}
	s := startDTLS(t, rec, Options{MaxMessageSize: 256})
	cc := dialDTLS(t, s, "id-1", testDevices["id-1"].key)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	req := cc.AcquireMessage(ctx)
	defer cc.ReleaseMessage(req)
	token, err := cc.GetToken()
	if err != nil {
		t.Fatal(err)
	}
	req.SetCode(codes.POST)
	req.SetToken(token)
	req.SetType(message.Confirmable)
	if err := req.SetPath("/hb"); err != nil {
		t.Fatal(err)
	}
	req.SetBody(bytes.NewReader(make([]byte, 600)))
	resp, err := cc.Do(req)
	if err != nil {
		t.Fatalf("oversized request: %v", err)
	}
	defer cc.ReleaseMessage(resp)
	if size, err := resp.GetOptionUint32(message.Size1); resp.Code() != codes.RequestEntityTooLarge || err != nil || size != 256 {
		t.Fatalf("answer %v Size1 %d (%v), want 4.13 with Size1 256", resp.Code(), size, err)
	}
	// The session goes on.
	if r := request(t, cc, message.Confirmable, codes.POST, "/hb"); r.code != codes.Changed {
		t.Fatalf("heartbeat after an oversized request: %v", r.code)
	}
	if evs := rec.Evidence(); len(evs) != 1 {
		t.Fatalf("evidence %+v", evs)
	}
}
