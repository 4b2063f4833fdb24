package mqtt

import (
	"context"
	"errors"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/paho"
	"github.com/mochi-mqtt/server/v2/packets"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/fleetgate/fleetgate/gateway"
	"github.com/fleetgate/fleetgate/gateway/gatewaytest"
)

// siteClients are the local clients of most tests: a flow engine that
// reads everything and sends commands, and a collector that reads
// telemetry and writes its own topic.
var siteClients = []LocalClient{
	{Name: "node-red", Read: []string{"devices/#"}, Write: []string{"devices/+/cmd/#"}},
	{Name: "telegraf", Read: []string{"devices/+/telemetry/#"}, Write: []string{"site/metrics"}},
}

func sitePasswords(t testing.TB) bcryptCreds {
	return newCreds(t, map[gateway.DeviceID]string{"node-red": "nr-secret", "telegraf": "tg-secret"})
}

// connectLocal connects local client name with client ID id over MQTT 5.
func connectLocal(t testing.TB, s *Server, id, name, password string) (*v5, *paho.Connack, error) {
	t.Helper()
	return connectV5(t, tcpAddr(s), nil, &paho.Connect{ClientID: id, KeepAlive: 30, CleanStart: true,
		Username: name, UsernameFlag: true, Password: []byte(password), PasswordFlag: true})
}

func mustConnectLocal(t testing.TB, s *Server, id, name, password string) *v5 {
	t.Helper()
	c, ack, err := connectLocal(t, s, id, name, password)
	if err != nil {
		t.Fatalf("connect %s as %s: %v (connack %v)", id, name, err, ack)
	}
	return c
}

// subscribeCode is the SUBACK reason code of one filter.
func subscribeCode(t testing.TB, c *v5, filter string) byte {
	t.Helper()
	ack, err := c.Subscribe(ctx10(t), &paho.Subscribe{Subscriptions: []paho.SubscribeOptions{{Topic: filter, QoS: 1}}})
	if ack == nil || len(ack.Reasons) != 1 {
		t.Fatalf("subscribe %s: %v (%v)", filter, ack, err)
	}
	return ack.Reasons[0]
}

// publishCode is the PUBACK reason code of a QoS 1 PUBLISH.
func publishCode(t testing.TB, c *v5, topic string) byte {
	t.Helper()
	resp, err := c.Publish(ctx10(t), &paho.Publish{Topic: topic, QoS: 1, Payload: []byte("x")})
	if resp == nil {
		t.Fatalf("publish %s: %v", topic, err)
	}
	return resp.ReasonCode
}

