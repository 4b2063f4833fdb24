package mqtt

import (
	"context"
	"fmt"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/paho"
	mochi "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/packets"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/fleetgate/fleetgate/gateway"
	"github.com/fleetgate/fleetgate/gateway/clocktest"
	"github.com/fleetgate/fleetgate/gateway/gatewaytest"
	"github.com/fleetgate/fleetgate/internal/ratelimit"
)

var t0 = time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)

func TestV5ConnectHeartbeatLeave(t *testing.T) {
	rec := &recorder{}
	clock := clocktest.New(t0)
	reg := prometheus.NewPedanticRegistry()
	s := startServer(t, rec, Options{Credentials: testCreds(t), Clock: clock, Registerer: reg})

	c := mustConnectV5(t, s, "dev-1", "secret-1")
	evs := rec.Evidence() // paho pings once at once: a renewal may follow
	if len(evs) == 0 {
		t.Fatal("no evidence after CONNECT")
	}
	want := gateway.Evidence{Device: "dev-1", Session: "gw-1/7/1", Kind: gateway.Connect, ObservedAt: t0, Protocol: "mqtt"}
	if evs[0] != want {
		t.Fatalf("connect evidence %+v, want %+v", evs[0], want)
	}

	// The device uses the broker as usual: it reads back its own telemetry.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	clock.Advance(time.Second)
	if _, err := c.Subscribe(ctx, &paho.Subscribe{Subscriptions: []paho.SubscribeOptions{{Topic: "devices/dev-1/#", QoS: 1}}}); err != nil {
		t.Fatalf("subscribe: %v", err)
	}
	if _, err := c.Publish(ctx, &paho.Publish{Topic: "devices/dev-1/telemetry", QoS: 1, Payload: []byte("21.5")}); err != nil {
		t.Fatalf("publish: %v", err)
	}
	select {
	case p := <-c.received:
		if p.Topic != "devices/dev-1/telemetry" || string(p.Payload) != "21.5" {
			t.Fatalf("received %s %q", p.Topic, p.Payload)
		}
	case <-ctx.Done():
		t.Fatal("own publish not delivered")
	}
	// SUBSCRIBE and PUBLISH were read (the PUBACK of the delivery may be
	// too, and a PINGREQ paho may send before the clock moved), each a
	// renewal stamped with the clock.
	eventually(t, 5*time.Second, "renewals", func() bool { return rec.Count("gw-1/7/1", gateway.Renew) >= 2 })
	evs = rec.Evidence()
	for _, ev := range evs[1:] {
		if ev.Kind != gateway.Renew || ev.Session != "gw-1/7/1" || ev.ObservedAt.Before(t0) || ev.ObservedAt.After(t0.Add(time.Second)) {
			t.Fatalf("renewal %+v", ev)
		}
	}
	if last := evs[len(evs)-1]; !last.ObservedAt.Equal(t0.Add(time.Second)) {
		t.Fatalf("last renewal %+v, want it at the advanced clock", last)
	}

	if err := c.Disconnect(&paho.Disconnect{ReasonCode: 0}); err != nil {
		t.Fatalf("disconnect: %v", err)
	}
	eventually(t, 5*time.Second, "leave", func() bool { return rec.Count("gw-1/7/1", gateway.Leave) == 1 })
	eventually(t, 5*time.Second, "connection gauge back to 0", func() bool { return s.conns.Load() == 0 })

	if got := value(t, s.metrics.evidence[gateway.Connect]); got != 1 {
		t.Errorf("connect evidence metric %v", got)
	}
	if got := value(t, s.metrics.evidence[gateway.Leave]); got != 1 {
		t.Errorf("leave evidence metric %v", got)
	}
	if got := value(t, s.metrics.connections); got != 0 {
		t.Errorf("connections gauge %v", got)
	}
}

func TestV311ConnectHeartbeatLeave(t *testing.T) {
	rec := &recorder{}
	s := startServer(t, rec, Options{Credentials: testCreds(t)})
	c, code, err := connectV3(t, "tcp://"+tcpAddr(s), nil, "dev-2", "secret-2", 10*time.Second)
	if err != nil || code != 0 {
		t.Fatalf("connect: code %d, %v", code, err)
	}
	session := rec.SessionOf("dev-2")
	if session == "" {
		t.Fatal("no connect evidence")
	}
	if tok := c.Publish("devices/dev-2/telemetry", 1, false, "x"); !tok.WaitTimeout(10*time.Second) || tok.Error() != nil {
		t.Fatalf("publish: %v", tok.Error())
	}
	if n := rec.Count(session, gateway.Renew); n != 1 {
		t.Fatalf("%d renewals after one PUBLISH", n)
	}
	c.Disconnect(100)
	eventually(t, 5*time.Second, "leave", func() bool { return rec.Count(session, gateway.Leave) == 1 })
}

