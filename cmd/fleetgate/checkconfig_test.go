package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"

	"github.com/fleetgate/fleetgate/configs"
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