// A local client subscribes to what its read list covers and publishes
// to what its write list matches; everything else is refused as for a
// device outside its subtree and counted. It is no device: no evidence,
// and a wrong or missing password is refused.
func TestLocalClientAccess(t *testing.T) {
	rec := &recorder{}
	k := &gatewaytest.DataSink{}
	s := startServer(t, rec, Options{Credentials: testCreds(t), Clients: siteClients, ClientPasswords: sitePasswords(t),
		Sink: k, Registerer: prometheus.NewRegistry()})
	nr := mustConnectLocal(t, s, "nr-1", "node-red", "nr-secret")
	tg := mustConnectLocal(t, s, "tg-1", "telegraf", "tg-secret")

	for _, c := range []struct {
		c      *v5
		filter string
		want   byte
	}{
		{nr, "devices/#", 1},
		{tg, "devices/+/telemetry/#", 1},
		{tg, "devices/dev-1/telemetry/temp", 1},
		{tg, "$share/collectors/devices/+/telemetry/#", 1},
		{tg, "devices/#", packets.ErrNotAuthorized.Code},
		{tg, "devices/dev-1/cmd/#", packets.ErrNotAuthorized.Code},
		{tg, "#", packets.ErrNotAuthorized.Code},
		{nr, "$SYS/#", packets.ErrNotAuthorized.Code},
		{nr, "site/#", packets.ErrNotAuthorized.Code},
	} {
		if got := subscribeCode(t, c.c, c.filter); got != c.want {
			t.Errorf("subscribe %s: %#x, want %#x", c.filter, got, c.want)
		}
	}
	dev := mustConnectV5(t, s, "dev-1", "secret-1")
	if _, err := dev.Publish(ctx10(t), &paho.Publish{Topic: "devices/dev-1/telemetry/temp", QoS: 1, Payload: []byte("21")}); err != nil {
		t.Fatal(err)
	}
	for name, c := range map[string]*v5{"node-red": nr, "telegraf": tg} {
		if p := receive(t, c, 10*time.Second); p.Topic != "devices/dev-1/telemetry/temp" || string(p.Payload) != "21" {
			t.Fatalf("%s received %s %q", name, p.Topic, p.Payload)
		}
	}
	if got := publishCode(t, tg, "site/metrics"); got != 0 {
		t.Errorf("telegraf publish site/metrics: %#x", got)
	}
	for _, topic := range []string{"site/other", "devices/dev-1/cmd/x", "devices/dev-1/telemetry/temp"} {
		if got := publishCode(t, tg, topic); got != packets.ErrNotAuthorized.Code {
			t.Errorf("telegraf publish %s: %#x, want 0x87", topic, got)
		}
	}
	if got := k.Messages(); len(got) != 1 || got[0].Device != "dev-1" {
		t.Fatalf("sink took %+v: a local client's message is not a device's", got)
	}
	for _, ev := range rec.Evidence() {
		if ev.Device != "dev-1" {
			t.Fatalf("evidence of a local client: %+v", ev)
		}
	}
	if n := value(t, s.metrics.localClients); n != 2 {
		t.Errorf("local clients connected %v", n)
	}
	for reason, want := range map[string]float64{reasonSubscribeDenied: 5, reasonPublishDenied: 3} {
		if n := value(t, s.metrics.messagesRefused[reason]); n != want {
			t.Errorf("refusals %s: %v, want %v", reason, n, want)
		}
	}

	for _, c := range []struct{ name, password string }{{"node-red", "tg-secret"}, {"telegraf", ""}, {"grafana", "nr-secret"}} {
		_, ack, err := connectV5(t, tcpAddr(s), nil, &paho.Connect{ClientID: "x", KeepAlive: 30, CleanStart: true,
			Username: c.name, UsernameFlag: true, Password: []byte(c.password), PasswordFlag: c.password != ""})
		if err == nil || ack == nil || ack.ReasonCode != packets.ErrNotAuthorized.Code {
			t.Errorf("%s with password %q: %v (connack %v), want 0x87", c.name, c.password, err, ack)
		}
	}
	if n := value(t, s.metrics.refused[reasonNotAuthorized]); n != 3 {
		t.Errorf("not_authorized refusals %v", n)
	}
	_ = nr.Disconnect(&paho.Disconnect{})
	eventually(t, 5*time.Second, "node-red gone", func() bool { return value(t, s.metrics.localClients) == 1 })
}

