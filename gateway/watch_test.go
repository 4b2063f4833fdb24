package gateway_test

import (
	"testing"

	"github.com/fleetgate/fleetgate/gateway"
)

// A cursor from outside never crashes ParseCursor, and what it accepts
// encodes back to itself.
func FuzzParseCursor(f *testing.F) {
	f.Add("v1:abc@0,def@1796078834146-3")
	f.Add("v1:@12-0,x@0")
	f.Add("v1:,")
	f.Add("v2:a@0,b@0")
	f.Add("v1:a@99999999999999999999-0,b@0")
	f.Fuzz(func(t *testing.T, s string) {
		c, err := gateway.ParseCursor(s, 2)
		if err != nil {
			return
		}
		if c.String() != s {
			t.Errorf("ParseCursor(%q).String() = %q", s, c.String())
		}
		for _, p := range c {
			_ = gateway.CompareLogIDs(p.ID, "0")
		}
	})
}

func TestCompareLogIDs(t *testing.T) {
	for _, c := range []struct {
		a, b string
		want int
	}{
		{"0", "0", 0}, {"0", "0-1", -1}, {"1-0", "0", 1}, {"5-2", "5-10", -1}, {"10-0", "9-99", 1}, {"7-7", "7-7", 0},
	} {
		if got := gateway.CompareLogIDs(c.a, c.b); got != c.want {
			t.Errorf("CompareLogIDs(%s, %s) = %d, want %d", c.a, c.b, got, c.want)
		}
	}
}
