package configs_test

import (
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/fleetgate/fleetgate/configs"
)

// parseValid parses yml and validates it.
func parseValid(t *testing.T, yml string) configs.Config {
	t.Helper()
	c, err := configs.Parse("x.yaml", []byte(yml), nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	return c
}

func TestAdaptersSection(t *testing.T) {
	yml := `presence:
  max_lease: 3h
plugins:
  dir: /usr/lib/fleetgate/plugins
  adapters:
    - udpline
    - name: lora
      path: /opt/lorawan
      sha256: ` + strings.Repeat("AB", 32) + `
      start_timeout: 3s
      lease: 2h
      limits: { max_sessions: 10, evidence_per_second: 5 }
      config:
        listen: ":8090"
        secret: hunter2
        nested: { api_key: k, port: 5 }
    - name: plc
      path: sub/modbus
      config: {}
`
	c := parseValid(t, yml)
	a := c.Plugins.Adapters
	if len(a) != 3 || !reflect.DeepEqual(a[0], configs.DefaultAdapter("udpline")) {
		t.Fatalf("adapters = %+v", a)
	}
	if a[1].StartTimeout.Std() != 3*time.Second || a[1].Lease.Std() != 2*time.Hour || a[1].Limits.MaxSessions != 10 || a[1].Limits.EvidencePerSecond != 5 ||
		a[1].Limits.MaxDevices != configs.DefaultAdapterMaxDevices {
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
	if len(c.Plugins.Adapters) != 2 || !reflect.DeepEqual(c.Plugins.Adapters[1], configs.DefaultAdapter("lorawan")) {
		t.Fatalf("adapters = %+v", c.Plugins.Adapters)
	}
	bad, _ := configs.Parse("x.yaml", nil, []string{"FLEETGATE_PLUGINS_ADAPTERS=a b"})
	if err := bad.Validate(); err == nil || !strings.Contains(err.Error(), `plugins.adapters[0]: name: "a b"`) {
		t.Fatalf("Validate = %v, want the bad name", err)
	}
}

// An adapter speaks for "<name>-*" unless it names its devices; its limits
// are on by default.
func TestAdapterDevicesAndLimitsDefaults(t *testing.T) {
	yml := `plugins:
  dir: /p
  adapters:
    - udpline
    - name: lora
      devices: [lw-*, press-1]
      limits: { max_devices: 0, max_address_space: 4294967296, max_open_files: 256 }
`
	a := parseValid(t, yml).Plugins.Adapters
	if got := a[0].Devices; !reflect.DeepEqual(got, []string{"udpline-*"}) {
		t.Errorf("udpline devices = %q, want [udpline-*]", got)
	}
	if got := a[1].Devices; !reflect.DeepEqual(got, []string{"lw-*", "press-1"}) {
		t.Errorf("lora devices = %q", got)
	}
	want := configs.AdapterLimits{MaxSessions: 2000, MaxDevices: 1000, EvidencePerSecond: 200, DataBytesPerSecond: 1 << 20}
	if a[0].Limits != want {
		t.Errorf("default limits = %+v, want %+v", a[0].Limits, want)
	}
	want.MaxDevices, want.MaxAddressSpace, want.MaxOpenFiles = 0, 4<<30, 256
	if a[1].Limits != want {
		t.Errorf("lora limits = %+v, want %+v", a[1].Limits, want)
	}
	env, err := configs.Parse("x.yaml", nil, []string{"FLEETGATE_PLUGINS_ADAPTERS=legacy"})
	if err != nil {
		t.Fatal(err)
	}
	if got := env.Plugins.Adapters[0].Devices; !reflect.DeepEqual(got, []string{"legacy-*"}) {
		t.Errorf("devices of an adapter from the environment = %q, want [legacy-*]", got)
	}
}

// Bad devices entries, overlapping namespaces and the front ends' names
// are refused with the file's line.
func TestAdapterDevicesProblems(t *testing.T) {
	for _, tc := range []struct {
		name, yml, want string
	}{
		{"empty list", "    - name: a\n      devices: []\n",
			`x.yaml:3:7: plugins.adapters[0]: devices: must name at least one device ID or prefix ("*": every device not in the devices file)`},
		{"bad entry", "    - name: a\n      devices: [ok, 'a*b', 'bad id*']\n",
			`plugins.adapters[0]: devices[1]: "a*b" must be a device ID, a device ID prefix followed by "*", or "*"`},
		{"bad prefix", "    - name: a\n      devices: ['bad id*']\n",
			`plugins.adapters[0]: devices[0]: "bad id*" must be a device ID, a device ID prefix followed by "*", or "*"`},
		{"coap", "    - coap\n", `x.yaml:3:7: plugins.adapters[0]: name: "coap" is the coap front end's: its sessions would be coap's sessions`},
		{"MQTT", "    - MQTT\n", `plugins.adapters[0]: name: "MQTT" is the mqtt front end's`},
		{"default prefixes overlap", "    - a\n    - a-b\n",
			`x.yaml:4:7: plugins.adapters[1]: devices: "a-b-*" overlaps "a-*" of adapter "a": no two adapters may speak for one device (line 3)`},
		{"id in a prefix", "    - name: a\n      devices: ['*']\n    - name: b\n      devices: [alpha]\n",
			`plugins.adapters[1]: devices: "alpha" overlaps "*" of adapter "a"`},
		{"same id", "    - name: a\n      devices: [alpha]\n    - name: b\n      devices: [beta, alpha]\n",
			`plugins.adapters[1]: devices: "alpha" overlaps "alpha" of adapter "a"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := configs.Parse("x.yaml", []byte("plugins:\n  adapters:\n"+tc.yml), nil)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v\nwant %s", err, tc.want)
			}
		})
	}
	// The same checks on a configuration built without a file, and the
	// gateway's own ID, whose MQTT sessions are "<gateway.id>/mqtt".
	c := configs.Default()
	c.Gateway.ID = "gw1"
	c.Plugins.Adapters = []configs.AdapterConfig{configs.DefaultAdapter("gw1"), configs.DefaultAdapter("x"), configs.DefaultAdapter("x"), configs.DefaultAdapter("x-y"), configs.DefaultAdapter("y")}
	c.Plugins.Adapters[4].Devices = nil
	err := c.Validate()
	for _, want := range []string{
		`plugins.adapters[0]: name: "gw1" is gateway.id: its sessions "gw1/<instance>" would be the MQTT front end's ("gw1/mqtt")`,
		`plugins.adapters[4]: devices: must name at least one device ID or prefix`,
		`plugins.adapters[2]: adapter name "x" is listed twice`,
		`plugins.adapters[3]: devices: "x-y-*" overlaps "x-*" of adapter "x": no two adapters may speak for one device (plugins.adapters[2])`,
	} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Validate = %v\nwant %s", err, want)
		}
	}
}
