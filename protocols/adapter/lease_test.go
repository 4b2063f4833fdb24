package adapter_test

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/fleetgate/fleetgate/gateway"
	"github.com/fleetgate/fleetgate/protocols/adapter"
)

// postTagged posts a ChirpStack uplink without data of lora-<eui> whose
// device has the tag uplink_interval (none when ""), and wants 204.
func postTagged(t *testing.T, addr, eui, interval string) {
	t.Helper()
	tags := "{}"
	if interval != "" {
		tags = `{"uplink_interval": "` + interval + `"}`
	}
	body := `{"deviceInfo": {"devEui": "` + eui + `", "tags": ` + tags + `}, "fPort": 1}`
	req, err := http.NewRequest("POST", "http://"+addr+"/chirpstack?event=up", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("X-Fleetgate-Secret", "k")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusNoContent {
		t.Fatalf("uplink of %s answered %d", eui, resp.StatusCode)
	}
}

// TestEvidenceLease: the lorawan adapter process sends each device's
// evidence with three of its uplink intervals as its lease; the host
// grants it within [presence.lease, presence.max_lease] (a longer one is
// cut to max_lease and counted in fleetgate_adapter_leases_clamped_total);
// evidence without one gets the adapter's lease, and without that none
// (the table's); a reload's max_lease applies to the evidence after it.
func TestEvidenceLease(t *testing.T) {
	reg := prometheus.NewRegistry()
	e := newHost(t, func(o *adapter.Options) {
		o.Lease, o.MaxLease, o.Registerer = 90*time.Second, 2*time.Hour, reg
	})
	addr := freeTCP(t)
	spec := lorawanSpec(addr)
	if err := e.host.Apply(ctx(t), []adapter.Spec{spec}); err != nil {
		t.Fatal(err)
	}
	clamped := func() string {
		for _, l := range series(t, reg) {
			if v, ok := strings.CutPrefix(l, "fleetgate_adapter_leases_clamped_total{adapter=lora} "); ok {
				return v
			}
		}
		return "none"
	}
	cases := []struct {
		eui, interval string
		want          time.Duration
	}{
		{"0101010101010101", "15m", 45 * time.Minute},
		{"0101010101010102", "1h", 2 * time.Hour}, // 3h asked: cut to max_lease
		{"0101010101010103", "10s", 90 * time.Second},
		{"0101010101010104", "", 0},
	}
	for _, c := range cases {
		postTagged(t, addr, c.eui, c.interval)
	}
	waitFor(t, 5*time.Second, "the evidence", func() bool { return len(e.rec.Evidence()) == len(cases) })
	leases := map[gateway.DeviceID]time.Duration{}
	for _, ev := range e.rec.Evidence() {
		leases[ev.Device] = ev.Lease
	}
	for _, c := range cases {
		if got := leases[gateway.DeviceID("lora-"+c.eui)]; got != c.want {
			t.Errorf("lora-%s (uplink interval %q): lease %v, want %v", c.eui, c.interval, got, c.want)
		}
	}
	if n := clamped(); n != "1" {
		t.Errorf("leases clamped: %s, want 1", n)
	}

	// the adapter's lease for a device without an interval; a reload's
	// max_lease for the evidence after it
	spec.Lease = 30 * time.Minute
	if err := e.host.Apply(ctx(t), []adapter.Spec{spec}); err != nil {
		t.Fatal(err)
	}
	e.host.SetTiming(gateway.Timing{Lease: 90 * time.Second, HeartbeatInterval: 30 * time.Second, MaxLease: time.Hour})
	before := len(e.rec.Evidence())
	postTagged(t, addr, "0101010101010104", "")
	postTagged(t, addr, "0101010101010101", "1h")
	waitFor(t, 5*time.Second, "the evidence after the reload", func() bool { return len(e.rec.Evidence()) == before+2 })
	after := e.rec.Evidence()[before:]
	if after[0].Lease != 30*time.Minute || after[1].Lease != time.Hour {
		t.Fatalf("leases after the reload: %v and %v, want the adapter's 30m and max_lease 1h", after[0].Lease, after[1].Lease)
	}
	if n := clamped(); n != "2" {
		t.Errorf("leases clamped: %s, want 2", n)
	}
}
