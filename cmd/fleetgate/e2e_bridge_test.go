package main

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/paho"
	"github.com/plgd-dev/go-coap/v3/message"
	"github.com/plgd-dev/go-coap/v3/message/codes"
	"golang.org/x/crypto/bcrypt"

	"github.com/fleetgate/fleetgate/internal/mosquittotest"
)

// upstreamReader subscribes to filter on an upstream broker and keeps
// what arrives.
type upstreamReader struct {
	mu   sync.Mutex
	msgs []*paho.Publish
}

func readUpstream(t *testing.T, addr, clientID, filter string) (*upstreamReader, *paho.Client) {
	t.Helper()
	r := &upstreamReader{}
	c := pahoClient(t, addr, &paho.Connect{ClientID: clientID, KeepAlive: 30, CleanStart: true}, func(p *paho.Publish) {
		r.mu.Lock()
		r.msgs = append(r.msgs, p)
		r.mu.Unlock()
	})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := c.Subscribe(ctx, &paho.Subscribe{Subscriptions: []paho.SubscribeOptions{{Topic: filter, QoS: 1}}}); err != nil {
		t.Fatalf("subscribe %s: %v", filter, err)
	}
	return r, c
}

func (r *upstreamReader) topics() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []string
	for _, p := range r.msgs {
		out = append(out, p.Topic+" "+string(p.Payload))
	}
	return out
}

func (r *upstreamReader) find(topic string) *paho.Publish {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, p := range r.msgs {
		if p.Topic == topic {
			return p
		}
	}
	return nil
}

// pahoClient connects an MQTT 5 client (user name and password in cp)
// handing what arrives to onPublish.
func pahoClient(t *testing.T, addr string, cp *paho.Connect, onPublish func(*paho.Publish)) *paho.Client {
	t.Helper()
	nc, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { nc.Close() })
	c := paho.NewClient(paho.ClientConfig{Conn: nc, OnClientError: func(error) {},
		OnPublishReceived: []func(paho.PublishReceived) (bool, error){func(pr paho.PublishReceived) (bool, error) {
			if onPublish != nil {
				onPublish(pr.Packet)
			}
			return true, nil
		}}})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if ack, err := c.Connect(ctx, cp); err != nil {
		t.Fatalf("mqtt connect %s at %s: %v (%+v)", cp.ClientID, addr, err, ack)
	}
	return c
}

