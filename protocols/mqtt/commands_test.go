package mqtt

import (
	"context"
	"fmt"
	"io"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/paho"
	paho3 "github.com/eclipse/paho.mqtt.golang"
	"github.com/mochi-mqtt/server/v2/packets"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/goleak"

	"github.com/fleetgate/fleetgate/gateway"
	"github.com/fleetgate/fleetgate/gateway/gatewaytest"
)

// A command submitted for a connected device that subscribed to its
// command subtree reaches it at QoS 1 under "<root>/cmd/...", with its
// content type, user properties and remaining lifetime as the message
// expiry, and is acknowledged to Commands once the broker took it.
func TestCommandToAConnectedDevice(t *testing.T) {
	box := &gatewaytest.Commands{TTL: time.Hour}
	s := startServer(t, &recorder{}, Options{Credentials: testCreds(t), Commands: box, Registerer: prometheus.NewRegistry()})
	c := mustConnectV5(t, s, "dev-1", "secret-1")
	subscribe(t, c, "devices/dev-1/cmd/#")

	cmd, err := box.Submit(context.Background(), gateway.Message{Device: "dev-1", Topic: "cmd/reboot", Payload: []byte("now"),
		ContentType: "text/plain", Properties: []gateway.Property{{Key: "by", Value: "ops"}}, QoS: 1, Received: time.Now(), Source: "upstream"})
	if err != nil {
		t.Fatal(err)
	}
	p := receive(t, c, 10*time.Second)
	if p.Topic != "devices/dev-1/cmd/reboot" || string(p.Payload) != "now" || p.QoS != 1 {
		t.Fatalf("received %s %q QoS %d", p.Topic, p.Payload, p.QoS)
	}
	if p.Properties == nil || p.Properties.ContentType != "text/plain" || p.Properties.User.Get("by") != "ops" {
		t.Fatalf("properties %+v", p.Properties)
	}
	if e := p.Properties.MessageExpiry; e == nil || *e < 3500 || *e > 3600 {
		t.Fatalf("message expiry %v, want about 3600 s", e)
	}
	eventually(t, 5*time.Second, "the command acknowledged", func() bool {
		return slices.Equal(box.Acks(), []gatewaytest.AckCall{{Device: "dev-1", ID: cmd.ID}}) && len(box.Held("dev-1")) == 0
	})
	if n := value(t, s.metrics.commandsDelivered); n != 1 {
		t.Fatalf("commands delivered %v", n)
	}
	if !nothingReceived(c, 200*time.Millisecond) {
		t.Fatal("the command came twice")
	}
}

// command is a command for device from the upstream broker, received
// now.
func command(device gateway.DeviceID, rest, payload string) gateway.Message {
	return gateway.Message{Device: device, Topic: rest, Payload: []byte(payload), QoS: 1, Received: time.Now(), Source: "upstream"}
}

// A command waits until the device is subscribed to its topic: commands
// submitted before the device connected are pending after CONNECT, go
// when a SUBSCRIBE covers them (each its own), oldest first.
func TestCommandsWaitForASubscription(t *testing.T) {
	box := &gatewaytest.Commands{}
	s := startServer(t, &recorder{}, Options{Credentials: testCreds(t), Commands: box})
	a := box.Add(command("dev-1", "cmd/a", "1"), time.Time{})
	b := box.Add(command("dev-1", "cmd/b", "2"), time.Time{})
	b2 := box.Add(command("dev-1", "cmd/b", "3"), time.Time{})

	c := mustConnectV5(t, s, "dev-1", "secret-1")
	subscribe(t, c, "devices/dev-1/telemetry")
	time.Sleep(200 * time.Millisecond)
	if acked, pending := box.Acks(), len(box.Held("dev-1")); len(acked) != 0 || pending != 3 {
		t.Fatalf("before a matching subscription: acked %v, %d pending", acked, pending)
	}
	subscribe(t, c, "devices/dev-1/cmd/b")
	for _, want := range []string{"2", "3"} {
		if p := receive(t, c, 10*time.Second); p.Topic != "devices/dev-1/cmd/b" || string(p.Payload) != want {
			t.Fatalf("received %s %q, want cmd/b %q", p.Topic, p.Payload, want)
		}
	}
	subscribe(t, c, "devices/dev-1/cmd/#")
	if p := receive(t, c, 10*time.Second); p.Topic != "devices/dev-1/cmd/a" {
		t.Fatalf("received %s, want cmd/a", p.Topic)
	}
	eventually(t, 5*time.Second, "all acknowledged", func() bool {
		return len(box.Held("dev-1")) == 0 && len(box.Acks()) == 3
	})
	if acked := box.Acks(); !slices.Equal(acked, []gatewaytest.AckCall{{Device: "dev-1", ID: b.ID}, {Device: "dev-1", ID: b2.ID}, {Device: "dev-1", ID: a.ID}}) {
		t.Fatalf("acknowledged %v", acked)
	}
}

