package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/fleetgate/fleetgate/internal/mosquittotest"
	"github.com/fleetgate/fleetgate/internal/redistest"
)

// canaryBound is the worst-case detection of fastTiming: lease 4s + 3 x
// flush 100ms + runner interval 100ms.
const canaryBound = 4400 * time.Millisecond

// canaryDetections waits until the gateway's canary has timed n offline
// events on path and returns its metrics then.
func canaryDetections(t *testing.T, gw *gatewayProc, path string, n int, limit time.Duration) []promSample {
	t.Helper()
	var m []promSample
	waitFor(t, limit, fmt.Sprintf("%d canary detections on %s", n, path), func() bool {
		m = scrape(t, "http://"+gw.admin+"/metrics")
		return metric(m, "fleetgate_canary_detection_seconds_count", `path="`+path+`"`) >= float64(n)
	})
	return m
}

// checkCanary checks the canary's figures: every detection within the
// bound and no earlier than the lease allows, the bound exported as
// check-config derives it, no false offline, nothing missed.
func checkCanary(t *testing.T, m []promSample, path string) {
	t.Helper()
	if b := metric(m, "fleetgate_canary_bound_seconds"); b != canaryBound.Seconds() {
		t.Errorf("fleetgate_canary_bound_seconds = %v, want %v", b, canaryBound.Seconds())
	}
	n := metric(m, "fleetgate_canary_detection_seconds_count", `path="`+path+`"`)
	within := metric(m, "fleetgate_canary_detection_seconds_bucket", `path="`+path+`"`, fmt.Sprintf(`le="%g"`, canaryBound.Seconds()))
	if within != n {
		t.Errorf("%s: %v of %v detections within the bound %s", path, within, n, canaryBound)
	}
	// earliest offline: lease - renew_every = 3s after the last heartbeat
	if avg := metric(m, "fleetgate_canary_detection_seconds_sum", `path="`+path+`"`) / n; avg < 3 {
		t.Errorf("%s: mean detection %.3fs, before the earliest offline (3s)", path, avg)
	}
	if last := metric(m, "fleetgate_canary_last_detection_seconds", `path="`+path+`"`); last < 3 || last > canaryBound.Seconds() {
		t.Errorf("%s: last detection %.3fs, want 3s..%s", path, last, canaryBound)
	}
	for _, name := range []string{"fleetgate_canary_false_offline_total", "fleetgate_canary_missed_total", "fleetgate_canary_heartbeat_failures_total"} {
		if v := metric(m, name); v != 0 {
			t.Errorf("%s = %v, want 0", name, v)
		}
	}
}

// The canary of a gateway with the embedded store heartbeats over plain
// UDP to the gateway's own CoAP listener, stops, and times its offline
// event out of the store's log, cycle after cycle, within the bound.
func TestCanaryEmbedded(t *testing.T) {
	t.Parallel()
	gw := newGateway(t, "gw-cn", "", fastTiming)
	gw.env = append(gw.env, "FLEETGATE_CANARY_ENABLED=true", "FLEETGATE_CANARY_LIVE=2s")
	gw.start()
	m := canaryDetections(t, gw, "log", 3, 60*time.Second)
	checkCanary(t, m, "log")
	if metric(m, "fleetgate_canary_detection_seconds_count", `path="upstream"`) != 0 {
		t.Errorf("upstream detections without a publisher")
	}
	code, out, _ := runCLI(t, "devices", "get", "--addr", gw.admin, "--json", "canary-gw-cn")
	if code != 0 || !strings.Contains(out, `"coap/default"`) {
		t.Errorf("devices get canary-gw-cn: %d %s", code, out)
	}
	if !strings.Contains(gw.logs(), `msg="canary: offline detected" gateway=gw-cn canary=canary-gw-cn path=log`) {
		t.Errorf("no detection logged")
	}
	// /v1/status holds the same figures
	st := gw.status(t).Canary
	if st == nil {
		t.Fatal("no canary in /v1/status")
	}
	p := st.Paths["log"]
	if st.Phase != "live" && st.Phase != "stopped" || st.BoundNS != int64(canaryBound) || st.FalseOffline != 0 ||
		p.Detected < 3 || p.Late != 0 || p.Missed != 0 || p.LastDetectionNS < int64(3*time.Second) || p.LastDetectionNS > int64(canaryBound) {
		t.Errorf("/v1/status canary: %+v", st)
	}
	if _, ok := st.Paths["upstream"]; ok {
		t.Errorf("/v1/status canary: an upstream path without a publisher: %+v", st)
	}
}

// With the Redis store, a devices file and the DTLS listener, the canary
// shakes hands with a key the gateway made for it, and times its offline
// both out of the log and out of the events publisher (a real mosquitto).
func TestCanaryRedisDTLSUpstream(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	broker := mosquittotest.Start(t, mosquittotest.Options{})
	gw := newGateway(t, "gw-cr", srv.Addr, fastTiming)
	devices := filepath.Join(t.TempDir(), "devices.yaml")
	if err := os.WriteFile(devices, []byte("devices:\n  - id: dev-1\n    psk: \"hex:00112233445566778899aabbccddeeff\"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	gw.useDevicesFile(devices)
	gw.env = append(gw.env, "FLEETGATE_CANARY_ENABLED=true", "FLEETGATE_CANARY_LIVE=2s",
		"FLEETGATE_EVENTS_MQTT_URL=mqtt://"+broker.Addr)
	gw.start()
	m := canaryDetections(t, gw, "upstream", 2, 60*time.Second)
	m = canaryDetections(t, gw, "log", int(metric(m, "fleetgate_canary_detection_seconds_count", `path="upstream"`)), 10*time.Second)
	checkCanary(t, m, "log")
	checkCanary(t, m, "upstream")
	if !strings.Contains(gw.logs(), "dtls=true") {
		t.Errorf("the canary did not speak DTLS")
	}
	// plain UDP with d= is refused for it: it is a device with a key
	if err := sendOnce(gw.coapAddr, "canary-gw-cr"); err == nil {
		t.Errorf("a plain UDP heartbeat as the canary was taken")
	}
}

// An offline event of the canary while it heartbeats counts as a false
// offline: here a leave sent in its name during its live phase.
func TestCanaryFalseOffline(t *testing.T) {
	t.Parallel()
	gw := newGateway(t, "gw-cf", "", fastTiming)
	gw.env = append(gw.env, "FLEETGATE_CANARY_ENABLED=true", "FLEETGATE_CANARY_LIVE=30s")
	gw.start()
	id := "canary-gw-cf"
	waitFor(t, 10*time.Second, "the canary online", func() bool {
		code, out, _ := runCLI(t, "devices", "get", "--addr", gw.admin, "--json", id)
		return code == 0 && strings.Contains(out, `"state": "online"`)
	})
	url := "http://" + gw.admin + "/metrics"
	if v := metric(scrape(t, url), "fleetgate_canary_false_offline_total"); v != 0 {
		t.Fatalf("false offlines before the leave: %v", v)
	}
	device{id: id, t: t}.leave(gw.coapAddr)
	waitFor(t, 10*time.Second, "a false offline counted", func() bool {
		return metric(scrape(t, url), "fleetgate_canary_false_offline_total") == 1
	})
	if !strings.Contains(gw.logs(), `msg="canary: offline event while it heartbeats"`) {
		t.Errorf("the false offline was not logged")
	}
	if st := gw.status(t).Canary; st == nil || st.FalseOffline != 1 || st.Phase != "live" {
		t.Errorf("/v1/status canary: %+v, want 1 false offline in the live phase", st)
	}
}