// A new connection of the same client takes the session over: the new
// connection is a new session, the old one gets no Leave.
func TestTakeoverIsNotALeave(t *testing.T) {
	rec := &recorder{}
	s := startServer(t, rec, Options{Credentials: testCreds(t)})
	old := mustConnectV5(t, s, "dev-1", "secret-1")
	first := rec.SessionOf("dev-1")

	next := mustConnectV5(t, s, "dev-1", "secret-1")
	second := rec.SessionOf("dev-1")
	if second == first {
		t.Fatalf("takeover kept session %s", first)
	}
	select {
	case d := <-old.disconnected:
		if d.ReasonCode != packets.ErrSessionTakenOver.Code {
			t.Fatalf("old connection: DISCONNECT %#x", d.ReasonCode)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("old connection not told of the takeover")
	}
	eventually(t, 5*time.Second, "old connection gone", func() bool { return s.conns.Load() == 1 })
	// A takeover of an MQTT 3.1.1 device behaves alike.
	_, code, err := connectV3(t, "tcp://"+tcpAddr(s), nil, "dev-1", "secret-1", 10*time.Second)
	if err != nil || code != 0 {
		t.Fatalf("3.1.1 takeover: code %d, %v", code, err)
	}
	select {
	case d := <-next.disconnected:
		if d.ReasonCode != packets.ErrSessionTakenOver.Code {
			t.Fatalf("second connection: DISCONNECT %#x", d.ReasonCode)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("second connection not told of the 3.1.1 takeover")
	}
	// at most the 3.1.1 connection is left (a loaded machine may already
	// have timed it out)
	eventually(t, 10*time.Second, "second connection gone", func() bool { return s.conns.Load() <= 1 })
	for _, ev := range rec.Evidence() {
		if ev.Kind == gateway.Leave {
			t.Fatalf("takeover made a leave: %+v", ev)
		}
	}
}

// A dropped connection and a frozen device are not leaves: their
// sessions stop renewing and the lease decides.
func TestDropAndFreezeAreNotLeaves(t *testing.T) {
	rec := &recorder{}
	s := startServer(t, rec, Options{Credentials: testCreds(t), HeartbeatInterval: 2 * time.Second})

	// Dropped: the socket closes without DISCONNECT.
	r := dialRaw(t, tcpAddr(s))
	if code := r.connack(connectPacket(t, 5, "dev-1", "secret-1", 30)); code != 0 {
		t.Fatalf("connack %#x", code)
	}
	r.send(encode(t, packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Pingreq}}))
	dropped := rec.SessionOf("dev-1")
	eventually(t, 5*time.Second, "ping renewal", func() bool { return rec.Count(dropped, gateway.Renew) == 1 })
	_ = r.Close()

	// Frozen: a 3.1.1 device asking for no keep-alive is held to the
	// heartbeat interval, so its silent connection ends after 1.5 × 2 s.
	f := dialRaw(t, tcpAddr(s))
	if code := f.connack(connectPacket(t, 4, "dev-2", "secret-2", 0)); code != 0 {
		t.Fatalf("connack %#x", code)
	}
	begin := time.Now()
	if !f.closedWithin(10 * time.Second) {
		t.Fatal("frozen connection kept open")
	}
	if d := time.Since(begin); d < 2*time.Second {
		t.Fatalf("frozen connection closed after %v, before the keep-alive", d)
	}
	eventually(t, 5*time.Second, "connections ended", func() bool { return s.conns.Load() == 0 })
	for _, ev := range rec.Evidence() {
		if ev.Kind == gateway.Leave {
			t.Fatalf("drop or freeze made a leave: %+v", ev)
		}
	}
	if n := len(rec.Evidence()); n != 3 {
		t.Fatalf("evidence %+v, want 2 connects and 1 renewal", rec.Evidence())
	}
}

// A DISCONNECT with an error reason code is not a clean leave.
func TestErrorDisconnectIsNotALeave(t *testing.T) {
	rec := &recorder{}
	s := startServer(t, rec, Options{Credentials: testCreds(t)})
	r := dialRaw(t, tcpAddr(s))
	if code := r.connack(connectPacket(t, 5, "dev-1", "secret-1", 30)); code != 0 {
		t.Fatalf("connack %#x", code)
	}
	r.send(encode(t, packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Disconnect}, ProtocolVersion: 5, ReasonCode: packets.ErrUnspecifiedError.Code}))
	if !r.closedWithin(10 * time.Second) {
		t.Fatal("connection kept open after DISCONNECT")
	}
	eventually(t, 5*time.Second, "connection ended", func() bool { return s.conns.Load() == 0 })
	if n := rec.Count(rec.SessionOf("dev-1"), gateway.Leave); n != 0 {
		t.Fatalf("%d leaves", n)
	}
}