// withBridge points the gateway's data path at the upstream broker and
// adds a local client "site" (password "site-secret") that reads the
// devices' topics and writes commands.
func withBridge(t *testing.T, g *gatewayProc, upstream string) {
	t.Helper()
	hash, err := bcrypt.GenerateFromPassword([]byte("site-secret"), bcrypt.MinCost)
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(g.config)
	if err != nil {
		t.Fatal(err)
	}
	cfg := strings.Replace(string(b), `auth: { allow_anonymous: true, devices_file: "" }`,
		fmt.Sprintf(`auth: { allow_anonymous: true, devices_file: "", clients: [ { name: site, password_bcrypt: %q, read: ["devices/#"], write: ["devices/+/cmd/#"] } ] }`, hash), 1)
	cfg += fmt.Sprintf("bridge: { mqtt: { url: \"mqtt://%s\" }, queue: { commit_interval: 2ms } }\n", upstream)
	if err := os.WriteFile(g.config, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
}

// The data path through the binary, with real clients: an MQTT device's
// QoS 1 message and a CoAP device's POST /d reach the upstream broker
// (content types kept) and the local client; commands published upstream
// reach an MQTT device subscribed to its subtree and ride on a CoAP
// device's next heartbeat until it acknowledges them; a local client's
// command reaches a CoAP device.
func TestE2EDataPath(t *testing.T) {
	t.Parallel()
	up := mosquittotest.Start(t, mosquittotest.Options{})
	gw := newGateway(t, "gw-br", "", fastTiming)
	withBridge(t, gw, up.Addr)
	gw.start()
	reader, upc := readUpstream(t, up.Addr, "reader", "fleetgate/gw-br/devices/#")

	var localMu sync.Mutex
	var local []string
	site := pahoClient(t, gw.mqttAddr, &paho.Connect{ClientID: "dashboard", KeepAlive: 30, CleanStart: true,
		UsernameFlag: true, Username: "site", PasswordFlag: true, Password: []byte("site-secret")}, func(p *paho.Publish) {
		localMu.Lock()
		local = append(local, p.Topic)
		localMu.Unlock()
	})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if _, err := site.Subscribe(ctx, &paho.Subscribe{Subscriptions: []paho.SubscribeOptions{{Topic: "devices/#", QoS: 0}}}); err != nil {
		t.Fatal(err)
	}

	// up: MQTT
	var cmdsMu sync.Mutex
	var mqttCmds []string
	dev := pahoClient(t, gw.mqttAddr, &paho.Connect{ClientID: "mq-1", KeepAlive: 5, CleanStart: true}, func(p *paho.Publish) {
		cmdsMu.Lock()
		mqttCmds = append(mqttCmds, p.Topic+" "+string(p.Payload))
		cmdsMu.Unlock()
	})
	if _, err := dev.Subscribe(ctx, &paho.Subscribe{Subscriptions: []paho.SubscribeOptions{{Topic: "devices/mq-1/cmd/#", QoS: 1}}}); err != nil {
		t.Fatal(err)
	}
	if _, err := dev.Publish(ctx, &paho.Publish{Topic: "devices/mq-1/telemetry/temp", QoS: 1, Payload: []byte("21.5"),
		Properties: &paho.PublishProperties{ContentType: "text/plain", User: paho.UserProperties{{Key: "unit", Value: "C"}}}}); err != nil {
		t.Fatal(err)
	}
	// up: CoAP, with libcoap's client (a CON: answered once durable)
	out, err := exec.Command("coap-client-notls", "-m", "post", "-t", "50", "-e", `{"t":21.5}`, "-B", "10",
		fmt.Sprintf("coap://%s/d/telemetry/temp?d=co-1", gw.coapAddr)).CombinedOutput()
	if err != nil {
		t.Fatalf("coap-client post: %v\n%s", err, out)
	}
	waitFor(t, 20*time.Second, "both messages upstream", func() bool {
		return reader.find("fleetgate/gw-br/devices/mq-1/telemetry/temp") != nil && reader.find("fleetgate/gw-br/devices/co-1/telemetry/temp") != nil
	})
	if p := reader.find("fleetgate/gw-br/devices/mq-1/telemetry/temp"); string(p.Payload) != "21.5" || p.Properties == nil ||
		p.Properties.ContentType != "text/plain" || p.Properties.User.Get("unit") != "C" {
		t.Fatalf("the MQTT device's message upstream: %+v", p)
	}
	if p := reader.find("fleetgate/gw-br/devices/co-1/telemetry/temp"); string(p.Payload) != `{"t":21.5}` || p.Properties == nil ||
		p.Properties.ContentType != "application/json" {
		t.Fatalf("the CoAP device's message upstream: %+v", p)
	}
	waitFor(t, 10*time.Second, "the local client read both", func() bool {
		localMu.Lock()
		defer localMu.Unlock()
		return strings.Contains(strings.Join(local, " "), "devices/mq-1/telemetry/temp") &&
			strings.Contains(strings.Join(local, " "), "devices/co-1/telemetry/temp")
	})

	// down: to the MQTT device, and to the CoAP device from upstream and
	// from the local client
	for _, c := range []struct{ topic, payload string }{
		{"fleetgate/gw-br/devices/mq-1/cmd/reboot", "now"},
		{"fleetgate/gw-br/devices/co-1/cmd/led", "on"},
	} {
		if _, err := upc.Publish(ctx, &paho.Publish{Topic: c.topic, QoS: 1, Payload: []byte(c.payload)}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := site.Publish(ctx, &paho.Publish{Topic: "devices/co-1/cmd/beep", QoS: 1, Payload: []byte("twice")}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 20*time.Second, "the MQTT device's command", func() bool {
		cmdsMu.Lock()
		defer cmdsMu.Unlock()
		return len(mqttCmds) == 1 && mqttCmds[0] == "devices/mq-1/cmd/reboot now"
	})
	got := map[string]bool{}
	waitFor(t, 20*time.Second, "the CoAP device's two commands", func() bool {
		path, payload, id := coapCommand(t, gw.coapAddr, "co-1", "")
		if id != "" {
			got[path+" "+payload] = true
			coapCommand(t, gw.coapAddr, "co-1", id)
		}
		return got["cmd/led on"] && got["cmd/beep twice"]
	})
	if path, _, id := coapCommand(t, gw.coapAddr, "co-1", ""); id != "" {
		t.Fatalf("a command left after both were acknowledged: %s %s", path, id)
	}
}

// coapCommand sends a heartbeat of device (acknowledging command ack
// when set), padded so that a command fits the answer, and returns the
// command the 2.04 carries: its Location-Path, payload and ID ("" when
// none).
func coapCommand(t *testing.T, addr, device, ack string) (path, payload, id string) {
	t.Helper()
	cc := dialCoAP(t, addr)
	defer cc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	opts := message.Options{{ID: message.URIQuery, Value: []byte("d=" + device)},
		{ID: message.URIQuery, Value: []byte("pad=" + strings.Repeat("x", 200))}}
	if ack != "" {
		opts = append(opts, message.Option{ID: message.URIQuery, Value: []byte("a=" + ack)})
	}
	resp, err := cc.Post(ctx, "/hb", message.TextPlain, nil, opts...)
	if err != nil {
		t.Fatalf("heartbeat of %s: %v", device, err)
	}
	if resp.Code() != codes.Changed {
		t.Fatalf("heartbeat of %s: %v", device, resp.Code())
	}
	var levels []string
	for _, o := range resp.Options() {
		switch o.ID {
		case message.LocationPath:
			levels = append(levels, string(o.Value))
		case message.LocationQuery:
			if v, ok := strings.CutPrefix(string(o.Value), "c="); ok {
				id = v
			}
		}
	}
	if body, err := resp.ReadBody(); err == nil {
		payload = string(body)
	}
	return strings.Join(levels, "/"), payload, id
}

// Data acknowledged to a device reaches the upstream broker at least once
// across an upstream outage and a kill -9 of the gateway: QoS 1 messages
// acknowledged while the broker is down wait in bridge.db and go up,
// in order, once both are back.
func TestE2EDataSurvivesKill(t *testing.T) {
	t.Parallel()
	up := mosquittotest.Start(t, mosquittotest.Options{})
	gw := newGateway(t, "gw-kd", "", fastTiming)
	withBridge(t, gw, up.Addr)
	gw.start()
	reader, _ := readUpstream(t, up.Addr, "reader", "fleetgate/gw-kd/devices/#")
	up.Kill()
	dev := pahoClient(t, gw.mqttAddr, &paho.Connect{ClientID: "mq-k", KeepAlive: 5, CleanStart: true}, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	const n = 50
	for i := range n {
		if _, err := dev.Publish(ctx, &paho.Publish{Topic: "devices/mq-k/seq", QoS: 1, Payload: []byte(fmt.Sprint(i))}); err != nil {
			t.Fatalf("publish %d: %v", i, err)
		}
	}
	gw.kill()
	up.Start()
	reader, _ = readUpstream(t, up.Addr, "reader-2", "fleetgate/gw-kd/devices/#")
	gw.start()
	waitFor(t, 30*time.Second, "every acknowledged message upstream", func() bool {
		return len(reader.topics()) >= n
	})
	seen := map[string]bool{}
	next := 0
	for _, m := range reader.topics() {
		v := strings.TrimPrefix(m, "fleetgate/gw-kd/devices/mq-k/seq ")
		if seen[v] {
			continue
		}
		seen[v] = true
		if v != fmt.Sprint(next) {
			t.Fatalf("message %s arrived first where %d was due (order per device)", v, next)
		}
		next++
	}
	if next != n {
		t.Fatalf("%d of %d messages upstream", next, n)
	}
}

// An adapter's data and commands through the binary: udpline's
// "hb <device> ><topic> <payload>" line reaches the upstream broker and
// the device's evidence keeps it online; a command published upstream
// comes back to the device's address as a "cmd" line.
func TestE2EAdapterDataPath(t *testing.T) {
	t.Parallel()
	up := mosquittotest.Start(t, mosquittotest.Options{})
	gw := newGateway(t, "gw-ad", "", fastTiming)
	listen := fmt.Sprintf("127.0.0.1:%d", freeUDPPort(t))
	gw.setAdapters(t, filepath.Dir(udpline), map[string]string{"legacy": listen})
	withBridge(t, gw, up.Addr)
	gw.start()
	reader, upc := readUpstream(t, up.Addr, "reader", "fleetgate/gw-ad/devices/#")

	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer pc.Close()
	dst, err := net.ResolveUDPAddr("udp", listen)
	if err != nil {
		t.Fatal(err)
	}
	send := func(line string) {
		if _, err := pc.WriteTo([]byte(line+"\n"), dst); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, 20*time.Second, "the adapter's message upstream", func() bool {
		send("hb legacy-9 >telemetry/level 42")
		return reader.find("fleetgate/gw-ad/devices/legacy-9/telemetry/level") != nil
	})
	if p := reader.find("fleetgate/gw-ad/devices/legacy-9/telemetry/level"); string(p.Payload) != "42" {
		t.Fatalf("upstream: %q", p.Payload)
	}
	waitFor(t, 10*time.Second, "legacy-9 online (its data is evidence)", func() bool { return gw.device(t, "legacy-9").State == "online" })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := upc.Publish(ctx, &paho.Publish{Topic: "fleetgate/gw-ad/devices/legacy-9/cmd/valve", QoS: 1, Payload: []byte("open")}); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 512)
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		send("hb legacy-9")
		_ = pc.SetReadDeadline(time.Now().Add(500 * time.Millisecond))
		n, _, err := pc.ReadFrom(buf)
		if err != nil {
			continue
		}
		if got := strings.TrimSpace(string(buf[:n])); got != "cmd legacy-9 >cmd/valve open" {
			t.Fatalf("the device got %q, want its command", got)
		}
		return
	}
	t.Fatal("no command line reached the device's address within 20 s")
}
