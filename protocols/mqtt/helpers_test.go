package mqtt

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"strings"
	"testing"
	"time"

	pahopackets "github.com/eclipse/paho.golang/packets"
	"github.com/eclipse/paho.golang/paho"
	paho3 "github.com/eclipse/paho.mqtt.golang"
	"github.com/mochi-mqtt/server/v2/packets"
	"golang.org/x/crypto/bcrypt"

	"github.com/fleetgate/fleetgate/gateway"
	"github.com/fleetgate/fleetgate/gateway/gatewaytest"
	"github.com/fleetgate/fleetgate/internal/testcert"
)

// recorder is the test's observation point (gatewaytest.Recorder).
type recorder = gatewaytest.Recorder

// bcryptCreds is a small in-memory devices file: device → bcrypt hash.
type bcryptCreds map[gateway.DeviceID][]byte

var _ gateway.Credentials = bcryptCreds(nil)

func newCreds(t testing.TB, passwords map[gateway.DeviceID]string) bcryptCreds {
	t.Helper()
	c := bcryptCreds{}
	for d, p := range passwords {
		h, err := bcrypt.GenerateFromPassword([]byte(p), bcrypt.MinCost)
		if err != nil {
			t.Fatal(err)
		}
		c[d] = h
	}
	return c
}

func (c bcryptCreds) CheckPassword(d gateway.DeviceID, password []byte) error {
	h, ok := c[d]
	if !ok || bcrypt.CompareHashAndPassword(h, password) != nil {
		return gateway.ErrUnauthorized
	}
	return nil
}

// Revision is the device's hash, "" when it is not listed.
func (c bcryptCreds) Revision(d gateway.DeviceID) string { return string(c[d]) }

func (c bcryptCreds) PSK([]byte) (gateway.DeviceID, []byte, error) {
	return "", nil, gateway.ErrUnauthorized
}

