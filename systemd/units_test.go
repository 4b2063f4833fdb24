package systemd

import (
	"bufio"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

var units = []string{"fleetgate.service", "fleetgate-runner.service"}

// installed copies unit into a directory of its own with /usr/bin/fleetgate
// replaced by the test's build, as systemd-analyze verify checks that
// every command exists.
func installed(t *testing.T, unit string) string {
	t.Helper()
	b, err := os.ReadFile(unit)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), unit)
	if err := os.WriteFile(path, []byte(strings.ReplaceAll(string(b), "/usr/bin/fleetgate", binary)), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

func TestUnitsVerify(t *testing.T) {
	for _, u := range units {
		out, err := run(t, "systemd-analyze", "verify", "--man=no", installed(t, u))
		if err != nil || strings.TrimSpace(out) != "" {
			t.Errorf("systemd-analyze verify %s: %v\n%s", u, err, out)
		}
	}
}

var exposureRE = regexp.MustCompile(`Overall exposure level for \S+: ([0-9.]+)`)

// Both units score at most 1.6 (nats-server's hardened unit: 1.7).
func TestUnitsSecurityExposure(t *testing.T) {
	for _, u := range units {
		out, err := run(t, "systemd-analyze", "security", "--offline=yes", "--threshold=16", u)
		if err != nil {
			t.Errorf("systemd-analyze security --threshold=16 %s: %v\n%s", u, err, out)
			continue
		}
		m := exposureRE.FindStringSubmatch(out)
		if m == nil {
			t.Fatalf("%s: no exposure level in:\n%s", u, out)
		}
		if x, _ := strconv.ParseFloat(m[1], 64); x > 1.6 {
			t.Errorf("%s: exposure %s, want ≤ 1.6\n%s", u, m[1], out)
		}
	}
}

// directives reads a unit's [Service] directives (a key given twice keeps
// every value, in order).
func directives(t *testing.T, unit string) map[string][]string {
	t.Helper()
	f, err := os.Open(unit)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	d := map[string][]string{}
	section := ""
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		l := strings.TrimSpace(sc.Text())
		switch {
		case l == "" || strings.HasPrefix(l, "#"):
		case strings.HasPrefix(l, "["):
			section = l
		default:
			k, v, _ := strings.Cut(l, "=")
			d[section+k] = append(d[section+k], v)
		}
	}
	return d
}

// The directives the issue asks for, as the operator guide describes them.
func TestGatewayUnitDirectives(t *testing.T) {
	d := directives(t, "fleetgate.service")
	want := map[string]string{
		"Type": "notify", "NotifyAccess": "main", "WatchdogSec": "120s",
		"Restart": "on-failure", "RestartPreventExitStatus": "78 65", "KillMode": "mixed",
		"StateDirectory": "fleetgate", "ConfigurationDirectory": "fleetgate", "RuntimeDirectory": "fleetgate",
		"User": "fleetgate", "LimitNOFILE": "524288", "Environment": "GODEBUG=adaptivestackstart=0",
		"ExecStartPre":          "/usr/bin/fleetgate check-config --quiet -c /etc/fleetgate/fleetgate.yaml",
		"ExecStart":             "/usr/bin/fleetgate run -c /etc/fleetgate/fleetgate.yaml",
		"CapabilityBoundingSet": "", "NoNewPrivileges": "yes", "ProtectSystem": "strict",
		"RestrictAddressFamilies": "AF_UNIX AF_INET AF_INET6", "ProtectProc": "invisible",
		"MemoryDenyWriteExecute": "yes", "UMask": "0077",
	}
	for k, v := range want {
		if got := d["[Service]"+k]; len(got) == 0 || got[0] != v {
			t.Errorf("%s=%q, want %q", k, got, v)
		}
	}
	// A reload checks the files first and signals only when they load.
	if got := strings.Join(d["[Service]ExecReload"], "\n"); got != "/usr/bin/fleetgate check-config --quiet -c /etc/fleetgate/fleetgate.yaml\n/bin/kill -HUP $MAINPID" {
		t.Errorf("ExecReload=%q, want check-config --quiet, then kill -HUP", got)
	}
	if got := d["[Service]SystemCallFilter"]; len(got) == 0 || got[0] != "@system-service" {
		t.Errorf("SystemCallFilter=%q, want @system-service first", got)
	}
}

// The runner-only unit speaks sd_notify with a watchdog like the gateway's
// (cmd/fleetgate's TestRunnerSystemdNotify checks the binary's side).
func TestRunnerUnitDirectives(t *testing.T) {
	d := directives(t, "fleetgate-runner.service")
	want := map[string]string{
		"Type": "notify", "NotifyAccess": "main", "WatchdogSec": "120s", "WatchdogSignal": "SIGABRT",
		"Restart": "on-failure", "RestartPreventExitStatus": "78", "KillMode": "mixed", "User": "fleetgate",
		"ExecStart": "/usr/bin/fleetgate runner -c /etc/fleetgate/fleetgate.yaml --metrics 127.0.0.1:9181",
	}
	for k, v := range want {
		if got := d["[Service]"+k]; len(got) == 0 || got[0] != v {
			t.Errorf("%s=%q, want %q", k, got, v)
		}
	}
}

