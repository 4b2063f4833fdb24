package main

import (
	"context"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/plgd-dev/go-coap/v3/message/codes"

	"github.com/fleetgate/fleetgate/admin"
	"github.com/fleetgate/fleetgate/internal/mosquittotest"
	"github.com/fleetgate/fleetgate/internal/redistest"
)

// fleetgateCLI runs the fleetgate binary with args and stdin, within 30 s,
// and returns its stdout, stderr and exit code.
func fleetgateCLI(t *testing.T, stdin string, args ...string) (string, string, int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, binary, args...)
	cmd.Stdin = strings.NewReader(stdin)
	var out, errb strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatalf("fleetgate %s: %v", strings.Join(args, " "), err)
	}
	return out.String(), errb.String(), code
}

// retainedOf is what a fresh mosquitto_sub prints of the retained
// messages of topic on broker: "topic payload" lines.
func retainedOf(t *testing.T, broker, topic string) string {
	t.Helper()
	host, port, _ := strings.Cut(broker, ":")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	// --retained-only ends at the first live message or after -W seconds
	// (exit 27, a timeout: not a failure)
	out, err := exec.CommandContext(ctx, "mosquitto_sub", "-h", host, "-p", port, "-v", "--retained-only", "-W", "2", "-t", topic).CombinedOutput()
	if ee, ok := err.(*exec.ExitError); err != nil && !(ok && ee.ExitCode() == 27) {
		t.Fatalf("mosquitto_sub: %v: %s", err, out)
	}
	return string(out)
}