// A sleepy device (MQTT 5 session expiry; 3.1.1 clean session 0) gets at
// its reconnect the commands submitted while it slept, through the
// subscription its session kept; nothing is acknowledged while it sleeps.
func TestCommandsToASleepyDevice(t *testing.T) {
	box := &gatewaytest.Commands{}
	s := startServer(t, &recorder{}, Options{Credentials: testCreds(t), Commands: box})

	t.Run("v5", func(t *testing.T) {
		expiry := uint32(600)
		connect := func() *v5 {
			c, ack, err := connectV5(t, tcpAddr(s), nil, &paho.Connect{ClientID: "dev-1", KeepAlive: 30, CleanStart: false,
				Password: []byte("secret-1"), PasswordFlag: true, Properties: &paho.ConnectProperties{SessionExpiryInterval: &expiry}})
			if err != nil {
				t.Fatalf("connect: %v (%v)", err, ack)
			}
			return c
		}
		c := connect()
		subscribe(t, c, "devices/dev-1/cmd/#")
		if err := c.Disconnect(&paho.Disconnect{ReasonCode: 0}); err != nil {
			t.Fatal(err)
		}
		eventually(t, 5*time.Second, "asleep", func() bool { return s.conns.Load() == 0 })
		for i := range 3 {
			box.Add(command("dev-1", "cmd/set", fmt.Sprint(i)), time.Time{})
		}
		time.Sleep(200 * time.Millisecond)
		if acked, pending := box.Acks(), len(box.Held("dev-1")); len(acked) != 0 || pending != 3 {
			t.Fatalf("while asleep: acked %v, %d pending", acked, pending)
		}
		c = connect() // no SUBSCRIBE: the session has it
		for i := range 3 {
			if p := receive(t, c, 10*time.Second); string(p.Payload) != fmt.Sprint(i) {
				t.Fatalf("command %d: %q", i, p.Payload)
			}
		}
		eventually(t, 5*time.Second, "acknowledged", func() bool { return len(box.Held("dev-1")) == 0 })
	})

	t.Run("v3.1.1", func(t *testing.T) {
		got := make(chan string, 8)
		o := paho3.NewClientOptions().AddBroker("tcp://" + tcpAddr(s)).SetClientID("dev-2").SetProtocolVersion(4).
			SetCleanSession(false).SetAutoReconnect(false).SetConnectTimeout(10 * time.Second).
			SetUsername("dev-2").SetPassword("secret-2").
			SetDefaultPublishHandler(func(_ paho3.Client, m paho3.Message) { got <- m.Topic() + " " + string(m.Payload()) })
		c := paho3.NewClient(o)
		if tok := c.Connect(); !tok.WaitTimeout(10*time.Second) || tok.Error() != nil {
			t.Fatalf("connect: %v", tok.Error())
		}
		t.Cleanup(func() { c.Disconnect(0) })
		if tok := c.Subscribe("devices/dev-2/cmd/#", 1, nil); !tok.WaitTimeout(10*time.Second) || tok.Error() != nil {
			t.Fatalf("subscribe: %v", tok.Error())
		}
		c.Disconnect(50)
		eventually(t, 5*time.Second, "asleep", func() bool { return s.conns.Load() == 0 })
		box.Add(command("dev-2", "cmd", "wake"), time.Time{})
		if tok := c.Connect(); !tok.WaitTimeout(10*time.Second) || tok.Error() != nil {
			t.Fatalf("reconnect: %v", tok.Error())
		}
		select {
		case m := <-got:
			if m != "devices/dev-2/cmd wake" {
				t.Fatalf("received %s", m)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("the command did not come at the reconnect")
		}
		eventually(t, 5*time.Second, "acknowledged", func() bool { return len(box.Held("dev-2")) == 0 })
	})
}

// readPublish reads packets until a PUBLISH and decodes it (MQTT 5).
func (r *raw) readPublish(d time.Duration) (packets.Packet, bool) {
	r.t.Helper()
	_ = r.SetReadDeadline(time.Now().Add(d))
	for {
		var hdr [1]byte
		if _, err := io.ReadFull(r, hdr[:]); err != nil {
			return packets.Packet{}, false
		}
		n, mult := 0, 1
		for {
			var b [1]byte
			if _, err := io.ReadFull(r, b[:]); err != nil {
				return packets.Packet{}, false
			}
			n += int(b[0]&0x7f) * mult
			mult *= 128
			if b[0]&0x80 == 0 {
				break
			}
		}
		body := make([]byte, n)
		if _, err := io.ReadFull(r, body); err != nil {
			return packets.Packet{}, false
		}
		var pk packets.Packet
		if err := pk.FixedHeader.Decode(hdr[0]); err != nil {
			r.t.Fatalf("decode header: %v", err)
		}
		if pk.FixedHeader.Type != packets.Publish {
			continue
		}
		pk.ProtocolVersion = 5
		if err := pk.PublishDecode(body); err != nil {
			r.t.Fatalf("decode publish: %v", err)
		}
		return pk, true
	}
}

// Beyond limits.mqtt_max_inflight the commands wait in Commands, in
// order: a device that does not acknowledge is sent no more than its
// room, and each PUBACK lets one more go.
func TestCommandsBeyondTheInflightRoom(t *testing.T) {
	box := &gatewaytest.Commands{}
	s := startServer(t, &recorder{}, Options{Credentials: testCreds(t), Commands: box, MaxInflight: 4})
	r := dialRaw(t, tcpAddr(s))
	if code := r.connack(connectPacket(t, 5, "dev-1", "secret-1", 30)); code != 0 {
		t.Fatalf("connack %#x", code)
	}
	r.send(encode(t, packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Subscribe, Qos: 1}, ProtocolVersion: 5, PacketID: 1,
		Filters: packets.Subscriptions{{Filter: "devices/dev-1/cmd/#", Qos: 1}}}))
	r.ack(packets.Suback)
	for i := range 10 {
		box.Add(command("dev-1", "cmd/step", fmt.Sprint(i)), time.Time{})
	}
	var ids []uint16
	var seq []string
	for range 4 {
		pk, ok := r.readPublish(10 * time.Second)
		if !ok {
			t.Fatalf("%d commands came, want 4", len(seq))
		}
		ids, seq = append(ids, pk.PacketID), append(seq, string(pk.Payload))
	}
	if _, ok := r.readPublish(300 * time.Millisecond); ok {
		t.Fatal("a fifth command came with the room full")
	}
	if acked, pending := box.Acks(), len(box.Held("dev-1")); len(acked) != 0 || pending != 10 {
		t.Fatalf("room full, no PUBACK: %d acknowledged, %d pending; want 0 and 10", len(acked), pending)
	}
	for len(seq) < 10 {
		r.send(encode(t, packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Puback}, ProtocolVersion: 5, PacketID: ids[0]}))
		ids = ids[1:]
		pk, ok := r.readPublish(10 * time.Second)
		if !ok {
			t.Fatalf("no command after a PUBACK (%d came)", len(seq))
		}
		ids, seq = append(ids, pk.PacketID), append(seq, string(pk.Payload))
	}
	if got := strings.Join(seq, ""); got != "0123456789" {
		t.Fatalf("commands came as %s", got)
	}
	if acked := len(box.Acks()); acked != 6 {
		t.Fatalf("%d acknowledged after 6 PUBACKs", acked)
	}
}

