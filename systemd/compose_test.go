package systemd

import (
	"os"
	"os/exec"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"
)

// container/compose.yaml's gateway: the image's configuration with the
// image's and the example's FLEETGATE_* variables passes check-config, and
// the example wires the gateway to its Redis and its upstream broker.
func TestComposeExample(t *testing.T) {
	b, err := os.ReadFile("../container/compose.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var compose struct {
		Services map[string]struct {
			Image       string
			Environment map[string]string
			Ports       []string
			Volumes     []string
		}
	}
	if err := yaml.Unmarshal(b, &compose); err != nil {
		t.Fatal(err)
	}
	gw, ok := compose.Services["fleetgate"]
	if !ok || compose.Services["redis"].Image == "" || compose.Services["upstream"].Image == "" {
		t.Fatalf("services %v: want fleetgate, redis and upstream", compose.Services)
	}
	for k, want := range map[string]string{"FLEETGATE_STORE_REDIS_ADDRS": "redis:6379", "FLEETGATE_EVENTS_MQTT_URL": "mqtt://upstream:1883",
		"FLEETGATE_BRIDGE_MQTT_URL": "mqtt://upstream:1883", "FLEETGATE_STORE_BACKEND": "redis"} {
		if gw.Environment[k] != want {
			t.Errorf("%s=%q, want %q", k, gw.Environment[k], want)
		}
	}
	if !strings.Contains(strings.Join(gw.Volumes, " "), ":/var/lib/fleetgate") {
		t.Errorf("the state volume is not mounted: %v", gw.Volumes)
	}
	// The image's ENV lines (container/Containerfile), then the example's.
	cf, err := os.ReadFile("../container/Containerfile")
	if err != nil {
		t.Fatal(err)
	}
	env := append(os.Environ(), "FLEETGATE_AUTH_DEVICES_FILE=../systemd/etc/devices.yaml")
	for _, l := range strings.Split(string(cf), "\n") {
		if strings.HasPrefix(strings.TrimSpace(l), "#") {
			continue
		}
		for _, f := range strings.Fields(strings.TrimPrefix(strings.TrimSpace(l), "ENV ")) {
			if strings.HasPrefix(f, "FLEETGATE_") {
				env = append(env, f)
			}
		}
	}
	for k, v := range gw.Environment {
		env = append(env, k+"="+v)
	}
	cmd := exec.Command(binary, "check-config", "-c", "../configs/fleetgate.yaml")
	cmd.Env = env
	out, err := cmd.CombinedOutput()
	if err != nil || !strings.Contains(string(out), "worst-case detection") {
		t.Fatalf("check-config with the example's environment: %v\n%s", err, out)
	}
}