func TestKeepAliveClamp(t *testing.T) {
	s := startServer(t, &recorder{}, Options{Credentials: testCreds(t), HeartbeatInterval: 20 * time.Second})
	for _, tc := range []struct {
		asked uint16
		want  *uint16
	}{
		{asked: 0, want: ptr[uint16](20)},
		{asked: 600, want: ptr[uint16](20)},
		{asked: 20, want: nil},
		{asked: 5, want: nil},
	} {
		_, ack, err := connectV5(t, tcpAddr(s), nil, &paho.Connect{ClientID: "dev-1", KeepAlive: tc.asked, CleanStart: true, Password: []byte("secret-1"), PasswordFlag: true})
		if err != nil {
			t.Fatalf("keep-alive %d: %v", tc.asked, err)
		}
		got := ack.Properties.ServerKeepAlive
		if (got == nil) != (tc.want == nil) || (got != nil && *got != *tc.want) {
			t.Errorf("keep-alive %d: server keep alive %v, want %v", tc.asked, deref(got), deref(tc.want))
		}
	}
	// A reload changes the clamp of later connects.
	s.SetTiming(gateway.Timing{Lease: 90 * time.Second, HeartbeatInterval: 2500 * time.Millisecond})
	s.SetTiming(gateway.Timing{Lease: 90 * time.Second}) // refused, keeps 3 s
	_, ack, err := connectV5(t, tcpAddr(s), nil, &paho.Connect{ClientID: "dev-1", KeepAlive: 60, CleanStart: true, Password: []byte("secret-1"), PasswordFlag: true})
	if err != nil || ack.Properties.ServerKeepAlive == nil || *ack.Properties.ServerKeepAlive != 3 {
		t.Fatalf("after reload: %v %v", err, ack)
	}
}

func ptr[T any](v T) *T { return &v }

func deref(p *uint16) string {
	if p == nil {
		return "none"
	}
	return fmt.Sprint(*p)
}

// Bad credentials all get "not authorized", whichever part was wrong,
// and make no evidence.
func TestWrongCredentials(t *testing.T) {
	rec := &recorder{}
	reg := prometheus.NewPedanticRegistry()
	creds := gatewaytest.NewCredentials(testCreds(t))
	s := startServer(t, rec, Options{Credentials: creds, Registerer: reg})
	for name, cp := range map[string]*paho.Connect{
		"wrong password":          {ClientID: "dev-1", Password: []byte("secret-2"), PasswordFlag: true},
		"unknown device":          {ClientID: "dev-9", Password: []byte("secret-1"), PasswordFlag: true},
		"no password":             {ClientID: "dev-1"},
		"another device's name":   {ClientID: "dev-2", Username: "dev-1", UsernameFlag: true, Password: []byte("secret-2"), PasswordFlag: true},
		"another device's secret": {ClientID: "dev-2", Password: []byte("secret-1"), PasswordFlag: true},
		"will outside the subtree": {ClientID: "dev-1", Password: []byte("secret-1"), PasswordFlag: true,
			WillMessage: &paho.WillMessage{Topic: "devices/dev-2/status", Payload: []byte("gone")}},
	} {
		cp.CleanStart = true
		if code := connackCode(t, s, cp); code != packets.ErrNotAuthorized.Code {
			t.Errorf("%s: CONNACK %#x, want %#x", name, code, packets.ErrNotAuthorized.Code)
		}
	}
	// MQTT 3.1.1: return code 5, "not authorized".
	for _, pw := range []string{"wrong", ""} {
		_, code, err := connectV3(t, "tcp://"+tcpAddr(s), nil, "dev-1", pw, 10*time.Second)
		if err == nil || code != packets.Err3NotAuthorized.Code {
			t.Errorf("3.1.1 password %q: code %d, %v", pw, code, err)
		}
	}
	if evs := rec.Evidence(); len(evs) != 0 {
		t.Fatalf("refused devices made evidence: %+v", evs)
	}
	if got := value(t, s.metrics.refused[reasonNotAuthorized]); got != 8 {
		t.Errorf("refused not_authorized %v, want 8", got)
	}
	eventually(t, 5*time.Second, "refusals' slots released", func() bool { return s.conns.Load() == 0 })
	// A reload of the devices file applies to later connects.
	creds.Set(newCreds(t, map[gateway.DeviceID]string{"dev-1": "rotated"}))
	if code := connackCode(t, s, &paho.Connect{ClientID: "dev-1", CleanStart: true, Password: []byte("secret-1"), PasswordFlag: true}); code != packets.ErrNotAuthorized.Code {
		t.Errorf("old password after reload: %#x", code)
	}
	if code := connackCode(t, s, &paho.Connect{ClientID: "dev-1", CleanStart: true, Password: []byte("rotated"), PasswordFlag: true}); code != 0 {
		t.Errorf("new password after reload: %#x", code)
	}
}

func TestInvalidClientIdentifier(t *testing.T) {
	rec := &recorder{}
	s := startServer(t, rec, Options{AllowAnonymous: true})
	for _, id := range []string{"", "has space", "slash/es", "ü", strings.Repeat("a", gateway.MaxDeviceIDLen+1)} {
		if code := connackCode(t, s, &paho.Connect{ClientID: id, CleanStart: true}); code != packets.ErrClientIdentifierNotValid.Code {
			t.Errorf("v5 client id %q: CONNACK %#x", id, code)
		}
		r := dialRaw(t, tcpAddr(s))
		if code := r.connack(connectPacket(t, 4, id, "", 30)); code != packets.Err3ClientIdentifierNotValid.Code {
			t.Errorf("3.1.1 client id %q: CONNACK %#x", id, code)
		}
	}
	if evs := rec.Evidence(); len(evs) != 0 {
		t.Fatalf("invalid ids made evidence: %+v", evs)
	}
}

