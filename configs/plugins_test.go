package configs_test

import (
	"strings"
	"testing"
	"time"

	"github.com/fleetgate/fleetgate/configs"
)

func TestAdaptersSection(t *testing.T) {
	yml := `plugins:
  dir: /usr/lib/fleetgate/plugins
  adapters:
    - udpline
    - name: lora
      path: /opt/lorawan
      sha256: ` + strings.Repeat("AB", 32) + `
      start_timeout: 3s
      limits: { max_sessions: 10, evidence_per_second: 5 }
      config:
        listen: ":8090"
        secret: hunter2
        nested: { api_key: k, port: 5 }
    - name: plc
      path: sub/modbus
      config: {}
`
	c, err := configs.Parse("x.yaml", []byte(yml), nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	a := c.Plugins.Adapters
	if len(a) != 3 || a[0] != configs.DefaultAdapter("udpline") {
		t.Fatalf("adapters = %+v", a)
	}
	if a[1].StartTimeout.Std() != 3*time.Second || a[1].Limits.MaxSessions != 10 || a[1].Limits.EvidencePerSecond != 5 {
		t.Fatalf("lora = %+v", a[1])
	}
	if got, want := string(a[1].Config.JSON()), `{"listen":":8090","nested":{"api_key":"k","port":5},"secret":"hunter2"}`; got != want {
		t.Fatalf("config JSON = %s, want %s", got, want)
	}
	if got := string(a[2].Config.JSON()); got != "{}" {
		t.Fatalf("empty config JSON = %s", got)
	}
	for i, want := range []string{"/usr/lib/fleetgate/plugins/udpline", "/opt/lorawan", "/usr/lib/fleetgate/plugins/sub/modbus"} {
		if got := c.Plugins.AdapterPath(a[i]); got != want {
			t.Errorf("path %d = %s, want %s", i, got, want)
		}
	}
	out, err := c.Redacted().YAML()
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(out), "hunter2") || strings.Contains(string(out), "api_key: k") || !strings.Contains(string(out), "port: 5") {
		t.Fatalf("redacted output shows a secret or lost a setting:\n%s", out)
	}
	if string(c.Plugins.Adapters[1].Config.JSON()) == "" || !strings.Contains(string(c.Plugins.Adapters[1].Config.JSON()), "hunter2") {
		t.Fatal("Redacted changed the original")
	}
}

func TestAdaptersFromEnvironment(t *testing.T) {
	c, err := configs.Parse("x.yaml", nil, []string{"FLEETGATE_PLUGINS_ADAPTERS=udpline, lorawan"})
	if err != nil {
		t.Fatal(err)
	}
	if len(c.Plugins.Adapters) != 2 || c.Plugins.Adapters[1] != configs.DefaultAdapter("lorawan") {
		t.Fatalf("adapters = %+v", c.Plugins.Adapters)
	}
	bad, _ := configs.Parse("x.yaml", nil, []string{"FLEETGATE_PLUGINS_ADAPTERS=a b"})
	if err := bad.Validate(); err == nil || !strings.Contains(err.Error(), `plugins.adapters[0]: name: "a b"`) {
		t.Fatalf("Validate = %v, want the bad name", err)
	}
}