// Provisioning and retirement against a real `fleetgate run` on Redis,
// with real clients: `devices add` (a generated key, used by a DTLS
// client; a key file, used by coap-client-openssl; a password, used by
// mosquitto_pub) edits the file and reloads the gateway by SIGHUP;
// `devices rotate` ends the live MQTT connection and swaps the password;
// `devices remove` refuses the device; the credentials API does the same
// over HTTP with the token; `devices forget` writes the removed event,
// which the gateway's publisher sends to a real mosquitto while it clears
// the device's retained presence there (mosquitto_sub), and the device
// that sends again comes back with a higher ver.
func TestE2EProvisioning(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	rc := srv.Client(t)
	dir := t.TempDir()
	devicesFile := filepath.Join(dir, "devices.yaml")
	if err := os.WriteFile(devicesFile, []byte("# provisioned by fleetgate devices add\ndevices: []\n"), 0o640); err != nil {
		t.Fatal(err)
	}
	const token = "e2e-provision-token-0123"
	tokenFile := filepath.Join(dir, "admin-token")
	if err := os.WriteFile(tokenFile, []byte(token+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	gw := newGateway(t, "gw-prov", srv.Addr, fastTiming)
	gw.useDevicesFile(devicesFile)
	b, _ := os.ReadFile(gw.config)
	cfg := strings.Replace(string(b), fmt.Sprintf("admin: { http: %q }", gw.admin),
		fmt.Sprintf("admin: { http: %q, token_file: %q, credentials_api: true }", gw.admin, tokenFile), 1)
	cfg = strings.Replace(cfg, "presence: { ", "presence: { max_lease: 5m, ", 1)
	if err := os.WriteFile(gw.config, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	broker := mosquittotest.Start(t, mosquittotest.Options{}).Addr
	appendConfig(t, gw.config, fmt.Sprintf("events:\n  mqtt: { url: \"mqtt://%s\", topic_prefix: site-p }\n", broker))
	gw.start()
	pid := strconv.Itoa(gw.cmd.Process.Pid)
	reloads := func() int { return strings.Count(gw.logs(), "devices file reloaded") }
	edit := func(stdin string, args ...string) string {
		t.Helper()
		n := reloads()
		out, errOut, code := fleetgateCLI(t, stdin, append(append([]string{"devices"}, args...), "-c", gw.config, "--pid", pid)...)
		if code != 0 {
			t.Fatalf("fleetgate devices %v: exit %d\n%s", args, code, errOut)
		}
		waitFor(t, 10*time.Second, "the gateway reloads the devices file", func() bool { return reloads() > n })
		return out
	}

	// A generated key, printed once, works for DTLS.
	out := edit("", "add", "dev-gen", "--psk-gen")
	psk := strings.TrimSpace(out)
	key, err := hex.DecodeString(strings.TrimPrefix(psk, "hex:"))
	if !strings.HasPrefix(psk, "hex:") || err != nil || len(key) != 32 {
		t.Fatalf("devices add --psk-gen printed %q", out)
	}
	if code, err := dtlsHeartbeat(gw.dtlsAddr, "dev-gen", key); err != nil || code != codes.Changed {
		t.Fatalf("DTLS with the generated key: %v %v, want 2.04", code, err)
	}
	if st, _ := os.Stat(devicesFile); st.Mode().Perm() != 0o640 {
		t.Errorf("devices file mode %v after edits, want 0640 kept", st.Mode().Perm())
	}

	// A key from a file, used by coap-client-openssl.
	keyFile := filepath.Join(dir, "key")
	if err := os.WriteFile(keyFile, []byte("text:provisioned-key-42\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	edit("", "add", "dev-coap", "--psk-file", keyFile)
	runTool(t, "coap-client-openssl", "-B", "5", "-m", "post", "-k", "provisioned-key-42", "-u", "dev-coap", "coaps://"+gw.dtlsAddr+"/hb")

	// A password from standard input, used by mosquitto_pub.
	edit("mqtt-pass-1\n", "add", "dev-mq", "--password-prompt")
	host, port, _ := strings.Cut(gw.mqttAddr, ":")
	pub := func(password string) error {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		return exec.CommandContext(ctx, "mosquitto_pub", "-h", host, "-p", port, "-i", "dev-mq", "-u", "dev-mq", "-P", password,
			"-t", "devices/dev-mq/temp", "-m", "20", "-q", "1").Run()
	}
	if err := pub("mqtt-pass-1"); err != nil {
		t.Fatalf("mosquitto_pub with the added password: %v", err)
	}

	// Rotate: the live connection ends, the old password is refused.
	if code := mqttConnack(t, gw.mqttAddr, "dev-mq", "mqtt-pass-1"); code != 0 {
		t.Fatalf("CONNACK 0x%x before the rotation", code)
	}
	edit("mqtt-pass-2\n", "rotate", "dev-mq", "--password-prompt")
	waitFor(t, 10*time.Second, "the live connection revoked", func() bool { return strings.Contains(gw.logs(), "connection revoked by a reload") })
	if err := pub("mqtt-pass-1"); err == nil {
		t.Fatal("mosquitto_pub with the old password accepted after the rotation")
	}
	// (the wrong password just sent holds this address back for a moment:
	// auth/guard.go)
	waitFor(t, 10*time.Second, "mosquitto_pub with the rotated password accepted", func() bool { return pub("mqtt-pass-2") == nil })

	// Remove: the device is refused.
	edit("", "remove", "dev-gen")
	if _, err := dtlsHeartbeat(gw.dtlsAddr, "dev-gen", key); err == nil {
		t.Fatal("DTLS of a removed device was answered")
	}

	// The credentials API: the token is required; a generated key works
	// at once, and stops working once deleted.
	call := func(method, path, body, tok string) (int, string) {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		req, _ := http.NewRequestWithContext(ctx, method, "http://"+gw.admin+path, strings.NewReader(body))
		if tok != "" {
			req.Header.Set("Authorization", "Bearer "+tok)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	if code, _ := call(http.MethodPost, "/v1/credentials/dev-api", `{"psk":"generate"}`, ""); code != http.StatusUnauthorized {
		t.Fatalf("credentials API without the token: %d, want 401", code)
	}
	code, body := call(http.MethodPost, "/v1/credentials/dev-api", `{"psk":"generate"}`, token)
	var res admin.CredentialResult
	if err := json.Unmarshal([]byte(body), &res); code != http.StatusCreated || err != nil {
		t.Fatalf("POST /v1/credentials/dev-api: %d %s", code, body)
	}
	apiKey, _ := hex.DecodeString(strings.TrimPrefix(res.PSK, "hex:"))
	if code, err := dtlsHeartbeat(gw.dtlsAddr, "dev-api", apiKey); err != nil || code != codes.Changed {
		t.Fatalf("DTLS with the API's key: %v %v, want 2.04", code, err)
	}
	// A lease alone: the device keeps its key, and its next heartbeat
	// gets the lease.
	if code, body := call(http.MethodPost, "/v1/credentials/dev-api", `{"lease":"2m"}`, token); code != http.StatusOK {
		t.Fatalf("POST a lease: %d %s", code, body)
	}
	if code, body := call(http.MethodPost, "/v1/credentials/dev-api", `{"lease":"1h"}`, token); code != http.StatusBadRequest || !strings.Contains(body, "presence.max_lease") {
		t.Errorf("POST a lease beyond max_lease: %d %s, want 400", code, body)
	}
	waitFor(t, 10*time.Second, "dev-api's heartbeat under its own lease", func() bool {
		if code, err := dtlsHeartbeat(gw.dtlsAddr, "dev-api", apiKey); err != nil || code != codes.Changed {
			t.Fatalf("DTLS after the lease's edit: %v %v, want 2.04", code, err)
		}
		_, body := call(http.MethodGet, "/v1/devices/dev-api", "", token)
		var d struct{ Deadline time.Time }
		return json.Unmarshal([]byte(body), &d) == nil && time.Until(d.Deadline) > time.Minute
	})
	if code, body := call(http.MethodDelete, "/v1/credentials/dev-api", "", token); code != http.StatusOK {
		t.Fatalf("DELETE /v1/credentials/dev-api: %d %s", code, body)
	}
	if _, err := dtlsHeartbeat(gw.dtlsAddr, "dev-api", apiKey); err == nil {
		t.Fatal("DTLS of a device deleted through the API was answered")
	}

	// Forget: the removed event, the device gone from the store; when it
	// sends again it is back, above every ver it had.
	waitFor(t, 10*time.Second, "dev-mq in the event log", func() bool { return len(eventsOf(events(t, rc, 4), "dev-mq")) > 0 })
	bus := mosquittoSub(t, broker, "site-p/events/dev-mq")
	waitFor(t, 20*time.Second, "dev-mq's retained presence on the broker", func() bool {
		return strings.Contains(retainedOf(t, broker, "site-p/presence/dev-mq"), "site-p/presence/dev-mq {")
	})
	out, errOut, exit := fleetgateCLI(t, "", "devices", "forget", "dev-mq", "-c", gw.config)
	if exit != 0 || !strings.Contains(out, "device dev-mq forgotten") {
		t.Fatalf("devices forget: exit %d %s %s", exit, out, errOut)
	}
	evs := eventsOf(events(t, rc, 4), "dev-mq")
	last := evs[len(evs)-1]
	if last.state != "removed" || last.reason != "forget" || last.gw != "gw-prov" {
		t.Fatalf("last event of dev-mq after forget: %+v", last)
	}
	if _, errOut, exit := fleetgateCLI(t, "", "devices", "get", "dev-mq", "-c", gw.config); exit != 1 || !strings.Contains(errOut, "not found") {
		t.Errorf("devices get after forget: exit %d %s", exit, errOut)
	}
	if _, _, exit := fleetgateCLI(t, "", "devices", "forget", "dev-mq", "-c", gw.config); exit != 1 {
		t.Errorf("second devices forget: exit %d, want 1 (not found)", exit)
	}
	waitFor(t, 20*time.Second, "the removed event on the broker and dev-mq's retained presence cleared", func() bool {
		line, _ := bus.find(`"state":"removed"`, `"reason":"forget"`, fmt.Sprintf(`"ver":%d`, last.ver))
		return line != "" && !strings.Contains(retainedOf(t, broker, "site-p/presence/dev-mq"), "dev-mq")
	})
	if err := pub("mqtt-pass-2"); err != nil {
		t.Fatal(err)
	}
	defer func() {
		if t.Failed() {
			t.Logf("events of dev-mq: %+v", eventsOf(events(t, rc, 4), "dev-mq"))
		}
	}()
	// its visit (connect, publish, disconnect) is online then offline
	var back []event
	waitFor(t, 10*time.Second, "dev-mq back online", func() bool {
		evs := eventsOf(events(t, rc, 4), "dev-mq")
		back = nil
		for _, e := range evs {
			if e.at.After(last.at) || e.ver > last.ver {
				back = append(back, e)
			}
		}
		return len(back) > 0
	})
	if back[0].state != "online" || back[0].ver <= last.ver {
		t.Errorf("dev-mq back with %+v, want online above its removed ver %d", back[0], last.ver)
	}
}

// Without a reachable gateway, `devices add` still edits the file but
// says that no gateway was told (exit 1); --no-reload edits quietly; a
// duplicate is refused and leaves the file as it was.
func TestDevicesAddWithoutGateway(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	devicesFile := filepath.Join(dir, "devices.yaml")
	if err := os.WriteFile(devicesFile, []byte("devices: []\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	config := filepath.Join(dir, "fleetgate.yaml")
	if err := os.WriteFile(config, fmt.Appendf(nil, "gateway: { id: gw-x, state_dir: %q }\nauth: { devices_file: %q }\npresence: { max_lease: 3h }\n", dir, devicesFile), 0o600); err != nil {
		t.Fatal(err)
	}
	out, errOut, code := fleetgateCLI(t, "", "devices", "add", "dev-1", "-c", config, "--no-reload")
	if code != 0 || !strings.HasPrefix(out, "hex:") || !strings.Contains(errOut, "not reloaded") {
		t.Fatalf("devices add --no-reload: exit %d\n%s%s", code, out, errOut)
	}
	before, _ := os.ReadFile(devicesFile)
	if _, errOut, code := fleetgateCLI(t, "", "devices", "add", "dev-1", "-c", config, "--no-reload"); code != 1 || !strings.Contains(errOut, "already in the devices file") {
		t.Fatalf("duplicate add: exit %d %s", code, errOut)
	}
	if _, errOut, code := fleetgateCLI(t, "", "devices", "add", "dev-2", "-c", config, "--pid", "999999999"); code != 1 || !strings.Contains(errOut, "no gateway was told") && !strings.Contains(errOut, "SIGHUP to pid") {
		t.Fatalf("add with a gone pid: exit %d %s", code, errOut)
	}
	after, _ := os.ReadFile(devicesFile)
	if !strings.Contains(string(after), "dev-2") || !strings.Contains(string(before), "dev-1") {
		t.Errorf("devices file:\n%s", after)
	}
	if _, errOut, code := fleetgateCLI(t, "", "devices", "add", "dev-3", "--psk-file", "/nonexistent", "-c", config); code != 1 || !strings.Contains(errOut, "--psk-file") {
		t.Errorf("add with a missing key file: exit %d %s", code, errOut)
	}
	// rotate without a flag rotates the key, of a device that has one
	if _, _, code := fleetgateCLI(t, "pw-1\n", "devices", "add", "dev-pw", "--password-prompt", "-c", config, "--no-reload"); code != 0 {
		t.Fatalf("add with a password: exit %d", code)
	}
	if _, errOut, code := fleetgateCLI(t, "", "devices", "rotate", "dev-pw", "-c", config, "--no-reload"); code != 2 || !strings.Contains(errOut, "has no psk to rotate") {
		t.Errorf("rotate of a password-only device without a flag: exit %d %s, want 2", code, errOut)
	}
	out, _, code = fleetgateCLI(t, "", "devices", "rotate", "dev-1", "-c", config, "--no-reload")
	if code != 0 || !strings.HasPrefix(out, "hex:") {
		t.Errorf("rotate of a keyed device: exit %d %q, want a new key", code, out)
	}
	// rotate --lease alone sets the lease and keeps the key; none removes it
	keyed, _ := os.ReadFile(devicesFile)
	if out, errOut, code := fleetgateCLI(t, "", "devices", "rotate", "dev-1", "--lease", "2h", "-c", config, "--no-reload"); code != 0 || out != "" {
		t.Errorf("rotate --lease 2h: exit %d %q %s, want no key", code, out, errOut)
	}
	leased, _ := os.ReadFile(devicesFile)
	if want := strings.Replace(string(keyed), "\n  - id: \"dev-2\"", "\n    lease: \"2h\"\n  - id: \"dev-2\"", 1); string(leased) != want {
		t.Errorf("after rotate --lease 2h:\n%s\nwant\n%s", leased, want)
	}
	if _, errOut, code := fleetgateCLI(t, "", "devices", "rotate", "dev-1", "--lease", "4h", "-c", config, "--no-reload"); code != 1 || !strings.Contains(errOut, "longer than presence.max_lease") {
		t.Errorf("rotate --lease beyond max_lease: exit %d %s", code, errOut)
	}
	if _, errOut, code := fleetgateCLI(t, "", "devices", "rotate", "dev-1", "--lease", "none", "-c", config, "--no-reload"); code != 0 {
		t.Errorf("rotate --lease none: exit %d %s", code, errOut)
	}
	if now, _ := os.ReadFile(devicesFile); string(now) != string(keyed) {
		t.Errorf("after rotate --lease none:\n%s\nwant\n%s", now, keyed)
	}
	if _, errOut, code := fleetgateCLI(t, "", "devices", "remove", "nobody", "-c", config, "--no-reload"); code != 1 || !strings.Contains(errOut, "not in the devices file") {
		t.Errorf("remove of an unlisted device: exit %d %s", code, errOut)
	}
}
