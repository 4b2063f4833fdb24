package bridge_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/autopaho"
	"github.com/eclipse/paho.golang/paho"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"go.uber.org/goleak"

	"github.com/fleetgate/fleetgate/bridge"
	"github.com/fleetgate/fleetgate/gateway"
	"github.com/fleetgate/fleetgate/internal/mosquittotest"
	"github.com/fleetgate/fleetgate/queue/memq"
)

// TestMain doubles as the bridge process of the kill -9 tests (child.go):
// with BRIDGE_CHILD set the test binary runs one bridge until killed.
func TestMain(m *testing.M) {
	if mode := os.Getenv(envChild); mode != "" {
		os.Exit(runChild(mode))
	}
	goleak.VerifyTestMain(m)
}

// startBroker runs a mosquitto that hands every message to its
// subscribers at once (no inflight bound) and queues many for a
// subscriber away.
func startBroker(t testing.TB, config ...string) *mosquittotest.Broker {
	t.Helper()
	return mosquittotest.Start(t, mosquittotest.Options{Config: append([]string{
		"max_queued_messages 1000000", "max_inflight_messages 0",
	}, config...)})
}

// brokerUser and brokerPassword are the one account of a TLS broker.
const brokerUser, brokerPassword = "bridge", "s3cret-pass"

// startTLSBroker is startBroker with a TLS listener and one account
// (brokerUser); anonymous clients are refused.
func startTLSBroker(t testing.TB) *mosquittotest.Broker {
	t.Helper()
	return mosquittotest.Start(t, mosquittotest.Options{TLS: true, User: brokerUser, Password: brokerPassword,
		Config: []string{"max_queued_messages 1000000", "max_inflight_messages 0"}})
}

func brokerURL(b *mosquittotest.Broker) string {
	if b.TLS != nil {
		return "mqtts://" + b.Addr
	}
	return "mqtt://" + b.Addr
}

// brokerClient is the part of a test client's configuration that
// reaches b: its URL, and on a TLS broker its certificate and account.
func brokerClient(b *mosquittotest.Broker, cfg autopaho.ClientConfig) autopaho.ClientConfig {
	u, _ := url.Parse(brokerURL(b))
	cfg.ServerUrls = []*url.URL{u}
	if b.TLS != nil {
		cfg.TlsCfg, cfg.ConnectUsername, cfg.ConnectPassword = b.TLS, brokerUser, []byte(brokerPassword)
	}
	return cfg
}

// memQueue is a memory queue closed when the test ends.
func memQueue(t testing.TB, clock gateway.Clock) *memq.Queue {
	t.Helper()
	q, err := memq.New(memq.Options{MaxBytes: 256 << 20, Clock: clock})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { q.Close() })
	return q
}

// startBridge starts a bridge closed when the test ends (before its
// queues, which were opened before it).
func startBridge(t testing.TB, o bridge.Options) *bridge.Bridge {
	t.Helper()
	if o.Logger == nil {
		o.Logger = testLogger(t)
	}
	b, err := bridge.New(t.Context(), o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	return b
}

// testLogger logs warnings and errors to the test's output.
func testLogger(t testing.TB) *slog.Logger {
	return slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelWarn}))
}

// upMsg is one message a subscriber read upstream.
type upMsg struct {
	topic       string
	payload     string
	qos         byte
	contentType string
	props       []paho.UserProperty
}

// subscriber is a paho.golang client reading a filter at QoS 1, in a
// session the broker keeps (so a subscriber restarted with the broker
// misses nothing the broker had saved).
type subscriber struct {
	mu   sync.Mutex
	msgs []upMsg
	cm   *autopaho.ConnectionManager
	subs atomic.Int32 // subscriptions acknowledged
}

var clientIDs atomic.Int64

func subscribe(t testing.TB, b *mosquittotest.Broker, filter string) *subscriber {
	t.Helper()
	s := &subscriber{}
	ctx, cancel := context.WithCancel(context.Background())
	cfg := autopaho.ClientConfig{
		KeepAlive:                     30,
		CleanStartOnInitialConnection: true, SessionExpiryInterval: 600,
		ReconnectBackoff: autopaho.NewConstantBackoff(50 * time.Millisecond),
		OnConnectionUp: func(cm *autopaho.ConnectionManager, _ *paho.Connack) {
			go func() {
				if _, err := cm.Subscribe(ctx, &paho.Subscribe{Subscriptions: []paho.SubscribeOptions{{Topic: filter, QoS: 1}}}); err == nil {
					s.subs.Add(1)
				}
			}()
		},
		ClientConfig: paho.ClientConfig{
			ClientID: fmt.Sprintf("sub-%d", clientIDs.Add(1)),
			OnPublishReceived: []func(paho.PublishReceived) (bool, error){func(pr paho.PublishReceived) (bool, error) {
				m := upMsg{topic: pr.Packet.Topic, payload: string(pr.Packet.Payload), qos: pr.Packet.QoS}
				if p := pr.Packet.Properties; p != nil {
					m.contentType, m.props = p.ContentType, p.User
				}
				s.mu.Lock()
				s.msgs = append(s.msgs, m)
				s.mu.Unlock()
				return true, nil
			}},
		},
	}
	cm, err := autopaho.NewConnection(ctx, brokerClient(b, cfg))
	if err != nil {
		t.Fatal(err)
	}
	s.cm = cm
	t.Cleanup(func() {
		dctx, dc := context.WithTimeout(context.Background(), time.Second)
		defer dc()
		_ = cm.Disconnect(dctx)
		cancel()
	})
	deadline := time.Now().Add(10 * time.Second)
	for s.subs.Load() == 0 {
		if time.Now().After(deadline) {
			t.Fatalf("subscriber not subscribed to %s after 10s:\n%s", filter, b.Log())
		}
		time.Sleep(10 * time.Millisecond)
	}
	return s
}

