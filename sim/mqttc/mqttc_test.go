package mqttc

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/fleetgate/fleetgate/gateway"
	"github.com/fleetgate/fleetgate/gateway/gatewaytest"
	"github.com/fleetgate/fleetgate/internal/mosquittotest"
	"github.com/fleetgate/fleetgate/protocols/mqtt"
)

// noDevices lists no device: every device is anonymous.
type noDevices struct{}

var _ gateway.Credentials = noDevices{}

func (noDevices) CheckPassword(gateway.DeviceID, []byte) error { return gateway.ErrUnauthorized }
func (noDevices) PSK([]byte) (gateway.DeviceID, []byte, error) {
	return "", nil, gateway.ErrUnauthorized
}
func (noDevices) Revision(gateway.DeviceID) string { return "" }

// gatewayFront runs the gateway's MQTT front end (anonymous devices
// allowed) on a free loopback port, recording the evidence it hands on.
func gatewayFront(t *testing.T) (string, *gatewaytest.Recorder) {
	t.Helper()
	rec := &gatewaytest.Recorder{}
	s, err := mqtt.New(rec, mqtt.Options{TCP: "127.0.0.1:0", Gateway: "gw-1", Epoch: 1, TopicPrefix: "devices",
		HeartbeatInterval: 30 * time.Second, AllowAnonymous: true, Credentials: noDevices{},
		Registerer: prometheus.NewRegistry()})
	if err != nil {
		t.Fatal(err)
	}
	gatewaytest.Serve(t, s)
	a, _ := s.Addrs()
	return a.String(), rec
}

// session runs a device's whole life on c: QoS 1 and QoS 0 PUBLISH,
// PINGREQ, DISCONNECT; it checks every answer and that the broker ends
// the connection after DISCONNECT.
func session(t *testing.T, c *Conn, topic string) {
	t.Helper()
	expect := func(typ byte, id uint16) {
		t.Helper()
		_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
		p, err := c.Read()
		// reason codes below 0x80 are successes (mosquitto answers a
		// message nobody subscribed to with 0x10)
		if err != nil || p.Type != typ || p.ID != id || p.Code >= 0x80 {
			t.Fatalf("read %+v, %v: want type %d id %d", p, err, typ, id)
		}
	}
	for id := uint16(1); id <= 3; id++ {
		if err := c.Send(PublishPacket(c.v, topic, []byte("21.5"), 1, id), time.Second); err != nil {
			t.Fatal(err)
		}
		expect(PUBACK, id)
	}
	if err := c.Send(PublishPacket(c.v, topic, []byte("21.5"), 0, 0), time.Second); err != nil {
		t.Fatal(err)
	}
	if err := c.Send(PingPacket(), time.Second); err != nil {
		t.Fatal(err)
	}
	expect(PINGRESP, 0) // after the QoS 0 message, which has no answer
	if err := c.Send(DisconnectPacket(), time.Second); err != nil {
		t.Fatal(err)
	}
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if p, err := c.Read(); !errors.Is(err, io.EOF) {
		t.Fatalf("after DISCONNECT: %+v, %v; want the broker to close", p, err)
	}
	c.Close()
}

// Against the gateway's MQTT front end, from a source address of the
// simulator's kind: the connection is a Connect, every packet after it
// a Renew, DISCONNECT a Leave; both versions.
func TestClientAgainstGateway(t *testing.T) {
	addr, rec := gatewayFront(t)
	for _, v := range []Version{V311, V5} {
		id := "dev-" + string('0'+byte(v))
		local := &net.TCPAddr{IP: net.IPv4(127, 9, 8, byte(v))}
		c, err := Dial(context.Background(), v, local, addr, id, 60*time.Second, 5*time.Second)
		if err != nil {
			t.Fatalf("v%d: %v", v, err)
		}
		if got := c.LocalAddr().(*net.TCPAddr).IP; !got.Equal(local.IP) {
			t.Fatalf("connected from %v, want %v", got, local.IP)
		}
		session(t, c, "devices/"+id+"/t")
		s := rec.SessionOf(gateway.DeviceID(id))
		deadline := time.Now().Add(5 * time.Second)
		for rec.Count(s, gateway.Leave) == 0 && time.Now().Before(deadline) {
			time.Sleep(10 * time.Millisecond)
		}
		if rec.Count(s, gateway.Connect) != 1 || rec.Count(s, gateway.Renew) < 5 || rec.Count(s, gateway.Leave) != 1 {
			t.Fatalf("v%d: connect %d renew %d leave %d", v, rec.Count(s, gateway.Connect), rec.Count(s, gateway.Renew), rec.Count(s, gateway.Leave))
		}
	}
}

// Against mosquitto: the same life, and a refused CONNECT is a
// RefusedError with the broker's code.
func TestClientAgainstMosquitto(t *testing.T) {
	open := mosquittotest.Start(t, mosquittotest.Options{})
	closed := mosquittotest.Start(t, mosquittotest.Options{User: "u", Password: "p"})
	for _, tc := range []struct {
		v       Version
		refused byte
	}{{V311, 0x05}, {V5, 0x87}} {
		c, err := Dial(context.Background(), tc.v, nil, open.Addr, "sim-1", 60*time.Second, 5*time.Second)
		if err != nil {
			t.Fatalf("v%d: %v", tc.v, err)
		}
		session(t, c, "sim/1/t")
		_, err = Dial(context.Background(), tc.v, nil, closed.Addr, "sim-2", 60*time.Second, 5*time.Second)
		var re *RefusedError
		if !errors.As(err, &re) || re.Code != tc.refused {
			t.Fatalf("v%d: anonymous on a broker with accounts: %v, want connack 0x%02x", tc.v, err, tc.refused)
		}
	}
}

// FuzzReadPacket: whatever a broker sends, the reader neither panics
// nor reads more than a packet's worth, and a PUBACK it accepts has an
// identifier. The seeds run as an ordinary test.
func FuzzReadPacket(f *testing.F) {
	for _, s := range [][]byte{
		{0x20, 0x02, 0x00, 0x00},                   // CONNACK 3.1.1
		{0x20, 0x03, 0x01, 0x00, 0x00},             // CONNACK 5, session present
		{0x20, 0x06, 0x00, 0x87, 0x03, 0x1f, 0, 0}, // CONNACK 5 with a property
		{0x40, 0x02, 0x00, 0x01},                   // PUBACK
		{0x40, 0x04, 0x00, 0x02, 0x10, 0x00},       // PUBACK 5 with a reason
		{0xd0, 0x00},                               // PINGRESP
		{0xe0, 0x01, 0x8e},                         // DISCONNECT 5
		{0x40, 0xff, 0xff, 0xff, 0x7f},             // 268 MB claimed
		{0x30, 0x80, 0x80, 0x80, 0x80, 0x01},       // a five-byte length
	} {
		f.Add(byte(V5), s)
		f.Add(byte(V311), s)
	}
	f.Fuzz(func(t *testing.T, v byte, data []byte) {
		r := bufio.NewReader(bytes.NewReader(data))
		for range len(data) + 1 {
			p, err := ReadPacket(r, Version(v))
			if err != nil {
				return
			}
			if p.Type == PUBACK && p.ID == 0 {
				t.Fatalf("PUBACK without an identifier from %x", data)
			}
		}
		t.Fatalf("more packets than bytes in %x", data)
	})
}
