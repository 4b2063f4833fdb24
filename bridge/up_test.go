package bridge_test

import (
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/paho"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/fleetgate/fleetgate/bridge"
	"github.com/fleetgate/fleetgate/gateway"
)

// localCalls records the bridge's Local calls.
type localCalls struct {
	mu     sync.Mutex
	topics []string
}

func (l *localCalls) publish(topic string, _ gateway.Message) error {
	l.mu.Lock()
	l.topics = append(l.topics, topic)
	l.mu.Unlock()
	return nil
}

func (l *localCalls) get() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.topics)
}

// Up end to end over MQTT 5: each message on
// <prefix>/devices/<device>[/<rest>] at its QoS, with its content type
// and user properties in order; Local gets what did not come through
// the local broker; the queues are empty once the broker acknowledged.
func TestUpMQTT5(t *testing.T) {
	br := startBroker(t)
	sub := subscribe(t, br, "fleetgate/gw1/#")
	durable, memory := memQueue(t, nil), memQueue(t, nil)
	var local localCalls
	reg := prometheus.NewRegistry()
	b := startBridge(t, bridge.Options{GatewayID: "gw1", URL: brokerURL(br), Durable: durable, Memory: memory,
		Commands: memQueue(t, nil), Local: local.publish, Registerer: reg})

	withProps := msg("d1", "telemetry/temp", "21.5", 1, "coap")
	withProps.ContentType = "text/plain"
	withProps.Properties = []gateway.Property{{Key: "unit", Value: "C"}, {Key: "unit", Value: "K"}, {Key: "a", Value: ""}}
	msgs := []gateway.Message{withProps, msg("d1", "", "root", 1, "coap"), msg("d1", "state", "best effort", 0, "coap")}
	if err := b.Publish(t.Context(), msgs); err != nil {
		t.Fatal(err)
	}
	if err := b.Publish(t.Context(), []gateway.Message{msg("d2", "x", "from mqtt", 1, "mqtt")}); err != nil {
		t.Fatal(err)
	}
	sub.await(t, 10*time.Second, "4 messages upstream", func(m []upMsg) bool { return len(m) >= 4 })
	got := sub.snapshot()
	byTopic := map[string]upMsg{}
	for _, m := range got {
		byTopic[m.topic] = m
	}
	want := []struct {
		topic, payload string
		qos            byte
	}{
		{"fleetgate/gw1/devices/d1/telemetry/temp", "21.5", 1},
		{"fleetgate/gw1/devices/d1", "root", 1},
		{"fleetgate/gw1/devices/d1/state", "best effort", 0},
		{"fleetgate/gw1/devices/d2/x", "from mqtt", 1},
	}
	for _, w := range want {
		m, ok := byTopic[w.topic]
		if !ok || m.payload != w.payload || m.qos != w.qos {
			t.Errorf("upstream %s: got %+v (found %v), want payload %q at QoS %d", w.topic, m, ok, w.payload, w.qos)
		}
	}
	m := byTopic["fleetgate/gw1/devices/d1/telemetry/temp"]
	wantProps := []paho.UserProperty{{Key: "unit", Value: "C"}, {Key: "unit", Value: "K"}, {Key: "a", Value: ""}}
	if m.contentType != "text/plain" || !slices.Equal(m.props, wantProps) {
		t.Errorf("properties upstream: content type %q, user %v; want text/plain, %v", m.contentType, m.props, wantProps)
	}
	if l := local.get(); !slices.Equal(l, []string{"devices/d1/telemetry/temp", "devices/d1", "devices/d1/state"}) {
		t.Errorf("Local got %v; want d1's three (d2's came through the local broker)", l)
	}
	await(t, 5*time.Second, "queues empty", func() bool { return durable.Stats().Messages == 0 && memory.Stats().Messages == 0 })
	if v := metric(t, reg, "fleetgate_bridge_messages_out_total", "direction", "up", "source", "coap"); v != 3 {
		t.Errorf("messages out (up, coap) = %v, want 3", v)
	}
	if v := metric(t, reg, "fleetgate_bridge_messages_in_total", "direction", "up", "source", "mqtt"); v != 1 {
		t.Errorf("messages in (up, mqtt) = %v, want 1", v)
	}
	if v := metric(t, reg, "fleetgate_bridge_publish_latency_seconds"); v != 3 {
		t.Errorf("publish latency observations = %v, want 3 (the QoS 1 messages)", v)
	}
	if v := metric(t, reg, "fleetgate_bridge_upstream_connected"); v != 1 {
		t.Errorf("upstream connected = %v", v)
	}
	s := b.Status()
	if !s.Upstream.Connected || s.Upstream.Connects != 1 || s.Upstream.Forwarded != 4 || len(s.Queues) != 3 {
		t.Errorf("Status = %+v", s)
	}
}

