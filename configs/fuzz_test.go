package configs_test

import (
	"reflect"
	"strings"
	"testing"

	"github.com/fleetgate/fleetgate/configs"
)

// FuzzParse: Parse never panics; its errors name the file on every line;
// a config it returns can be validated, and renders to YAML that parses
// back to the same config. The seed corpus is testdata/fuzz/FuzzParse.
func FuzzParse(f *testing.F) {
	f.Fuzz(func(t *testing.T, data []byte) {
		c, err := configs.Parse("fuzz.yaml", data, nil)
		if err != nil {
			for _, line := range strings.Split(err.Error(), "\n") {
				if !strings.HasPrefix(line, "fuzz.yaml:") {
					t.Fatalf("error line %q does not name the file; whole error:\n%v", line, err)
				}
			}
			return
		}
		if err := c.Validate(); err != nil && !strings.Contains(err.Error(), ": ") {
			t.Fatalf("validation error names no key: %v", err)
		}
		c.Bounds()
		out, err := c.YAML()
		if err != nil {
			t.Fatal(err)
		}
		back, err := configs.Parse("out.yaml", out, nil)
		if err != nil {
			t.Fatalf("rendered config does not parse: %v\n%s", err, out)
		}
		if !reflect.DeepEqual(back, c) {
			t.Fatalf("round trip changed the config:\n%+v\n%+v\n%s", c, back, out)
		}
	})
}
