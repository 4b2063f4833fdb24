package configs_test

import (
	"os"
	"reflect"
	"strings"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/fleetgate/fleetgate/configs"
)

// The shipped file holds exactly the defaults; its empty gateway.id means
// the host name, which is what Default() uses too.
func TestShippedFileIsDefault(t *testing.T) {
	c, err := configs.Load("fleetgate.yaml", nil)
	if err != nil {
		t.Fatal(err)
	}
	if want := configs.Default(); !reflect.DeepEqual(c, want) {
		t.Fatalf("fleetgate.yaml parses to\n%+v\nwant Default()\n%+v", c, want)
	}
}

func TestDevFileValidates(t *testing.T) {
	c, err := configs.Load("dev.yaml", nil)
	if err != nil {
		t.Fatal(err)
	}
	if !c.Auth.AllowAnonymous || c.Store.Backend != configs.BackendEmbedded || !c.Runner.Enabled || c.Gateway.StateDir != ".run" {
		t.Fatalf("dev.yaml: %+v", c)
	}
	for _, addr := range []string{c.Listen.CoAP.UDP, c.Listen.MQTT.TCP, c.Listen.Admin.HTTP} {
		if len(addr) < 10 || addr[:10] != "127.0.0.1:" {
			t.Errorf("dev.yaml listens on %q, want loopback only", addr)
		}
	}
}

// Every key of the shipped file is present, with a comment, in the order
// of Config.
func TestShippedFileDocumentsEveryKey(t *testing.T) {
	data, err := os.ReadFile("fleetgate.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var doc yaml.Node
	if err := yaml.Unmarshal(data, &doc); err != nil {
		t.Fatal(err)
	}
	var found []string
	var walk func(n *yaml.Node, path string)
	walk = func(n *yaml.Node, path string) {
		for i := 0; i+1 < len(n.Content); i += 2 {
			k, v := n.Content[i], n.Content[i+1]
			p := k.Value
			if path != "" {
				p = path + "." + k.Value
			}
			if v.Kind == yaml.MappingNode {
				walk(v, p)
				continue
			}
			found = append(found, p)
			if strings.TrimSpace(k.HeadComment+k.LineComment) == "" {
				t.Errorf("fleetgate.yaml:%d: %s has no comment", k.Line, p)
			}
		}
	}
	walk(doc.Content[0], "")
	if want := configs.Keys(); !reflect.DeepEqual(found, want) {
		t.Errorf("fleetgate.yaml keys\n%v\nwant\n%v", found, want)
	}
}

// YAML renders what Parse reads back unchanged.
func TestYAMLRoundTrip(t *testing.T) {
	dev, err := configs.Load("dev.yaml", nil)
	if err != nil {
		t.Fatal(err)
	}
	odd := configs.Default()
	odd.Presence.Lease = configs.Duration(90*time.Second + 500*time.Millisecond)
	odd.Runner.Interval = configs.Duration(1500 * time.Millisecond)
	odd.Uplink.FlushInterval = configs.Duration(2*time.Hour + time.Second)
	odd.Store.Redis.Password = "p: #'\"\n x"
	lora := configs.DefaultAdapter("lora")
	lora.Config = `{"listen":"127.0.0.1:8080","prefix":"lw-","secret":"s: #'x","timeouts":[1,2.5]}`
	zigbee := configs.DefaultAdapter("zigbee")
	zigbee.Path = "/opt/x y/zigbee"
	zigbee.SHA256 = strings.Repeat("ab", 32)
	zigbee.Limits = configs.AdapterLimits{MaxSessions: 10, EvidencePerSecond: 5}
	odd.Plugins.Adapters = []configs.AdapterConfig{lora, zigbee}
	odd.Gateway.ID = "0123"
	for _, c := range []configs.Config{configs.Default(), dev, odd} {
		out, err := c.YAML()
		if err != nil {
			t.Fatal(err)
		}
		back, err := configs.Parse("out.yaml", out, nil)
		if err != nil {
			t.Fatalf("%v\n%s", err, out)
		}
		if !reflect.DeepEqual(back, c) {
			t.Errorf("round trip of\n%s\ngave %+v\nwant %+v", out, back, c)
		}
	}
}

func TestYAMLOfDefaults(t *testing.T) {
	c := configs.Default()
	c.Gateway.ID = "site-a-1"
	out, err := c.YAML()
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range []string{
		"gateway:\n  id: site-a-1\n",
		"  lease: 90s\n",
		"  suspect_after: 45s\n",
		"    addrs:\n      - 127.0.0.1:6379\n",
		"  lock_ttl: 5s\n",
		"  adapters: []\n",
	} {
		if !strings.Contains(string(out), line) {
			t.Errorf("YAML() lacks %q:\n%s", line, out)
		}
	}
}

func TestRedacted(t *testing.T) {
	c := configs.Default()
	if r := c.Redacted(); r.Store.Redis.Password != "" {
		t.Fatalf("empty password shown as %q", r.Store.Redis.Password)
	}
	c.Store.Redis.Password = "hunter2"
	r := c.Redacted()
	out, err := r.YAML()
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(out), "hunter2") || !strings.Contains(string(out), "password: <redacted>") {
		t.Fatalf("redacted YAML:\n%s", out)
	}
	r.Store.Redis.Addrs[0] = "changed:1"
	if c.Store.Redis.Password != "hunter2" || c.Store.Redis.Addrs[0] != "127.0.0.1:6379" {
		t.Fatalf("Redacted changed the original: %+v", c.Store.Redis)
	}
}
