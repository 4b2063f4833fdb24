package coap

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"os"
	"testing"
	"time"

	"github.com/plgd-dev/go-coap/v3/message"
	"github.com/plgd-dev/go-coap/v3/message/codes"
	"github.com/plgd-dev/go-coap/v3/message/pool"
	"github.com/plgd-dev/go-coap/v3/options"
	"github.com/plgd-dev/go-coap/v3/pkg/runner/periodic"
	"github.com/plgd-dev/go-coap/v3/udp"
	udpClient "github.com/plgd-dev/go-coap/v3/udp/client"
	"github.com/plgd-dev/go-coap/v3/udp/coder"

	"github.com/fleetgate/fleetgate/gateway"
	"github.com/fleetgate/fleetgate/gateway/gatewaytest"
)

// recorder is the test's observation point (gatewaytest.Recorder).
type recorder = gatewaytest.Recorder

// testLogger writes debug logs to stderr when COAP_TEST_LOG is set.
func testLogger() *slog.Logger {
	if os.Getenv("COAP_TEST_LOG") == "" {
		return nil
	}
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

// noUDP as Options.Addr makes startServer serve no plain UDP.
const noUDP = "none"

// startServer runs a server on a free loopback port until the test ends,
// and checks that Serve then returned nil.
func startServer(t testing.TB, obs gateway.Observer, o Options) *Server {
	t.Helper()
	switch o.Addr {
	case "":
		o.Addr = "127.0.0.1:0"
	case noUDP:
		o.Addr = ""
	}
	if o.HeartbeatInterval == 0 {
		o.HeartbeatInterval = 30 * time.Second
	}
	if o.Logger == nil {
		o.Logger = testLogger()
	}
	if o.RequestsPerSecond == 0 {
		// Every test client is 127.0.0.1: one source for the rate limit.
		o.RequestsPerSecond = 1_000_000
	}
	s, err := New(obs, o)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	gatewaytest.Serve(t, s)
	return s
}

// dial opens a go-coap UDP client to s whose background goroutines end
// with the test.
func dial(t testing.TB, s *Server) *udpClient.Conn {
	t.Helper()
	stop := make(chan struct{})
	cc, err := udp.Dial(s.Addr().String(),
		options.WithPeriodicRunner(periodic.New(stop, time.Second)),
		options.WithErrors(func(error) {}))
	if err != nil {
		t.Fatalf("dial: %v", err)
	}
	t.Cleanup(func() {
		_ = cc.Close()
		close(stop)
	})
	return cc
}

// request sends one request and returns the response code, Max-Age
// (-1 when absent), type and payload.
type reply struct {
	code    codes.Code
	maxAge  int64
	typ     message.Type
	payload string
}

// request sends one request without a payload (post) and returns its
// answer as a reply.
func request(t testing.TB, cc *udpClient.Conn, typ message.Type, code codes.Code, path string, queries ...string) reply {
	t.Helper()
	a := post(t, cc, typ, code, path, nil, noCF, queries...)
	return reply{code: a.code, maxAge: a.maxAge(), typ: a.typ, payload: string(a.payload)}
}

// datagram encodes a request the way a device would put it on the wire.
func datagram(t testing.TB, typ message.Type, code codes.Code, mid uint16, path string, queries ...string) []byte {
	t.Helper()
	m := pool.NewMessage(context.Background())
	m.SetType(typ)
	m.SetCode(code)
	m.SetMessageID(int32(mid))
	m.SetToken(message.Token{0xf1, 0xee, byte(mid >> 8), byte(mid)})
	if path != "" {
		if err := m.SetPath(path); err != nil {
			t.Fatalf("path: %v", err)
		}
	}
	for _, q := range queries {
		m.AddQuery(q)
	}
	b, err := m.MarshalWithEncoder(coder.DefaultCoder)
	if err != nil {
		t.Fatalf("marshal: %v", err)
	}
	return b
}

// decode parses a datagram the server sent.
func decode(t testing.TB, b []byte) *pool.Message {
	t.Helper()
	m := pool.NewMessage(context.Background())
	if _, err := m.UnmarshalWithDecoder(coder.DefaultCoder, b); err != nil {
		t.Fatalf("decode %x: %v", b, err)
	}
	return m
}

// rawConn is a plain UDP socket towards s, for hand-made datagrams.
func rawConn(t testing.TB, s *Server) *net.UDPConn {
	t.Helper()
	c, err := net.DialUDP("udp", nil, s.Addr().(*net.UDPAddr))
	if err != nil {
		t.Fatalf("dial raw: %v", err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// exchange sends b and reads one answer within timeout; ok is false when
// none came.
func exchange(t testing.TB, c *net.UDPConn, b []byte, timeout time.Duration) ([]byte, bool) {
	t.Helper()
	if _, err := c.Write(b); err != nil {
		t.Fatalf("write: %v", err)
	}
	return readDatagram(t, c, timeout)
}

func readDatagram(t testing.TB, c *net.UDPConn, timeout time.Duration) ([]byte, bool) {
	t.Helper()
	buf := make([]byte, 2048)
	if err := c.SetReadDeadline(time.Now().Add(timeout)); err != nil {
		t.Fatalf("deadline: %v", err)
	}
	n, err := c.Read(buf)
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return nil, false
	}
	if err != nil {
		t.Fatalf("read: %v", err)
	}
	return buf[:n], true
}

// eventually polls cond every 10 ms until it holds or d has passed.
func eventually(t testing.TB, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", d, what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