// A local client's PUBLISH to a device's command subtree is a command:
// submitted with the client's name as its source, acknowledged with the
// result of Submit, and routed only by the command delivery (the device
// and every reader get it once).
func TestLocalClientCommand(t *testing.T) {
	box := &gatewaytest.Commands{}
	k := &gatewaytest.DataSink{}
	s := startServer(t, &recorder{}, Options{Credentials: testCreds(t), Clients: siteClients, ClientPasswords: sitePasswords(t),
		Sink: k, Commands: box, Registerer: prometheus.NewRegistry()})
	dev := mustConnectV5(t, s, "dev-1", "secret-1")
	subscribe(t, dev, "devices/dev-1/cmd/#")
	nr := mustConnectLocal(t, s, "nr-1", "node-red", "nr-secret")
	subscribe(t, nr, "devices/#")

	resp, err := nr.Publish(ctx10(t), &paho.Publish{Topic: "devices/dev-1/cmd/reboot", QoS: 1, Payload: []byte("in 5 s"),
		Properties: &paho.PublishProperties{ContentType: "text/plain", User: paho.UserProperties{{Key: "flow", Value: "f1"}}}})
	if err != nil || resp.ReasonCode != 0 {
		t.Fatalf("command: %v %v", resp, err)
	}
	submitted := box.Submitted()
	if len(submitted) != 1 {
		t.Fatalf("submitted %+v", submitted)
	}
	m := submitted[0]
	if m.Device != "dev-1" || m.Topic != "cmd/reboot" || string(m.Payload) != "in 5 s" || m.Source != "node-red" ||
		m.ContentType != "text/plain" || len(m.Properties) != 1 || m.Properties[0] != (gateway.Property{Key: "flow", Value: "f1"}) || m.QoS != 1 {
		t.Fatalf("submitted %+v", m)
	}
	for name, c := range map[string]*v5{"device": dev, "node-red": nr} {
		if p := receive(t, c, 10*time.Second); p.Topic != "devices/dev-1/cmd/reboot" || string(p.Payload) != "in 5 s" {
			t.Fatalf("%s received %s %q", name, p.Topic, p.Payload)
		}
		if !nothingReceived(c, 300*time.Millisecond) {
			t.Fatalf("%s received the command twice", name)
		}
	}
	eventually(t, 5*time.Second, "acknowledged", func() bool { return len(box.Held("dev-1")) == 0 })
	if len(k.Messages()) != 0 {
		t.Fatal("a command went to the sink")
	}

	// A will there would be published as a command without being one.
	if code := connackCode(t, s, &paho.Connect{ClientID: "nr-2", KeepAlive: 30, CleanStart: true, Username: "node-red", UsernameFlag: true,
		Password: []byte("nr-secret"), PasswordFlag: true, WillMessage: &paho.WillMessage{Topic: "devices/dev-1/cmd/x", Payload: []byte("x")}}); code != packets.ErrNotAuthorized.Code {
		t.Fatalf("a local client's will in a command subtree: CONNACK %#x, want 0x87", code)
	}

	// Submit's refusals reach the local client as the sink's do a device.
	box.FailSubmit(errors.New("disk: input/output error"))
	if got := publishCode(t, nr, "devices/dev-2/cmd/x"); got != packets.ErrUnspecifiedError.Code {
		t.Errorf("a failed Submit: %#x, want 0x80", got)
	}
	box.FailSubmit(nil)
	if got := publishCode(t, nr, "devices/dev-2/cmd//x"); got != packets.ErrTopicNameInvalid.Code {
		t.Errorf("an invalid command: %#x, want 0x90", got)
	}
	if n := value(t, s.metrics.commandsSubmitted); n != 1 {
		t.Errorf("commands submitted %v", n)
	}
}

// A local client's client ID is its own: one that is a device's ID takes
// nothing from the device (the broker keeps the client as
// "<name>/<client ID>"), and a device whose ID is a local client's name
// connects without a user name.
func TestLocalClientIDIsNotADevice(t *testing.T) {
	creds := newCreds(t, map[gateway.DeviceID]string{"dev-1": "secret-1", "telegraf": "device-secret"})
	s := startServer(t, &recorder{}, Options{Credentials: creds, Clients: siteClients, ClientPasswords: sitePasswords(t)})
	dev := mustConnectV5(t, s, "dev-1", "secret-1")
	mustConnectLocal(t, s, "dev-1", "node-red", "nr-secret")
	if _, ok := s.broker.Clients.Get("node-red/dev-1"); !ok {
		t.Fatal("the local client is not kept as node-red/dev-1")
	}
	select {
	case d := <-dev.disconnected:
		t.Fatalf("the device was disconnected: %v", d)
	case <-time.After(200 * time.Millisecond):
	}
	if got := publishCode(t, dev, "devices/dev-1/t"); got != 0 {
		t.Fatalf("the device after the local client connected: %#x", got)
	}

	// User name "telegraf" is the local client: the device's password fails.
	if _, ack, err := connectLocal(t, s, "telegraf", "telegraf", "device-secret"); err == nil || ack.ReasonCode != packets.ErrNotAuthorized.Code {
		t.Fatalf("device telegraf with its user name: %v %v", ack, err)
	}
	mustConnectV5(t, s, "telegraf", "device-secret")
}

