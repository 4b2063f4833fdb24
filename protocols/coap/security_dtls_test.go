package coap

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/plgd-dev/go-coap/v3/dtls"
	"github.com/plgd-dev/go-coap/v3/message"
	"github.com/plgd-dev/go-coap/v3/message/codes"
	"github.com/plgd-dev/go-coap/v3/options"
	"github.com/prometheus/client_golang/prometheus"
)

// helloFlood sends ClientHellos from nAddrs loopback source addresses
// (127.0.1.1, ...), each from a new port every interval, from one
// goroutine, and never answers a HelloVerifyRequest, until ctx ends; the
// sockets stay open until then. It returns how many it sent.
func helloFlood(ctx context.Context, to *net.UDPAddr, hello []byte, nAddrs int, interval time.Duration) int {
	sent := 0
	var socks []*net.UDPConn
	defer func() {
		for _, c := range socks {
			_ = c.Close()
		}
	}()
	tick := time.NewTicker(interval)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return sent
		case <-tick.C:
		}
		for a := range nAddrs {
			c, err := net.DialUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 1, byte(1+a))}, to)
			if err != nil {
				continue
			}
			socks = append(socks, c)
			if _, err := c.Write(hello); err == nil {
				sent++
			}
		}
	}
}

// Attack: one unanswered ClientHello held a peer slot for the whole
// handshake timeout, and later pion's state and about four goroutines for
// 2 s; a flood from 40 addresses added 674 goroutines. Now the gate answers
// a ClientHello without a valid cookie with a stateless
// HelloVerifyRequest: during the flood no slot is taken, no goroutine is
// started, and a real device shakes hands and gets 2.04 within 1 s.
func TestDTLSHelloFloodTakesNoState(t *testing.T) {
	reg := prometheus.NewRegistry()
	const addrs = 40
	// The real device's session must stay live until the flood ends (its
	// slot is counted then), longer than the default idle timeout.
	s := startDTLS(t, &recorder{}, Options{MaxDTLSPeers: 200, Registerer: reg, DTLSIdleTimeout: 10 * time.Second})
	hello := pionClientHello(t)
	// The bound on the real device's handshake: 1 s, or five handshakes
	// timed here without the flood on a slower machine.
	start := time.Now()
	dc, err := handshake(t, s, "id-2", testDevices["id-2"].key, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	bound := max(time.Second, 5*time.Since(start))
	if raceEnabled {
		bound *= 3
	}
	_ = dc.Close()
	eventually(t, 5*time.Second, "the first handshake's slot to be freed", func() bool {
		return gather(t, reg)["fleetgate_coap_dtls_peers{}"] == 0
	})
	interval := 50 * time.Millisecond
	if raceEnabled {
		interval *= 4
	}
	runtime.GC()
	base := runtime.NumGoroutine()

	ctx, stop := context.WithTimeout(context.Background(), 4*time.Second)
	defer stop()
	sent := make(chan int, 1)
	go func() { sent <- helloFlood(ctx, s.DTLSAddr().(*net.UDPAddr), hello, addrs, interval) }()

	// While the flood is under way (it holds every old slot within 1 s),
	// the goroutines stay where they were: the flood's own one only.
	peak := 0
	for deadline := time.Now().Add(1500 * time.Millisecond); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		peak = max(peak, runtime.NumGoroutine()-base-1)
	}
	m := gather(t, reg)
	if n := m["fleetgate_coap_dtls_peers{}"]; n != 0 {
		t.Fatalf("%v peer slots taken by unanswered ClientHellos", n)
	}
	answered := m["fleetgate_coap_dtls_hello_verify_total{}"]
	if answered < 100 {
		t.Fatalf("%v HelloVerifyRequests after 1.5 s of the flood", answered)
	}
	// The real device: handshake and heartbeat, answered 2.04.
	start = time.Now()
	cc := dialDTLS(t, s, "id-1", testDevices["id-1"].key)
	code, err := tryRequest(cc, 5*time.Second, codes.POST)
	took := time.Since(start)
	if err != nil || code != codes.Changed || took > bound {
		t.Fatalf("real device during the flood: %v %v after %v, want 2.04 within %v", code, err, took, bound)
	}
	n := <-sent
	m = gather(t, reg)
	if peers := m["fleetgate_coap_dtls_peers{}"]; peers != 1 {
		t.Fatalf("%v peer slots taken, want the real device's 1", peers)
	}
	if busy := m[`fleetgate_coap_dropped_total{reason="dtls_busy"}`]; busy != 0 {
		t.Fatalf("%v unproven ClientHellos counted as refused peers", busy)
	}
	if peak > 4 {
		t.Fatalf("%d goroutines more during the flood of %d ClientHellos, want none", peak, n)
	}
	t.Logf("%d ClientHellos from %d addresses, %v HelloVerifyRequests; goroutines +%d at the peak (%.4f per ClientHello); real device's handshake and 2.04 in %v",
		n, addrs, m["fleetgate_coap_dtls_hello_verify_total{}"], peak, float64(peak)/float64(n), took)
}

