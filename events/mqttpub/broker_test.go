package mqttpub_test

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/autopaho"
	"github.com/eclipse/paho.golang/paho"

	"github.com/fleetgate/fleetgate/gateway"
	"github.com/fleetgate/fleetgate/internal/mosquittotest"
)

// broker is a mosquitto broker for the publisher: plain and anonymous,
// or TLS with a password file.
type broker struct {
	*mosquittotest.Broker
	t   testing.TB
	tls bool
	// user and password of the password file (TLS brokers only)
	user, pass string
}

func startBroker(t testing.TB, withTLS bool) *broker {
	t.Helper()
	b := &broker{t: t, tls: withTLS}
	o := mosquittotest.Options{Config: []string{"max_queued_messages 100000"}}
	if withTLS {
		b.user, b.pass = "publisher", "s3cret-pass"
		o.User, o.Password = b.user, b.pass
		o.TLS = true
	}
	b.Broker = mosquittotest.Start(t, o)
	return b
}

func (b *broker) url() string {
	if b.tls {
		return "mqtts://" + b.Addr
	}
	return "mqtt://" + b.Addr
}

func (b *broker) tlsConfig() *tls.Config {
	if !b.tls {
		return nil
	}
	return b.Broker.TLS
}

// received is one message a subscriber got.
type received struct {
	topic    string
	retained bool
	env      gateway.Envelope
}

// subscriber is a paho.golang client subscribed to <prefix>/#.
type subscriber struct {
	mu   sync.Mutex
	msgs []received
	cm   *autopaho.ConnectionManager
}

func subscribe(t testing.TB, b *broker, prefix, topic string) *subscriber {
	t.Helper()
	s := &subscriber{}
	u, _ := url.Parse(strings.Replace(b.url(), "mqtts://", "tls://", 1))
	ctx, cancel := context.WithCancel(context.Background())
	subscribed := make(chan error, 1)
	cfg := autopaho.ClientConfig{
		ServerUrls: []*url.URL{u}, TlsCfg: b.tlsConfig(), KeepAlive: 30,
		CleanStartOnInitialConnection: false, SessionExpiryInterval: 600,
		ConnectRetryDelay: 100 * time.Millisecond,
		ConnectUsername:   b.user, ConnectPassword: []byte(b.pass),
		OnConnectionUp: func(cm *autopaho.ConnectionManager, _ *paho.Connack) {
			go func() {
				_, err := cm.Subscribe(ctx, &paho.Subscribe{Subscriptions: []paho.SubscribeOptions{{Topic: prefix + "/" + topic, QoS: 1}}})
				select {
				case subscribed <- err:
				default:
				}
			}()
		},
		ClientConfig: paho.ClientConfig{
			ClientID: fmt.Sprintf("sub-%d", time.Now().UnixNano()),
			OnPublishReceived: []func(paho.PublishReceived) (bool, error){func(pr paho.PublishReceived) (bool, error) {
				var env gateway.Envelope
				if err := json.Unmarshal(pr.Packet.Payload, &env); err != nil {
					t.Errorf("message on %s: %v: %q", pr.Packet.Topic, err, pr.Packet.Payload)
				}
				s.mu.Lock()
				s.msgs = append(s.msgs, received{topic: pr.Packet.Topic, retained: pr.Packet.Retain, env: env})
				s.mu.Unlock()
				return true, nil
			}},
		},
	}
	cm, err := autopaho.NewConnection(ctx, cfg)
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
	select {
	case err := <-subscribed:
		if err != nil {
			t.Fatalf("subscribe: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("subscriber not subscribed after 10s:\n%s", b.Log())
	}
	return s
}

func (s *subscriber) snapshot() []received {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]received(nil), s.msgs...)
}

// await waits (bounded) until cond holds over the messages received.
func (s *subscriber) await(t testing.TB, limit time.Duration, what string, cond func([]received) bool) {
	t.Helper()
	deadline := time.Now().Add(limit)
	for {
		if cond(s.snapshot()) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("after %v: %s; received %d messages", limit, what, len(s.snapshot()))
		}
		time.Sleep(20 * time.Millisecond)
	}
}