// rawDevice connects dev-1 over a raw connection (nothing acknowledged
// but what the test sends) with a clean session and subscribes to its
// command subtree; the SUBACK is left to readPublish, which skips it (a
// pending command may come before it).
func rawDevice(t *testing.T, s *Server) *raw {
	t.Helper()
	r := dialRaw(t, tcpAddr(s))
	if code := r.connack(connectPacket(t, 5, "dev-1", "secret-1", 30)); code != 0 {
		t.Fatalf("connack %#x", code)
	}
	r.send(encode(t, packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Subscribe, Qos: 1}, ProtocolVersion: 5, PacketID: 1,
		Filters: packets.Subscriptions{{Filter: "devices/dev-1/cmd/#", Qos: 1}}}))
	return r
}

// A command stays in Commands until the device's PUBACK: a device that
// received it and did not acknowledge it gets it again after the
// gateway restarted (the broker's sessions were in its memory) and after
// its clean session ended; once acknowledged it is gone and does not
// come again.
func TestCommandsAcknowledgedOnlyByThePUBACK(t *testing.T) {
	box := &gatewaytest.Commands{}
	box.Add(command("dev-1", "cmd/set", "v1"), time.Time{})
	expect := func(r *raw) packets.Packet {
		t.Helper()
		pk, ok := r.readPublish(10 * time.Second)
		if !ok || string(pk.Payload) != "v1" {
			t.Fatalf("received %q (%v), want the command v1", pk.Payload, ok)
		}
		return pk
	}
	t.Run("received, then the gateway stops", func(t *testing.T) {
		s := startServer(t, &recorder{}, Options{Credentials: testCreds(t), Commands: box})
		expect(rawDevice(t, s))
		time.Sleep(200 * time.Millisecond)
		if acked, held := box.Acks(), len(box.Held("dev-1")); len(acked) != 0 || held != 1 {
			t.Fatalf("without a PUBACK: acknowledged %v, %d held", acked, held)
		}
	})
	s := startServer(t, &recorder{}, Options{Credentials: testCreds(t), Commands: box})
	t.Run("after the restart, the clean session ends", func(t *testing.T) {
		r := rawDevice(t, s)
		expect(r)
		_ = r.Close()
		eventually(t, 5*time.Second, "disconnected", func() bool { return s.conns.Load() == 0 })
	})
	r := rawDevice(t, s)
	pk := expect(r)
	if len(box.Acks()) != 0 {
		t.Fatal("acknowledged before the PUBACK")
	}
	r.send(encode(t, packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Puback}, ProtocolVersion: 5, PacketID: pk.PacketID}))
	eventually(t, 5*time.Second, "acknowledged once", func() bool { return len(box.Acks()) == 1 && len(box.Held("dev-1")) == 0 })
	if _, ok := r.readPublish(300 * time.Millisecond); ok {
		t.Fatal("the command came again after its PUBACK")
	}
	if n := len(s.inflight.held("dev-1")); n != 0 {
		t.Fatalf("%d commands still tracked in the session", n)
	}
}

