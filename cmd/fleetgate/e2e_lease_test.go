package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/plgd-dev/go-coap/v3/message"
	"github.com/plgd-dev/go-coap/v3/message/codes"

	"github.com/fleetgate/fleetgate/auth"
)

// A CoAP device asks for a longer lease (l=<seconds>) within
// presence.max_lease: it is answered with the Max-Age that fits it, and
// the store holds the device for that lease, not presence.lease.
func TestCoAPLeaseAsked(t *testing.T) {
	t.Parallel()
	gw := newGateway(t, "gw-l", "", fastTiming) // lease 4s, heartbeat 1s
	gw.env = append(gw.env, "FLEETGATE_PRESENCE_MAX_LEASE=60s")
	gw.start()
	post := func(query ...string) (uint32, time.Time) {
		t.Helper()
		cc := dialCoAP(t, gw.coapAddr)
		defer cc.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		var opts message.Options
		for _, q := range query {
			opts = append(opts, message.Option{ID: message.URIQuery, Value: []byte(q)})
		}
		sent := time.Now()
		resp, err := cc.Post(ctx, "/hb", message.TextPlain, nil, opts...)
		if err != nil {
			t.Fatal(err)
		}
		if resp.Code() != codes.Changed {
			t.Fatalf("POST /hb %v: %v, want 2.04", query, resp.Code())
		}
		v, err := resp.GetOptionUint32(message.MaxAge)
		if err != nil {
			t.Fatalf("no Max-Age: %v", err)
		}
		return v, sent
	}
	deadline := func() time.Time {
		t.Helper()
		var info struct {
			Deadline time.Time `json:"deadline"`
		}
		waitFor(t, 10*time.Second, "dev-l in the store", func() bool {
			code, out, _ := runCLI(t, "devices", "get", "--addr", gw.admin, "--json", "dev-l")
			return code == 0 && json.Unmarshal([]byte(out), &info) == nil && !info.Deadline.IsZero()
		})
		return info.Deadline
	}

	if got, _ := post("d=dev-l", "l=30"); got != 27 {
		t.Fatalf("Max-Age for l=30 = %d, want 27 (30s - (4s - 1s))", got)
	}
	if got, _ := post("d=dev-l", "l=600"); got != 57 {
		t.Fatalf("Max-Age for l=600 = %d, want 57 (granted max_lease 60s)", got)
	}
	_, sent := post("d=dev-l", "l=60")
	waitFor(t, 10*time.Second, "the 60s lease in the store", func() bool {
		d := deadline()
		return d.After(sent.Add(50*time.Second)) && d.Before(time.Now().Add(61*time.Second))
	})
	if got, _ := post("d=dev-other"); got != 1 {
		t.Fatalf("Max-Age without l= = %d, want the heartbeat interval 1", got)
	}
	gw.stop()
}

// setPresence adds keys to the presence section of g's configuration
// ("max_lease: 60s"); call it before start.
func (g *gatewayProc) setPresence(keys string) {
	g.t.Helper()
	b, err := os.ReadFile(g.config)
	if err != nil {
		g.t.Fatal(err)
	}
	cfg := strings.Replace(string(b), "presence: { ", "presence: { "+keys+", ", 1)
	if err := os.WriteFile(g.config, []byte(cfg), 0o600); err != nil {
		g.t.Fatal(err)
	}
}

// deadline is dev's deadline in g's store (devices get), once it has one.
func (g *gatewayProc) deadline(t *testing.T, dev string) time.Time {
	t.Helper()
	var info struct {
		Deadline time.Time `json:"deadline"`
	}
	waitFor(t, 10*time.Second, dev+" in the store", func() bool {
		code, out, _ := runCLI(t, "devices", "get", "--addr", g.admin, "--json", dev)
		return code == 0 && json.Unmarshal([]byte(out), &info) == nil && !info.Deadline.IsZero()
	})
	return info.Deadline
}

