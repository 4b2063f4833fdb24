package coap

import (
	"context"
	"errors"
	"net"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/plgd-dev/go-coap/v3/message"
	"github.com/plgd-dev/go-coap/v3/message/codes"
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
	s := startDTLS(t, &recorder{}, Options{MaxDTLSPeers: 200, Registerer: reg})
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
