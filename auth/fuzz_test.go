package auth_test

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/fleetgate/fleetgate/auth"
	"github.com/fleetgate/fleetgate/gateway"
)

// FuzzParse: Parse never panics; its errors name the file on every line;
// a set it returns holds valid, distinct device IDs whose keys have a
// valid length and whose leases are above zero, and those IDs and leases
// written to a new file parse back to the same. The seed corpus is testdata/fuzz/FuzzParse.
func FuzzParse(f *testing.F) {
	f.Fuzz(func(t *testing.T, data []byte) {
		d, err := auth.Parse("fuzz.yaml", data)
		if err != nil {
			if d != nil {
				t.Fatal("Parse returned a set with its error")
			}
			for _, line := range strings.Split(err.Error(), "\n") {
				if !strings.HasPrefix(line, "fuzz.yaml:") {
					t.Fatalf("error line %q does not name the file; whole error:\n%v", line, err)
				}
			}
			return
		}
		ids := d.IDs()
		if len(ids) != d.Len() || !slices.IsSorted(ids) || len(slices.Compact(slices.Clone(ids))) != len(ids) {
			t.Fatalf("IDs %v do not match Len %d", ids, d.Len())
		}
		var file strings.Builder
		leases := 0
		file.WriteString("devices:\n")
		for _, id := range ids {
			if back, err := gateway.ParseDeviceID(string(id)); err != nil || back != id {
				t.Fatalf("set holds an invalid device ID %q: %v", id, err)
			}
			got, key, err := d.PSK([]byte(id))
			switch {
			case err == nil && (got != id || len(key) < auth.MinPSKLen || len(key) > auth.MaxPSKLen):
				t.Fatalf("PSK(%q) = %q and a %d-byte key", id, got, len(key))
			case err != nil && !errors.Is(err, gateway.ErrUnauthorized):
				t.Fatalf("PSK(%q): %v", id, err)
			}
			fmt.Fprintf(&file, "  - id: %q\n    psk: \"hex:00112233445566778899aabbccddeeff\"\n", id)
			if l := d.Lease(id); l != 0 {
				if l < 0 {
					t.Fatalf("device %q has the lease %v", id, l)
				}
				fmt.Fprintf(&file, "    lease: %s\n", l)
				leases++
			}
		}
		if r := d.Leases(); r.Devices != leases || leases > 0 && (r.Shortest <= 0 || r.Longest < r.Shortest) {
			t.Fatalf("Leases %+v with %d devices with a lease", r, leases)
		}
		back, err := auth.Parse("back.yaml", []byte(file.String()))
		if err != nil {
			t.Fatalf("the IDs do not parse back: %v\n%s", err, file.String())
		}
		if !slices.Equal(back.IDs(), ids) {
			t.Fatalf("round trip changed the IDs: %v, then %v", ids, back.IDs())
		}
		for _, id := range ids {
			if back.Lease(id) != d.Lease(id) {
				t.Fatalf("round trip changed the lease of %q: %v, then %v", id, d.Lease(id), back.Lease(id))
			}
		}
	})
}