// A source address has at most maxHandshakesPerAddr handshakes in
// flight, even with proven ClientHellos: beyond them a peer is refused
// and counted, and a real device from another address gets through.
func TestDTLSHandshakesPerAddressBounded(t *testing.T) {
	reg := prometheus.NewRegistry()
	s := startDTLS(t, &recorder{}, Options{Registerer: reg, HandshakeTimeout: 5 * time.Second})
	hello := pionClientHello(t)
	const tries = 2 * maxHandshakesPerAddr
	for range tries {
		c, err := net.DialUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 1, 1)}, s.DTLSAddr().(*net.UDPAddr))
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		provenHello(t, c, hello)
	}
	eventually(t, 5*time.Second, "the refusals beyond the address's handshakes", func() bool {
		m := gather(t, reg)
		return m[`fleetgate_coap_dropped_total{reason="dtls_busy"}`] == tries-maxHandshakesPerAddr &&
			m["fleetgate_coap_dtls_peers{}"] == maxHandshakesPerAddr
	})
	cc := dialDTLS(t, s, "id-1", testDevices["id-1"].key)
	if code, err := tryRequest(cc, 5*time.Second, codes.POST); err != nil || code != codes.Changed {
		t.Fatalf("real device beside the bounded address: %v %v", code, err)
	}
}

// Attack: the bound of handshakes in flight counted exact addresses, so
// 1,024 addresses, each with one proven ClientHello and then silence,
// held all 1,024 peer slots for the handshake timeout (4,096 addresses
// the default 4,096), and a real device was refused; an IPv6 host holds
// a whole /64. Now the handshakes of a /24 (IPv4) or /64 (IPv6) in
// flight are bounded too, to 1/prefixShare of the slots: the 1,024
// addresses of 127.2.0.0/22 hold 4 × 16 slots, the rest are refused and
// counted, and a device from another /24 shakes hands and gets 2.04.
func TestDTLSHandshakesPerPrefixBounded(t *testing.T) {
	reg := prometheus.NewRegistry()
	const (
		maxPeers = 1024
		addrs    = 1024 // 127.2.0.0 to 127.2.3.255: four /24s
	)
	s := startDTLS(t, &recorder{}, Options{Registerer: reg, MaxDTLSPeers: maxPeers, HandshakeTimeout: time.Minute})
	hello := pionClientHello(t)
	for i := range addrs {
		c, err := net.DialUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 2, byte(i>>8), byte(i))}, s.DTLSAddr().(*net.UDPAddr))
		if err != nil {
			t.Fatal(err)
		}
		provenHello(t, c, hello)
		_ = c.Close()
	}
	var peers, busy float64
	eventually(t, 10*time.Second, "every proven ClientHello admitted or refused", func() bool {
		m := gather(t, reg)
		peers, busy = m["fleetgate_coap_dtls_peers{}"], m[`fleetgate_coap_dropped_total{reason="dtls_busy"}`]
		return peers+busy == addrs
	})
	perPrefix := maxPeers / prefixShare
	t.Logf("%d addresses in 4 /24s, one proven ClientHello each: %v peer slots taken of %d, %v refused", addrs, peers, maxPeers, busy)
	if peers != float64(4*perPrefix) {
		t.Errorf("%v peer slots taken by 4 /24s, want 4 × %d", peers, perPrefix)
	}
	start := time.Now()
	dc, err := handshake(t, s, "id-1", testDevices["id-1"].key, 3*time.Second)
	if err != nil {
		t.Fatalf("real device from 127.0.0.1 beside the stalled /24s: %v after %v", err, time.Since(start))
	}
	cc := dtls.Client(dc, options.WithErrors(func(error) {}), options.WithCloseSocket())
	defer cc.Close()
	if code, err := tryRequest(cc, 5*time.Second, codes.POST); err != nil || code != codes.Changed {
		t.Fatalf("real device beside the stalled /24s: %v %v", code, err)
	}
}