// testLogger writes debug logs to stderr when MQTT_TEST_LOG is set.
func testLogger() *slog.Logger {
	if os.Getenv("MQTT_TEST_LOG") == "" {
		return nil
	}
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

// testCreds are the devices of most tests.
func testCreds(t testing.TB) bcryptCreds {
	return newCreds(t, map[gateway.DeviceID]string{"dev-1": "secret-1", "dev-2": "secret-2"})
}

// startServer runs a server on free loopback ports until the test ends,
// and checks that Serve then returned nil.
func startServer(t testing.TB, obs gateway.Observer, o Options) *Server {
	t.Helper()
	s := newServer(t, obs, o)
	gatewaytest.Serve(t, s)
	return s
}

// newServer is New with the tests' defaults for the unset options.
func newServer(t testing.TB, obs gateway.Observer, o Options) *Server {
	t.Helper()
	if o.TCP == "" && o.TLS == "" {
		o.TCP = "127.0.0.1:0"
	}
	if o.Gateway == "" {
		o.Gateway = "gw-1"
	}
	if o.Epoch == 0 {
		o.Epoch = 7
	}
	if o.TopicPrefix == "" {
		o.TopicPrefix = "devices"
	}
	if o.HeartbeatInterval == 0 {
		o.HeartbeatInterval = 30 * time.Second
	}
	if o.Logger == nil {
		o.Logger = testLogger()
	}
	s, err := New(obs, o)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	return s
}

func tcpAddr(s *Server) string {
	a, _ := s.Addrs()
	return a.String()
}

// v5 is an MQTT 5 device (paho.golang) whose connection ends with the test.
type v5 struct {
	*paho.Client
	conn         net.Conn
	disconnected chan *paho.Disconnect
	received     chan *paho.Publish
	// clientErrs holds the first errors paho reported (a read that
	// failed ends the connection), for a test's failure message.
	clientErrs chan error
}

// why describes what ended c's connection early, as far as the client
// saw: paho's errors and a server DISCONNECT.
func (c *v5) why() string {
	var b strings.Builder
	for {
		select {
		case err := <-c.clientErrs:
			fmt.Fprintf(&b, "client error: %v; ", err)
		case d := <-c.disconnected:
			fmt.Fprintf(&b, "server DISCONNECT %#x; ", d.ReasonCode)
		default:
			if b.Len() == 0 {
				return "no client error, no DISCONNECT"
			}
			return b.String()
		}
	}
}

// connectV5 dials addr (TLS when tc is set) and sends cp; it returns the
// client and its CONNACK, or the refusal's error.
func connectV5(t testing.TB, addr string, tc *tls.Config, cp *paho.Connect) (*v5, *paho.Connack, error) {
	t.Helper()
	var nc net.Conn
	var err error
	if tc != nil {
		nc, err = tls.Dial("tcp", addr, tc)
	} else {
		nc, err = net.Dial("tcp", addr)
	}
	if err != nil {
		t.Fatalf("dial: %v", err)
	}
	// paho writes a packet in parts, and its pinger (whose first PINGREQ
	// goes at once) writes beside the caller: over TLS, whose Write is
	// not one system call for all the parts, two packets interleave
	// unless the connection is a sync.Locker (paho's
	// packets.NewThreadSafeConn). A DISCONNECT with a PINGREQ inside it
	// reads as reason code 0xC0.
	nc = pahopackets.NewThreadSafeConn(nc)
	c := &v5{conn: nc, disconnected: make(chan *paho.Disconnect, 1), received: make(chan *paho.Publish, 16), clientErrs: make(chan error, 4)}
	c.Client = paho.NewClient(paho.ClientConfig{
		Conn:               nc,
		OnServerDisconnect: func(d *paho.Disconnect) { c.disconnected <- d },
		OnClientError: func(err error) {
			select {
			case c.clientErrs <- err:
			default:
			}
		},
		OnPublishReceived: []func(paho.PublishReceived) (bool, error){func(pr paho.PublishReceived) (bool, error) {
			c.received <- pr.Packet
			return true, nil
		}},
	})
	t.Cleanup(func() { _ = nc.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ack, err := c.Connect(ctx, cp)
	return c, ack, err
}

// mustConnectV5 connects device with password and fails the test on a refusal.
func mustConnectV5(t testing.TB, s *Server, device, password string) *v5 {
	t.Helper()
	c, ack, err := connectV5(t, tcpAddr(s), nil, &paho.Connect{
		ClientID: device, KeepAlive: 30, CleanStart: true,
		Password: []byte(password), PasswordFlag: password != "",
	})
	if err != nil {
		t.Fatalf("connect %s: %v (connack %v)", device, err, ack)
	}
	return c
}

// connackCode dials with MQTT 5, sends cp and returns the CONNACK reason code.
func connackCode(t testing.TB, s *Server, cp *paho.Connect) byte {
	t.Helper()
	_, ack, err := connectV5(t, tcpAddr(s), nil, cp)
	if ack == nil {
		t.Fatalf("connect %q: no CONNACK: %v", cp.ClientID, err)
	}
	return ack.ReasonCode
}

// connectV3 connects an MQTT 3.1.1 device (paho.mqtt.golang) and returns
// the client and the CONNACK return code.
func connectV3(t testing.TB, broker string, tc *tls.Config, device, password string, keepAlive time.Duration) (paho3.Client, byte, error) {
	t.Helper()
	o := paho3.NewClientOptions().
		AddBroker(broker).
		SetClientID(device).
		SetProtocolVersion(4).
		SetCleanSession(true).
		SetAutoReconnect(false).
		SetConnectRetry(false).
		SetConnectTimeout(10 * time.Second).
		SetKeepAlive(keepAlive)
	if password != "" {
		o.SetUsername(device).SetPassword(password)
	}
	if tc != nil {
		o.SetTLSConfig(tc)
	}
	c := paho3.NewClient(o)
	tok := c.Connect()
	if !tok.WaitTimeout(15 * time.Second) {
		t.Fatalf("3.1.1 connect %s: timed out", device)
	}
	t.Cleanup(func() {
		if c.IsConnected() {
			c.Disconnect(0)
		}
	})
	return c, tok.(*paho3.ConnectToken).ReturnCode(), tok.Error()
}

// raw is a hand-driven MQTT connection, for packets no client library
// would send and for devices that freeze.
type raw struct {
	net.Conn
	t testing.TB
}

func dialRaw(t testing.TB, addr string) *raw {
	t.Helper()
	nc, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatalf("dial: %v", err)
	}
	t.Cleanup(func() { _ = nc.Close() })
	return &raw{Conn: nc, t: t}
}

// connectPacket encodes a CONNECT of version (4 = 3.1.1, 5).
func connectPacket(t testing.TB, version byte, device string, password string, keepAlive uint16) []byte {
	t.Helper()
	pk := packets.Packet{
		FixedHeader:     packets.FixedHeader{Type: packets.Connect},
		ProtocolVersion: version,
		Connect: packets.ConnectParams{
			ProtocolName:     []byte("MQTT"),
			Clean:            true,
			Keepalive:        keepAlive,
			ClientIdentifier: device,
		},
	}
	if password != "" {
		pk.Connect.PasswordFlag = true
		pk.Connect.Password = []byte(password)
	}
	return encode(t, pk)
}

func encode(t testing.TB, pk packets.Packet) []byte {
	t.Helper()
	var b bytes.Buffer
	var err error
	switch pk.FixedHeader.Type {
	case packets.Connect:
		err = pk.ConnectEncode(&b)
	case packets.Publish:
		err = pk.PublishEncode(&b)
	case packets.Pingreq:
		err = pk.PingreqEncode(&b)
	case packets.Disconnect:
		err = pk.DisconnectEncode(&b)
	case packets.Subscribe:
		err = pk.SubscribeEncode(&b)
	case packets.Puback:
		err = pk.PubackEncode(&b)
	default:
		t.Fatalf("encode: type %d", pk.FixedHeader.Type)
	}
	if err != nil {
		t.Fatalf("encode: %v", err)
	}
	return b.Bytes()
}

func (r *raw) send(b []byte) {
	r.t.Helper()
	if _, err := r.Write(b); err != nil {
		r.t.Fatalf("write: %v", err)
	}
}

// readPacket reads one packet's fixed header byte and body within d; ok
// is false when the connection ended (or nothing came).
func (r *raw) readPacket(d time.Duration) (typ byte, body []byte, ok bool) {
	r.t.Helper()
	_ = r.SetReadDeadline(time.Now().Add(d))
	var hdr [1]byte
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		return 0, nil, false
	}
	n, mult := 0, 1
	for i := 0; i < 4; i++ {
		var b [1]byte
		if _, err := io.ReadFull(r, b[:]); err != nil {
			return 0, nil, false
		}
		n += int(b[0]&0x7f) * mult
		mult *= 128
		if b[0]&0x80 == 0 {
			break
		}
	}
	body = make([]byte, n)
	if _, err := io.ReadFull(r, body); err != nil {
		return 0, nil, false
	}
	return hdr[0] >> 4, body, true
}

// connack sends CONNECT and returns the CONNACK's code (byte 1 of its
// body: the 3.1.1 return code or the MQTT 5 reason code).
func (r *raw) connack(connect []byte) byte {
	r.t.Helper()
	r.send(connect)
	typ, body, ok := r.readPacket(10 * time.Second)
	if !ok || typ != packets.Connack || len(body) < 2 {
		r.t.Fatalf("no CONNACK (type %d, %x, ok %v)", typ, body, ok)
	}
	return body[1]
}

// closedWithin reports whether the server ends the connection within d
// (whatever it sends before that is skipped).
func (r *raw) closedWithin(d time.Duration) bool {
	r.t.Helper()
	deadline := time.Now().Add(d)
	buf := make([]byte, 256)
	for time.Now().Before(deadline) {
		_ = r.SetReadDeadline(deadline)
		_, err := r.Read(buf)
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			return false
		}
		if err != nil {
			return true
		}
	}
	return false
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

// selfSigned returns a server TLS config for 127.0.0.1 and a client
// config that trusts it.
func selfSigned(t testing.TB) (server, client *tls.Config) {
	c := testcert.New(t)
	return c.Server, c.Client
}
