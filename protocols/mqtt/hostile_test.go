package mqtt

import (
	"context"
	"crypto/tls"
	"math/rand/v2"
	"net"
	"runtime"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/paho"
	"github.com/mochi-mqtt/server/v2/packets"
	"go.uber.org/goleak"

	"github.com/fleetgate/fleetgate/gateway"
)

// hostileStreams returns what hostile peers send on a connection: random
// bytes, every truncation of valid CONNECTs, valid sessions with random
// bytes flipped, garbage after a valid CONNECT, and packets announcing
// more than the packet size limit (or than MQTT allows).
func hostileStreams(t testing.TB, seed uint64) [][]byte {
	t.Helper()
	rng := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	random := func(n int) []byte {
		b := make([]byte, n)
		for i := range b {
			b[i] = byte(rng.Uint32())
		}
		return b
	}
	var out [][]byte
	for range 150 {
		b := random(rng.IntN(400))
		if len(b) > 0 && rng.IntN(2) == 0 {
			b[0] = packets.Connect << 4 // gets past the first-packet check
		}
		out = append(out, b)
	}
	publish := encode(t, packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Publish, Qos: 1}, TopicName: "devices/dev-1/t", PacketID: 1, Payload: []byte("x")})
	valid := [][]byte{
		connectPacket(t, 4, "dev-1", "", 30),
		connectPacket(t, 5, "dev-1", "", 30),
		append(connectPacket(t, 5, "dev-1", "", 30), publish...),
	}
	for _, v := range valid {
		for n := range len(v) {
			out = append(out, v[:n])
		}
		for range 40 {
			b := append([]byte(nil), v...)
			for range 1 + rng.IntN(3) {
				b[rng.IntN(len(b))] = byte(rng.Uint32())
			}
			out = append(out, b)
		}
		out = append(out, append(append([]byte(nil), v...), random(200)...))
	}
	out = append(out,
		// CONNECT of 1 MiB and of the largest remaining length MQTT can encode.
		append([]byte{packets.Connect << 4, 0x80, 0x80, 0x40}, random(1000)...),
		[]byte{packets.Connect << 4, 0xff, 0xff, 0xff, 0x7f},
		// A remaining length with a fifth continuation byte.
		[]byte{packets.Connect << 4, 0xff, 0xff, 0xff, 0xff, 0x01},
		// A valid CONNECT, then a PUBLISH of 1 MiB.
		append(connectPacket(t, 5, "dev-1", "", 30), append([]byte{packets.Publish << 4, 0x80, 0x80, 0x40}, random(1000)...)...),
	)
	return out
}

// storm sends every hostile stream on its own connection to addr (TLS
// when tc is set), a few at a time, and closes each after its bytes.
func storm(t testing.TB, addr string, tc *tls.Config, streams [][]byte) {
	t.Helper()
	sem := make(chan struct{}, 16)
	done := make(chan struct{}, len(streams))
	for _, b := range streams {
		sem <- struct{}{}
		go func() {
			defer func() { <-sem; done <- struct{}{} }()
			var c net.Conn
			var err error
			if tc != nil {
				c, err = tls.DialWithDialer(&net.Dialer{Timeout: 5 * time.Second}, "tcp", addr, tc)
			} else {
				c, err = net.DialTimeout("tcp", addr, 5*time.Second)
			}
			if err != nil {
				return // the server may close a hostile peer at any point
			}
			defer c.Close()
			_ = c.SetDeadline(time.Now().Add(5 * time.Second))
			_, _ = c.Write(b)
			// Read what the server answers until it closes or a short wait.
			_ = c.SetReadDeadline(time.Now().Add(100 * time.Millisecond))
			buf := make([]byte, 512)
			for {
				if _, err := c.Read(buf); err != nil {
					return
				}
			}
		}()
	}
	for range streams {
		<-done
	}
}

// checkEvidence fails if garbage produced malformed evidence.
func checkEvidence(t testing.TB, evs []gateway.Evidence) {
	t.Helper()
	for _, ev := range evs {
		_, errD := gateway.ParseDeviceID(string(ev.Device))
		_, errS := gateway.ParseSessionID(string(ev.Session))
		if errD != nil || errS != nil || ev.Protocol != "mqtt" {
			t.Fatalf("malformed evidence from garbage: %+v", ev)
		}
	}
}

func TestHostileInput(t *testing.T) {
	rec := &recorder{}
	srvTLS, cliTLS := selfSigned(t)
	s := startServer(t, rec, Options{TCP: "127.0.0.1:0", TLS: "127.0.0.1:0", TLSConfig: srvTLS,
		AllowAnonymous: true, MaxPacketSize: 4096, ConnectsPerSecond: 100000})
	tcpA, tlsA := s.Addrs()
	const seed = 20261129
	t.Logf("seed %d", seed)
	streams := hostileStreams(t, seed)
	storm(t, tcpA.String(), nil, streams)
	storm(t, tlsA.String(), cliTLS, streams[:200])
	// Plain garbage on the TLS port: no handshake at all.
	storm(t, tlsA.String(), nil, streams[:50])

	// The server still serves, on both ports.
	c := mustConnectV5(t, s, "after-storm", "")
	if err := c.Disconnect(&paho.Disconnect{}); err != nil {
		t.Fatal(err)
	}
	if _, _, err := connectV5(t, tlsA.String(), cliTLS, &paho.Connect{ClientID: "after-storm-tls", CleanStart: true}); err != nil {
		t.Fatalf("TLS after the storm: %v", err)
	}
	checkEvidence(t, rec.Evidence())
	eventually(t, 10*time.Second, "storm connections ended", func() bool { return s.conns.Load() <= 1 })
}