// mosquitto_sub as a local client reads what its list allows and is
// refused the rest; mosquitto_pub as one sends a command.
func TestMosquittoLocalClients(t *testing.T) {
	box := &gatewaytest.Commands{}
	s := startServer(t, &recorder{}, Options{Credentials: testCreds(t), Clients: siteClients, ClientPasswords: sitePasswords(t), Commands: box})
	host, port, _ := strings.Cut(tcpAddr(s), ":")
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	sub := exec.CommandContext(ctx, "mosquitto_sub", "-h", host, "-p", port, "-V", "mqttv311", "-i", "dashboard",
		"-u", "node-red", "-P", "nr-secret", "-t", "devices/#", "-C", "1", "-v")
	var out strings.Builder
	sub.Stdout, sub.Stderr = &out, &out
	if err := sub.Start(); err != nil {
		t.Fatal(err)
	}
	eventually(t, 10*time.Second, "mosquitto_sub subscribed", func() bool {
		return s.broker.Topics.Subscribers("devices/dev-1/t").Subscriptions["node-red/dashboard"].Filter != ""
	})
	mosquitto(t, "mosquitto_pub", "-h", host, "-p", port, "-i", "dev-1", "-u", "dev-1", "-P", "secret-1", "-q", "1",
		"-t", "devices/dev-1/t", "-m", "21")
	if err := sub.Wait(); err != nil || strings.TrimSpace(out.String()) != "devices/dev-1/t 21" {
		t.Fatalf("mosquitto_sub: %v: %q", err, out.String())
	}

	denied := exec.CommandContext(ctx, "mosquitto_sub", "-h", host, "-p", port, "-V", "mqttv5", "-i", "tg",
		"-u", "telegraf", "-P", "tg-secret", "-t", "devices/#", "-C", "1", "-W", "5")
	b, err := denied.CombinedOutput() // mosquitto_sub exits 0 when it was denied
	if !strings.Contains(string(b), "All subscription requests were denied") {
		t.Fatalf("telegraf reading devices/#: %v: %q", err, b)
	}

	mosquitto(t, "mosquitto_pub", "-h", host, "-p", port, "-V", "mqttv5", "-i", "flows", "-u", "node-red", "-P", "nr-secret",
		"-q", "1", "-t", "devices/dev-2/cmd/light", "-m", "on")
	if submitted, pending := box.Submitted(), len(box.Held("dev-2")); len(submitted) != 1 || submitted[0].Topic != "cmd/light" || pending != 1 {
		t.Fatalf("submitted %+v, %d pending", submitted, pending)
	}
}