// The handshakes in flight of one IPv6 /64 are bounded as those of a
// /24, whatever the number of its addresses; the end of a handshake
// frees its prefix's place, and another /64 is not affected.
func TestGateHandshakesPerIPv6Prefix(t *testing.T) {
	m, err := newMetrics(nil)
	if err != nil {
		t.Fatal(err)
	}
	g, err := newGate("127.0.0.1:0", DefaultMaxDTLSPeers, 0, m, func() {}, time.Now)
	if err != nil {
		t.Fatal(err)
	}
	defer gatedListener{g}.Close()
	hello := pionClientHello(t)
	h, err := parseClientHello(hello)
	if err != nil {
		t.Fatal(err)
	}
	var peers []*peer
	defer func() {
		for _, p := range peers {
			_ = p.Close()
		}
	}()
	admit := func(addr string) bool {
		g.mu.Lock()
		p, ok := g.admit(netip.AddrPortFrom(netip.MustParseAddr(addr), 40000), h, hello)
		g.mu.Unlock()
		if ok {
			peers = append(peers, p)
		}
		return ok
	}
	perPrefix := DefaultMaxDTLSPeers / prefixShare
	admitted := 0
	for i := range 4 * perPrefix {
		if admit(fmt.Sprintf("2001:db8:0:1:%x::1", i+1)) {
			admitted++
		}
	}
	if admitted != perPrefix {
		t.Fatalf("%d handshakes of one /64 admitted from %d addresses, want %d", admitted, 4*perPrefix, perPrefix)
	}
	if !admit("2001:db8:0:2::1") {
		t.Fatal("another /64 refused")
	}
	peers[0].endHandshake()
	if !admit("2001:db8:0:1:ffff::1") {
		t.Fatal("the /64 refused after one of its handshakes ended")
	}
}

// Attack (PSK oracle): an unknown identity got an immediate fatal alert,
// a known identity with a wrong key silence. Both now end the same way:
// no alert, the handshake runs until the client gives up.
func TestDTLSNoIdentityOracle(t *testing.T) {
	s := startDTLS(t, &recorder{}, Options{HandshakeTimeout: 5 * time.Second})
	results := map[string]error{}
	for name, id := range map[string]string{"unknown identity": "id-9", "known identity, wrong key": "id-1"} {
		start := time.Now()
		dc, err := handshake(t, s, id, []byte("not the real key"), 1500*time.Millisecond)
		if err == nil {
			_ = dc.Close()
			t.Fatalf("%s: handshake succeeded", name)
		}
		if took := time.Since(start); took < 1400*time.Millisecond {
			t.Errorf("%s: ended after %v (%v), want the client's own timeout", name, took, err)
		}
		results[name] = err
	}
	for name, err := range results {
		if strings.Contains(strings.ToLower(err.Error()), "alert") || !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("%s: %v, want the client's timeout and no alert", name, err)
		}
	}
}

// Revocation: a reload that gives a PSK identity another key closes its
// DTLS session, as one that removes it does (dtls_test.go); other
// sessions stay.
func TestDTLSReloadRevokesChangedKey(t *testing.T) {
	s := startDTLS(t, &recorder{}, Options{})
	changed := dialDTLS(t, s, "id-1", testDevices["id-1"].key)
	kept := dialDTLS(t, s, "id-2", testDevices["id-2"].key)
	if r := request(t, changed, message.Confirmable, codes.POST, "/hb"); r.code != codes.Changed {
		t.Fatal(r.code)
	}
	s.SetCredentials(pskTable{
		"id-1": {device: "dev-1", key: []byte("a brand new key!")},
		"id-2": testDevices["id-2"],
	})
	if code, err := tryRequest(changed, 2*time.Second, codes.POST); err == nil {
		t.Fatalf("session with the old key after the reload: %v", code)
	}
	if r := request(t, kept, message.Confirmable, codes.POST, "/hb"); r.code != codes.Changed {
		t.Fatalf("unchanged device: %v", r.code)
	}
	if r := request(t, dialDTLS(t, s, "id-1", []byte("a brand new key!")), message.Confirmable, codes.POST, "/hb"); r.code != codes.Changed {
		t.Fatalf("new key: %v", r.code)
	}
}

// spoofSockets opens n sockets on the loopback address 127.0.0.1, each
// with its own port, towards addr; they are closed when the test ends.
// Sending from many ports of one address is what spoofing that address is
// to a limit keyed on it.
func spoofSockets(t *testing.T, addr net.Addr, n int) []*net.UDPConn {
	t.Helper()
	conns := make([]*net.UDPConn, 0, n)
	t.Cleanup(func() {
		for _, c := range conns {
			_ = c.Close()
		}
	})
	for range n {
		c, err := net.DialUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)}, addr.(*net.UDPAddr))
		if err != nil {
			t.Fatalf("flood socket: %v", err)
		}
		conns = append(conns, c)
	}
	return conns
}

// spoofFlood sends perSecond datagrams b a second, round robin over
// conns, until ctx ends, and returns how many it sent (or tried to). It
// is paced by the elapsed time in steps of a fraction of a millisecond,
// so that the flood is as even as a real one.
func spoofFlood(ctx context.Context, conns []*net.UDPConn, b []byte, perSecond int) int {
	begin := time.Now()
	sent := 0
	for ctx.Err() == nil {
		for due := int(time.Since(begin).Seconds() * float64(perSecond)); sent < due; sent++ {
			_, _ = conns[sent%len(conns)].Write(b)
		}
		time.Sleep(200 * time.Microsecond)
	}
	return sent
}

