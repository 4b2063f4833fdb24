package main

import (
	"bytes"
	"context"
	"io"
	"regexp"
	"testing"

	"github.com/fleetgate/fleetgate/configs"
)

// The simulator's timing flags default to the gateway's presence and
// runner defaults (one source: gateway.Default*, gateway.DefaultRunnerInterval),
// so that its bounds fit a gateway run with the shipped configuration.
func TestSimulateDefaultsAreTheConfigDefaults(t *testing.T) {
	var usage bytes.Buffer
	code := dispatch(context.Background(), []string{"simulate", "-h"}, &usage, io.Discard)
	if code != 0 {
		t.Fatalf("simulate -h: exit %d", code)
	}
	def := configs.Default()
	for flag, want := range map[string]string{
		"lease":           def.Presence.Lease.Std().String(),
		"heartbeat":       def.Presence.HeartbeatInterval.Std().String(),
		"renew-every":     def.Presence.RenewEvery.Std().String(),
		"runner-interval": def.Runner.Interval.Std().String(),
	} {
		m := regexp.MustCompile(`(?m)^  --` + regexp.QuoteMeta(flag) + ` duration\n.*\(default ([^)]+)\)$`).FindStringSubmatch(usage.String())
		if m == nil {
			t.Errorf("-%s: no default in the usage:\n%s", flag, usage.String())
			continue
		}
		if m[1] != want {
			t.Errorf("-%s defaults to %s, the configuration to %s", flag, m[1], want)
		}
	}
}
