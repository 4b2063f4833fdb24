package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"
)

// TestE2ERefusalsExplained runs the gateway at the default log level
// (info) and refuses devices with the real clients an operator uses:
// mosquitto_pub with a wrong password, coap-client-openssl with a wrong
// key and with an unknown identity, coap-client-notls without
// credentials. Each refusal is one "device refused" warning with the
// device and reason, fleetgate_refused_total counts it, and `fleetgate
// devices get` says why, for a device never seen online as for one that
// was; repeats are summarised, not logged again.
func TestE2ERefusalsExplained(t *testing.T) {
	t.Parallel()
	devicesFile := filepath.Join(t.TempDir(), "devices.yaml")
	key := "0123456789abcdef"
	writeDevices(t, devicesFile, "pw-1", fmt.Sprintf("%x", key), "")
	gw := newGateway(t, "gw-refusals", "", fastTiming)
	gw.useDevicesFile(devicesFile)
	gw.env = []string{"FLEETGATE_LOG_LEVEL=info", "FLEETGATE_LIMITS_DTLS_HANDSHAKE_TIMEOUT=1s"}
	gw.start()
	mqttHost, mqttPort, _ := net.SplitHostPort(gw.mqttAddr)

	// dev-pw is online first, then a client with a wrong password: the
	// device's record exists and carries the refusal.
	if code := mqttConnack(t, gw.mqttAddr, "dev-pw", "pw-1"); code != 0 {
		t.Fatalf("right password: CONNACK 0x%x", code)
	}
	for range 3 {
		if out, err := client("mosquitto_pub", "-h", mqttHost, "-p", mqttPort, "-i", "dev-pw", "-u", "dev-pw", "-P", "wrong", "-t", "devices/dev-pw/t", "-m", "x"); err == nil {
			t.Fatalf("mosquitto_pub with a wrong password was admitted:\n%s", out)
		}
	}
	// coap-client's exit status does not tell a refusal; the log does.
	_, _ = client("coap-client-openssl", "-B", "4", "-m", "post", "-k", "fedcba9876543210", "-u", "dev-psk", "coaps://"+gw.dtlsAddr+"/hb")
	_, _ = client("coap-client-openssl", "-B", "4", "-m", "post", "-k", key, "-u", "nobody", "coaps://"+gw.dtlsAddr+"/hb")
	_, _ = client("coap-client-notls", "-B", "2", "-m", "post", "coap://"+gw.coapAddr+"/hb?d=ghost")

	want := map[string]string{
		"mqtt dev-pw":  "bad_credentials",
		"coap dev-psk": "bad_credentials",
		"coap nobody":  "unknown_device",
		"coap ghost":   "unknown_device",
	}
	refused := regexp.MustCompile(`level=WARN msg="device refused" gateway=gw-refusals protocol=(\S+) device=(\S+) reason=(\S+) detail=.* remote=127\.0\.0\.1:\d+`)
	waitFor(t, 15*time.Second, "a refusal line of each device", func() bool {
		seen := map[string]string{}
		for _, m := range refused.FindAllStringSubmatch(gw.logs(), -1) {
			seen[m[1]+" "+m[2]] = m[3]
		}
		for k, v := range want {
			if seen[k] != v {
				return false
			}
		}
		return true
	})
	t.Logf("refusals logged:\n%s", grepLines(gw.logs(), "device refused"))
	if n := strings.Count(gw.logs(), `msg="device refused" gateway=gw-refusals protocol=mqtt device=dev-pw`); n != 1 {
		t.Errorf("%d lines for dev-pw's 3 refusals within a minute, want 1 (the rest summarised later)", n)
	}

	metrics := httpGet(t, "http://"+gw.admin+"/metrics")
	for series, n := range map[string]string{
		`fleetgate_refused_total{protocol="mqtt",reason="bad_credentials"}`: "3",
		`fleetgate_refused_total{protocol="coap",reason="bad_credentials"}`: "1",
		`fleetgate_refused_total{protocol="coap",reason="unknown_device"}`:  "2",
	} {
		if !strings.Contains(metrics, series+" "+n+"\n") {
			t.Errorf("metrics lack %s %s:\n%s", series, n, grepLines(metrics, "fleetgate_refused_total"))
		}
	}

	code, out, errOut := runCLI(t, "devices", "get", "--addr", gw.admin, "dev-pw")
	if code != 0 || !regexp.MustCompile(`last refused\s+.* over mqtt: bad_credentials \(wrong password.*\) from 127\.0\.0\.1:\d+`).MatchString(out) {
		t.Errorf("devices get dev-pw: exit %d\n%s%s", code, out, errOut)
	}
	// Never online: not found, and why.
	code, out, errOut = runCLI(t, "devices", "get", "--addr", gw.admin, "dev-psk")
	if code != 1 || !strings.Contains(errOut, "device dev-psk: not found; last refused") || !strings.Contains(errOut, "over coap: bad_credentials (DTLS handshake failed") {
		t.Errorf("devices get dev-psk: exit %d\n%s%s", code, out, errOut)
	}
	code, out, errOut = runCLI(t, "devices", "get", "--addr", gw.admin, "--json", "dev-pw")
	if code != 0 || !strings.Contains(out, `"last_refusal": {`) || !strings.Contains(out, `"reason": "bad_credentials"`) {
		t.Errorf("devices get --json dev-pw: exit %d\n%s%s", code, out, errOut)
	}
}

// client runs an external client, for at most 30 s.
func client(name string, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, name, args...).CombinedOutput()
	return string(out), err
}

func httpGet(t *testing.T, url string) string {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func grepLines(s, substr string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, substr) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}
