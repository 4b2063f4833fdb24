package auth

import (
	"bytes"
	"fmt"
	"testing"
	"time"

	"github.com/fleetgate/fleetgate/gateway"
	"golang.org/x/crypto/bcrypt"
)

// The guard's policy (guard.go): a verified password is verified again
// without bcrypt; a known device's failure starts a backoff in which its
// password is not compared; unknown devices share a global budget of
// comparisons against the dummy hash; every refusal without a comparison
// waits the average comparison time instead, so that the time of a
// refusal does not tell whether the device exists.
func TestCheckPasswordGuard(t *testing.T) {
	h, err := HashPassword([]byte("pw"), MinCost)
	if err != nil {
		t.Fatal(err)
	}
	file := fmt.Sprintf("devices:\n  - id: known\n    password_bcrypt: %q\n  - id: psk-only\n    psk: \"hex:00112233445566778899aabbccddeeff\"\n", h)
	d, err := Parse("devices.yaml", []byte(file))
	if err != nil {
		t.Fatal(err)
	}
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	g := d.guard
	g.now = func() time.Time { return now }
	var paused []time.Duration
	g.pause = func(d time.Duration) { paused = append(paused, d) }
	var compared [][]byte
	d.compare = func(hash, password []byte) error {
		compared = append(compared, hash)
		return bcrypt.CompareHashAndPassword(hash, password)
	}
	check := func(device, password string, ok bool, hashes ...[]byte) {
		t.Helper()
		compared, paused = nil, nil
		err := d.CheckPassword(gateway.DeviceID(device), []byte(password))
		if (err == nil) != ok {
			t.Fatalf("%s/%s: %v, want ok=%v", device, password, err, ok)
		}
		if len(compared) != len(hashes) || (len(hashes) == 1 && !bytes.Equal(compared[0], hashes[0])) {
			t.Fatalf("%s/%s compared against %q, want %q", device, password, compared, hashes)
		}
		if !ok && len(hashes) == 0 && (len(paused) != 1 || paused[0] != g.avg || g.avg <= 0) {
			t.Fatalf("%s/%s: refused without comparison after %v, want one pause of the average %v", device, password, paused, g.avg)
		}
	}
	check("known", "pw", true, []byte(h))
	check("known", "pw", true) // cached
	check("known", "wrong", false, []byte(h))
	check("known", "pw", true) // the cache answers in the backoff
	check("known", "wrong", false)
	now = now.Add(backoffMin)
	check("known", "wrong2", false, []byte(h))
	now = now.Add(backoffMin) // the second failure waits 2 × backoffMin
	check("known", "wrong3", false)
	now = now.Add(backoffMin)
	check("known", "wrong3", false, []byte(h))

	// Unknown devices: a burst, then unknownPerSecond.
	for range unknownBurst {
		check("unknown", "pw", false, d.dummy)
	}
	check("psk-only", "pw", false)
	check("other", "pw", false)
	now = now.Add(time.Second / unknownPerSecond)
	check("other", "pw", false, d.dummy)
	check("other", "pw", false)

	// Revisions, and a reload that changes known's password forgets its
	// verified one.
	if d.Revision("known") == "" || d.Revision("psk-only") == "" || d.Revision("unknown") != "" {
		t.Fatalf("revisions: %q %q %q", d.Revision("known"), d.Revision("psk-only"), d.Revision("unknown"))
	}
	h2, err := HashPassword([]byte("pw2"), MinCost)
	if err != nil {
		t.Fatal(err)
	}
	next, err := Parse("devices.yaml", fmt.Appendf(nil, "devices:\n  - id: known\n    password_bcrypt: %q\n", h2))
	if err != nil {
		t.Fatal(err)
	}
	g.carry(next)
	if next.Revision("known") == d.Revision("known") {
		t.Fatal("a new password keeps the revision")
	}
	next.compare = d.compare
	d = next
	now = now.Add(backoffMax)
	check("known", "pw", false, []byte(h2))
}

// The dummy hash takes the cost most devices use, so that an unknown
// device costs what a typical known one does.
func TestUsualCost(t *testing.T) {
	for _, c := range []struct {
		costs map[int]int
		want  int
	}{
		{nil, DefaultCost},
		{map[int]int{4: 3}, 4},
		{map[int]int{4: 2, 12: 1}, 4},
		{map[int]int{4: 1, 12: 2}, 12},
		{map[int]int{11: 1, 5: 1}, 11},
	} {
		if got := usualCost(c.costs); got != c.want {
			t.Errorf("usualCost(%v) = %d, want %d", c.costs, got, c.want)
		}
		if cost, err := bcrypt.Cost(dummyHash(c.want)); err != nil || cost != c.want {
			t.Errorf("dummyHash(%d) has cost %d, %v", c.want, cost, err)
		}
	}
}
