package main

import (
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"net/http"
	"os"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/fleetgate/fleetgate/internal/redistest"
	"github.com/fleetgate/fleetgate/internal/testcert"
)

// A running gateway exports its build, the lease and the detection bound
// in force (following a reload), the expiry of the certificates its
// configuration names (in /v1/status too), and the results of its reloads.
func TestProcessMetrics(t *testing.T) {
	t.Parallel()
	gw := newGateway(t, "gw-pm", "", fastTiming)
	dir := t.TempDir()
	certFile, keyFile := testcert.New(t).Write(t, dir)
	b, err := os.ReadFile(gw.config)
	if err != nil {
		t.Fatal(err)
	}
	tlsAddr := fmt.Sprintf("127.0.0.1:%d", redistest.FreePort(t))
	cfg := strings.Replace(string(b), fmt.Sprintf("mqtt: { tcp: %q }", gw.mqttAddr),
		fmt.Sprintf("mqtt: { tcp: %q, tls: %q, cert_file: %q, key_file: %q }", gw.mqttAddr, tlsAddr, certFile, keyFile), 1)
	cfg += fmt.Sprintf("bridge: { mqtt: { tls: { ca: %q } } }\n", certFile)
	if err := os.WriteFile(gw.config, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	gw.start()
	url := "http://" + gw.admin + "/metrics"
	m := scrape(t, url)
	if v := metric(m, "fleetgate_build_info", `version="dev"`, fmt.Sprintf(`goversion=%q`, runtime.Version())); v != 1 {
		t.Errorf("fleetgate_build_info{version=dev} = %v", v)
	}
	if v := metric(m, "fleetgate_presence_lease_seconds"); v != 4 {
		t.Errorf("fleetgate_presence_lease_seconds = %v, want 4", v)
	}
	if v := metric(m, "fleetgate_detection_bound_seconds"); v != 4.4 {
		t.Errorf("fleetgate_detection_bound_seconds = %v, want 4.4", v)
	}
	pemBytes, err := os.ReadFile(certFile)
	if err != nil {
		t.Fatal(err)
	}
	blk, _ := pem.Decode(pemBytes)
	cert, err := x509.ParseCertificate(blk.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	for _, key := range []string{"listen.mqtt", "bridge.mqtt.tls.ca"} {
		if v := metric(m, "fleetgate_certificate_expiry_timestamp_seconds", fmt.Sprintf(`key=%q`, key)); v != float64(cert.NotAfter.Unix()) {
			t.Errorf("expiry of %s = %v, want %d", key, v, cert.NotAfter.Unix())
		}
	}
	// /v1/status names the same expiries (the page shows them)
	resp, err := http.Get("http://" + gw.admin + "/v1/status")
	if err != nil {
		t.Fatal(err)
	}
	var st struct {
		Certificates []struct {
			Key      string    `json:"key"`
			NotAfter time.Time `json:"not_after"`
		} `json:"certificates"`
	}
	err = json.NewDecoder(resp.Body).Decode(&st)
	resp.Body.Close()
	if err != nil {
		t.Fatal(err)
	}
	if len(st.Certificates) != 2 || st.Certificates[0].Key != "listen.mqtt" || st.Certificates[1].Key != "bridge.mqtt.tls.ca" ||
		!st.Certificates[0].NotAfter.Equal(cert.NotAfter) || !st.Certificates[1].NotAfter.Equal(cert.NotAfter) {
		t.Errorf("/v1/status certificates %+v, want listen.mqtt and bridge.mqtt.tls.ca expiring %v", st.Certificates, cert.NotAfter)
	}
	// the gateway's own runner holds every shard (4)
	waitFor(t, 10*time.Second, "every shard covered", func() bool {
		m := scrape(t, url)
		return metric(m, "fleetgate_store_shards") == 4 && metric(m, "fleetgate_runner_shards_covered") == 4
	})
	if v := metric(m, "fleetgate_reload_last_success"); v != 1 {
		t.Errorf("fleetgate_reload_last_success = %v before any reload", v)
	}

	// a refused reload, then an applied one with a longer lease
	good := cfg
	if err := os.WriteFile(gw.config, []byte("presence: { lease: nope }\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	gw.signal(syscall.SIGHUP)
	waitFor(t, 10*time.Second, "a refused reload counted", func() bool {
		m := scrape(t, url)
		return metric(m, "fleetgate_reloads_total", `result="refused"`) == 1 && metric(m, "fleetgate_reload_last_success") == 0
	})
	newer := strings.NewReplacer("lease: 4s", "lease: 8s", "suspect_after: 2s", "suspect_after: 4s").Replace(good)
	if err := os.WriteFile(gw.config, []byte(newer), 0o600); err != nil {
		t.Fatal(err)
	}
	gw.signal(syscall.SIGHUP)
	waitFor(t, 10*time.Second, "an applied reload counted", func() bool {
		m := scrape(t, url)
		return metric(m, "fleetgate_reloads_total", `result="applied"`) == 1 && metric(m, "fleetgate_reload_last_success") == 1
	})
	m = scrape(t, url)
	if v := metric(m, "fleetgate_presence_lease_seconds"); v != 8 {
		t.Errorf("fleetgate_presence_lease_seconds after the reload = %v, want 8", v)
	}
	if v := metric(m, "fleetgate_detection_bound_seconds"); v != 8.4 {
		t.Errorf("fleetgate_detection_bound_seconds after the reload = %v, want 8.4", v)
	}
}

// Without any runner no shard is covered, and the metric says so (the
// store's offline events would never come).
func TestRunnerCoverageNone(t *testing.T) {
	t.Parallel()
	gw := newGateway(t, "gw-nr", "", fastTiming)
	gw.env = append(gw.env, "FLEETGATE_RUNNER_ENABLED=false")
	gw.start()
	m := scrape(t, "http://"+gw.admin+"/metrics")
	if metric(m, "fleetgate_store_shards") != 4 || metric(m, "fleetgate_runner_shards_covered") != 0 {
		t.Errorf("store shards %v covered %v, want 4 and 0", metric(m, "fleetgate_store_shards"), metric(m, "fleetgate_runner_shards_covered"))
	}
	found := false
	for _, s := range m {
		found = found || s.name == "fleetgate_runner_shards_covered"
	}
	if !found {
		t.Errorf("fleetgate_runner_shards_covered not exported")
	}
}
