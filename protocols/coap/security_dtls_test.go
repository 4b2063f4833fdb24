package coap

import (
	"context"
	"errors"
	"net"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/plgd-dev/go-coap/v3/message"
	"github.com/plgd-dev/go-coap/v3/message/codes"
	"github.com/prometheus/client_golang/prometheus"
)

// helloFlood sends ClientHellos from nAddrs loopback source addresses
// (127.0.1.1, ...), each from a new port every interval, and never answers
// a HelloVerifyRequest, until ctx ends; the sockets stay open until then.
// It returns how many it sent.
func helloFlood(ctx context.Context, t *testing.T, to *net.UDPAddr, hello []byte, nAddrs int, interval time.Duration) int {
	var mu sync.Mutex
	sent := 0
	var wg sync.WaitGroup
	for a := range nAddrs {
		src := net.IPv4(127, 0, 1, byte(1+a))
		wg.Go(func() {
			tick := time.NewTicker(interval)
			defer tick.Stop()
			var socks []*net.UDPConn
			defer func() {
				for _, c := range socks {
					_ = c.Close()
				}
			}()
			for {
				select {
				case <-ctx.Done():
					return
				case <-tick.C:
				}
				c, err := net.DialUDP("udp", &net.UDPAddr{IP: src}, to)
				if err != nil {
					continue
				}
				socks = append(socks, c)
				if _, err := c.Write(hello); err == nil {
					mu.Lock()
					sent++
					mu.Unlock()
				}
			}
		})
	}
	wg.Wait()
	return sent
}

// Attack: one unanswered ClientHello held one of the peer slots for the
// whole handshake timeout; a flood from 40 addresses filled them and
// locked a real device out. Now a peer takes a slot only once it has
// returned the HelloVerifyRequest's cookie, each address has at most 4
// handshakes in flight, and an unproven peer is dropped after the cookie
// timeout: during the flood no slot is taken, the real device shakes
// hands within 1 s and is answered, and the goroutines stay bounded.
func TestDTLSHelloFloodTakesNoSlot(t *testing.T) {
	reg := prometheus.NewRegistry()
	const addrs = 40
	s := startDTLS(t, &recorder{}, Options{MaxDTLSPeers: 200, Registerer: reg})
	hello := clientHello(t)
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
	interval := 50 * time.Millisecond
	if raceEnabled {
		interval *= 4
	}
	base := runtime.NumGoroutine()

	ctx, stop := context.WithTimeout(context.Background(), 4*time.Second)
	defer stop()
	sent := make(chan int, 1)
	go func() { sent <- helloFlood(ctx, t, s.DTLSAddr().(*net.UDPAddr), hello, addrs, interval) }()

	time.Sleep(1500 * time.Millisecond) // the flood is under way: every old slot would be taken
	m := gather(t, reg)
	if n := m["fleetgate_coap_dtls_peers{}"]; n != 0 {
		t.Fatalf("%v peer slots taken by unanswered ClientHellos", n)
	}
	peak := runtime.NumGoroutine() - base
	start = time.Now()
	dc, err = handshake(t, s, "id-1", testDevices["id-1"].key, 10*time.Second)
	took := time.Since(start)
	if err != nil || took > bound {
		t.Fatalf("real device during the flood: %v after %v, want a handshake within %v", err, took, bound)
	}
	_ = dc.Close()
	cc := dialDTLS(t, s, "id-2", testDevices["id-2"].key)
	if code, err := tryRequest(cc, 5*time.Second, codes.POST); err != nil || code != codes.Changed {
		t.Fatalf("real device's heartbeat during the flood: %v %v", code, err)
	}
	if n := gather(t, reg)["fleetgate_coap_dtls_peers{}"]; n != 1 { // the first id-2 closed
		t.Fatalf("%v peer slots taken, want the real device's 1", n)
	}
	n := <-sent
	// At most 4 handshakes per address live for at most the cookie
	// timeout; each costs a few goroutines (pion's and go-coap's: about
	// four).
	if limit := addrs * maxHandshakesPerAddr * 6; peak > limit {
		t.Fatalf("%d goroutines more during the flood of %d ClientHellos, want at most %d", peak, n, limit)
	}
	if busy := gather(t, reg)[`fleetgate_coap_dropped_total{reason="dtls_busy"}`]; busy == 0 {
		t.Fatalf("no peer refused beyond its address's handshakes (%d ClientHellos sent)", n)
	}
	t.Logf("%d ClientHellos from %d addresses; goroutines +%d during the flood; real handshake %v", n, addrs, peak, took)
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
