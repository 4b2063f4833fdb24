package mqtt

import (
	"context"
	"errors"
	"fmt"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/paho"
	paho3 "github.com/eclipse/paho.mqtt.golang"
	"github.com/mochi-mqtt/server/v2/packets"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/fleetgate/fleetgate/gateway"
	"github.com/fleetgate/fleetgate/gateway/clocktest"
	"github.com/fleetgate/fleetgate/gateway/gatewaytest"
)

// ctx10 is a context for one exchange of a test.
func ctx10(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// subscribe subscribes c to filter at QoS 1 and fails the test on a
// refusal.
func subscribe(t testing.TB, c *v5, filter string) {
	t.Helper()
	ack, err := c.Subscribe(ctx10(t), &paho.Subscribe{Subscriptions: []paho.SubscribeOptions{{Topic: filter, QoS: 1}}})
	if err != nil || len(ack.Reasons) != 1 || ack.Reasons[0] > 1 {
		t.Fatalf("subscribe %s: %v (suback %v)", filter, err, ack)
	}
}

// receive waits for the next PUBLISH c receives.
func receive(t testing.TB, c *v5, within time.Duration) *paho.Publish {
	t.Helper()
	select {
	case p := <-c.received:
		return p
	case <-time.After(within):
		t.Fatalf("nothing received within %v", within)
		return nil
	}
}

// quiet reports whether c receives nothing within d.
func nothingReceived(c *v5, d time.Duration) bool {
	select {
	case <-c.received:
		return false
	case <-time.After(d):
		return true
	}
}

// A QoS 1 PUBLISH is acknowledged only once the DataSink took it: while
// the sink holds the device's messages the PUBACK does not come, and it
// comes once they are released. The message carries the device, the
// topic below its root, the payload, the MQTT 5 content type and user
// properties in order, QoS 1, the gateway's clock and Source "mqtt";
// the broker routes it to subscribers only after that.
func TestQoS1PubackWaitsForTheSink(t *testing.T) {
	k := &gatewaytest.DataSink{}
	t0 := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)
	s := startServer(t, &recorder{}, Options{Credentials: testCreds(t), Sink: k, Clock: clocktest.New(t0)})
	c := mustConnectV5(t, s, "dev-1", "secret-1")
	subscribe(t, c, "devices/dev-1/#")

	release := k.Hold("dev-1")
	acked := make(chan error, 1)
	go func() {
		resp, err := c.Publish(context.Background(), &paho.Publish{
			Topic: "devices/dev-1/telemetry/temp", QoS: 1, Payload: []byte(`{"t":21.5}`),
			Properties: &paho.PublishProperties{ContentType: "application/json",
				User: paho.UserProperties{{Key: "unit", Value: "C"}, {Key: "seq", Value: "7"}, {Key: "unit", Value: "K"}}},
		})
		if err == nil && (resp.ReasonCode != 0 || len(resp.Properties.User) != 0) {
			err = fmt.Errorf("PUBACK reason code %#x, properties %v", resp.ReasonCode, resp.Properties.User)
		}
		acked <- err
	}()
	select {
	case m := <-k.Began():
		if m.Topic != "telemetry/temp" {
			t.Fatalf("sink called with topic %q", m.Topic)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the sink was not called")
	}
	select {
	case err := <-acked:
		t.Fatalf("PUBACK before the sink returned (err %v)", err)
	case <-c.received:
		t.Fatal("routed to a subscriber before the sink returned")
	case <-time.After(500 * time.Millisecond):
	}
	release()
	select {
	case err := <-acked:
		if err != nil {
			t.Fatalf("publish: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no PUBACK after the sink returned")
	}
	if p := receive(t, c, 5*time.Second); p.Topic != "devices/dev-1/telemetry/temp" {
		t.Fatalf("routed %s", p.Topic)
	}

	got := k.Messages()
	want := gateway.Message{
		Device: "dev-1", Topic: "telemetry/temp", Payload: []byte(`{"t":21.5}`), ContentType: "application/json",
		Properties: []gateway.Property{{Key: "unit", Value: "C"}, {Key: "seq", Value: "7"}, {Key: "unit", Value: "K"}},
		QoS:        1, Received: t0, Source: "mqtt",
	}
	if len(got) != 1 || !sameMessage(got[0], want) {
		t.Fatalf("sink took %+v\nwant %+v", got, want)
	}
	if n := value(t, s.metrics.upMessages[1]); n != 1 {
		t.Errorf("messages up at QoS 1: %v", n)
	}
	if n := value(t, s.metrics.upBytes[1]); n != float64(len(want.Payload)) {
		t.Errorf("bytes up at QoS 1: %v", n)
	}
}

func sameMessage(a, b gateway.Message) bool {
	return a.Device == b.Device && a.Topic == b.Topic && string(a.Payload) == string(b.Payload) &&
		a.ContentType == b.ContentType && slices.Equal(a.Properties, b.Properties) && a.QoS == b.QoS &&
		a.Received.Equal(b.Received) && a.Source == b.Source
}

// QoS 0 goes up as QoS 0, QoS 2 as QoS 1 (its PUBREC waits for the sink
// as a PUBACK does); the root itself is topic "".
func TestQoSLevelsUp(t *testing.T) {
	k := &gatewaytest.DataSink{}
	s := startServer(t, &recorder{}, Options{Credentials: testCreds(t), Sink: k})
	c := mustConnectV5(t, s, "dev-1", "secret-1")
	if _, err := c.Publish(ctx10(t), &paho.Publish{Topic: "devices/dev-1", QoS: 0, Payload: []byte("zero")}); err != nil {
		t.Fatal(err)
	}
	eventually(t, 5*time.Second, "QoS 0 message up", func() bool { return len(k.Messages()) == 1 })

	release := k.Hold("dev-1")
	done := make(chan error, 1)
	go func() {
		_, err := c.Publish(context.Background(), &paho.Publish{Topic: "devices/dev-1/two", QoS: 2, Payload: []byte("two")})
		done <- err
	}()
	<-k.Began()
	<-k.Began()
	select {
	case err := <-done:
		t.Fatalf("QoS 2 flow ended before the sink returned (%v)", err)
	case <-time.After(300 * time.Millisecond):
	}
	release()
	if err := <-done; err != nil {
		t.Fatalf("QoS 2 publish: %v", err)
	}
	got := k.Messages()
	if len(got) != 2 || got[0].Topic != "" || got[0].QoS != 0 || got[1].Topic != "two" || got[1].QoS != 1 {
		t.Fatalf("sink took %+v", got)
	}
	if value(t, s.metrics.upMessages[0]) != 1 || value(t, s.metrics.upMessages[1]) != 1 {
		t.Fatal("messages up not counted by QoS")
	}
}

// A refusal by the sink gets MQTT 5 clients the reason code of the
// error, for QoS 1 in PUBACK and for QoS 2 in PUBREC; the message is not
// routed. An empty level is refused by the front end before the sink.
func TestSinkRefusalsV5(t *testing.T) {
	k := &gatewaytest.DataSink{}
	s := startServer(t, &recorder{}, Options{Credentials: testCreds(t), Sink: k, Registerer: prometheus.NewRegistry()})
	c := mustConnectV5(t, s, "dev-1", "secret-1")
	subscribe(t, c, "devices/dev-1/#")
	for _, tc := range []struct {
		err   error
		topic string
		qos   byte
		code  byte
	}{
		{errors.New("disk: input/output error"), "devices/dev-1/t", 1, packets.ErrUnspecifiedError.Code},
		{fmt.Errorf("queue: %w", gateway.ErrTooLarge), "devices/dev-1/t", 1, packets.ErrQuotaExceeded.Code},
		{nil, "devices/dev-1/a//b", 1, packets.ErrTopicNameInvalid.Code},
		{nil, "devices/dev-1/", 1, packets.ErrTopicNameInvalid.Code},
		{errors.New("closed"), "devices/dev-1/t", 2, packets.ErrUnspecifiedError.Code},
	} {
		k.Fail(tc.err)
		// paho.golang returns the PUBACK's or PUBREC's reason code.
		resp, err := c.Publish(ctx10(t), &paho.Publish{Topic: tc.topic, QoS: tc.qos, Payload: []byte("x")})
		if resp == nil || resp.ReasonCode != tc.code {
			t.Errorf("%s QoS %d after %v: %+v (%v), want reason code %#x", tc.topic, tc.qos, tc.err, resp, err, tc.code)
		}
	}
	if !nothingReceived(c, 300*time.Millisecond) {
		t.Fatal("a refused message was routed")
	}
	if got := k.Messages(); len(got) != 0 {
		t.Fatalf("sink took %+v", got)
	}
	for reason, want := range map[string]float64{reasonFailed: 2, reasonTooLarge: 1, reasonInvalid: 2} {
		if n := value(t, s.metrics.messagesRefused[reason]); n != want {
			t.Errorf("refusals %s: %v, want %v", reason, n, want)
		}
	}
	// The device is still connected and its next message goes up.
	k.Fail(nil)
	if _, err := c.Publish(ctx10(t), &paho.Publish{Topic: "devices/dev-1/t", QoS: 1, Payload: []byte("ok")}); err != nil {
		t.Fatal(err)
	}
}

// A 3.1.1 client cannot be told: a QoS 1 message the sink failed gets no
// PUBACK, and the client (paho.mqtt.golang with a persistent session)
// sends it again once it has reconnected, when the sink takes it.
func TestV311ResendsAfterAFailure(t *testing.T) {
	k := &gatewaytest.DataSink{}
	s := startServer(t, &recorder{}, Options{Credentials: testCreds(t), Sink: k})
	o := paho3.NewClientOptions().AddBroker("tcp://" + tcpAddr(s)).SetClientID("dev-2").SetProtocolVersion(4).
		SetCleanSession(false).SetAutoReconnect(false).SetConnectTimeout(10 * time.Second).
		SetUsername("dev-2").SetPassword("secret-2")
	c := paho3.NewClient(o)
	if tok := c.Connect(); !tok.WaitTimeout(10*time.Second) || tok.Error() != nil {
		t.Fatalf("connect: %v", tok.Error())
	}
	t.Cleanup(func() { c.Disconnect(0) })

	k.Fail(errors.New("disk full"))
	tok := c.Publish("devices/dev-2/reading", 1, false, "42")
	if tok.WaitTimeout(500 * time.Millisecond) {
		t.Fatalf("publish completed while the sink failed: %v", tok.Error())
	}
	c.Disconnect(50)
	eventually(t, 5*time.Second, "connection ended", func() bool { return s.conns.Load() == 0 })
	k.Fail(nil)
	if len(k.Messages()) != 0 {
		t.Fatal("the failed message was taken")
	}
	if tok := c.Connect(); !tok.WaitTimeout(10*time.Second) || tok.Error() != nil {
		t.Fatalf("reconnect: %v", tok.Error())
	}
	eventually(t, 10*time.Second, "the message sent again", func() bool { return len(k.Messages()) == 1 })
	if m := k.Messages()[0]; m.Topic != "reading" || string(m.Payload) != "42" || m.QoS != 1 {
		t.Fatalf("sink took %+v", m)
	}
}

// A refusal for good (an invalid topic) ends a 3.1.1 client's
// connection: it cannot be told, and would send it again for ever.
func TestV311RefusedForGoodDisconnects(t *testing.T) {
	k := &gatewaytest.DataSink{}
	s := startServer(t, &recorder{}, Options{Credentials: testCreds(t), Sink: k})
	r := dialRaw(t, tcpAddr(s))
	if code := r.connack(connectPacket(t, 4, "dev-1", "secret-1", 30)); code != 0 {
		t.Fatalf("connack %#x", code)
	}
	r.publish(4, 1, false, 1, "devices/dev-1/a//b", []byte("x"))
	if !r.closedWithin(5 * time.Second) {
		t.Fatal("still connected after a message refused for good")
	}
}

// A device may read its command subtree but not write it: a PUBLISH
// there is refused as one outside its subtree (MQTT 5: PUBACK 0x87; 3.1.1:
// disconnected), never reaches the sink, and is counted.
func TestCommandSubtreeRefusedToTheDevice(t *testing.T) {
	k := &gatewaytest.DataSink{}
	s := startServer(t, &recorder{}, Options{Credentials: testCreds(t), Sink: k, Commands: &gatewaytest.Commands{}, Registerer: prometheus.NewRegistry()})
	c := mustConnectV5(t, s, "dev-1", "secret-1")
	subscribe(t, c, "devices/dev-1/cmd/#")
	for _, topic := range []string{"devices/dev-1/cmd", "devices/dev-1/cmd/reboot"} {
		resp, _ := c.Publish(ctx10(t), &paho.Publish{Topic: topic, QoS: 1, Payload: []byte("x")})
		if resp == nil || resp.ReasonCode != packets.ErrNotAuthorized.Code {
			t.Errorf("publish %s: %v, want PUBACK 0x87", topic, resp)
		}
	}
	if _, err := c.Publish(ctx10(t), &paho.Publish{Topic: "devices/dev-1/cmdline", QoS: 1, Payload: []byte("x")}); err != nil {
		t.Errorf("cmdline is not the command subtree: %v", err)
	}
	if got := k.Messages(); len(got) != 1 || got[0].Topic != "cmdline" {
		t.Fatalf("sink took %+v", got)
	}
	if !nothingReceived(c, 200*time.Millisecond) {
		t.Fatal("a refused command reached the device")
	}
	if n := value(t, s.metrics.messagesRefused[reasonCommandTopic]); n != 2 {
		t.Fatalf("command_topic refusals %v", n)
	}

	// Nor may it leave a will there.
	if code := connackCode(t, s, &paho.Connect{ClientID: "dev-2", KeepAlive: 30, CleanStart: true, Password: []byte("secret-2"), PasswordFlag: true,
		WillMessage: &paho.WillMessage{Topic: "devices/dev-2/cmd/reboot", Payload: []byte("x")}}); code != packets.ErrNotAuthorized.Code {
		t.Fatalf("a will in the command subtree: CONNACK %#x, want 0x87", code)
	}

	r := dialRaw(t, tcpAddr(s))
	if code := r.connack(connectPacket(t, 4, "dev-2", "secret-2", 30)); code != 0 {
		t.Fatalf("connack %#x", code)
	}
	r.publish(4, 1, false, 1, "devices/dev-2/cmd/x", []byte("x"))
	if !r.closedWithin(5 * time.Second) {
		t.Fatal("3.1.1 device still connected after a PUBLISH to its command subtree")
	}
}

// A slow sink holds up the client whose message it holds, not the
// others: while dev-1's first message waits, dev-1's next ones are not
// read (they reach the sink afterwards, in order), and dev-2 is
// acknowledged as usual. The figure logged is dev-2's PUBACK latency
// meanwhile.
func TestSlowSinkHoldsOnlyItsClient(t *testing.T) {
	k := &gatewaytest.DataSink{}
	s := startServer(t, &recorder{}, Options{Credentials: testCreds(t), Sink: k})
	slow := dialRaw(t, tcpAddr(s))
	if code := slow.connack(connectPacket(t, 5, "dev-1", "secret-1", 30)); code != 0 {
		t.Fatalf("connack %#x", code)
	}
	fast := mustConnectV5(t, s, "dev-2", "secret-2")

	release := k.Hold("dev-1")
	for i := 1; i <= 5; i++ {
		slow.publish(5, 1, false, uint16(i), "devices/dev-1/seq", []byte{byte('0' + i)})
	}
	<-k.Began() // the first is in the sink; the rest wait unread
	var worst time.Duration
	for i := range 20 {
		begin := time.Now()
		if _, err := fast.Publish(ctx10(t), &paho.Publish{Topic: "devices/dev-2/t", QoS: 1, Payload: []byte{byte(i)}}); err != nil {
			t.Fatalf("dev-2 publish %d: %v", i, err)
		}
		worst = max(worst, time.Since(begin))
	}
	if n := len(k.Messages()); n != 20 {
		t.Fatalf("sink took %d of dev-2's 20 messages while dev-1 was held", n)
	}
	t.Logf("dev-2: 20 QoS 1 publishes while dev-1's sink call was held, slowest PUBACK %v", worst)
	if worst > 2*time.Second {
		t.Fatalf("dev-2 waited %v for a PUBACK while dev-1 was held", worst)
	}
	release()
	for i := 1; i <= 5; i++ {
		if code, ok := slow.ack(packets.Puback); !ok || code != 0 {
			t.Fatalf("dev-1 PUBACK %d: %#x %v", i, code, ok)
		}
	}
	var seq []string
	for _, m := range k.Messages() {
		if m.Device == "dev-1" {
			seq = append(seq, string(m.Payload))
		}
	}
	if strings.Join(seq, "") != "12345" {
		t.Fatalf("dev-1's messages reached the sink as %v", seq)
	}
}

// mosquitto_pub's MQTT 5 properties reach the sink as they were sent.
func TestMosquittoPubPropertiesUp(t *testing.T) {
	k := &gatewaytest.DataSink{}
	s := startServer(t, &recorder{}, Options{Credentials: testCreds(t), Sink: k})
	host, port, _ := strings.Cut(tcpAddr(s), ":")
	mosquitto(t, "mosquitto_pub", "-h", host, "-p", port, "-V", "mqttv5", "-i", "dev-1", "-u", "dev-1", "-P", "secret-1",
		"-q", "1", "-t", "devices/dev-1/status", "-m", "up",
		"-D", "publish", "content-type", "text/plain",
		"-D", "publish", "user-property", "site", "north",
		"-D", "publish", "user-property", "fw", "1.2.3")
	got := k.Messages()
	want := gateway.Message{Device: "dev-1", Topic: "status", Payload: []byte("up"), ContentType: "text/plain",
		Properties: []gateway.Property{{Key: "site", Value: "north"}, {Key: "fw", Value: "1.2.3"}}, QoS: 1, Source: "mqtt"}
	if len(got) != 1 {
		t.Fatalf("sink took %+v", got)
	}
	want.Received = got[0].Received
	if !sameMessage(got[0], want) {
		t.Fatalf("sink took %+v\nwant %+v", got[0], want)
	}
}

// mosquitto runs a mosquitto client to completion within 20 s.
func mosquitto(t testing.TB, name string, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, name, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
	return string(out)
}