// RestartPreventExitStatus= names the exit code the binary really uses
// for a bad configuration, in ExecStartPre (check-config) and in run:
// a misspelt key, and files the configuration names that do not load (a
// devices file with a duplicate, a certificate that is no PEM).
func TestConfigErrorExitCodeMatchesUnit(t *testing.T) {
	dir := t.TempDir()
	write := func(name, body string) string {
		t.Helper()
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	const dev = "  - id: a\n    psk: \"hex:00112233445566778899aabbccddeeff\"\n"
	good := write("devices.yaml", "devices:\n"+dev)
	dup := write("dup.yaml", "devices:\n"+dev+dev)
	notPEM := write("cert.pem", "not a certificate")
	base := "gateway: { state_dir: " + filepath.Join(dir, "state") + " }\n"
	bad := map[string]string{
		"misspelt key": write("bad.yaml", "presence:\n  leese: 90s\n"),
		"devices file": write("dup-c.yaml", base+"auth: { devices_file: "+dup+" }\n"+
			"listen: { coap: { udp: \"127.0.0.1:0\" }, mqtt: { tcp: \"127.0.0.1:0\" }, admin: { http: \"\" } }\n"),
		"TLS certificate": write("tls-c.yaml", base+"auth: { devices_file: "+good+" }\n"+
			"listen: { coap: { udp: \"127.0.0.1:0\" }, mqtt: { tcp: \"127.0.0.1:0\", tls: \"127.0.0.1:0\", cert_file: "+notPEM+", key_file: "+notPEM+" }, admin: { http: \"\" } }\n"),
	}
	want, _, _ := strings.Cut(directives(t, "fleetgate.service")["[Service]RestartPreventExitStatus"][0], " ")
	for name, cfg := range bad {
		for _, cmd := range []string{"check-config", "run"} {
			out, err := exec.Command(binary, cmd, "-c", cfg).CombinedOutput()
			var ee *exec.ExitError
			if !errors.As(err, &ee) || strconv.Itoa(ee.ExitCode()) != want || name != "misspelt key" && !strings.Contains(string(out), map[string]string{"devices file": dup + ":", "TLS certificate": "listen.mqtt: load certificate"}[name]) {
				t.Errorf("fleetgate %s, %s: %v, want exit %s\n%s", cmd, name, err, want, out)
			}
		}
	}
}

func TestSysusers(t *testing.T) {
	abs, err := filepath.Abs("fleetgate.sysusers")
	if err != nil {
		t.Fatal(err)
	}
	out, err := run(t, "systemd-sysusers", "--dry-run", abs)
	if err != nil || strings.Contains(out, "ignoring") || strings.Contains(out, "Failed") {
		t.Fatalf("systemd-sysusers --dry-run: %v\n%s", err, out)
	}
}

// The maintainer scripts parse, and create the user exactly as the
// sysusers file describes it (they run before that file is unpacked).
func TestMaintainerScripts(t *testing.T) {
	b, err := os.ReadFile("fleetgate.sysusers")
	if err != nil {
		t.Fatal(err)
	}
	var line string
	for _, l := range strings.Split(string(b), "\n") {
		if l != "" && !strings.HasPrefix(l, "#") {
			line = l
		}
	}
	scripts, _ := filepath.Glob("deb/*")
	rpms, _ := filepath.Glob("rpm/*.sh")
	if len(scripts) != 4 || len(rpms) != 4 {
		t.Fatalf("scripts %v %v, want 4 deb and 4 rpm", scripts, rpms)
	}
	for _, s := range append(scripts, rpms...) {
		if out, err := run(t, "sh", "-n", s); err != nil {
			t.Errorf("sh -n %s: %v\n%s", s, err, out)
		}
		text, err := os.ReadFile(s)
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(string(text), "SYSUSER=") && !strings.Contains(string(text), "SYSUSER='"+line+"'") {
			t.Errorf("%s creates the user differently from fleetgate.sysusers (%s)", s, line)
		}
		if strings.Contains(string(text), "systemctl") && !strings.Contains(string(text), "/run/systemd/system") {
			t.Errorf("%s calls systemctl without checking that systemd runs", s)
		}
	}
	for _, s := range []string{"deb/preinst", "rpm/pre.sh"} {
		if text, _ := os.ReadFile(s); !strings.Contains(string(text), "SYSUSER=") {
			t.Errorf("%s does not create the user", s)
		}
	}
}