// Attack: datagrams spoofed "from" a site's NAT address to the UDP port
// spent that address's rate limit, which DTLS handshakes and the requests
// of established DTLS sessions shared: about 5,000 datagrams a second
// locked out every DTLS device behind the address. Now DTLS handshakes
// (proven by the cookie) and the records of established sessions (proven
// by their keys) have limits of their own that spoofed datagrams cannot
// reach: during such a flood from the device's own address, every
// heartbeat of an established session is answered 2.04, and a new session
// from that address shakes hands and is answered 2.04, while plain UDP
// probes from the address find its budget spent.
func TestDTLSServedDuringSpoofedFlood(t *testing.T) {
	reg := prometheus.NewRegistry()
	// 2 a second per endpoint and device, 500 per address. The flood's
	// 4,096 ports send about 1.2 a second each, within their endpoints'
	// limit, so that nearly all of it reaches the address's, as a spoofed
	// flood with random ports does.
	const (
		rate      = 2
		sockets   = 4096
		perSecond = 5000
		floodFor  = 5 * time.Second
		beatEvery = 600 * time.Millisecond
	)
	s := startDTLS(t, &recorder{}, Options{RequestsPerSecond: rate, Registerer: reg})
	device := dialDTLS(t, s, "id-1", testDevices["id-1"].key)
	if code, err := tryRequest(device, 5*time.Second, codes.POST); err != nil || code != codes.Changed {
		t.Fatalf("before the flood: %v %v", code, err)
	}
	dropped := func() float64 { return gather(t, reg)[`fleetgate_coap_dropped_total{reason="rate_limited"}`] }
	conns := spoofSockets(t, s.Addr(), sockets)
	ctx, stop := context.WithTimeout(context.Background(), floodFor)
	defer stop()
	spoofed := datagram(t, message.NonConfirmable, codes.POST, 1, "/hb", "d=spoofed")
	sent := make(chan int, 1)
	go func() { sent <- spoofFlood(ctx, conns, spoofed, perSecond) }()
	eventually(t, 5*time.Second, "the flood under way", func() bool { return dropped() > 1000 })

	// The established session's heartbeats while the flood lasts.
	var beats, changed int
	var failures []string
	begin := time.Now()
	beating := make(chan struct{})
	go func() {
		defer close(beating)
		for {
			time.Sleep(beatEvery)
			if ctx.Err() != nil {
				return
			}
			beats++
			if code, err := tryRequest(device, 3*time.Second, codes.POST); err == nil && code == codes.Changed {
				changed++
			} else {
				failures = append(failures, fmt.Sprintf("%v %v at %v", code, err, time.Since(begin).Round(time.Millisecond)))
			}
		}
	}()
	// Plain UDP probes from the address, each from a new port, over a
	// second: the flood has spent the address's budget, so most get no
	// answer.
	probe := datagram(t, message.Confirmable, codes.POST, 2, "/hb", "d=probe")
	probed, answered := 0, 0
	for range 20 {
		probed++
		if _, ok := exchange(t, rawConn(t, s), probe, 50*time.Millisecond); ok {
			answered++
			time.Sleep(50 * time.Millisecond)
		}
	}
	// A new session from the flooded address.
	tried := time.Now()
	var newCode codes.Code
	dc, err := handshake(t, s, "id-2", testDevices["id-2"].key, 3*time.Second)
	if err == nil {
		newCode, err = tryRequest(dtls.Client(dc, options.WithErrors(func(error) {}), options.WithCloseSocket()), 3*time.Second, codes.POST)
		_ = dc.Close()
	}
	newTook := time.Since(tried)
	if ctx.Err() != nil {
		t.Errorf("the flood ended before the new session was tried out (%v)", newTook)
	}
	<-beating
	n := <-sent
	t.Logf("flood: %d datagrams from %d ports of 127.0.0.1 in %v, %v dropped as rate limited; plain UDP probes answered: %d of %d; established session: %d of %d heartbeats 2.04 (%.0f%%); new session: %v %v after %v",
		n, sockets, floodFor, dropped(), answered, probed, changed, beats, 100*float64(changed)/float64(max(beats, 1)),
		newCode, err, newTook.Round(time.Millisecond))
	if answered > probed/2 {
		t.Errorf("%d of %d plain UDP probes answered: the flood did not spend the address's budget", answered, probed)
	}
	if beats < 3 || changed != beats {
		t.Errorf("established session during the flood: %d of %d heartbeats answered 2.04, want all; %q", changed, beats, failures)
	}
	if err != nil || newCode != codes.Changed {
		t.Errorf("new session during the flood: %v %v after %v, want 2.04", newCode, err, newTook)
	}
}
