package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/fleetgate/fleetgate/configs"
)

// check-config checks what run checks besides the configuration (the
// devices file, the TLS certificate and key) and fails as run would,
// with exit 78 as for any configuration error; it warns about risky
// settings on stderr and still succeeds.
func TestCheckConfigSecurity(t *testing.T) {
	dir := t.TempDir()
	write := func(name, body string, mode os.FileMode) string {
		t.Helper()
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, []byte(body), mode); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(path, mode); err != nil {
			t.Fatal(err)
		}
		return path
	}
	state := filepath.Join(dir, "state")
	if err := os.Mkdir(state, 0o750); err != nil {
		t.Fatal(err)
	}
	good := write("devices.yaml", "devices:\n  - id: a\n    psk: \"hex:00112233445566778899aabbccddeeff\"\n", 0o600)
	dup := write("dup.yaml", "devices:\n  - id: a\n    psk: \"hex:00112233445566778899aabbccddeeff\"\n  - id: a\n    psk: \"hex:00112233445566778899aabbccddeeff\"\n", 0o600)
	badHex := write("hex.yaml", "devices:\n  - id: a\n    psk: \"hex:zz\"\n", 0o600)
	readable := write("readable.yaml", "devices:\n  - id: a\n    psk: \"hex:00112233445566778899aabbccddeeff\"\n", 0o644)
	notPEM := write("cert.pem", "not a certificate", 0o600)
	token := write("token", "0123456789abcdef0123\n", 0o600)
	short := write("short", "secret\n", 0o600)
	config := func(name, extra string) string {
		return write(name, fmt.Sprintf("gateway: { state_dir: %q }\n%s", state, extra), 0o600)
	}
	cases := []struct {
		name         string
		cfg          string
		code         int
		stderr, warn string
	}{
		{"good", config("good.yaml", fmt.Sprintf("auth: { devices_file: %q }\n", good)), 0, "", ""},
		{"duplicate device", config("dup-c.yaml", fmt.Sprintf("auth: { devices_file: %q }\n", dup)), 78, dup + ":4:", ""},
		{"bad hex", config("hex-c.yaml", fmt.Sprintf("auth: { devices_file: %q }\n", badHex)), 78, badHex + ":3:", ""},
		{"missing devices file", config("missing-c.yaml", "auth: { devices_file: /nonexistent/devices.yaml }\n"), 78, "no such file", ""},
		{"bad certificate", config("tls-c.yaml", fmt.Sprintf("auth: { devices_file: %q }\nlisten: { mqtt: { tls: \"127.0.0.1:0\", cert_file: %q, key_file: %q } }\n", good, notPEM, notPEM)), 78, "listen.mqtt: load certificate", ""},
		{"readable devices file", config("readable-c.yaml", fmt.Sprintf("auth: { devices_file: %q }\n", readable)), 0, "", "is readable by others (mode 0644)"},
		{"admin beyond loopback with a token", config("admin-t.yaml", fmt.Sprintf("auth: { devices_file: %q }\nlisten: { admin: { http: \"0.0.0.0:9180\", token_file: %q } }\n", good, token)), 0, "",
			"listen.admin.http 0.0.0.0:9180 is reachable beyond this host over plain HTTP: the bearer token of listen.admin.token_file travels in clear"},
		{"admin on loopback with a token", config("admin-l.yaml", fmt.Sprintf("auth: { devices_file: %q }\nlisten: { admin: { http: \"127.0.0.1:9180\", token_file: %q } }\n", good, token)), 0, "", ""},
		{"short admin token", config("admin-s.yaml", fmt.Sprintf("auth: { devices_file: %q }\nlisten: { admin: { token_file: %q } }\n", good, short)), 78, "holds a token of 6 bytes; want at least 16", ""},
		{"admin certificate without key", config("admin-k.yaml", fmt.Sprintf("auth: { devices_file: %q }\nlisten: { admin: { cert_file: %q } }\n", good, notPEM)), 78, "listen.admin.cert_file: and listen.admin.key_file must be set together", ""},
		{"admin beyond loopback", config("admin-c.yaml", fmt.Sprintf("auth: { devices_file: %q }\nlisten: { admin: { http: \"0.0.0.0:9180\" } }\n", good)), 78,
			`listen.admin.http: "0.0.0.0:9180" is reachable beyond this host and the admin API would have no authentication (listen.admin.token_file is empty)`, ""},
		{"admin beyond loopback, insecure", config("admin-i.yaml", fmt.Sprintf("auth: { devices_file: %q }\nlisten: { admin: { http: \"0.0.0.0:9180\", insecure: true } }\n", good)), 0, "",
			"listen.admin.http 0.0.0.0:9180 serves the admin API beyond this host without authentication (listen.admin.insecure: true)"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			code, _, errs := runCLI(t, "check-config", "-c", c.cfg)
			if code != c.code || !strings.Contains(errs, c.stderr) || !strings.Contains(errs, c.warn) {
				t.Fatalf("exit %d, want %d; stderr:\n%s\nwant ∋ %q and %q", code, c.code, errs, c.stderr, c.warn)
			}
			if c.warn == "" && strings.Contains(errs, "warning:") {
				t.Fatalf("unexpected warning:\n%s", errs)
			}
		})
	}
	// A state directory others may write.
	if err := os.Chmod(state, 0o777); err != nil {
		t.Fatal(err)
	}
	code, _, errs := runCLI(t, "check-config", "-c", config("state-c.yaml", fmt.Sprintf("auth: { devices_file: %q }\n", good)))
	if code != 0 || !strings.Contains(errs, "gateway.state_dir "+state+" is writable by others (mode 0777)") {
		t.Fatalf("exit %d; stderr:\n%s", code, errs)
	}
}