func (s *subscriber) snapshot() []upMsg {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]upMsg(nil), s.msgs...)
}

// await waits (bounded) until cond holds over the messages read.
func (s *subscriber) await(t testing.TB, limit time.Duration, what string, cond func([]upMsg) bool) {
	t.Helper()
	if !s.wait(limit, cond) {
		t.Fatalf("after %v: %s; read %d messages", limit, what, len(s.snapshot()))
	}
}

// wait waits at most limit until cond holds over the messages read, and
// reports whether it does.
func (s *subscriber) wait(limit time.Duration, cond func([]upMsg) bool) bool {
	deadline := time.Now().Add(limit)
	for !cond(s.snapshot()) {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(10 * time.Millisecond)
	}
	return true
}

// publisher is a paho.golang client publishing into the broker (the
// commands' sender upstream).
func publisher(t testing.TB, b *mosquittotest.Broker) *autopaho.ConnectionManager {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	cm, err := autopaho.NewConnection(ctx, brokerClient(b, autopaho.ClientConfig{
		KeepAlive: 30, CleanStartOnInitialConnection: true,
		ReconnectBackoff: autopaho.NewConstantBackoff(50 * time.Millisecond),
		ClientConfig:     paho.ClientConfig{ClientID: fmt.Sprintf("pub-%d", clientIDs.Add(1))},
	}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		dctx, dc := context.WithTimeout(context.Background(), time.Second)
		defer dc()
		_ = cm.Disconnect(dctx)
		cancel()
	})
	actx, ac := context.WithTimeout(ctx, 10*time.Second)
	defer ac()
	if err := cm.AwaitConnection(actx); err != nil {
		t.Fatal(err)
	}
	return cm
}

// publishSeqs publishes, from a goroutine per device d0..d<devices-1>,
// per QoS 1 messages on "seq" with payloads 0..per-1 (checkOrder reads
// them), pause apart; the WaitGroup ends when all are published.
func publishSeqs(t testing.TB, b *bridge.Bridge, devices, per int, pause time.Duration) *sync.WaitGroup {
	var wg sync.WaitGroup
	for d := range devices {
		wg.Go(func() {
			for i := range per {
				if err := b.Publish(t.Context(), []gateway.Message{msg(fmt.Sprintf("d%d", d), "seq", strconv.Itoa(i), 1, "coap")}); err != nil {
					t.Error(err)
					return
				}
				time.Sleep(pause)
			}
		})
	}
	return &wg
}

// await polls cond (bounded).
func await(t testing.TB, limit time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(limit)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("after %v: %s", limit, what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// msg is a device's message received now.
func msg(device, topic, payload string, qos byte, source string) gateway.Message {
	return gateway.Message{Device: gateway.DeviceID(device), Topic: topic, Payload: []byte(payload), QoS: qos,
		Received: time.Now(), Source: source}
}

// metric returns the value of the metric name with labels (name=value
// pairs) in reg; 0 when absent.
func metric(t testing.TB, reg *prometheus.Registry, name string, labels ...string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	next:
		for _, m := range mf.GetMetric() {
			for i := 0; i+1 < len(labels); i += 2 {
				if !hasLabel(m, labels[i], labels[i+1]) {
					continue next
				}
			}
			switch {
			case m.Counter != nil:
				return m.Counter.GetValue()
			case m.Gauge != nil:
				return m.Gauge.GetValue()
			case m.Histogram != nil:
				return float64(m.Histogram.GetSampleCount())
			}
		}
	}
	return 0
}

func hasLabel(m *dto.Metric, name, value string) bool {
	for _, l := range m.GetLabel() {
		if l.GetName() == name {
			return l.GetValue() == value
		}
	}
	return false
}

// logBuffer is a log the test reads, also written to the test's output.
type logBuffer struct {
	mu sync.Mutex
	sb strings.Builder
	t  testing.TB
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	l.sb.Write(p)
	l.mu.Unlock()
	return l.t.Output().Write(p)
}

func (l *logBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.sb.String()
}

// proxy passes TCP connections to a broker until cut, then closes them
// and every new one until opened again: the bridge's link fails while
// the broker keeps what it acknowledged, or the bridge is kept from a
// restarted broker until its subscribers are back.
type proxy struct {
	ln      net.Listener
	target  string
	wg      sync.WaitGroup
	mu      sync.Mutex
	conns   []net.Conn
	refused bool
}

func startProxy(t testing.TB, target string) *proxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &proxy{ln: ln, target: target}
	p.wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			p.pass(c)
		}
	})
	t.Cleanup(func() {
		ln.Close()
		p.cut()
		p.wg.Wait()
	})
	return p
}

func (p *proxy) url() string { return "mqtt://" + p.ln.Addr().String() }

// pass links c to the target, unless the proxy is cut.
func (p *proxy) pass(c net.Conn) {
	p.mu.Lock()
	defer p.mu.Unlock()
	var up net.Conn
	err := errors.New("cut")
	if !p.refused {
		up, err = net.Dial("tcp", p.target)
	}
	if err != nil {
		c.Close()
		return
	}
	p.conns = append(p.conns, c, up)
	p.wg.Go(func() { _, _ = io.Copy(up, c); up.Close() })
	p.wg.Go(func() { _, _ = io.Copy(c, up); c.Close() })
}

// cut closes the connections and refuses new ones.
func (p *proxy) cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.refused = true
	for _, c := range p.conns {
		c.Close()
	}
	p.conns = nil
}

// open passes new connections again.
func (p *proxy) open() {
	p.mu.Lock()
	p.refused = false
	p.mu.Unlock()
}