func TestAnonymous(t *testing.T) {
	rec := &recorder{}
	creds := gatewaytest.NewCredentials(bcryptCreds{})
	s := startServer(t, rec, Options{AllowAnonymous: true, TopicPrefix: "site/a", Credentials: creds})
	c := mustConnectV5(t, s, "anon-7", "")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := c.Publish(ctx, &paho.Publish{Topic: "site/a/anon-7/t", QoS: 1}); err != nil {
		t.Fatalf("publish under the configured prefix: %v", err)
	}
	// With credentials as well, a password given is checked.
	creds.Set(testCreds(t))
	if code := connackCode(t, s, &paho.Connect{ClientID: "dev-1", CleanStart: true, Password: []byte("nope"), PasswordFlag: true}); code != packets.ErrNotAuthorized.Code {
		t.Errorf("wrong password with anonymous allowed: %#x", code)
	}
	// Anonymous access covers the devices that are not listed only
	// (security_test.go has the attack).
	if code := connackCode(t, s, &paho.Connect{ClientID: "dev-1", CleanStart: true}); code != packets.ErrNotAuthorized.Code {
		t.Errorf("anonymous dev-1, a listed device: %#x", code)
	}
	if code := connackCode(t, s, &paho.Connect{ClientID: "anon-8", CleanStart: true}); code != 0 {
		t.Errorf("anonymous anon-8: %#x", code)
	}
}

// A device publishes and subscribes under devices/<id>/# only.
func TestTopicSubtree(t *testing.T) {
	rec := &recorder{}
	s := startServer(t, rec, Options{Credentials: testCreds(t)})
	c := mustConnectV5(t, s, "dev-1", "secret-1")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	filters := map[string]byte{
		"devices/dev-1/#":     0x01,
		"devices/dev-1":       0x01,
		"devices/dev-1/+/cfg": 0x01,
		"devices/dev-2/#":     packets.ErrNotAuthorized.Code,
		"devices/dev-10/#":    packets.ErrNotAuthorized.Code,
		"devices/+/cfg":       packets.ErrNotAuthorized.Code,
		"#":                   packets.ErrNotAuthorized.Code,
		"$SYS/#":              packets.ErrNotAuthorized.Code,
	}
	for f, want := range filters {
		ack, err := c.Subscribe(ctx, &paho.Subscribe{Subscriptions: []paho.SubscribeOptions{{Topic: f, QoS: 1}}})
		if err != nil && ack == nil {
			t.Fatalf("subscribe %s: %v", f, err)
		}
		if len(ack.Reasons) != 1 || ack.Reasons[0] != want {
			t.Errorf("subscribe %s: reasons %v, want %#x", f, ack.Reasons, want)
		}
	}
	for topic, want := range map[string]byte{
		"devices/dev-1/t":  0,
		"devices/dev-2/t":  packets.ErrNotAuthorized.Code,
		"devices/dev-1x/t": packets.ErrNotAuthorized.Code,
		"other/t":          packets.ErrNotAuthorized.Code,
	} {
		resp, err := c.Publish(ctx, &paho.Publish{Topic: topic, QoS: 1})
		if resp == nil {
			t.Fatalf("publish %s: %v", topic, err)
		}
		if resp.ReasonCode != want {
			t.Errorf("publish %s: PUBACK %#x, want %#x", topic, resp.ReasonCode, want)
		}
	}
}

func TestObserverRefusals(t *testing.T) {
	rec := &recorder{}
	s := startServer(t, rec, Options{AllowAnonymous: true})
	for _, tc := range []struct {
		err    error
		v5, v3 byte
	}{
		{gateway.ErrOverloaded, packets.ErrServerBusy.Code, packets.Err3ServerUnavailable.Code},
		{fmt.Errorf("observe: %w", gateway.ErrInvalidDeviceID), packets.ErrClientIdentifierNotValid.Code, packets.Err3ClientIdentifierNotValid.Code},
		{fmt.Errorf("uplink down"), packets.ErrUnspecifiedError.Code, packets.Err3ServerUnavailable.Code},
	} {
		rec.SetErr(tc.err)
		if code := connackCode(t, s, &paho.Connect{ClientID: "dev-1", CleanStart: true}); code != tc.v5 {
			t.Errorf("%v: v5 CONNACK %#x, want %#x", tc.err, code, tc.v5)
		}
		if code := dialRaw(t, tcpAddr(s)).connack(connectPacket(t, 4, "dev-1", "", 30)); code != tc.v3 {
			t.Errorf("%v: 3.1.1 CONNACK %#x, want %#x", tc.err, code, tc.v3)
		}
	}
	eventually(t, 5*time.Second, "slots released", func() bool { return s.conns.Load() == 0 })
}

