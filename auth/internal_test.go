package auth

import (
	"bytes"
	"fmt"
	"net/netip"
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

// Attack: one wrong password for a device every few seconds, from
// anywhere, kept its backoff on, and the backoff refused even the right
// password: a device whose password was not cached (all of them after a
// restart) stayed out. Now the backoff is kept per source address and
// device: the right password from another address is compared, within a
// global budget of contestedPerSecond while the device is in backoff
// anywhere, so that many attacking addresses get no more comparisons.
func TestBackoffPerSource(t *testing.T) {
	d := knownDevice(t, "pw")
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	g := d.guard
	g.now = func() time.Time { return now }
	g.pause = func(time.Duration) {}
	compared := 0
	d.compare = func(hash, password []byte) error {
		compared++
		return bcrypt.CompareHashAndPassword(hash, password)
	}
	attacker, device := netip.MustParseAddr("192.0.2.66"), netip.MustParseAddr("198.51.100.7")
	check := func(from netip.Addr, password string, ok, comparison bool) {
		t.Helper()
		compared = 0
		err := d.CheckPasswordFrom("known", from, []byte(password))
		if (err == nil) != ok || (compared == 1) != comparison {
			t.Fatalf("%s from %s: %v after %d comparisons, want ok=%v, compared=%v", password, from, err, compared, ok, comparison)
		}
	}
	check(attacker, "wrong", false, true)
	check(attacker, "pw", false, false) // the attacker's address is in backoff
	check(device, "pw", true, true)     // the device's is not
	check(attacker, "pw", true, false)  // cached now, from anywhere

	// The device's password changes (a reload): not cached any more. The
	// attack goes on; the device gets in from its address each time.
	next := knownDevice(t, "pw2")
	g.carry(next)
	next.compare = d.compare
	d = next
	for range 3 {
		now = now.Add(backoffMax)
		check(attacker, "wrong", false, true)
		check(attacker, "wrong", false, false)
		check(device, "pw2", true, true)
		g.mu.Lock()
		delete(g.ok, "known") // as after a restart
		g.mu.Unlock()
	}

	// Many attacking addresses: while the device is in backoff, each
	// new one takes from the contested budget, contestedPerSecond a
	// second; beyond it, checks are refused without comparison.
	now = now.Add(backoffMax)
	check(attacker, "wrong", false, true) // the device was not in backoff
	for i := range 2 * contestedPerSecond {
		compared = 0
		_ = d.CheckPasswordFrom("known", netip.AddrFrom4([4]byte{203, 0, 113, byte(i)}), []byte("wrong"))
		if want := i < contestedPerSecond; (compared == 1) != want {
			t.Fatalf("attacking address %d: compared %d, want a comparison %v", i, compared, want)
		}
	}
	check(device, "pw2", false, false) // budget spent: the device waits its turn
	now = now.Add(time.Second / contestedPerSecond)
	check(device, "pw2", true, true)

	// The backoffs per address are bounded: beyond maxSourceFailures a
	// new address's failure is not kept (its checks stay within the
	// contested budget), and ended backoffs make room.
	for i := range maxSourceFailures + 10 {
		g.failed("known", netip.AddrFrom4([4]byte{10, byte(i >> 16), byte(i >> 8), byte(i)}), now)
	}
	if n := len(g.srcFails); n > maxSourceFailures {
		t.Fatalf("%d backoffs per address kept, want at most %d", n, maxSourceFailures)
	}
	g.failed("known", attacker, now.Add(backoffMax))
	if _, ok := g.srcFails[sourced{attacker, "known"}]; !ok || len(g.srcFails) > maxSourceFailures {
		t.Fatalf("a failure after the backoffs ended was not kept (%d kept)", len(g.srcFails))
	}
}

// knownDevice is a devices set of one device, known, with password.
func knownDevice(t *testing.T, password string) *Devices {
	t.Helper()
	h, err := HashPassword([]byte(password), MinCost)
	if err != nil {
		t.Fatal(err)
	}
	d, err := Parse("devices.yaml", fmt.Appendf(nil, "devices:\n  - id: known\n    password_bcrypt: %q\n", h))
	if err != nil {
		t.Fatal(err)
	}
	return d
}
