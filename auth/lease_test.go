package auth_test

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/fleetgate/fleetgate/auth"
	"github.com/fleetgate/fleetgate/gateway"
)

const leaseFile = `devices:
  - id: lw-1
    psk: "hex:00112233445566778899aabbccddeeff"
    lease: 2h
  - id: lw-2
    psk: "hex:00112233445566778899aabbccddeeff"
    lease: "15m"
  - id: plain
    psk: "hex:00112233445566778899aabbccddeeff"
`

// A device's lease is its own: Lease gives it (0 for a device without
// one, or not listed), Leases sums them up, and it is no credential: the
// Revision does not depend on it.
func TestDevicesLease(t *testing.T) {
	d, err := auth.Parse("d.yaml", []byte(leaseFile))
	if err != nil {
		t.Fatal(err)
	}
	for id, want := range map[string]time.Duration{"lw-1": 2 * time.Hour, "lw-2": 15 * time.Minute, "plain": 0, "unknown": 0} {
		if got := d.Lease(gateway.DeviceID(id)); got != want {
			t.Errorf("Lease(%s) = %v, want %v", id, got, want)
		}
	}
	if r := d.Leases(); r != (auth.LeaseRange{Devices: 2, Shortest: 15 * time.Minute, Longest: 2 * time.Hour}) {
		t.Errorf("Leases = %+v", r)
	}
	without, err := auth.Parse("d.yaml", []byte(strings.ReplaceAll(leaseFile, "    lease: 2h\n", "")))
	if err != nil {
		t.Fatal(err)
	}
	if without.Revision("lw-1") != d.Revision("lw-1") {
		t.Error("the lease changed the device's Revision: a lease change would end its sessions")
	}
	r := auth.NewReloadable(d)
	if r.Lease("lw-1") != 2*time.Hour {
		t.Errorf("Reloadable.Lease = %v", r.Lease("lw-1"))
	}
}

// CheckLeases holds every lease within [presence.lease, presence.max_lease]
// and places each problem at its key.
func TestCheckLeases(t *testing.T) {
	d, err := auth.Parse("d.yaml", []byte(leaseFile))
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		lease, max time.Duration
		want       string
	}{
		{90 * time.Second, 2 * time.Hour, ""},
		{90 * time.Second, time.Hour,
			"d.yaml:4:12: devices[0].lease: 2h0m0s is longer than presence.max_lease (1h0m0s); raise presence.max_lease or shorten the lease"},
		{20 * time.Minute, 2 * time.Hour,
			"d.yaml:7:12: devices[1].lease: 15m0s is shorter than presence.lease (20m0s); a device's lease only lengthens the lease"},
		{90 * time.Second, 0,
			"d.yaml:4:12: devices[0].lease: 2h0m0s is longer than presence.lease (1m30s) and presence.max_lease is 0s: none may be longer; raise presence.max_lease to at least 2h0m0s\n" +
				"d.yaml:7:12: devices[1].lease: 15m0s is longer than presence.lease (1m30s) and presence.max_lease is 0s: none may be longer; raise presence.max_lease to at least 15m0s"},
	} {
		err := d.CheckLeases(c.lease, c.max)
		got := ""
		if err != nil {
			got = err.Error()
		}
		if got != c.want {
			t.Errorf("CheckLeases(%v, %v):\n%s\nwant:\n%s", c.lease, c.max, got, c.want)
		}
	}
}

// devices add --lease writes the lease, and an edit that would leave a
// lease beyond max_lease is refused with the file untouched.
func TestEditLease(t *testing.T) {
	path := filepath.Join(t.TempDir(), "devices.yaml")
	if err := os.WriteFile(path, []byte(leaseFile), 0o600); err != nil {
		t.Fatal(err)
	}
	b := auth.LeaseBounds{Lease: 90 * time.Second, MaxLease: 3 * time.Hour}
	d, err := auth.Edit(path, auth.Add, "lw-3", auth.Secrets{PSK: "text:0123456789abcdef", Lease: "3h"}, b)
	if err != nil {
		t.Fatal(err)
	}
	if d.Lease("lw-3") != 3*time.Hour {
		t.Fatalf("lease after the edit: %v", d.Lease("lw-3"))
	}
	before, _ := os.ReadFile(path)
	_, err = auth.Edit(path, auth.Add, "lw-4", auth.Secrets{PSK: "text:0123456789abcdef", Lease: "4h"}, b)
	if !errors.Is(err, auth.ErrInvalid) || !strings.Contains(err.Error(), "devices[4].lease: 4h0m0s is longer than presence.max_lease (3h0m0s)") {
		t.Fatalf("a lease beyond max_lease: %v", err)
	}
	if after, _ := os.ReadFile(path); string(after) != string(before) {
		t.Fatal("a refused edit changed the file")
	}
	if _, err := auth.Edit(path, auth.Add, "lw-5", auth.Secrets{PSK: "text:0123456789abcdef", Lease: "soon"}, b); !errors.Is(err, auth.ErrInvalid) {
		t.Fatalf("a lease that does not parse: %v", err)
	}
	if _, err := auth.Edit(path, auth.Add, "lw-5", auth.Secrets{PSK: "text:0123456789abcdef", Lease: auth.NoLease}, b); !errors.Is(err, auth.ErrInvalid) {
		t.Fatalf("a new device without a lease of its own to remove: %v", err)
	}

	// A rotation of the lease alone keeps the key; NoLease removes it.
	rev := d.Revision("lw-3")
	if d, err = auth.Edit(path, auth.Rotate, "lw-3", auth.Secrets{Lease: "2h"}, b); err != nil {
		t.Fatal(err)
	}
	if d.Lease("lw-3") != 2*time.Hour {
		t.Errorf("lease after a rotation of the lease: %v", d.Lease("lw-3"))
	}
	if _, _, err := d.PSK([]byte("lw-3")); err != nil {
		t.Errorf("a rotation of the lease dropped the key: %v", err)
	}
	if d, err = auth.Edit(path, auth.Rotate, "lw-3", auth.Secrets{Lease: auth.NoLease}, b); err != nil {
		t.Fatal(err)
	}
	if d.Lease("lw-3") != 0 {
		t.Errorf("lease after %q: %v", auth.NoLease, d.Lease("lw-3"))
	}
	if data, _ := os.ReadFile(path); strings.Contains(string(data[strings.Index(string(data), `"lw-3"`):]), "lease") {
		t.Errorf("the lease stayed in the file:\n%s", data)
	}
	if _, _, err := d.PSK([]byte("lw-3")); err != nil || d.Revision("lw-3") != rev {
		t.Errorf("the lease's edits touched the key: %v (revision %q, was %q)", err, d.Revision("lw-3"), rev)
	}
}