func TestMaxClients(t *testing.T) {
	rec := &recorder{}
	s := startServer(t, rec, Options{AllowAnonymous: true, MaxClients: 2})
	a := mustConnectV5(t, s, "dev-a", "")
	_ = mustConnectV5(t, s, "dev-b", "")
	if code := connackCode(t, s, &paho.Connect{ClientID: "dev-c", CleanStart: true}); code != packets.ErrServerBusy.Code {
		t.Fatalf("third client: CONNACK %#x", code)
	}
	if code := dialRaw(t, tcpAddr(s)).connack(connectPacket(t, 4, "dev-c", "", 30)); code != packets.Err3ServerUnavailable.Code {
		t.Fatalf("third 3.1.1 client: CONNACK %#x", code)
	}
	if err := a.Disconnect(&paho.Disconnect{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, 5*time.Second, "slot released", func() bool { return s.conns.Load() == 1 })
	_ = mustConnectV5(t, s, "dev-c", "")
}

// Connects are limited per device (after CONNECT names it) and, 250 times
// higher, per source address: devices behind one NAT address reconnect
// together after a restart. (The devices are anonymous: their own bound
// per source network is lifted here, TestAnonymousConnectsPerNetwork
// has it.)
func TestConnectRatePerDeviceAndSource(t *testing.T) {
	clock := clocktest.New(t0)
	s := startServer(t, &recorder{}, Options{AllowAnonymous: true, ConnectsPerSecond: 2, AnonymousConnectsPerSecond: 1000, Clock: clock})
	// One device: two connects a second, then "connection rate exceeded".
	for i := range 2 {
		if code := dialRaw(t, tcpAddr(s)).connack(connectPacket(t, 5, "dev-a", "", 30)); code != 0 {
			t.Fatalf("connect %d of dev-a: %#x", i, code)
		}
	}
	if code := dialRaw(t, tcpAddr(s)).connack(connectPacket(t, 5, "dev-a", "", 30)); code != packets.ErrConnectionRateExceeded.Code {
		t.Fatalf("third connect of dev-a within the second: %#x, want %#x", code, packets.ErrConnectionRateExceeded.Code)
	}
	if code := dialRaw(t, tcpAddr(s)).connack(connectPacket(t, 4, "dev-a", "", 30)); code != packets.Err3ServerUnavailable.Code {
		t.Fatalf("3.1.1 connect of dev-a beyond its rate: %#x, want %#x", code, packets.Err3ServerUnavailable.Code)
	}
	// Other devices from the same address: up to 2 × ratelimit.AddressFactor
	// connects a second in all (4 so far).
	for i := range 2*ratelimit.AddressFactor - 4 {
		if code := dialRaw(t, tcpAddr(s)).connack(connectPacket(t, 5, fmt.Sprintf("nat-%d", i), "", 30)); code != 0 {
			t.Fatalf("connect %d behind the address: %#x", i, code)
		}
	}
	if !dialRaw(t, tcpAddr(s)).closedWithin(10 * time.Second) {
		t.Fatal("connect beyond the address's rate accepted")
	}
	clock.Advance(time.Second)
	if code := dialRaw(t, tcpAddr(s)).connack(connectPacket(t, 5, "dev-a", "", 30)); code != 0 {
		t.Fatalf("connect after a second: %#x", code)
	}
	if got := value(t, s.metrics.refused[reasonRate]); got != 3 {
		t.Errorf("refused connect_rate %v, want 3", got)
	}
}

func TestTLS(t *testing.T) {
	rec := &recorder{}
	srvTLS, cliTLS := selfSigned(t)
	s := startServer(t, rec, Options{TCP: "127.0.0.1:0", TLS: "127.0.0.1:0", TLSConfig: srvTLS, Credentials: testCreds(t)})
	_, tlsAddr := s.Addrs()

	c, _, err := connectV5(t, tlsAddr.String(), cliTLS, &paho.Connect{ClientID: "dev-1", CleanStart: true, KeepAlive: 30, Password: []byte("secret-1"), PasswordFlag: true})
	if err != nil {
		t.Fatalf("v5 over TLS: %v", err)
	}
	session := rec.SessionOf("dev-1")
	if err := c.Disconnect(&paho.Disconnect{}); err != nil {
		t.Fatalf("DISCONNECT over TLS: %v (%s)", err, c.why())
	}
	eventually(t, 5*time.Second, "leave over TLS", func() bool { return rec.Count(session, gateway.Leave) == 1 })

	c3, code, err := connectV3(t, "ssl://"+tlsAddr.String(), cliTLS, "dev-2", "secret-2", 10*time.Second)
	if err != nil || code != 0 {
		t.Fatalf("3.1.1 over TLS: code %d, %v", code, err)
	}
	session = rec.SessionOf("dev-2")
	c3.Disconnect(100)
	eventually(t, 5*time.Second, "3.1.1 leave over TLS", func() bool { return rec.Count(session, gateway.Leave) == 1 })
	if code := connackCode(t, s, &paho.Connect{ClientID: "dev-2", CleanStart: true, Password: []byte("bad"), PasswordFlag: true}); code != packets.ErrNotAuthorized.Code {
		t.Fatalf("wrong password on the TCP port: %#x", code)
	}
}

// The evidence counter is shared with the other front ends on one registry.
func TestMetricsShared(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	coap := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name:        "fleetgate_evidence_total",
		Help:        "Evidence accepted by the gateway from protocol front ends, by kind.",
		ConstLabels: prometheus.Labels{"protocol": "coap"},
	}, []string{"kind"})
	reg.MustRegister(coap)
	coap.WithLabelValues("renew").Inc()
	s := startServer(t, &recorder{}, Options{AllowAnonymous: true, Registerer: reg})
	_ = mustConnectV5(t, s, "dev-1", "")
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, mf := range mfs {
		n += len(mf.GetMetric())
	}
	// coap renew + mqtt connect/renew/leave, the connections gauge, the
	// refusal reasons, the retained refusals and bytes, and the data
	// path's: messages and bytes up by QoS, message refusals by reason,
	// commands delivered and submitted, local clients.
	if n != 1+3+1+len(refusalReasons)+2+4+len(messageRefusalReasons)+3 {
		t.Fatalf("%d series", n)
	}
	if _, err := New(&recorder{}, Options{TCP: "127.0.0.1:0", Gateway: "gw-2", AllowAnonymous: true, HeartbeatInterval: time.Second, Registerer: reg}); err != nil {
		t.Fatalf("second server on the same registry: %v", err)
	}
}