// SetClients replaces the local clients: a client whose password or
// lists changed, or that went away, is disconnected; the others stay; a
// new one may connect; an invalid list is refused and the old one kept.
func TestSetClients(t *testing.T) {
	s := startServer(t, &recorder{}, Options{Credentials: testCreds(t), Clients: siteClients, ClientPasswords: sitePasswords(t),
		Registerer: prometheus.NewRegistry()})
	nr := mustConnectLocal(t, s, "nr", "node-red", "nr-secret")
	tg := mustConnectLocal(t, s, "tg", "telegraf", "tg-secret")

	// node-red's password changes, telegraf's entry does not, grafana is new.
	next := []LocalClient{siteClients[0], siteClients[1], {Name: "grafana", Read: []string{"devices/+/telemetry/#"}}}
	passwords := newCreds(t, map[gateway.DeviceID]string{"node-red": "nr-new", "grafana": "gf-secret"})
	passwords["telegraf"] = tgHash(t, s)
	if err := s.SetClients(next, passwords); err != nil {
		t.Fatal(err)
	}
	expectRevoked(t, nr, "node-red")
	select {
	case d := <-tg.disconnected:
		t.Fatalf("telegraf disconnected: %v", d)
	case <-time.After(200 * time.Millisecond):
	}
	if _, _, err := connectLocal(t, s, "nr", "node-red", "nr-secret"); err == nil {
		t.Fatal("node-red's old password still admitted")
	}
	mustConnectLocal(t, s, "nr", "node-red", "nr-new")
	mustConnectLocal(t, s, "gf", "grafana", "gf-secret")

	// telegraf's write list changes: it goes.
	next[1] = LocalClient{Name: "telegraf", Read: siteClients[1].Read}
	if err := s.SetClients(next, passwords); err != nil {
		t.Fatal(err)
	}
	expectRevoked(t, tg, "telegraf")

	for _, bad := range [][]LocalClient{
		{{Name: "twice"}, {Name: "twice"}},
		{{Name: "bad name"}},
		{{Name: "x", Read: []string{"a/#/b"}}},
	} {
		if err := s.SetClients(bad, passwords); err == nil {
			t.Errorf("SetClients(%+v) took it", bad)
		}
	}
	if err := s.SetClients(siteClients, nil); err == nil {
		t.Error("SetClients without passwords took it")
	}
	mustConnectLocal(t, s, "gf2", "grafana", "gf-secret") // the list in force was kept
	if n := value(t, s.metrics.refused[reasonRevoked]); n != 2 {
		t.Errorf("revoked %v", n)
	}
}

// tgHash is the hash s checks telegraf's password against.
func tgHash(t testing.TB, s *Server) []byte {
	t.Helper()
	return s.local.Load().passwords.c.(bcryptCreds)["telegraf"]
}

// expectRevoked waits for an MQTT 5 client's DISCONNECT "not authorized".
func expectRevoked(t testing.TB, c *v5, name string) {
	t.Helper()
	select {
	case d := <-c.disconnected:
		if d.ReasonCode != packets.ErrNotAuthorized.Code {
			t.Fatalf("%s: DISCONNECT %#x, want 0x87", name, d.ReasonCode)
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("%s was not disconnected", name)
	}
}

// A device message that came over CoAP or an adapter reaches the local
// consumers through PublishLocal, with its content type and user
// properties, and is not handed to the sink again.
func TestPublishLocalReachesLocalClients(t *testing.T) {
	k := &gatewaytest.DataSink{}
	s := startServer(t, &recorder{}, Options{Credentials: testCreds(t), Clients: siteClients, ClientPasswords: sitePasswords(t),
		Sink: k, Registerer: prometheus.NewRegistry()})
	nr := mustConnectLocal(t, s, "nr-1", "node-red", "nr-secret")
	if got := subscribeCode(t, nr, "devices/#"); got != 1 {
		t.Fatalf("subscribe: %#x", got)
	}
	m := gateway.Message{Device: "coap-7", Topic: "telemetry/temp", Payload: []byte(`{"t":21}`), ContentType: "application/json",
		Properties: []gateway.Property{{Key: "site", Value: "a"}, {Key: "site", Value: "b"}}, Source: "coap"}
	if err := s.PublishLocal("devices/coap-7/telemetry/temp", m); err != nil {
		t.Fatal(err)
	}
	p := receive(t, nr, 10*time.Second)
	if p.Topic != "devices/coap-7/telemetry/temp" || string(p.Payload) != `{"t":21}` || p.Properties == nil ||
		p.Properties.ContentType != "application/json" || len(p.Properties.User) != 2 || p.Properties.User[1].Value != "b" {
		t.Fatalf("received %+v", p)
	}
	if n := len(k.Messages()); n != 0 {
		t.Fatalf("the sink took %d messages, want none (the message came from the data path)", n)
	}
}