// heldFor checks that dev's deadline in g's store, once it reflects the
// evidence sent at sent, is sent + lease (within the time the request
// took and the store's millisecond).
func (g *gatewayProc) heldFor(t *testing.T, dev string, sent time.Time, lease time.Duration) {
	t.Helper()
	var d time.Time
	waitFor(t, 10*time.Second, fmt.Sprintf("%s held for %v", dev, lease), func() bool {
		d = g.deadline(t, dev)
		return !d.Before(sent.Add(lease - 10*time.Millisecond))
	})
	if d.After(time.Now().Add(lease + 10*time.Millisecond)) {
		t.Fatalf("%s: deadline %v after the evidence sent at %v, want %v", dev, d.Sub(sent), sent.Format(time.TimeOnly), lease)
	}
}

var maxAgeRE = regexp.MustCompile(`Max-Age:(\d+)`)

// coapsMaxAge sends a heartbeat with coap-client-openssl over DTLS as
// identity with key, and returns when it was sent and the Max-Age of the
// answer (coap-client -v 6 prints the options).
func coapsMaxAge(t *testing.T, addr, identity, key string) (time.Time, int) {
	t.Helper()
	sent := time.Now()
	out := runTool(t, "coap-client-openssl", "-v", "6", "-B", "5", "-m", "post", "-u", identity, "-k", key, "coaps://"+addr+"/hb")
	m := maxAgeRE.FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("coap-client: no Max-Age in its output:\n%s", out)
	}
	n, _ := strconv.Atoi(m[1])
	return sent, n
}

// Devices of the devices file with a lease of their own, with the real
// clients: coap-client-openssl (DTLS) is answered with the Max-Age of its
// 30 s lease and the store holds it that long; mosquitto_pub with a
// persistent session (its DISCONNECT is no leave: the lease decides) is
// held for its 40 s lease; a device without one keeps presence.lease
// (4 s). check-config prints the worst case of the file's leases; a lease
// beyond max_lease makes check-config exit 78 at its key and a reload
// that brings one is refused; a reload that changes a lease applies to
// the next evidence, ending no session.
func TestE2EDeviceFileLeases(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	hash, err := auth.HashPassword([]byte("lease-mqtt-pw"), 4)
	if err != nil {
		t.Fatal(err)
	}
	devicesFile := filepath.Join(dir, "devices.yaml")
	devices := func(coapLease string) string {
		return fmt.Sprintf(`devices:
  - id: dev-cl
    psk: "text:lease-key-0123456789"
    lease: %s
  - id: dev-ml
    password_bcrypt: %q
    lease: 40s
  - id: dev-plain
    psk: "text:plain-key-0123456789"
`, coapLease, hash)
	}
	if err := os.WriteFile(devicesFile, []byte(devices("30s")), 0o600); err != nil {
		t.Fatal(err)
	}
	gw := newGateway(t, "gw-dl", "", fastTiming) // lease 4s, heartbeat 1s
	gw.useDevicesFile(devicesFile)
	gw.setPresence("max_lease: 60s")
	code, out, errOut := runCLI(t, "check-config", "-c", gw.config)
	if code != 0 || !strings.Contains(out, "devices file: shortest   30.4s") || !strings.Contains(out, "devices file: longest    40.4s") {
		t.Fatalf("check-config: exit %d\n%s%s", code, out, errOut)
	}
	gw.start()

	// CoAP over DTLS with coap-client: its own lease, its Max-Age
	sent, age := coapsMaxAge(t, gw.dtlsAddr, "dev-cl", "lease-key-0123456789")
	if age != 27 {
		t.Fatalf("Max-Age %d for a 30s lease, want 27 (30s - (4s - 1s))", age)
	}
	gw.heldFor(t, "dev-cl", sent, 30*time.Second)
	sent, age = coapsMaxAge(t, gw.dtlsAddr, "dev-plain", "plain-key-0123456789")
	if age != 1 {
		t.Fatalf("Max-Age %d without a lease of its own, want the heartbeat interval 1", age)
	}
	gw.heldFor(t, "dev-plain", sent, 4*time.Second)

	// MQTT with mosquitto_pub, a persistent session (-c): its own lease
	host, port, _ := strings.Cut(gw.mqttAddr, ":")
	sent = time.Now()
	runTool(t, "mosquitto_pub", "-h", host, "-p", port, "-c", "-i", "dev-ml", "-u", "dev-ml", "-P", "lease-mqtt-pw",
		"-t", "devices/dev-ml/temp", "-m", "21", "-q", "1")
	gw.heldFor(t, "dev-ml", sent, 40*time.Second)
	if evs := adminEvents(t, gw, "dev-ml"); strings.Join(evs, ", ") != "online connect" {
		t.Fatalf("events of dev-ml %v: want its online only (the DISCONNECT of a persistent session is no leave)", evs)
	}

	// a lease beyond max_lease: check-config refuses the file at the key,
	// a reload keeps the devices in use
	if err := os.WriteFile(devicesFile, []byte(devices("2m")), 0o600); err != nil {
		t.Fatal(err)
	}
	code, _, errOut = runCLI(t, "check-config", "-c", gw.config)
	if want := devicesFile + ":4:12: devices[0].lease: 2m0s is longer than presence.max_lease (1m0s)"; code != 78 || !strings.Contains(errOut, want) {
		t.Fatalf("check-config with a lease beyond max_lease: exit %d, want 78 and %q:\n%s", code, want, errOut)
	}
	gw.signal(syscall.SIGHUP)
	waitFor(t, 10*time.Second, "the reload refused", func() bool {
		return strings.Contains(gw.logs(), "devices file not reloaded") && strings.Contains(gw.logs(), "devices[0].lease: 2m0s is longer than presence.max_lease")
	})
	if _, age := coapsMaxAge(t, gw.dtlsAddr, "dev-cl", "lease-key-0123456789"); age != 27 {
		t.Fatalf("Max-Age %d after the refused reload, want the lease in use (27)", age)
	}
	// a lease within it applies to the next heartbeat
	if err := os.WriteFile(devicesFile, []byte(devices("50s")), 0o600); err != nil {
		t.Fatal(err)
	}
	reloads := strings.Count(gw.logs(), "devices file reloaded")
	gw.signal(syscall.SIGHUP)
	waitFor(t, 10*time.Second, "the devices file reloaded", func() bool { return strings.Count(gw.logs(), "devices file reloaded") > reloads })
	sent, age = coapsMaxAge(t, gw.dtlsAddr, "dev-cl", "lease-key-0123456789")
	if age != 47 {
		t.Fatalf("Max-Age %d after the reload to 50s, want 47", age)
	}
	gw.heldFor(t, "dev-cl", sent, 50*time.Second)
	gw.stop()
}

