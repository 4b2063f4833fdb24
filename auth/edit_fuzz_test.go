package auth

import (
	"testing"
	"time"

	"github.com/fleetgate/fleetgate/gateway"
)

// FuzzEdit: editYAML never panics on a devices file's contents, and an
// edit it makes of a file that loads leaves one that loads, with the
// device added (with its key and lease), rotated or removed and every
// other device kept. The seed corpus is testdata/fuzz/FuzzEdit.
func FuzzEdit(f *testing.F) {
	const psk = "text:0123456789abcdef"
	f.Fuzz(func(t *testing.T, data []byte, op uint8, id string) {
		device, err := gateway.ParseDeviceID(id)
		if err != nil {
			return
		}
		before, err := Parse("fuzz.yaml", data)
		if err != nil {
			return
		}
		o := Op(op%3) + Add
		out, err := editYAML("fuzz.yaml", data, o, device, Secrets{PSK: psk, Lease: "2h"})
		if err != nil {
			return
		}
		after, err := Parse("fuzz.yaml", out)
		if err != nil {
			t.Fatalf("edit %d of %s left a file that does not load: %v\n%s", o, device, err, out)
		}
		for _, d := range before.IDs() {
			if d != device && (after.Revision(d) != before.Revision(d) || after.Lease(d) != before.Lease(d)) {
				t.Fatalf("edit %d of %s changed %s", o, device, d)
			}
		}
		_, key, err := after.PSK([]byte(device))
		switch o {
		case Add, Rotate:
			if err != nil || string(key) != psk[len("text:"):] {
				t.Fatalf("edit %d of %s: its key is %q, %v", o, device, key, err)
			}
			if l := after.Lease(device); l != 2*time.Hour {
				t.Fatalf("edit %d of %s: its lease is %v, want 2h", o, device, l)
			}
		case Remove:
			if after.Revision(device) != "" || after.Len() != before.Len()-1 {
				t.Fatalf("remove of %s left it or another: %v", device, after.IDs())
			}
		}
	})
}