// An oversized packet ends the connection, and is never read whole.
func TestOversizedPacket(t *testing.T) {
	rec := &recorder{}
	s := startServer(t, rec, Options{AllowAnonymous: true, MaxPacketSize: 1024})
	r := dialRaw(t, tcpAddr(s))
	if code := r.connack(connectPacket(t, 5, "dev-1", "", 30)); code != 0 {
		t.Fatalf("connack %#x", code)
	}
	big := encode(t, packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Publish}, TopicName: "devices/dev-1/t", Payload: make([]byte, 2000)})
	r.send(big[:10]) // the header announces 2000 bytes: enough to refuse
	if !r.closedWithin(10 * time.Second) {
		t.Fatal("oversized PUBLISH did not end the connection")
	}
	// A packet of the limit itself is fine.
	r = dialRaw(t, tcpAddr(s))
	if code := r.connack(connectPacket(t, 5, "dev-2", "", 30)); code != 0 {
		t.Fatalf("connack %#x", code)
	}
	r.send(encode(t, packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Publish}, TopicName: "devices/dev-2/t", Payload: make([]byte, 900)}))
	session := rec.SessionOf("dev-2")
	eventually(t, 5*time.Second, "renewal", func() bool { return rec.Count(session, gateway.Renew) == 1 })
}

// A connection that never sends CONNECT is closed after connectTimeout;
// Close does not wait for it.
func TestSilentConnectionDoesNotHoldClose(t *testing.T) {
	s, err := New(&recorder{}, Options{TCP: "127.0.0.1:0", Gateway: "gw-1", AllowAnonymous: true, HeartbeatInterval: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- s.Serve(context.Background()) }()
	r := dialRaw(t, tcpAddr(s))
	r.send([]byte{packets.Connect << 4, 20}) // half a CONNECT header
	begin := time.Now()
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if d := time.Since(begin); d > 5*time.Second {
		t.Fatalf("Close took %v", d)
	}
	if err := <-served; err != nil {
		t.Fatalf("Serve: %v", err)
	}
	if !r.closedWithin(5 * time.Second) {
		t.Fatal("silent connection open after Close")
	}
}

func TestNoGoroutineLeak(t *testing.T) {
	ignore := goleak.IgnoreCurrent()
	srvTLS, cliTLS := selfSigned(t)
	s, err := New(&recorder{}, Options{TCP: "127.0.0.1:0", TLS: "127.0.0.1:0", TLSConfig: srvTLS, Gateway: "gw-1",
		AllowAnonymous: true, HeartbeatInterval: time.Second, ConnectsPerSecond: 100000})
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- s.Serve(context.Background()) }()
	tcpA, tlsA := s.Addrs()
	streams := hostileStreams(t, 7)
	storm(t, tcpA.String(), nil, streams[:300])
	storm(t, tlsA.String(), cliTLS, streams[:50])

	// Left open at Close: established sessions of both versions on both
	// ports, a connection mid-CONNECT, one mid-TLS-handshake.
	var open []net.Conn
	for i, addr := range []string{tcpA.String(), tlsA.String()} {
		for _, v := range []byte{4, 5} {
			var c net.Conn
			if i == 0 {
				c, err = net.Dial("tcp", addr)
			} else {
				c, err = tls.Dial("tcp", addr, cliTLS)
			}
			if err != nil {
				t.Fatal(err)
			}
			r := &raw{Conn: c, t: t}
			if code := r.connack(connectPacket(t, v, "dev-1", "", 30)); code != 0 {
				t.Fatalf("connack %#x", code)
			}
			open = append(open, c)
		}
	}
	for _, addr := range []string{tcpA.String(), tlsA.String()} {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = c.Write([]byte{packets.Connect << 4})
		open = append(open, c)
	}

	if err := s.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	select {
	case err := <-served:
		if err != nil {
			t.Fatalf("Serve: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Serve did not return after Close")
	}
	for _, c := range open {
		_ = c.Close()
	}
	goleak.VerifyNone(t, ignore)
}

// Rounds of hostile connections leave no memory behind.
func TestHostileInputMemory(t *testing.T) {
	rec := &recorder{}
	s := startServer(t, rec, Options{AllowAnonymous: true, ConnectsPerSecond: 100000})
	streams := hostileStreams(t, 11)
	heap := func() uint64 {
		eventually(t, 10*time.Second, "storm connections ended", func() bool { return s.conns.Load() == 0 })
		runtime.GC()
		runtime.GC()
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		return ms.HeapAlloc
	}
	storm(t, tcpAddr(s), nil, streams)
	rec.SetErr(gateway.ErrOverloaded) // the recorder itself must not grow
	storm(t, tcpAddr(s), nil, streams)
	base := heap()
	for range 4 {
		storm(t, tcpAddr(s), nil, streams)
	}
	after := heap()
	t.Logf("heap %d → %d bytes after 4 rounds of %d connections", base, after, len(streams))
	if after > base+2<<20 {
		t.Fatalf("heap grew from %d to %d bytes", base, after)
	}
}
