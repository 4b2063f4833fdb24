package main

import (
	"context"
	"fmt"
	"net/url"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/autopaho"
	"github.com/eclipse/paho.golang/paho"

	"github.com/fleetgate/fleetgate/gateway"
	"github.com/fleetgate/fleetgate/internal/mosquittotest"
	"github.com/fleetgate/fleetgate/internal/redistest"
	"github.com/fleetgate/fleetgate/store/redisstore"
)

// presenceSubscriber subscribes to <prefix>/presence/+ on broker and
// returns the last payload of a topic as it arrives.
func presenceSubscriber(t *testing.T, broker, prefix string) func(topic string) string {
	t.Helper()
	var mu sync.Mutex
	got := map[string]string{}
	u, _ := url.Parse("mqtt://" + broker)
	ctx, cancel := context.WithCancel(context.Background())
	cm, err := autopaho.NewConnection(ctx, autopaho.ClientConfig{
		ServerUrls: []*url.URL{u}, KeepAlive: 30, CleanStartOnInitialConnection: true,
		OnConnectionUp: func(cm *autopaho.ConnectionManager, _ *paho.Connack) {
			go cm.Subscribe(ctx, &paho.Subscribe{Subscriptions: []paho.SubscribeOptions{{Topic: prefix + "/presence/+", QoS: 1}}})
		},
		ClientConfig: paho.ClientConfig{ClientID: "e2e-sub-" + prefix, OnPublishReceived: []func(paho.PublishReceived) (bool, error){
			func(pr paho.PublishReceived) (bool, error) {
				mu.Lock()
				got[pr.Packet.Topic] = string(pr.Packet.Payload)
				mu.Unlock()
				return true, nil
			}}},
	})
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	t.Cleanup(func() {
		dctx, dcancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer dcancel()
		_ = cm.Disconnect(dctx)
		cancel()
	})
	return func(topic string) string {
		mu.Lock()
		defer mu.Unlock()
		return got[topic]
	}
}

// A gateway with events.mqtt publishes its devices' presence, retained,
// to the broker, with either store.
func TestGatewayPublishesToBroker(t *testing.T) {
	t.Parallel()
	for _, backend := range []string{"redis", "embedded"} {
		t.Run(backend, func(t *testing.T) {
			t.Parallel()
			redisAddr := ""
			if backend == "redis" {
				redisAddr = redistest.Start(t).Addr
			}
			broker := mosquittotest.Start(t, mosquittotest.Options{}).Addr
			gw := newGateway(t, "gw-p", redisAddr, fastTiming)
			appendConfig(t, gw.config, fmt.Sprintf("events:\n  mqtt: { url: \"mqtt://%s\", topic_prefix: site-p }\n", broker))
			gw.start()
			device{t: t, id: "dev-p"}.heartbeat(gw.coapAddr)
			presence := presenceSubscriber(t, broker, "site-p")
			waitFor(t, 20*time.Second, "dev-p's presence on the broker", func() bool {
				return strings.Contains(presence("site-p/presence/dev-p"), `"state":"online"`)
			})
			code, out, _ := runCLI(t, "status", "--addr", gw.admin, "--json")
			if code != 0 || !strings.Contains(out, `"publisher"`) || !strings.Contains(out, `"connected": true`) {
				t.Errorf("status shows no connected publisher:\n%s", out)
			}
		})
	}
}

// `fleetgate runner` with events.mqtt publishes what gateways wrote to
// the store, and shows its publisher on its status.
func TestRunnerPublishesToBroker(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	broker := mosquittotest.Start(t, mosquittotest.Options{}).Addr
	cfg := newGateway(t, "gw-rp", srv.Addr, fastTiming).config
	appendConfig(t, cfg, fmt.Sprintf("events:\n  mqtt: { url: \"mqtt://%s\", topic_prefix: site-r }\n", broker))
	store, err := redisstore.Open(context.Background(), srv.Client(t), redisstore.Options{Prefix: "fleetgate", Shards: 4})
	if err != nil {
		t.Fatal(err)
	}
	d := gateway.DeviceID("dev-rp")
	b := gateway.Batch{Gateway: "gw-elsewhere", Epoch: 1, Lease: time.Hour,
		Writes: []gateway.Write{{Device: d, Session: "coap/default", Kind: gateway.Connect}}}
	if _, err := store.Apply(context.Background(), gateway.ShardOf(d, 4), b); err != nil {
		t.Fatal(err)
	}
	metrics := fmt.Sprintf("127.0.0.1:%d", redistest.FreePort(t))
	r := startRunner(t, cfg, []string{"--metrics", metrics})
	presence := presenceSubscriber(t, broker, "site-r")
	waitFor(t, 20*time.Second, "dev-rp's presence published by the runner", func() bool {
		return strings.Contains(presence("site-r/presence/dev-rp"), `"state":"online"`)
	})
	code, out, _ := runCLI(t, "status", "--addr", metrics, "--json")
	if code != 0 || !strings.Contains(out, `"publisher"`) || !strings.Contains(out, `"connected": true`) {
		t.Errorf("runner status shows no connected publisher:\n%s", out)
	}
	r.stop(os.Interrupt)
}

// appendConfig appends yaml to the configuration file path.
func appendConfig(t *testing.T, path, yaml string) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteString(yaml); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
}
