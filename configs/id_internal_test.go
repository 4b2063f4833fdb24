package configs

import (
	"strings"
	"testing"

	"github.com/fleetgate/fleetgate/gateway"
)

func TestSanitizeID(t *testing.T) {
	for in, want := range map[string]string{
		"site-a-1":               "site-a-1",
		"edge_7.example.org":     "edge_7.example.org",
		"my host/1":              "my-host-1",
		"höst":                   "h--st",
		"":                       "fleetgate",
		strings.Repeat("a", 200): strings.Repeat("a", gateway.MaxDeviceIDLen),
	} {
		got := sanitizeID(in)
		if got != want {
			t.Errorf("sanitizeID(%q) = %q, want %q", in, got, want)
		}
		if err := gateway.ValidGatewayID(got); err != nil {
			t.Errorf("sanitizeID(%q) = %q: %v", in, got, err)
		}
	}
}
