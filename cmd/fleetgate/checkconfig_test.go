package main

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"

	"github.com/fleetgate/fleetgate/configs"
	"github.com/fleetgate/fleetgate/internal/redistest"
)

// check-config runs before both units start (ExecStartPre), so what it
// prints lands in the journal: with every secret set, in the file, in
// the environment or in a _file, and an adapter's secret, no secret
// value appears in its output.
func TestCheckConfigPrintsNoSecret(t *testing.T) {
	dir := t.TempDir()
	state := filepath.Join(dir, "state")
	if err := os.Mkdir(state, 0o750); err != nil {
		t.Fatal(err)
	}
	write := func(name, body string) string {
		t.Helper()
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	secrets := configs.SecretKeys()
	value := func(how, key string) string { return "secret-" + how + "-of-" + key }
	for _, how := range []string{"file", "environment", "secret-file"} {
		t.Run(how, func(t *testing.T) {
			cfg := tree{}
			cfg.set("gateway.state_dir", state)
			cfg.set("auth.allow_anonymous", true)
			cfg.set("auth.devices_file", "")
			cfg.set("events.mqtt.url", "mqtt://127.0.0.1:1883")
			var values []string
			for _, key := range secrets {
				v := value(how, key)
				values = append(values, v)
				switch how {
				case "file":
					cfg.set(key, v)
				case "environment":
					t.Setenv(configs.EnvName(key), v)
				case "secret-file":
					cfg.set(key+configs.FileSuffix, write(how+"-"+key, v+"\n"))
				}
			}
			lora := "lora-" + how
			values = append(values, lora)
			settings := tree{"secret": lora}
			if how == "secret-file" {
				settings = tree{"secret" + configs.FileSuffix: write("lora", lora+"\n")}
			}
			cfg.set("plugins.adapters", []tree{{"name": "lora", "config": settings}})
			body, err := yaml.Marshal(cfg)
			if err != nil {
				t.Fatal(err)
			}
			code, out, errs := runCLI(t, "check-config", "-c", write(how+".yaml", string(body)))
			if code != 0 {
				t.Fatalf("exit %d:\n%s", code, errs)
			}
			for _, v := range values {
				if strings.Contains(out+errs, v) {
					t.Errorf("check-config prints %q:\n%s%s", v, out, errs)
				}
			}
			if !strings.Contains(out, "<redacted>") {
				t.Errorf("no <redacted> in:\n%s", out)
			}
		})
	}
}

// tree is a configuration file built key by key.
type tree map[string]any

// set sets the key at the dotted path.
func (m tree) set(path string, v any) {
	first, rest, ok := strings.Cut(path, ".")
	if !ok {
		m[first] = v
		return
	}
	sub, _ := m[first].(tree)
	if sub == nil {
		sub = tree{}
		m[first] = sub
	}
	sub.set(rest, v)
}

// check-config --quiet prints one line (the units run it at every start
// and reload, into the journal); --ports binds every listener for a
// moment and names each one another program holds, with its key.
func TestCheckConfigQuietAndPorts(t *testing.T) {
	dir := t.TempDir()
	held, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer held.Close()
	heldUDP, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer heldUDP.Close()
	devices := filepath.Join(dir, "devices.yaml")
	if err := os.WriteFile(devices, []byte("devices:\n  - id: a\n    psk: \"hex:00112233445566778899aabbccddeeff\"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	config := func(name, coap, mqtt string) string {
		p := filepath.Join(dir, name)
		body := fmt.Sprintf("gateway: { id: gw-1, state_dir: %q }\nauth: { devices_file: %q }\nlisten: { coap: { udp: %q }, mqtt: { tcp: %q }, admin: { http: \"\" } }\n",
			filepath.Join(dir, "state"), devices, coap, mqtt)
		if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	free := config("free.yaml", fmt.Sprintf("127.0.0.1:%d", freeUDPPort(t)), fmt.Sprintf("127.0.0.1:%d", redistest.FreePort(t)))
	code, out, errs := runCLI(t, "check-config", "--quiet", "--ports", "-c", free)
	want := "configuration " + free + " is valid: gateway gw-1, embedded store, 16 shards; coap 127.0.0.1:"
	if code != 0 || strings.Count(out, "\n") != 1 || !strings.HasPrefix(out, want) ||
		!strings.Contains(out, "(loopback only: ") || !strings.Contains(out, "; 1 devices in "+devices+"; admin API off; offline reported within 94s") {
		t.Fatalf("exit %d, stdout %q, stderr %q; want one line starting %q", code, out, errs, want)
	}
	busy := config("busy.yaml", heldUDP.LocalAddr().String(), held.Addr().String())
	code, _, errs = runCLI(t, "check-config", "--ports", "-c", busy)
	for _, w := range []string{
		"listen.coap.udp " + heldUDP.LocalAddr().String() + " cannot be bound (address already in use): another program holds the port; set listen.coap.udp",
		"listen.mqtt.tcp " + held.Addr().String() + " cannot be bound (address already in use): another program holds the port; set listen.mqtt.tcp",
	} {
		if code != 1 || !strings.Contains(errs, w) {
			t.Errorf("exit %d, want 1; stderr:\n%s\nwant ∋ %q", code, errs, w)
		}
	}
	// Without --ports the ports are not looked at (the gateway itself
	// holds them at a reload).
	if code, _, errs := runCLI(t, "check-config", "--quiet", "-c", busy); code != 0 {
		t.Errorf("without --ports: exit %d\n%s", code, errs)
	}
}
