package configs_test

import (
	"reflect"
	"testing"

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
