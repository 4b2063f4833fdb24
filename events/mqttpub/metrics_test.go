package mqttpub_test

import (
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/fleetgate/fleetgate/events/mqttpub"
	"github.com/fleetgate/fleetgate/gateway"
	"github.com/fleetgate/fleetgate/internal/redistest"
)

// The publisher counts the events it published, observes their lag,
// calls OnPublished with each once the broker acknowledged it, and
// reports its connection as a gauge that drops while the broker is down.
func TestPublisherMetricsAndHook(t *testing.T) {
	srv := redistest.Start(t)
	b := startBroker(t, false)
	store := redisStore(t, srv, uniquePrefix())
	startAtLogStart(t, store) // no snapshot: every event is published as one
	var mu sync.Mutex
	got := map[gateway.DeviceID]uint64{}
	reg := prometheus.NewRegistry()
	runPublisher(t, store, b, mqttpub.Options{TopicPrefix: "fg", Registerer: reg, OnPublished: func(e gateway.Event) {
		mu.Lock()
		got[e.Device] = max(got[e.Device], e.Ver)
		mu.Unlock()
	}})
	devs := devices("m", 12)
	apply(t, store, gateway.Connect, devs...)
	apply(t, store, gateway.Leave, devs[:4]...)
	want := storeStates(t, store)
	deadline := time.Now().Add(20 * time.Second)
	for {
		mu.Lock()
		done := len(got) == len(want)
		for d, sv := range want {
			done = done && got[d] == sv.ver
		}
		mu.Unlock()
		if done {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("OnPublished saw %v, want the store's vers %v", got, want)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if v := counterValue(t, reg, "fleetgate_publisher_published_total"); v != 16 {
		t.Errorf("fleetgate_publisher_published_total = %v, want 16", v)
	}
	if n := histogramCount(t, reg, "fleetgate_publisher_lag_seconds"); n != 16 {
		t.Errorf("fleetgate_publisher_lag_seconds observed %d events, want 16", n)
	}
	if v := gaugeValue(t, reg, "fleetgate_publisher_connected"); v != 1 {
		t.Errorf("fleetgate_publisher_connected = %v while connected", v)
	}
	b.Stop()
	for end := time.Now().Add(10 * time.Second); gaugeValue(t, reg, "fleetgate_publisher_connected") != 0; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(end) {
			t.Fatal("fleetgate_publisher_connected still 1 10s after the broker stopped")
		}
	}
}

func histogramCount(t *testing.T, reg *prometheus.Registry, name string) uint64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name {
			return mf.GetMetric()[0].GetHistogram().GetSampleCount()
		}
	}
	t.Fatalf("no metric %s", name)
	return 0
}

func gaugeValue(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name {
			return mf.GetMetric()[0].GetGauge().GetValue()
		}
	}
	t.Fatalf("no metric %s", name)
	return 0
}
