package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/fleetgate/fleetgate/internal/redistest"
)

func runCLI(t *testing.T, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var out, errb bytes.Buffer
	code = dispatch(context.Background(), args, &out, &errb)
	return code, out.String(), errb.String()
}

func TestCLIExitCodes(t *testing.T) {
	repo := filepath.Join("..", "..", "configs")
	bad := filepath.Join(t.TempDir(), "bad.yaml")
	if err := os.WriteFile(bad, []byte("presence:\n  leese: 90s\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	adapters := filepath.Join(t.TempDir(), "adapters.yaml")
	if err := os.WriteFile(adapters, []byte("store: { backend: embedded }\nauth: { allow_anonymous: true }\nplugins: { adapters: [{ name: \"lo ra\" }] }\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	flap := filepath.Join(t.TempDir(), "flap.yaml")
	if err := os.WriteFile(flap, []byte("presence: { lease: 30s, heartbeat_interval: 30s }\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name   string
		args   []string
		code   int
		stdout string // substring
		stderr string // substring
	}{
		{"no command", nil, 2, "", "usage: fleetgate <command>"},
		{"unknown command", []string{"frobnicate"}, 2, "", `unknown command "frobnicate"`},
		{"help", []string{"--help"}, 0, "check-config", ""},
		{"help word", []string{"help"}, 0, "check-config", ""},
		{"help of a command", []string{"help", "devices", "list"}, 0, "--state", ""},
		{"version", []string{"version"}, 0, "fleetgate ", ""},
		{"--version", []string{"--version"}, 0, "fleetgate ", ""},
		{"version json", []string{"version", "--json"}, 0, `"go": "go1.`, ""},
		{"command help", []string{"run", "--help"}, 0, "  -c, --config FILE\n", ""},
		{"subcommand help", []string{"devices", "--help"}, 0, "devices list", ""},
		{"bad flag", []string{"status", "--nope"}, 2, "", "fleetgate status: usage: flag provided but not defined: -nope\nRun 'fleetgate status --help' for its usage.\n"},
		{"no config for hash-password", []string{"hash-password", "-c", "x.yaml"}, 2, "", "flag provided but not defined: -c"},
		{"no config for simulate", []string{"simulate", "--config", "x.yaml"}, 2, "", "flag provided but not defined: -config"},
		{"state checked locally", []string{"devices", "list", "--addr", "127.0.0.1:1", "--state", "onlin"}, 2, "", `--state "onlin": want online, suspect or offline`},
		{"order checked locally", []string{"devices", "list", "--addr", "127.0.0.1:1", "--order", "name"}, 2, "", `--order "name": want id or changed`},
		{"prefix by ID only", []string{"devices", "list", "--addr", "127.0.0.1:1", "--order", "changed", "--prefix", "a"}, 2, "", "--prefix lists by ID, not with --order changed"},
		// The shipped file names /etc/fleetgate/devices.yaml, which run
		// would load: check-config fails as run would without it.
		{"shipped config", []string{"check-config", "-c", filepath.Join(repo, "fleetgate.yaml")}, exitConfig, "", "devices file: open /etc/fleetgate/devices.yaml"},
		{"dev config", []string{"check-config", "-c", filepath.Join(repo, "dev.yaml")}, 0, "allow_anonymous: true", ""},
		{"missing file", []string{"check-config", "-c", "/nonexistent/fleetgate.yaml"}, exitConfig, "", "no such file"},
		{"misspelt key", []string{"check-config", "-c", bad}, exitConfig, "", bad + ":2:3"},
		{"flapping timings", []string{"check-config", "-c", flap}, exitConfig, "", "would flap"},
		{"devices without verb", []string{"devices"}, 2, "", "devices get ID"},
		{"events without verb", []string{"events"}, 2, "", "events tail"},
		{"runner on embedded", []string{"runner", "-c", filepath.Join(repo, "dev.yaml")}, exitConfig, "", "redis store only"},
		{"bad adapter", []string{"check-config", "-c", adapters}, 78, "", adapters + ":3:23: plugins.adapters[0]: name: \"lo ra\""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			code, out, errs := runCLI(t, c.args...)
			if code != c.code || !strings.Contains(out, c.stdout) || !strings.Contains(errs, c.stderr) {
				t.Fatalf("fleetgate %v: exit %d, want %d\nstdout:\n%s\nstderr:\n%s\nwant stdout ∋ %q, stderr ∋ %q",
					c.args, code, c.code, out, errs, c.stdout, c.stderr)
			}
		})
	}
}

func TestCheckConfigRedactsSecrets(t *testing.T) {
	path := filepath.Join(t.TempDir(), "f.yaml")
	if err := os.WriteFile(path, []byte("store:\n  backend: redis\n  redis: { addrs: [\"127.0.0.1:1\"], password: hunter2 }\nauth: { devices_file: \"\", allow_anonymous: true }\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	code, out, errs := runCLI(t, "check-config", "-c", path)
	if code != 0 || strings.Contains(out, "hunter2") || !strings.Contains(out, "redacted") {
		t.Fatalf("exit %d, stderr %s; the password must be redacted:\n%s", code, errs, out)
	}
}

// The query commands read the running gateway's admin API, and SIGHUP
// keeps the running configuration when the new file is invalid.
func TestQueryCommandsAndReload(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	gw := newGateway(t, "gw-q", srv.Addr, fastTiming)
	gw.start()
	device{t: t, id: "dev-q"}.heartbeat(gw.coapAddr)
	waitFor(t, 10*time.Second, "device online through the API", func() bool {
		code, out, _ := runCLI(t, "devices", "get", "--addr", gw.admin, "--json", "dev-q")
		return code == 0 && strings.Contains(out, `"state": "online"`)
	})

	resp, err := http.Get("http://" + gw.admin + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	metrics, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, m := range []string{"fleetgate_sessions 1", `fleetgate_evidence_total{kind="renew",protocol="coap"}`, "fleetgate_renewals_written_total",
		"fleetgate_flushes_total", "fleetgate_flush_duration_seconds", "fleetgate_outbox_sessions", "fleetgate_outbox_oldest_age_seconds",
		"fleetgate_uplink_up 1", "fleetgate_runner_reaped_total", "fleetgate_runner_reap_lag_seconds"} {
		if !strings.Contains(string(metrics), m) {
			t.Errorf("/metrics has no %s", m)
		}
	}

	code, out, errs := runCLI(t, "status", "--addr", gw.admin, "--json")
	var st map[string]any
	if code != 0 || json.Unmarshal([]byte(out), &st) != nil || st["gateway"] != "gw-q" || st["store"] != "redis" {
		t.Fatalf("status: exit %d %s\n%s", code, errs, out)
	}
	code, out, _ = runCLI(t, "devices", "list", "--addr", gw.admin, "--state", "online")
	if code != 0 || !strings.Contains(out, "dev-q") || !strings.Contains(out, "1 device: 1 online, 0 suspect, 0 offline") {
		t.Fatalf("devices list: exit %d\n%s", code, out)
	}
	code, out, _ = runCLI(t, "devices", "list", "--all", "--limit", "1", "--addr", gw.admin)
	if code != 0 || !strings.Contains(out, "dev-q") || !strings.HasSuffix(out, "1 device: 1 online, 0 suspect, 0 offline\n") {
		t.Fatalf("devices list --all: exit %d\n%s", code, out)
	}
	for _, args := range [][]string{{"--prefix", "dev-"}, {"--order", "changed", "--protocol", "coap"}} {
		code, out, _ = runCLI(t, append([]string{"devices", "list", "--addr", gw.admin}, args...)...)
		if code != 0 || !strings.Contains(out, "dev-q") || !strings.HasSuffix(out, "1 device: 1 online, 0 suspect, 0 offline\n") {
			t.Fatalf("devices list %v: exit %d\n%s", args, code, out)
		}
	}
	for _, args := range [][]string{{"--prefix", "xyz"}, {"--protocol", "mqtt"}} {
		code, out, _ = runCLI(t, append([]string{"devices", "list", "--addr", gw.admin}, args...)...)
		if code != 0 || strings.Contains(out, "dev-q") || !strings.HasSuffix(out, "0 devices: 0 online, 0 suspect, 0 offline\n") {
			t.Fatalf("devices list %v: exit %d\n%s", args, code, out)
		}
	}
	code, out, _ = runCLI(t, "events", "tail", "--addr", gw.admin, "--json", "--since", "1m")
	if code != 0 || !strings.Contains(out, `"device":"dev-q"`) || !strings.Contains(out, `"reason":"connect"`) {
		t.Fatalf("events tail: exit %d\n%s", code, out)
	}
	code, out, errs = runCLI(t, "devices", "get", "no-such-device", "--addr", gw.admin)
	if code != 1 || out != "" || errs != "fleetgate devices get: device no-such-device: not found\n" {
		t.Fatalf("devices get unknown: exit %d, stdout %q, stderr %q", code, out, errs)
	}
	code, out, _ = runCLI(t, "devices", "get", "dev-q", "--addr", gw.admin)
	if code != 0 || !strings.Contains(out, "state") || !strings.Contains(out, " ago)") {
		t.Fatalf("devices get: exit %d\n%s", code, out)
	}
	code, out, _ = runCLI(t, "status", "--addr", gw.admin)
	if code != 0 || !strings.Contains(out, "gateway     gw-q") || strings.Contains(out, "e+") || strings.Contains(out, "map[") {
		t.Fatalf("status: exit %d\n%s", code, out)
	}
	code, _, errs = runCLI(t, "devices", "get", "--addr", gw.admin, "bad id")
	if code != 1 || !strings.Contains(errs, "fleetgate devices get: invalid device id: byte 3") {
		t.Fatalf("devices get bad id: exit %d %s", code, errs)
	}

	// An invalid file at SIGHUP is refused and the gateway keeps serving.
	good, err := os.ReadFile(gw.config)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(gw.config, []byte("presence: { lease: nope }\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	gw.signal(syscall.SIGHUP)
	waitFor(t, 10*time.Second, "reload refused in the log", func() bool { return strings.Contains(gw.logs(), "reload refused") })
	device{t: t, id: "dev-q"}.heartbeat(gw.coapAddr)
	// A valid file with a new heartbeat interval applies at once.
	newer := strings.NewReplacer("heartbeat_interval: 1s", "heartbeat_interval: 2s",
		"lease: 4s", "lease: 8s", "suspect_after: 2s", "suspect_after: 4s").Replace(string(good))
	if err := os.WriteFile(gw.config, []byte(newer), 0o600); err != nil {
		t.Fatal(err)
	}
	gw.signal(syscall.SIGHUP)
	waitFor(t, 10*time.Second, "reload applied", func() bool { return strings.Contains(gw.logs(), "configuration reloaded") })
	if got := maxAge(t, gw.coapAddr, "dev-q"); got != 2 {
		t.Fatalf("Max-Age after reload = %d, want 2", got)
	}
	gw.stop()
}

// SIGTERM sends no leave for live sessions: the device stays online in the
// store after the gateway stopped, and expires by its lease.
func TestSIGTERMSendsNoLeave(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	rc := srv.Client(t)
	gw := newGateway(t, "gw-t", srv.Addr, fastTiming)
	gw.start()
	device{t: t, id: "dev-t"}.heartbeat(gw.coapAddr)
	waitFor(t, 10*time.Second, "online", func() bool { return len(eventsOf(events(t, rc, 4), "dev-t")) == 1 })
	gw.stop()
	if !strings.Contains(gw.logs(), "stopped") {
		t.Fatalf("no clean stop in the log:\n%s", gw.logs())
	}
	n, err := rc.ZCard(context.Background(), shardKey("dev-t", 4, "exp")).Result()
	if err != nil || n != 1 {
		t.Fatalf("after SIGTERM the device's entry is gone (zcard %d, %v): a leave was sent", n, err)
	}
	if evs := eventsOf(events(t, rc, 4), "dev-t"); len(evs) != 1 {
		t.Fatalf("events after SIGTERM %+v, want only the online", evs)
	}
}

// The binary itself runs, prints its version, and exits 2 on usage errors.
func TestBinaryExitCodes(t *testing.T) {
	out, err := exec.Command(binary, "version").CombinedOutput()
	if err != nil || !strings.HasPrefix(string(out), "fleetgate ") {
		t.Fatalf("version: %v %s", err, out)
	}
	err = exec.Command(binary, "bogus").Run()
	if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 2 {
		t.Fatalf("bogus command: %v, want exit 2", err)
	}
}