func TestOptionsChecked(t *testing.T) {
	ok := Options{TCP: "127.0.0.1:0", Gateway: "gw-1", AllowAnonymous: true, HeartbeatInterval: time.Second}
	for name, mut := range map[string]func(*Options){
		"no address":                func(o *Options) { o.TCP = "" },
		"tls without cert":          func(o *Options) { o.TLS = "127.0.0.1:0" },
		"no heartbeat":              func(o *Options) { o.HeartbeatInterval = 0 },
		"no credentials":            func(o *Options) { o.AllowAnonymous = false },
		"bad gateway":               func(o *Options) { o.Gateway = "gw 1" },
		"negative limit":            func(o *Options) { o.MaxClients = -1 },
		"negative retained":         func(o *Options) { o.RetainedBytes = -1 },
		"inflight too big":          func(o *Options) { o.MaxInflight = 65536 },
		"bad address":               func(o *Options) { o.TCP = "256.0.0.1:0" },
		"clients without passwords": func(o *Options) { o.Clients = []LocalClient{{Name: "nr"}} },
		"bad client name": func(o *Options) {
			o.Clients, o.ClientPasswords = []LocalClient{{Name: "node red"}}, bcryptCreds{}
		},
		"bad client filter": func(o *Options) {
			o.Clients, o.ClientPasswords = []LocalClient{{Name: "nr", Read: []string{"a/#/b"}}}, bcryptCreds{}
		},
	} {
		o := ok
		mut(&o)
		if s, err := New(&recorder{}, o); err == nil {
			_ = s.Close()
			t.Errorf("%s: accepted", name)
		}
	}
}

// value reads a counter or gauge.
func value(t testing.TB, c prometheus.Metric) float64 {
	t.Helper()
	var m dto.Metric
	if err := c.Write(&m); err != nil {
		t.Fatal(err)
	}
	if m.Counter != nil {
		return m.Counter.GetValue()
	}
	return m.Gauge.GetValue()
}

// The per-packet path (a Renew per packet read) allocates nothing.
func TestRenewDoesNotAllocate(t *testing.T) {
	obs := &countingObserver{}
	s := startServer(t, obs, Options{AllowAnonymous: true, Registerer: prometheus.NewRegistry()})
	h := &presence{srv: s}
	cl := &mochi.Client{}
	cl.Net.Conn = &conn{device: "dev-1", session: "gw-1/7/1", root: "devices/dev-1"}
	pk := packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Publish}}
	if n := testing.AllocsPerRun(1000, func() { _, _ = h.OnPacketRead(cl, pk) }); n != 0 {
		t.Fatalf("%v allocations per packet", n)
	}
	if got := obs.n.Load(); got != 1001 {
		t.Fatalf("%d renewals observed", got)
	}
}

// busyCreds are Credentials whose password checks find no slot.
type busyCreds struct{ bcryptCreds }

func (busyCreds) CheckPassword(gateway.DeviceID, []byte) error {
	return fmt.Errorf("no slot: %w", gateway.ErrOverloaded)
}

// Credentials that cannot check a password now (auth bounds the bcrypt
// work) make the device hear "server busy", not "not authorized".
func TestPasswordCheckOverloaded(t *testing.T) {
	s := startServer(t, &recorder{}, Options{Credentials: busyCreds{testCreds(t)}, Registerer: prometheus.NewRegistry()})
	for _, v := range []byte{4, 5} {
		r := dialRaw(t, tcpAddr(s))
		want := packets.ErrServerBusy.Code
		if v == 4 {
			want = packets.Err3ServerUnavailable.Code
		}
		if code := r.connack(connectPacket(t, v, "dev-1", "secret-1", 30)); code != want {
			t.Fatalf("v%d: connack %#x, want %#x", v, code, want)
		}
	}
	if n := value(t, s.metrics.refused[reasonOverloaded]); n != 2 {
		t.Fatalf("refused overloaded %v", n)
	}
}

