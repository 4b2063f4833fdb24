package auth

import (
	"bytes"
	"errors"
	"fmt"
	"testing"

	"github.com/fleetgate/fleetgate/gateway"
	"golang.org/x/crypto/bcrypt"
)

// Every refusal of CheckPassword does one bcrypt comparison, against the
// device's hash or, for an unknown device or one without a password,
// against the dummy hash: the work does not tell which devices exist.
func TestCheckPasswordAlwaysDoesTheBcryptWork(t *testing.T) {
	h, err := HashPassword([]byte("pw"), MinCost)
	if err != nil {
		t.Fatal(err)
	}
	file := fmt.Sprintf("devices:\n  - id: known\n    password_bcrypt: %q\n  - id: psk-only\n    psk: \"hex:00112233445566778899aabbccddeeff\"\n", h)
	d, err := Parse("devices.yaml", []byte(file))
	if err != nil {
		t.Fatal(err)
	}
	var compared [][]byte
	d.compare = func(hash, password []byte) error {
		compared = append(compared, hash)
		return bcrypt.CompareHashAndPassword(hash, password)
	}
	for _, c := range []struct {
		device, password string
		hash             []byte
		ok               bool
	}{
		{"known", "pw", []byte(h), true},
		{"known", "wrong", []byte(h), false},
		{"unknown", "pw", d.dummy, false},
		{"psk-only", "pw", d.dummy, false},
	} {
		compared = nil
		err := d.CheckPassword(gateway.DeviceID(c.device), []byte(c.password))
		if (err == nil) != c.ok {
			t.Errorf("%s/%s: %v", c.device, c.password, err)
		}
		if len(compared) != 1 || !bytes.Equal(compared[0], c.hash) {
			t.Errorf("%s/%s compared against %q, want once against %q", c.device, c.password, compared, c.hash)
		}
	}
	// The dummy is a real hash at the set's cost, so comparing with it
	// runs bcrypt to the end instead of failing on its format.
	if cost, err := bcrypt.Cost(d.dummy); err != nil || cost != MinCost {
		t.Errorf("dummy cost %d, %v; want %d", cost, err, MinCost)
	}
	if !bcryptRE.Match(d.dummy) {
		t.Errorf("dummy %q is not a well-formed bcrypt hash", d.dummy)
	}
	if err := bcrypt.CompareHashAndPassword(d.dummy, []byte("pw")); !errors.Is(err, bcrypt.ErrMismatchedHashAndPassword) {
		t.Errorf("comparing with the dummy: %v, want a mismatch after the full work", err)
	}
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