// Up end to end over MQTT 3.1.1: the broker sees a 3.1.1 client, the
// messages arrive at their QoS, without properties (3.1.1 has none).
func TestUpMQTT311(t *testing.T) {
	br := startBroker(t)
	sub := subscribe(t, br, "up/#")
	durable, memory := memQueue(t, nil), memQueue(t, nil)
	b := startBridge(t, bridge.Options{URL: brokerURL(br), ClientID: "bridge311", TopicPrefix: "up", ProtocolVersion: 4,
		Durable: durable, Memory: memory, Commands: memQueue(t, nil)})
	m := msg("d1", "t", "one", 1, "coap")
	m.ContentType = "text/plain"
	if err := b.Publish(t.Context(), []gateway.Message{m, msg("d1", "t", "two", 0, "coap")}); err != nil {
		t.Fatal(err)
	}
	sub.await(t, 10*time.Second, "both upstream", func(m []upMsg) bool { return len(m) == 2 })
	got := sub.snapshot() // QoS 0 and 1 go through two queues: in either order
	slices.SortFunc(got, func(a, b upMsg) int { return strings.Compare(a.payload, b.payload) })
	if got[0].payload != "one" || got[0].qos != 1 || got[0].contentType != "" || got[1].payload != "two" || got[1].qos != 0 {
		t.Errorf("upstream: %+v", got)
	}
	// mosquitto's log names MQTT 3.1 p1, 3.1.1 p2 and 5 p5
	if !strings.Contains(br.Log(), "as bridge311 (p2,") {
		t.Errorf("the broker did not log a 3.1.1 (p2) client bridge311:\n%s", br.Log())
	}
	await(t, 5*time.Second, "queues empty", func() bool { return durable.Stats().Messages == 0 && memory.Stats().Messages == 0 })
}

// Only the messages an up filter matches (on their local topic) are
// queued and forwarded; Local gets every one.
func TestUpFilter(t *testing.T) {
	br := startBroker(t)
	sub := subscribe(t, br, "fg/#")
	durable, memory := memQueue(t, nil), memQueue(t, nil)
	var local localCalls
	b := startBridge(t, bridge.Options{URL: brokerURL(br), ClientID: "c", TopicPrefix: "fg",
		Up: []string{"devices/+/telemetry/#", "devices/special/#"}, Durable: durable, Memory: memory,
		Commands: memQueue(t, nil), Local: local.publish})
	in := []gateway.Message{
		msg("a", "telemetry", "1", 1, "coap"),
		msg("a", "telemetry/x/y", "2", 0, "coap"),
		msg("a", "status", "no", 1, "coap"),
		msg("a", "", "no", 1, "coap"),
		msg("special", "", "3", 1, "coap"),
		msg("b", "telemetryx", "no", 1, "coap"),
	}
	for _, m := range in {
		if err := b.Publish(t.Context(), []gateway.Message{m}); err != nil {
			t.Fatal(err)
		}
	}
	sub.await(t, 10*time.Second, "the three selected", func(m []upMsg) bool { return len(m) >= 3 })
	time.Sleep(200 * time.Millisecond) // nothing else comes
	var got []string
	for _, m := range sub.snapshot() {
		got = append(got, m.topic+"="+m.payload)
	}
	slices.Sort(got)
	want := []string{"fg/devices/a/telemetry/x/y=2", "fg/devices/a/telemetry=1", "fg/devices/special=3"}
	if !slices.Equal(got, want) {
		t.Errorf("forwarded %v, want %v", got, want)
	}
	if n := len(local.get()); n != len(in) {
		t.Errorf("Local got %d messages, want all %d", n, len(in))
	}
}