// A client that does not read what it subscribed to is disconnected once
// limits.mqtt_max_pending_writes packets are queued for it; that is a
// dropped connection, not a leave.
func TestSlowClientDisconnected(t *testing.T) {
	rec := &recorder{}
	s := startServer(t, rec, Options{AllowAnonymous: true, MaxPendingWrites: 4, Registerer: prometheus.NewRegistry()})
	r := dialRaw(t, tcpAddr(s))
	if code := r.connack(connectPacket(t, 4, "dev-1", "", 30)); code != 0 {
		t.Fatalf("connack %#x", code)
	}
	r.send(encode(t, packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Subscribe, Qos: 1}, ProtocolVersion: 4, PacketID: 1,
		Filters: packets.Subscriptions{{Filter: "devices/dev-1/#"}}}))
	// Publish to itself and never read: the socket buffers fill, then the
	// pending writes.
	pub := encode(t, packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Publish}, ProtocolVersion: 4, TopicName: "devices/dev-1/t", Payload: make([]byte, 4000)})
	_ = r.SetWriteDeadline(time.Now().Add(30 * time.Second))
	ended := false
	for range 100000 {
		if _, err := r.Write(pub); err != nil {
			ended = true
			break
		}
	}
	if !ended {
		t.Fatal("a client that never reads was kept")
	}
	eventually(t, 10*time.Second, "slot released", func() bool { return s.conns.Load() == 0 })
	if n := value(t, s.metrics.refused[reasonTooSlow]); n != 1 {
		t.Fatalf("refused too_slow %v", n)
	}
	if n := rec.Count(rec.SessionOf("dev-1"), gateway.Leave); n != 0 {
		t.Fatalf("%d leaves", n)
	}
}

// freezable is a device-side connection that can stop sending without
// closing: a frozen device.
type freezable struct {
	net.Conn
	frozen atomic.Bool
}

func (f *freezable) Write(b []byte) (int, error) {
	if f.frozen.Load() {
		return len(b), nil
	}
	return f.Conn.Write(b)
}

// An MQTT 5 client asking for no keep-alive follows the Server Keep Alive
// it is given (paho pings at the heartbeat interval, each ping a Renew);
// when it freezes, the server ends the connection after 1.5 keep-alives
// without a Leave, and the session's lease decides. (2 s, not 1 s: mochi
// allows keep-alive + keep-alive/2 in whole seconds, which is no grace at
// all for 1 s.)
func TestV5ServerKeepAliveAndFreeze(t *testing.T) {
	rec := &recorder{}
	s := startServer(t, rec, Options{Credentials: testCreds(t), HeartbeatInterval: 2 * time.Second})
	nc, err := net.Dial("tcp", tcpAddr(s))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = nc.Close() })
	f := &freezable{Conn: nc}
	c := paho.NewClient(paho.ClientConfig{Conn: f, OnClientError: func(error) {}})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ack, err := c.Connect(ctx, &paho.Connect{ClientID: "dev-1", KeepAlive: 0, CleanStart: true, Password: []byte("secret-1"), PasswordFlag: true})
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	if ka := ack.Properties.ServerKeepAlive; ka == nil || *ka != 2 {
		t.Fatalf("server keep alive %s, want 2", deref(ka))
	}
	session := rec.SessionOf("dev-1")
	eventually(t, 10*time.Second, "keep-alive pings", func() bool { return rec.Count(session, gateway.Renew) >= 2 })

	f.frozen.Store(true)
	frozenAt := time.Now()
	renewals := rec.Count(session, gateway.Renew)
	eventually(t, 10*time.Second, "frozen connection ended", func() bool { return s.conns.Load() == 0 })
	if d := time.Since(frozenAt); d < 2*time.Second {
		t.Fatalf("frozen connection ended after %v, before its keep-alive", d)
	}
	if n := rec.Count(session, gateway.Renew); n > renewals+1 { // one ping may have been on the wire
		t.Fatalf("%d renewals after the freeze", n-renewals)
	}
	if n := rec.Count(session, gateway.Leave); n != 0 {
		t.Fatalf("freeze made %d leaves", n)
	}
}

