package auth_test

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/fleetgate/fleetgate/auth"
	"github.com/fleetgate/fleetgate/gateway"
)

// devicesCopy copies testdata/devices.yaml to a temporary file of mode
// 0640 and returns its path.
func devicesCopy(t *testing.T) string {
	t.Helper()
	data, err := os.ReadFile("testdata/devices.yaml")
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "devices.yaml")
	if err := os.WriteFile(path, data, 0o640); err != nil {
		t.Fatal(err)
	}
	return path
}

// TestEditAddRotateRemove: each edit leaves a file that loads with the
// change made, keeps the other entries, the comments and the mode, and
// leaves no temporary file behind; Add of a listed device and Rotate or
// Remove of an unlisted one are refused.
func TestEditAddRotateRemove(t *testing.T) {
	path := devicesCopy(t)
	psk, err := auth.GeneratePSK()
	if err != nil {
		t.Fatal(err)
	}
	d, err := auth.Edit(path, auth.Add, "new-1", auth.Secrets{PSK: psk}, auth.LeaseBounds{})
	if err != nil {
		t.Fatal(err)
	}
	if id, _, err := d.PSK([]byte("new-1")); err != nil || id != "new-1" {
		t.Fatalf("PSK(new-1) after Add: %v", err)
	}
	loaded, err := auth.Load(path)
	if err != nil {
		t.Fatalf("Load after Add: %v", err)
	}
	if loaded.Len() != 4 || loaded.Revision("new-1") != d.Revision("new-1") || loaded.Revision("sensor-17") == "" {
		t.Fatalf("after Add: %v", loaded.IDs())
	}
	data, _ := os.ReadFile(path)
	if !strings.Contains(string(data), "# A device that speaks both CoAP over DTLS and MQTT.") {
		t.Errorf("comments lost:\n%s", data)
	}
	if st, _ := os.Stat(path); st.Mode().Perm() != 0o640 {
		t.Errorf("mode %v, want 0640", st.Mode().Perm())
	}

	before := loaded.Revision("sensor-17")
	hash, err := auth.HashPassword([]byte("new-password-1"), auth.MinCost)
	if err != nil {
		t.Fatal(err)
	}
	d, err = auth.Edit(path, auth.Rotate, "sensor-17", auth.Secrets{PasswordHash: hash}, auth.LeaseBounds{})
	if err != nil {
		t.Fatal(err)
	}
	if d.Revision("sensor-17") == before {
		t.Error("Rotate kept the revision")
	}
	if err := d.CheckPassword("sensor-17", []byte("new-password-1")); err != nil {
		t.Errorf("new password after Rotate: %v", err)
	}
	if _, _, err := d.PSK([]byte("sensor-17")); err != nil {
		t.Errorf("Rotate of the password dropped the key: %v", err)
	}

	if d, err = auth.Edit(path, auth.Remove, "meter:0042", auth.Secrets{}, auth.LeaseBounds{}); err != nil {
		t.Fatal(err)
	}
	if d.Revision("meter:0042") != "" || d.Len() != 3 {
		t.Errorf("after Remove: %v", d.IDs())
	}

	for _, tc := range []struct {
		op   auth.Op
		id   gateway.DeviceID
		want error
	}{{auth.Add, "new-1", auth.ErrExists}, {auth.Rotate, "meter:0042", auth.ErrAbsent}, {auth.Remove, "meter:0042", auth.ErrAbsent}} {
		if _, err := auth.Edit(path, tc.op, tc.id, auth.Secrets{PSK: psk}, auth.LeaseBounds{}); !errors.Is(err, tc.want) {
			t.Errorf("Edit(%d, %s) = %v, want %v", tc.op, tc.id, err, tc.want)
		}
	}
	entries, _ := os.ReadDir(filepath.Dir(path))
	if len(entries) != 1 {
		t.Errorf("directory holds %d entries after the edits, want the devices file alone", len(entries))
	}
}

// TestEditRefusesInvalid: an edit that would leave a file run cannot
// load (a bad key) is refused with the loader's error, naming the line,
// and the file is left byte for byte as it was.
func TestEditRefusesInvalid(t *testing.T) {
	path := devicesCopy(t)
	before, _ := os.ReadFile(path)
	_, err := auth.Edit(path, auth.Add, "new-1", auth.Secrets{PSK: "hex:0102"}, auth.LeaseBounds{})
	if err == nil || !strings.Contains(err.Error(), "devices.yaml:") || !strings.Contains(err.Error(), "the key is 2 bytes") {
		t.Fatalf("Edit with a short key: %v; want the loader's error with its position", err)
	}
	if after, _ := os.ReadFile(path); !bytes.Equal(before, after) {
		t.Error("a refused edit changed the file")
	}
}

// TestEditConcurrent: edits at once, each its own device, all land (the
// lock serialises them: none is lost to another's rename).
func TestEditConcurrent(t *testing.T) {
	path := devicesCopy(t)
	const n = 8
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			psk, err := auth.GeneratePSK()
			if err == nil {
				_, err = auth.Edit(path, auth.Add, gateway.DeviceID(fmt.Sprintf("conc-%d", i)), auth.Secrets{PSK: psk}, auth.LeaseBounds{})
			}
			if err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	d, err := auth.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	if d.Len() != 3+n {
		t.Errorf("%d devices after %d concurrent adds to 3: %v", d.Len(), n, d.IDs())
	}
}

// TestEditEmptyList: a file with no devices ("devices: []", or every
// entry commented out) takes an Add, in block style.
func TestEditEmptyList(t *testing.T) {
	for _, body := range []string{"devices: []\n", "# none yet\ndevices:\n#  - id: x\n"} {
		path := filepath.Join(t.TempDir(), "devices.yaml")
		if err := os.WriteFile(path, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		if _, err := auth.Edit(path, auth.Add, "first", auth.Secrets{PSK: "text:0123456789abcdef"}, auth.LeaseBounds{}); err != nil {
			t.Fatalf("%q: %v", body, err)
		}
		d, err := auth.Load(path)
		if err != nil || d.Len() != 1 {
			data, _ := os.ReadFile(path)
			t.Fatalf("%q: after Add: %v\n%s", body, err, data)
		}
	}
}