// A device's messages arrive upstream in order, 40 devices in parallel
// through 8 lanes, from a backlog (queued while the bridge could not
// reach the broker) and as they come; at QoS 1 and 0.
func TestOrderPerDevice(t *testing.T) {
	br := startBroker(t)
	sub := subscribe(t, br, "fg/#")
	link := startProxy(t, br.Addr)
	link.cut()
	b := startBridge(t, bridge.Options{URL: link.url(), ClientID: "c", TopicPrefix: "fg", Lanes: 8,
		Durable: memQueue(t, nil), Memory: memQueue(t, nil), Commands: memQueue(t, nil)})
	const devices, per = 40, 50
	opened := make(chan struct{})
	go func() {
		defer close(opened)
		time.Sleep(100 * time.Millisecond)
		link.open()
	}()
	defer func() { <-opened }()
	var wg sync.WaitGroup
	for d := range devices {
		wg.Go(func() {
			for i := range per {
				qos := byte(1)
				if d%4 == 0 {
					qos = 0
				}
				if err := b.Publish(t.Context(), []gateway.Message{msg(fmt.Sprintf("d%d", d), "seq", strconv.Itoa(i), qos, "coap")}); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	if !sub.wait(60*time.Second, func(m []upMsg) bool { return len(m) == devices*per }) {
		t.Errorf("after 60s %d messages of %d read", len(sub.snapshot()), devices*per)
	}
	checkOrder(t, sub.snapshot(), devices, per, true)
}

// checkOrder checks that each device's first occurrences come in
// order, with none missing ("seq" payloads 0..per-1 of devices d0..); it
// returns the duplicates.
func checkOrder(t testing.TB, msgs []upMsg, devices, per int, noDuplicates bool) int {
	t.Helper()
	next := map[string]int{}
	seen := map[string]bool{}
	dups := 0
	for _, m := range msgs {
		if seen[m.topic+"#"+m.payload] {
			dups++
			continue
		}
		seen[m.topic+"#"+m.payload] = true
		n, _ := strconv.Atoi(m.payload)
		if n != next[m.topic] {
			t.Errorf("%s: first read %d after %d", m.topic, n, next[m.topic]-1)
		}
		next[m.topic] = n + 1
	}
	for d := range devices {
		topic := fmt.Sprintf("fg/devices/d%d/seq", d)
		if next[topic] != per {
			t.Errorf("%s: %d of %d read", topic, next[topic], per)
		}
	}
	if noDuplicates && dups > 0 {
		t.Errorf("%d duplicates", dups)
	}
	return dups
}

// A message the broker refuses for good is sent RefusalTries times, then
// dropped, logged with its device and counted; the other devices' go on,
// and so do the refused device's later messages. Refused by a mosquitto
// ACL (PUBACK 0x87) and by its maximum packet size.
func TestRefusedMessageDropped(t *testing.T) {
	for _, tc := range []struct {
		name   string
		config func(t *testing.T) []string
		bad    gateway.Message
		reason string
	}{
		{"acl", func(t *testing.T) []string {
			path := filepath.Join(t.TempDir(), "acl")
			if err := os.WriteFile(path, []byte("topic readwrite fg/devices/+/ok\n"), 0o600); err != nil {
				t.Fatal(err)
			}
			return []string{"acl_file " + path}
		}, msg("d1", "denied", "x", 1, "coap"), "reason code 0x87"},
		{"packet size", func(*testing.T) []string { return []string{"max_packet_size 400"} },
			msg("d1", "ok", strings.Repeat("x", 500), 1, "coap"), "more than the broker's maximum packet size 400"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			br := startBroker(t, tc.config(t)...)
			sub := subscribe(t, br, "fg/#")
			reg := prometheus.NewRegistry()
			logs := &logBuffer{t: t}
			durable := memQueue(t, nil)
			b := startBridge(t, bridge.Options{URL: brokerURL(br), ClientID: "c", TopicPrefix: "fg", Registerer: reg,
				Logger:  slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelWarn})),
				Durable: durable, Memory: memQueue(t, nil), Commands: memQueue(t, nil)})
			start := time.Now()
			for _, m := range []gateway.Message{tc.bad, msg("d1", "ok", "after", 1, "coap")} {
				if err := b.Publish(t.Context(), []gateway.Message{m}); err != nil {
					t.Fatal(err)
				}
			}
			for d := range 10 {
				if err := b.Publish(t.Context(), []gateway.Message{msg(fmt.Sprintf("o%d", d), "ok", "other", 1, "coap")}); err != nil {
					t.Fatal(err)
				}
			}
			sub.await(t, 10*time.Second, "the others' messages and d1's later one", func(m []upMsg) bool { return len(m) == 11 })
			if d := time.Since(start); d > 5*time.Second {
				t.Errorf("took %v: the refused message stalled more than its lane", d)
			}
			for _, m := range sub.snapshot() {
				if m.topic == "fg/devices/d1/denied" || len(m.payload) > 100 {
					t.Errorf("refused message delivered: %s", m.topic)
				}
			}
			await(t, 5*time.Second, "the durable queue empty", func() bool { return durable.Stats().Messages == 0 })
			if v := metric(t, reg, "fleetgate_bridge_refused_total"); v != bridge.RefusalTries {
				t.Errorf("refused = %v, want %d", v, bridge.RefusalTries)
			}
			if v := metric(t, reg, "fleetgate_bridge_dropped_total", "queue", "durable", "reason", "refused"); v != 1 {
				t.Errorf("dropped (durable, refused) = %v, want 1", v)
			}
			for _, want := range []string{"the upstream broker refused a message; dropped", "device=d1 ", "tries=5", tc.reason} {
				if !strings.Contains(logs.String(), want) {
					t.Errorf("log lacks %q:\n%s", want, logs.String())
				}
			}
		})
	}
}

