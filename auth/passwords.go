package auth

import (
	"fmt"
	"slices"

	"golang.org/x/crypto/bcrypt"

	"github.com/fleetgate/fleetgate/gateway"
)

// CheckHash reports whether hash is a bcrypt hash that the devices
// file's password_bcrypt takes ("$2a$", "$2b$" or "$2y$", a cost in
// MinCost..MaxCost, 53 characters of salt and hash). Its error never
// quotes the hash.
func CheckHash(hash string) error {
	_, err := parseHash(hash)
	return err
}

// NewPasswords returns a set that holds MQTT passwords only, keyed by
// name: the local MQTT clients of the configuration's auth.clients
// (docs/design.md §6.8), name → bcrypt hash as password_bcrypt takes it.
// Each name must be a device ID ([A-Za-z0-9._:-], 1 to 128 bytes). Its
// password checks are the devices file's (CheckPasswordFrom: the same
// timing whether a name exists or not, backoff of wrong passwords per
// source address, a cache of verified passwords), and a name has no PSK.
// Errors name the entry, never its hash.
func NewPasswords(hashes map[string]string) (*Devices, error) {
	d := &Devices{
		byID:    make(map[string]device, len(hashes)),
		compare: bcrypt.CompareHashAndPassword,
		guard:   newGuard(),
	}
	costs := make(map[int]int)
	names := make([]string, 0, len(hashes))
	for name := range hashes {
		names = append(names, name)
	}
	slices.Sort(names)
	for _, name := range names {
		if _, err := gateway.ParseDeviceID(name); err != nil {
			return nil, fmt.Errorf("password of %q: name: %w", name, err)
		}
		cost, err := parseHash(hashes[name])
		if err != nil {
			return nil, fmt.Errorf("password of %q: %w", name, err)
		}
		hash := []byte(hashes[name])
		d.byID[name] = device{hash: hash, rev: revision(nil, hash)}
		costs[cost]++
	}
	d.dummy = dummyHash(usualCost(costs))
	return d, nil
}