// TestCloseWhileConnecting closes servers while connections are on their
// way into mochi (complete and half-sent CONNECTs). Close must not return
// before every connection goroutine has left mochi: mochi's Close waits
// for its clients with a WaitGroup that a goroutine entering
// EstablishConnection would otherwise Add to concurrently, which -race
// reports (it did in about one run in two of this test before the
// listener waited for its handlers).
func TestCloseWhileConnecting(t *testing.T) {
	for round := range 30 {
		var servers []*Server
		var conns []net.Conn
		for range 3 {
			s := startServer(t, &recorder{}, Options{AllowAnonymous: true, ConnectsPerSecond: 100000})
			servers = append(servers, s)
			for i := range 5 {
				nc, err := net.Dial("tcp", tcpAddr(s))
				if err != nil {
					t.Fatal(err)
				}
				conns = append(conns, nc)
				pk := connectPacket(t, 5, fmt.Sprintf("dev-%d", i), "", 30)
				if i%2 == 1 {
					pk = pk[:len(pk)/2]
				}
				if _, err := nc.Write(pk); err != nil {
					t.Fatal(err)
				}
			}
		}
		closed := make(chan struct{})
		go func() {
			for _, s := range servers {
				s.Close()
			}
			close(closed)
		}()
		select {
		case <-closed:
		case <-time.After(20 * time.Second):
			t.Fatalf("round %d: Close did not return in 20 s", round)
		}
		for _, c := range conns {
			c.Close()
		}
	}
}

// Clients that end while the server shuts down: mochi's own
// closeListenerClients read-locks the client list twice, and a client's
// Clients.Delete queued between the two locks hung Close for good (CI,
// mochi v2.7.9). Each round ends 20 clients (DISCONNECT or a dropped
// socket) at the moment Close starts.
func TestCloseWhileClientsLeave(t *testing.T) {
	for round := range 20 {
		s := startServer(t, &recorder{}, Options{AllowAnonymous: true, ConnectsPerSecond: 100000})
		disconnect := encode(t, packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Disconnect}, ProtocolVersion: 5})
		var clients []*raw
		for i := range 20 {
			r := dialRaw(t, tcpAddr(s))
			if code := r.connack(connectPacket(t, 5, fmt.Sprintf("dev-%d", i), "", 30)); code != 0 {
				t.Fatalf("round %d: CONNACK %#x", round, code)
			}
			clients = append(clients, r)
		}
		start := make(chan struct{})
		var wg sync.WaitGroup
		for i, r := range clients {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				if i%2 == 0 {
					_, _ = r.Write(disconnect)
				}
				_ = r.Close()
			}()
		}
		closed := make(chan struct{})
		go func() {
			<-start
			s.Close()
			close(closed)
		}()
		close(start)
		select {
		case <-closed:
		case <-time.After(20 * time.Second):
			t.Fatalf("round %d: Close did not return in 20 s", round)
		}
		wg.Wait()
	}
}

// The user name names the device, whatever client ID the client sends:
// mosquitto_pub -u without -i (3.1.1: a generated "mosq-…"; MQTT 5: an
// empty one), and an MQTT 5 client with an empty client ID, which is told
// its device ID. Without a user name the client ID names it. A second
// connection of the device, under another client ID, takes the first one
// over: one connection per device.
func TestUserNameNamesTheDevice(t *testing.T) {
	rec := &recorder{}
	s := startServer(t, rec, Options{Credentials: gatewaytest.NewCredentials(testCreds(t))})
	host, port, _ := net.SplitHostPort(tcpAddr(s))
	for _, v := range []string{"mqttv311", "mqttv5"} {
		mosquitto(t, "mosquitto_pub", "-h", host, "-p", port, "-V", v, "-u", "dev-1", "-P", "secret-1", "-t", "devices/dev-1/t", "-m", v)
	}
	mosquitto(t, "mosquitto_pub", "-h", host, "-p", port, "-i", "generated-7", "-u", "dev-2", "-P", "secret-2", "-t", "devices/dev-2/t", "-m", "x")
	var devices []string
	for _, e := range rec.Evidence() {
		if e.Kind == gateway.Connect {
			devices = append(devices, string(e.Device))
		}
	}
	if strings.Join(devices, " ") != "dev-1 dev-1 dev-2" {
		t.Fatalf("connects of devices %v, want dev-1 (3.1.1), dev-1 (5), dev-2", devices)
	}

	first, ack, err := connectV5(t, tcpAddr(s), nil, &paho.Connect{KeepAlive: 30, CleanStart: true,
		Username: "dev-1", UsernameFlag: true, Password: []byte("secret-1"), PasswordFlag: true})
	if err != nil || ack.Properties == nil || ack.Properties.AssignedClientID != "dev-1" {
		t.Fatalf("empty client ID: %v, %+v; want Assigned Client Identifier dev-1", err, ack)
	}
	_, ack, err = connectV5(t, tcpAddr(s), nil, &paho.Connect{ClientID: "other-id", KeepAlive: 30, CleanStart: true,
		Username: "dev-1", UsernameFlag: true, Password: []byte("secret-1"), PasswordFlag: true})
	if err != nil || ack.ReasonCode != 0 || ack.Properties.AssignedClientID != "" {
		t.Fatalf("second connection: %v, %+v", err, ack)
	}
	select {
	case d := <-first.disconnected:
		if d.ReasonCode != packets.ErrSessionTakenOver.Code {
			t.Fatalf("first connection: DISCONNECT %#x, want session taken over", d.ReasonCode)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the first connection of dev-1 was not taken over by its second")
	}
}