// Over TLS with a password, MQTT 5 and 3.1.1: up in order per device
// (the packets of concurrent lanes combined into fewer writes, the
// PUBACKs read through a buffer) and commands down; a bridge that does
// not trust the broker's certificate does not connect.
func TestUpAndDownOverTLS(t *testing.T) {
	for _, version := range []byte{5, 4} {
		t.Run("v"+string('0'+version), func(t *testing.T) {
			br := startTLSBroker(t)
			sub := subscribe(t, br, "fg/#")
			b := startBridge(t, bridge.Options{URL: brokerURL(br), TLS: br.TLS, Username: brokerUser, Password: brokerPassword,
				ClientID: "c", TopicPrefix: "fg", Down: true, ProtocolVersion: version,
				Durable: memQueue(t, nil), Memory: memQueue(t, nil), Commands: memQueue(t, nil)})
			await(t, 10*time.Second, "subscribed", func() bool { return b.Status().Upstream.Subscribed })
			const devices, per = 16, 100
			publishSeqs(t, b, devices, per, 0).Wait()
			if !sub.wait(30*time.Second, func(m []upMsg) bool { return len(m) == devices*per }) {
				t.Errorf("after 30s %d messages of %d read", len(sub.snapshot()), devices*per)
			}
			checkOrder(t, sub.snapshot(), devices, per, true)
			publish(t, publisher(t, br), "fg/devices/d1/cmd/reboot", "now")
			await(t, 10*time.Second, "the command pending", func() bool { return len(b.Pending("d1", time.Now(), 10)) == 1 })
		})
	}
	t.Run("untrusted", func(t *testing.T) {
		br := startTLSBroker(t)
		logs := &logBuffer{t: t}
		b := startBridge(t, bridge.Options{URL: brokerURL(br), Username: brokerUser, Password: brokerPassword, ClientID: "c", TopicPrefix: "fg",
			Logger:  slog.New(slog.NewTextHandler(logs, nil)),
			Durable: memQueue(t, nil), Memory: memQueue(t, nil), Commands: memQueue(t, nil)})
		await(t, 10*time.Second, "a failed connection logged", func() bool { return strings.Contains(logs.String(), "certificate") })
		if b.Status().Upstream.Connected {
			t.Error("connected to a broker whose certificate it does not trust")
		}
	})
}