// Waiting for commands costs no goroutine per device: with 300 devices
// connected the server runs the two of each connection (mochi's read and
// write loops) and one per 128 devices watching, and once they are gone
// nothing is left.
func TestCommandWaitersPerGroup(t *testing.T) {
	ignore := goleak.IgnoreCurrent()
	box := &gatewaytest.Commands{}
	s, err := New(&recorder{}, Options{TCP: "127.0.0.1:0", Gateway: "gw-1", AllowAnonymous: true, HeartbeatInterval: time.Hour,
		Commands: box, ConnectsPerSecond: 100000, AnonymousConnectsPerSecond: 100000})
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- s.Serve(context.Background()) }()
	const n = 300
	before := runtime.NumGoroutine()
	conns := make([]*raw, n)
	for i := range conns {
		conns[i] = dialRaw(t, tcpAddr(s))
		if code := conns[i].connack(connectPacket(t, 5, fmt.Sprintf("dev-%d", i), "", 0)); code != 0 {
			t.Fatalf("connack %#x", code)
		}
	}
	eventually(t, 5*time.Second, "deliveries started", func() bool { return box.Waiters() == n })
	grew := runtime.NumGoroutine() - before
	t.Logf("%d devices connected: %d goroutines more (%.2f per device)", n, grew, float64(grew)/n)
	if want := 2*n + (n+groupSize-1)/groupSize; grew > want+2 {
		t.Fatalf("%d goroutines for %d devices, want at most %d", grew, n, want+2)
	}
	box.Add(command("dev-299", "cmd", "x"), time.Time{}) // wakes one group
	for _, c := range conns {
		_ = c.Close()
	}
	eventually(t, 10*time.Second, "connections ended", func() bool { return s.conns.Load() == 0 })
	eventually(t, 5*time.Second, "watch groups gone", func() bool {
		s.watchers.mu.Lock()
		defer s.watchers.mu.Unlock()
		return len(s.watchers.open) == 0
	})
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if err := <-served; err != nil {
		t.Fatal(err)
	}
	goleak.VerifyNone(t, ignore)
}
