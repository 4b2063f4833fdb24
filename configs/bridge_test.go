package configs_test

import (
	"strings"
	"testing"

	"github.com/fleetgate/fleetgate/configs"
)

const hash = "$2a$10$abcdefghijklmnopqrstuu1234567890ABCDEFGHIJKLMNOPQRSTU"

func TestBridgeConfig(t *testing.T) {
	file := `
bridge:
  mqtt:
    url: mqtts://broker.example:8883
    protocol_version: 4
    up: ["devices/+/telemetry/#"]
  queue:
    max_bytes: 1GiB
    memory_bytes: 512KB
auth:
  clients:
    - name: nodered
      password_bcrypt: "` + hash + `"
      read: ["devices/#"]
      write: ["devices/+/cmd/#"]
`
	c, err := configs.Parse("f.yaml", []byte(file), []string{"FLEETGATE_BRIDGE_QUEUE_COMMIT_INTERVAL=0s", "FLEETGATE_BRIDGE_MQTT_TOPIC_PREFIX=site/7"})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	b := c.Bridge
	if !b.MQTT.Enabled() || b.MQTT.ProtocolVersion != 4 || b.Queue.MaxBytes != 1<<30 || b.Queue.MemoryBytes != 512_000 ||
		b.Queue.CommitInterval != 0 || b.MQTT.Prefix("gw") != "site/7" || !b.MQTT.Down {
		t.Fatalf("bridge %+v", b)
	}
	if got := c.UpFilters(); len(got) != 1 || got[0] != "devices/+/telemetry/#" {
		t.Fatalf("up %v", got)
	}
	if len(c.Auth.Clients) != 1 || c.Auth.Clients[0].Name != "nodered" || c.Auth.Clients[0].Write[0] != "devices/+/cmd/#" {
		t.Fatalf("clients %+v", c.Auth.Clients)
	}
	d := configs.Default()
	d.Auth.TopicPrefix = "site"
	if got := d.UpFilters(); len(got) != 1 || got[0] != "site/#" {
		t.Fatalf("default up %v, want the local prefix's subtree", got)
	}
	if d.Bridge.MQTT.Prefix("gw-1") != "fleetgate/gw-1" {
		t.Fatalf("default prefix %q", d.Bridge.MQTT.Prefix("gw-1"))
	}
}

func TestBridgeConfigRefused(t *testing.T) {
	for _, tc := range []struct {
		file string
		env  []string
		want string
	}{
		{"bridge:\n  queue:\n    max_bytes: 256\n", nil, `f.yaml:3:16: bridge.queue.max_bytes: size 256 has no unit (write "256B" for bytes, or use KiB, MiB, GiB)`},
		{"bridge:\n  queue:\n    max_bytes: 2TB\n", nil, `bridge.queue.max_bytes: invalid size "2TB"`},
		{"auth:\n  clients:\n    - name: a\n      pasword_bcrypt: x\n", nil, `f.yaml:4:7: unknown key "pasword_bcrypt" in auth.clients[0]`},
		{"", []string{"FLEETGATE_AUTH_CLIENTS=a"}, "FLEETGATE_AUTH_CLIENTS (auth.clients): a list of entries: set it in the configuration file"},
		{"", []string{"FLEETGATE_BRIDGE_QUEUE_MAX_BYTES=lots"}, `FLEETGATE_BRIDGE_QUEUE_MAX_BYTES (bridge.queue.max_bytes): invalid size "lots"`},
	} {
		_, err := configs.Parse("f.yaml", []byte(tc.file), tc.env)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q %v: error %v, want %q", tc.file, tc.env, err, tc.want)
		}
	}
}

func TestBridgeValidate(t *testing.T) {
	for _, tc := range []struct {
		name   string
		change func(*configs.Config)
		want   string
	}{
		{"url scheme", func(c *configs.Config) { c.Bridge.MQTT.URL = "http://x:1" }, `bridge.mqtt.url: "http://x:1": want mqtt://host:port or mqtts://host:port`},
		{"tls without mqtts", func(c *configs.Config) {
			c.Bridge.MQTT.URL = "mqtt://x:1883"
			c.Bridge.MQTT.TLS.CA = "/ca.pem"
		}, "bridge.mqtt.tls: is set, but bridge.mqtt.url"},
		{"protocol", func(c *configs.Config) { c.Bridge.MQTT.ProtocolVersion = 3 }, "bridge.mqtt.protocol_version: must be 5 (MQTT 5) or 4 (MQTT 3.1.1), got 3"},
		{"prefix wildcard", func(c *configs.Config) { c.Bridge.MQTT.TopicPrefix = "a/+" }, `bridge.mqtt.topic_prefix: "a/+"`},
		{"up filter", func(c *configs.Config) { c.Bridge.MQTT.Up = []string{"devices/#/x"} }, `bridge.mqtt.up[0]: "devices/#/x": not an MQTT topic filter`},
		{"queue small", func(c *configs.Config) { c.Bridge.Queue.MaxBytes = 1000 }, "bridge.queue.max_bytes: must be at least 1MiB, got 1000B"},
		{"commit", func(c *configs.Config) { c.Bridge.Queue.CommitInterval = sec(2) }, "bridge.queue.commit_interval: must be between 0 and 1s, got 2s"},
		{"ttl", func(c *configs.Config) { c.Bridge.Commands.TTL = 0 }, "bridge.commands.ttl: must be between 1s and 168h, got 0s"},
		{"pending", func(c *configs.Config) { c.Bridge.Commands.MaxPendingPerDevice = 0 }, "bridge.commands.max_pending_per_device: must be between 1 and 1024, got 0"},
		{"client password", func(c *configs.Config) {
			c.Auth.Clients = []configs.LocalClient{{Name: "n", PasswordBcrypt: "secret", Read: []string{"#"}}}
		}, "auth.clients[0].password_bcrypt: want a bcrypt hash"},
		{"client twice", func(c *configs.Config) {
			c.Auth.Clients = []configs.LocalClient{{Name: "n", PasswordBcrypt: hash, Read: []string{"#"}}, {Name: "n", PasswordBcrypt: hash, Read: []string{"#"}}}
		}, `auth.clients[1].name: "n" is named twice`},
		{"client no rights", func(c *configs.Config) {
			c.Auth.Clients = []configs.LocalClient{{Name: "n", PasswordBcrypt: hash}}
		}, `auth.clients[0]: "n" may neither read nor write`},
		{"client filter", func(c *configs.Config) {
			c.Auth.Clients = []configs.LocalClient{{Name: "n", PasswordBcrypt: hash, Write: []string{"a+"}}}
		}, `auth.clients[0].write[0]: "a+": not an MQTT topic filter`},
	} {
		c := configs.Default()
		tc.change(&c)
		err := c.Validate()
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want %q", tc.name, err, tc.want)
		}
	}
}

func TestByteSizeRoundTrip(t *testing.T) {
	for _, s := range []string{"0B", "1B", "1023B", "1KiB", "256MiB", "3GiB", "1536KiB"} {
		var b configs.ByteSize
		if err := b.UnmarshalText([]byte(s)); err != nil || b.String() != s {
			t.Errorf("%s: %v %v", s, b, err)
		}
	}
}
