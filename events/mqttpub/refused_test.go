package mqttpub_test

import (
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/fleetgate/fleetgate/events/mqttpub"
	"github.com/fleetgate/fleetgate/gateway"
	"github.com/fleetgate/fleetgate/internal/mosquittotest"
	"github.com/fleetgate/fleetgate/internal/redistest"
)

// A message the broker refuses for good is sent mqttpub.RefusalTries
// times, then skipped, logged with its event and counted; its shard goes
// on with the events after it. Refused here by a mosquitto ACL (MQTT 5
// PUBACK 0x87) for one device's topics, and by the broker's maximum
// packet size for a device whose ID makes its messages too large.
func TestRefusedMessageIsSkipped(t *testing.T) {
	srv := redistest.Start(t)
	for _, tc := range []struct {
		name   string
		bad    gateway.DeviceID
		config func(ok []gateway.DeviceID) []string
		reason string
	}{
		{"acl", "refused", func(ok []gateway.DeviceID) []string {
			acl := []string{"topic read fg/#"}
			for _, d := range ok {
				acl = append(acl, "topic write fg/+/"+string(d))
			}
			path := filepath.Join(t.TempDir(), "acl")
			if err := os.WriteFile(path, []byte(strings.Join(acl, "\n")+"\n"), 0o600); err != nil {
				t.Fatal(err)
			}
			return []string{"acl_file " + path}
		}, `reason="reason code 0x87`},
		{"packet size", gateway.DeviceID("big-" + strings.Repeat("x", 120)), func([]gateway.DeviceID) []string {
			return []string{"max_packet_size 400"}
		}, "more than the broker's maximum packet size 400"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ok := devices("ok", 16)
			var mates []gateway.DeviceID // in tc.bad's shard
			for _, d := range ok {
				if gateway.ShardOf(d, shards) == gateway.ShardOf(tc.bad, shards) {
					mates = append(mates, d)
				}
			}
			if len(mates) == 0 {
				t.Fatalf("no device shares %s's shard", tc.bad)
			}
			b := &broker{t: t, Broker: mosquittotest.Start(t, mosquittotest.Options{Config: tc.config(ok)})}
			store := redisStore(t, srv, uniquePrefix())
			startAtLogStart(t, store) // no snapshot: every event is published as one
			sub := subscribe(t, b, "fg", "#")
			reg := prometheus.NewRegistry()
			logs, err := os.Create(filepath.Join(t.TempDir(), "log"))
			if err != nil {
				t.Fatal(err)
			}
			defer logs.Close()
			log := slog.New(slog.NewTextHandler(io.MultiWriter(logs, t.Output()), &slog.HandlerOptions{Level: slog.LevelWarn}))
			p, _ := runPublisher(t, store, b, mqttpub.Options{TopicPrefix: "fg", Registerer: reg, Logger: log})

			apply(t, store, gateway.Connect, append([]gateway.DeviceID{tc.bad}, ok...)...)
			state := func(m []received, devs []gateway.DeviceID, s gateway.State) bool {
				latest := latestPresence(m)
				for _, d := range devs {
					if latest[d].state != s {
						return false
					}
				}
				return true
			}
			sub.await(t, 20*time.Second, "every other device online", func(m []received) bool { return state(m, ok, gateway.Online) })
			// the shard goes on past the refused event
			apply(t, store, gateway.Leave, mates...)
			sub.await(t, 20*time.Second, "the refused device's shard mates offline", func(m []received) bool { return state(m, mates, gateway.Offline) })

			// its two messages (events and presence) skipped, each once
			if s := p.Stats().Skipped; s != 2 {
				t.Errorf("Stats().Skipped = %d, want 2", s)
			}
			if v := counterValue(t, reg, "fleetgate_publisher_skipped_total"); v != 2 {
				t.Errorf("fleetgate_publisher_skipped_total = %v, want 2", v)
			}
			for _, m := range sub.snapshot() {
				if m.env.Device == tc.bad {
					t.Errorf("refused device's message delivered: %+v", m)
				}
			}
			out, err := os.ReadFile(logs.Name())
			if err != nil {
				t.Fatal(err)
			}
			ver := fmt.Sprintf("ver=%d ", storeStates(t, store)[tc.bad].ver)
			for _, want := range []string{"the broker refused a message; skipped", "device=" + string(tc.bad) + " ", ver, "tries=5", tc.reason} {
				if !strings.Contains(string(out), want) {
					t.Errorf("log lacks %q:\n%s", want, out)
				}
			}
		})
	}
}

// counterValue returns the value of the counter name in reg.
func counterValue(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name {
			return mf.GetMetric()[0].GetCounter().GetValue()
		}
	}
	t.Fatalf("no metric %s", name)
	return 0
}
