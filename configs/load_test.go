package configs_test

import (
	"flag"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/fleetgate/fleetgate/configs"
)

var update = flag.Bool("update", false, "rewrite testdata/bad/*.err from the current errors")

// Every file in testdata/bad fails to load with exactly the text of the
// .err file next to it.
func TestBadConfigs(t *testing.T) {
	files, err := filepath.Glob("testdata/bad/*.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if len(files) < 20 {
		t.Fatalf("found %d bad configs, want at least 20", len(files))
	}
	for _, f := range files {
		t.Run(strings.TrimSuffix(filepath.Base(f), ".yaml"), func(t *testing.T) {
			_, err := configs.Load(f, nil)
			if err == nil {
				t.Fatalf("%s loaded without error", f)
			}
			golden := strings.TrimSuffix(f, ".yaml") + ".err"
			if *update {
				if err := os.WriteFile(golden, []byte(err.Error()+"\n"), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			want, rerr := os.ReadFile(golden)
			if rerr != nil {
				t.Fatal(rerr)
			}
			if got := err.Error() + "\n"; got != string(want) {
				t.Errorf("error:\n%s\nwant (%s):\n%s", got, golden, want)
			}
		})
	}
}

func TestParseLayers(t *testing.T) {
	yml := "presence:\n  lease: 2m\n  shards: 32\nstore:\n  backend: redis\n"
	c, err := configs.Parse("x.yaml", []byte(yml), []string{
		"PATH=/bin", // not ours: ignored
		"FLEETGATE_PRESENCE_SHARDS=64",
	})
	if err != nil {
		t.Fatal(err)
	}
	want := configs.Default()
	want.Presence.Lease = configs.Duration(2 * time.Minute) // from the file
	want.Presence.Shards = 64                               // the environment wins over the file
	want.Store.Backend = configs.BackendRedis
	if !reflect.DeepEqual(c, want) {
		t.Fatalf("got\n%+v\nwant\n%+v", c, want)
	}
}

func TestParseEmptyAndSparse(t *testing.T) {
	for name, yml := range map[string]string{
		"empty":          "",
		"comments only":  "# nothing here\n",
		"null document":  "~\n",
		"empty sections": "gateway:\npresence:\nlisten:\n  coap:\n",
	} {
		c, err := configs.Parse("x.yaml", []byte(yml), nil)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if !reflect.DeepEqual(c, configs.Default()) {
			t.Errorf("%s: got %+v, want Default()", name, c)
		}
	}
}

// An empty string or list is a value of its own: it disables a listener
// or clears a list, it does not fall back to the default.
func TestParseEmptyValues(t *testing.T) {
	yml := "listen:\n  coap:\n    udp:\n  mqtt:\n    tcp: \"\"\nstore:\n  redis:\n    addrs: []\nplugins:\n  adapters:\n"
	c, err := configs.Parse("x.yaml", []byte(yml), nil)
	if err != nil {
		t.Fatal(err)
	}
	if c.Listen.CoAP.UDP != "" || c.Listen.MQTT.TCP != "" {
		t.Errorf("listeners not disabled: %+v", c.Listen)
	}
	if c.Store.Redis.Addrs == nil || len(c.Store.Redis.Addrs) != 0 || c.Plugins.Adapters == nil || len(c.Plugins.Adapters) != 0 {
		t.Errorf("lists: addrs %#v adapters %#v, want empty non-nil", c.Store.Redis.Addrs, c.Plugins.Adapters)
	}
}

func TestParseAliases(t *testing.T) {
	yml := "listen:\n  coap: &loop\n    udp: \"127.0.0.1:5683\"\n  mqtt:\n    tcp: &mq \"127.0.0.1:1883\"\nstore:\n  redis:\n    addrs: [*mq]\n"
	c, err := configs.Parse("x.yaml", []byte(yml), nil)
	if err != nil {
		t.Fatal(err)
	}
	if c.Listen.CoAP.UDP != "127.0.0.1:5683" || c.Store.Redis.Addrs[0] != "127.0.0.1:1883" {
		t.Fatalf("aliases not followed: %+v", c)
	}
}

func TestParseGatewayIDDefaultsToHost(t *testing.T) {
	for _, tc := range []struct {
		yml  string
		env  []string
		want string
	}{
		{"gateway:\n  id: site-b-2\n", nil, "site-b-2"},
		{"gateway:\n  id: \"\"\n", nil, configs.HostID()},
		{"gateway:\n  id: site-b-2\n", []string{"FLEETGATE_GATEWAY_ID="}, configs.HostID()},
		{"", []string{"FLEETGATE_GATEWAY_ID=edge-7"}, "edge-7"},
	} {
		c, err := configs.Parse("x.yaml", []byte(tc.yml), tc.env)
		if err != nil {
			t.Fatal(err)
		}
		if c.Gateway.ID != tc.want {
			t.Errorf("%q %q: id %q, want %q", tc.yml, tc.env, c.Gateway.ID, tc.want)
		}
	}
	if err := configs.Default().Validate(); err != nil {
		t.Fatalf("the host name gives an invalid gateway id: %v", err)
	}
}

func TestLoadMissingFile(t *testing.T) {
	_, err := configs.Load(filepath.Join(t.TempDir(), "none.yaml"), nil)
	if err == nil || !strings.HasPrefix(err.Error(), "config: open ") || !strings.HasSuffix(err.Error(), "none.yaml: no such file or directory") {
		t.Fatalf("err = %v", err)
	}
}

// A validation failure still returns what was decoded, for check-config.
func TestLoadReturnsConfigWithValidationError(t *testing.T) {
	c, err := configs.Load("testdata/bad/shards_zero.yaml", nil)
	if err == nil || c.Presence.Shards != 0 || c.Presence.Lease != configs.Default().Presence.Lease {
		t.Fatalf("config %+v, err %v", c.Presence, err)
	}
}

func TestTooManyErrorsAreCut(t *testing.T) {
	var sb strings.Builder
	sb.WriteString("presence:\n")
	for i := range 50 {
		sb.WriteString("  k")
		sb.WriteString(strings.Repeat("x", i))
		sb.WriteString(": 1\n")
	}
	_, err := configs.Parse("x.yaml", []byte(sb.String()), nil)
	lines := strings.Split(err.Error(), "\n")
	if len(lines) != 21 || lines[20] != "x.yaml: too many errors" {
		t.Fatalf("%d lines, last %q", len(lines), lines[len(lines)-1])
	}
}
