package configs_test

import (
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/fleetgate/fleetgate/configs"
)

func TestEnvOverrides(t *testing.T) {
	env := []string{
		"FLEETGATE_PRESENCE_LEASE=2m",
		"FLEETGATE_GATEWAY_STATE_DIR=/x",
		"FLEETGATE_STORE_BACKEND=redis",
		"FLEETGATE_STORE_REDIS_ADDRS=a:1, b:2",
		"FLEETGATE_STORE_REDIS_PASSWORD=s3cret=yes",
		"FLEETGATE_STORE_REDIS_TLS=true",
		"FLEETGATE_LISTEN_COAP_UDP=127.0.0.1:5684",
		"FLEETGATE_LISTEN_MQTT_TCP=",
		"FLEETGATE_AUTH_ALLOW_ANONYMOUS=true",
		"FLEETGATE_RUNNER_BATCH=50",
		"FLEETGATE_PLUGINS_ADAPTERS=",
		"FLEETGATE_LOG_FORMAT=json",
		"FLEETGATE_TEST_BOOT_ID=0d4b1f4c-21e6-4d7b-9a5e-2f0c1e6b8a11",
		"HOME=/root",
		"NOT_AN_ASSIGNMENT",
	}
	c, err := configs.Parse("x.yaml", []byte("runner:\n  batch: 7\n"), env)
	if err != nil {
		t.Fatal(err)
	}
	want := configs.Default()
	want.Presence.Lease = configs.Duration(2 * time.Minute)
	want.Gateway.StateDir = "/x"
	want.Store.Backend = "redis"
	want.Store.Redis.Addrs = []string{"a:1", "b:2"}
	want.Store.Redis.Password = "s3cret=yes"
	want.Store.Redis.TLS = true
	want.Listen.CoAP.UDP = "127.0.0.1:5684"
	want.Listen.MQTT.TCP = ""
	want.Auth.AllowAnonymous = true
	want.Runner.Batch = 50
	want.Log.Format = "json"
	if !reflect.DeepEqual(c, want) {
		t.Fatalf("got\n%+v\nwant\n%+v", c, want)
	}
}

func TestEnvErrors(t *testing.T) {
	_, err := configs.Parse("x.yaml", nil, []string{
		"FLEETGATE_PRESENCE_LEESE=60s",
		"FLEETGATE_PRESENCE_LEASE=60",
		"FLEETGATE_PRESENCE_SHARDS=many",
		"FLEETGATE_AUTH_ALLOW_ANONYMOUS=yes please",
		"FLEETGATE_STORE=redis",
		"FLEETGATE_CONFIG=/etc/x.yaml",
		"FLEETGATE_TEST_BOOT_ID=reboot",
	})
	want := strings.Join([]string{
		`environment FLEETGATE_PRESENCE_LEESE: no such configuration key (did you mean "FLEETGATE_PRESENCE_LEASE"?)`,
		`environment FLEETGATE_PRESENCE_LEASE (presence.lease): duration 60 has no unit (write "60s" for seconds)`,
		`environment FLEETGATE_PRESENCE_SHARDS (presence.shards): want an integer, got "many"`,
		`environment FLEETGATE_AUTH_ALLOW_ANONYMOUS (auth.allow_anonymous): want true or false, got "yes please"`,
		`environment FLEETGATE_STORE: no such configuration key`,
		`environment FLEETGATE_CONFIG: no such configuration key`,
		`environment FLEETGATE_TEST_BOOT_ID (a test hook): boot ID "reboot": want 32 hex digits`,
	}, "\n")
	if err == nil || err.Error() != want {
		t.Fatalf("error:\n%v\nwant:\n%s", err, want)
	}
}

// Every key has its own variable: no two paths collapse to one name.
func TestEnvNamesAreUnique(t *testing.T) {
	seen := map[string]string{}
	for _, path := range configs.Keys() {
		name := configs.EnvName(path)
		if prev, dup := seen[name]; dup {
			t.Errorf("%s and %s both map to %s", prev, path, name)
		}
		seen[name] = path
	}
	if len(seen) != 103 {
		t.Errorf("%d keys, want 103: %v", len(seen), configs.Keys())
	}
}

func TestTestBootID(t *testing.T) {
	env := []string{"HOME=/root", "FLEETGATE_TEST_BOOT_ID=00000000-0000-4000-8000-000000000002"}
	if got := configs.TestBootID(env); got != "00000000-0000-4000-8000-000000000002" {
		t.Errorf("TestBootID = %q", got)
	}
	if got := configs.TestBootID(env[:1]); got != "" {
		t.Errorf("TestBootID without the variable = %q, want empty", got)
	}
}