// The admin API beyond loopback is warned about without a token (only
// listen.admin.insecure lets it start) and with a token over plain HTTP;
// on loopback, or with HTTPS, it is not.
func TestAdminWarnings(t *testing.T) {
	token := configs.AdminListen{TokenFile: "/t"}
	for _, c := range []struct {
		a    configs.AdminListen
		addr string
		want string
	}{
		{configs.AdminListen{}, "", ""},
		{configs.AdminListen{}, "127.0.0.1:9181", ""},
		{configs.AdminListen{}, "localhost:9181", ""},
		{token, "[::1]:9181", ""},
		{configs.AdminListen{Insecure: true}, "0.0.0.0:9181", "runner --metrics 0.0.0.0:9181 serves the admin API beyond this host without authentication (listen.admin.insecure: true): anyone who reaches it reads every device and event"},
		{token, ":9181", "runner --metrics :9181 is reachable beyond this host over plain HTTP: the bearer token of listen.admin.token_file travels in clear; set listen.admin.cert_file and key_file, or bind it to 127.0.0.1"},
		{configs.AdminListen{TokenFile: "/t", CertFile: "/c", KeyFile: "/k"}, "192.0.2.1:9181", ""},
	} {
		got := strings.Join(adminWarnings(c.a, "runner --metrics", c.addr), "\n")
		if got != c.want {
			t.Errorf("%+v at %q: %q, want %q", c.a, c.addr, got, c.want)
		}
	}
}

// The devices file may be read by its owner and by the gateway's group
// (the package ships it root:fleetgate 0640), never by others; the
// advice keeps the gateway able to read it.
func TestDevicesFileWarning(t *testing.T) {
	const gw, other = 996, 50
	name := func(gid int) string { return map[int]string{gw: "fleetgate", other: "staff", 0: "root"}[gid] }
	me := os.Geteuid()
	for _, c := range []struct {
		perm          os.FileMode
		uid, gid, gwg int
		want          string
	}{
		{0o640, 0, gw, gw, ""},  // as the package ships it
		{0o600, me, gw, gw, ""}, // the gateway's user owns it
		{0o440, 0, gw, gw, ""},
		{0o640, 0, other, -1, ""}, // the gateway's group unknown
		{0o644, 0, gw, gw, "auth.devices_file /etc/fleetgate/devices.yaml is readable by others (mode 0644); it holds device keys: chmod o-rwx /etc/fleetgate/devices.yaml"},
		{0o604, 0, gw, -1, "auth.devices_file /etc/fleetgate/devices.yaml is readable by others (mode 0604); it holds device keys: chmod o-rwx /etc/fleetgate/devices.yaml"},
		{0o640, 0, other, gw, "auth.devices_file /etc/fleetgate/devices.yaml is readable by group staff (mode 0640), which is not the gateway's group fleetgate; it holds device keys: chgrp fleetgate /etc/fleetgate/devices.yaml (the package ships it root:fleetgate 0640)"},
	} {
		if got := devicesFileWarning("/etc/fleetgate/devices.yaml", c.perm, c.uid, c.gid, c.gwg, name); got != c.want {
			t.Errorf("mode %04o %d:%d, gateway group %d:\n got %q\nwant %q", c.perm, c.uid, c.gid, c.gwg, got, c.want)
		}
	}
	if me != 0 {
		if got := devicesFileWarning("/d", 0o640, me, other, gw, name); !strings.HasSuffix(got, ", or chmod g-r /d") {
			t.Errorf("a file of the gateway's user: %q, want the chmod g-r advice too", got)
		}
	}
}