// postLoRa posts a ChirpStack uplink without data of lora-<eui>, of the
// device profile profile with the tag uplink_interval (none when ""), to
// the lorawan adapter at addr, and returns when it was sent.
func postLoRa(t *testing.T, addr, eui, profile, interval string) time.Time {
	t.Helper()
	tags := "{}"
	if interval != "" {
		tags = fmt.Sprintf(`{"uplink_interval": %q}`, interval)
	}
	body := fmt.Sprintf(`{"deviceInfo": {"devEui": %q, "deviceProfileName": %q, "tags": %s}, "fPort": 1}`, eui, profile, tags)
	req, err := http.NewRequest("POST", "http://"+addr+"/chirpstack?event=up", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("X-Fleetgate-Secret", "lease-secret")
	sent := time.Now()
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusNoContent {
		t.Fatalf("uplink of %s answered %d", eui, resp.StatusCode)
	}
	return sent
}

// The lorawan adapter process gives each device's evidence three of its
// uplink intervals as its lease (its ChirpStack tag, else its device
// profile's in uplink_intervals); a device with neither gets the
// adapter's lease; one beyond max_lease is cut to it and counted
// (fleetgate_adapter_leases_clamped_total); check-config prints the
// adapter's worst case.
func TestE2EAdapterEvidenceLease(t *testing.T) {
	t.Parallel()
	gw := newGateway(t, "gw-al", "", fastTiming)
	gw.setPresence("max_lease: 60s")
	addr := fmt.Sprintf("127.0.0.1:%d", freeUDPPort(t))
	f, err := os.OpenFile(gw.config, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	_, err = fmt.Fprintf(f, `plugins:
  dir: %q
  adapters:
    - name: lora
      path: lorawan
      start_timeout: 20s
      lease: 20s
      config: { listen: %q, secret: lease-secret, prefix: "lora-", uplink_intervals: { meters: 10s } }
`, filepath.Dir(lorawan), addr)
	f.Close()
	if err != nil {
		t.Fatal(err)
	}
	code, out, errOut := runCLI(t, "check-config", "-c", gw.config)
	if code != 0 || !strings.Contains(out, "adapter lora             20.4s") {
		t.Fatalf("check-config: exit %d\n%s%s", code, out, errOut)
	}
	gw.start()
	gw.heldFor(t, "lora-0101010101010101", postLoRa(t, addr, "0101010101010101", "sensors", "15s"), 45*time.Second)
	gw.heldFor(t, "lora-0101010101010102", postLoRa(t, addr, "0101010101010102", "meters", ""), 30*time.Second)
	gw.heldFor(t, "lora-0101010101010103", postLoRa(t, addr, "0101010101010103", "sensors", ""), 20*time.Second)
	gw.heldFor(t, "lora-0101010101010104", postLoRa(t, addr, "0101010101010104", "sensors", "1h"), 60*time.Second)
	resp, err := http.Get("http://" + gw.admin + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	metrics, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !strings.Contains(string(metrics), `fleetgate_adapter_leases_clamped_total{adapter="lora"} 1`) {
		t.Fatalf("metrics: no clamped lease counted:\n%s", grepLines(string(metrics), "fleetgate_adapter_"))
	}
	gw.stop()
}

// A device that sends every 5 s, with coap-client, under a lease of 4 s:
// a gateway that learns leases (presence.learn_lease, max_lease 20 s)
// holds it from its first message (max_lease until its period is
// learned, then 3 × 5 s + renew_every), reports no offline while it
// sends, and reports it offline about 16 s after its last message, before
// max_lease would; the same device on a gateway that does not learn
// flaps offline between its messages.
func TestE2ELearnedLease(t *testing.T) {
	t.Parallel()
	learning := newGateway(t, "gw-learn", "", fastTiming) // lease 4s, renew_every 1s
	learning.setPresence("max_lease: 20s, learn_lease: true")
	fixed := newGateway(t, "gw-fixed", "", fastTiming)
	fixed.setPresence("max_lease: 20s")
	learning.start()
	fixed.start()
	client := coapClient(t)
	const period = 5 * time.Second
	var last time.Time
	for i := range 6 {
		if i > 0 {
			time.Sleep(time.Until(last.Add(period)))
		}
		last = time.Now()
		runTool(t, client, "-B", "5", "-m", "post", "coap://"+learning.coapAddr+"/hb?d=dev-learn")
		runTool(t, client, "-B", "5", "-m", "post", "coap://"+fixed.coapAddr+"/hb?d=dev-learn")
	}
	// the last gap was 5 s: 3 × 5 s + renew_every, not max_lease
	var d time.Duration
	waitFor(t, 5*time.Second, "the last message's deadline in the store", func() bool {
		d = learning.deadline(t, "dev-learn").Sub(last)
		return d >= 15*time.Second
	})
	if d > 17*time.Second {
		t.Fatalf("learned lease: the deadline is %v after the last message, want about 16s (max_lease 20s)", d)
	}
	if evs := adminEvents(t, learning, "dev-learn"); strings.Join(evs, ", ") != "online connect" {
		t.Fatalf("events while it sent every 5s: %v, want its online only", evs)
	}
	awaitEvents(t, learning, "dev-learn", 25*time.Second, "online connect", "offline expired")
	if late := time.Since(last); late > 19*time.Second {
		t.Fatalf("offline %v after the last message, want about 16s, not max_lease", late)
	}
	if evs := adminEvents(t, fixed, "dev-learn"); strings.Count(strings.Join(evs, ","), "offline") < 3 {
		t.Fatalf("events of the device on the gateway with the fixed lease: %v, want it flapping", evs)
	}
}
