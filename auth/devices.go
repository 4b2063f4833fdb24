// Package auth holds device credentials: the devices file, which gives each
// device a pre-shared key for CoAP over DTLS and a bcrypt password hash for
// MQTT. Devices implements gateway.Credentials for one parsed file;
// Reloadable swaps the file's contents at runtime (SIGHUP).
//
// Secrets never appear in errors: a refused device gets gateway
// ErrUnauthorized whichever part was wrong, and a bad file names the line
// and column of a bad key or hash, never its value.
package auth

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"slices"
	"time"

	"github.com/fleetgate/fleetgate/gateway"
	"golang.org/x/crypto/bcrypt"
)

// Bounds of the bcrypt cost accepted by HashPassword and in the devices
// file, and the cost fleetgate hash-password uses by default.
const (
	MinCost     = bcrypt.MinCost
	MaxCost     = bcrypt.MaxCost
	DefaultCost = bcrypt.DefaultCost
)

// Lengths of a pre-shared key, in bytes (after hex or base64 decoding).
const (
	MinPSKLen = 16
	MaxPSKLen = 64
)

// MaxPasswordLen is the longest password bcrypt can hash: it ignores
// every byte after the 72nd, so a longer password is refused instead.
const MaxPasswordLen = 72

var (
	_ gateway.SourceCredentials = (*Devices)(nil)
	_ gateway.LeaseCredentials  = (*Devices)(nil)
)

// Devices is one parsed devices file, made by Load or Parse (the zero
// value is not usable). It is immutable and safe for concurrent use.
type Devices struct {
	byID map[string]device
	// dummy is a well-formed bcrypt hash, at the cost most devices use, that
	// CheckPassword compares against when the device is unknown or has no
	// password, so that a refusal takes the same work either way.
	dummy []byte
	// compare is bcrypt.CompareHashAndPassword; tests wrap it to see
	// which paths do the bcrypt work.
	compare func(hash, password []byte) error
	// guard bounds the work of failed checks (guard.go); a Reloadable's
	// sets share one.
	guard *guard
	// leases are the devices with a lease of their own, in file order,
	// for CheckLeases and Leases.
	leases []leased
}

type device struct {
	psk   []byte        // nil: no CoAP DTLS
	hash  []byte        // nil: no MQTT password
	rev   string        // Revision: changes with psk or hash
	lease time.Duration // the device's own lease, 0: none
}

// leased is a device's lease and where the file sets it.
type leased struct {
	lease time.Duration
	at    string // "name:line:column: devices[i].lease"
}

// Load reads and parses the devices file at path.
func Load(path string) (*Devices, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("devices file: %w", err)
	}
	return Parse(path, data)
}

// Parse parses a devices file's contents; name prefixes every error line,
// which reads "name:line:column: key: problem".
func Parse(name string, data []byte) (*Devices, error) {
	entries, err := decodeFile(name, data)
	if err != nil {
		return nil, err
	}
	d := &Devices{
		byID:    make(map[string]device, len(entries)),
		compare: bcrypt.CompareHashAndPassword,
		guard:   newGuard(),
	}
	costs := make(map[int]int)
	for _, e := range entries {
		d.byID[string(e.id)] = device{psk: e.psk, hash: e.hash, rev: revision(e.psk, e.hash), lease: e.lease}
		if e.hash != nil {
			costs[e.cost]++
		}
		if e.lease > 0 {
			d.leases = append(d.leases, leased{lease: e.lease, at: e.at})
		}
	}
	d.dummy = dummyHash(usualCost(costs))
	return d, nil
}

// usualCost is the most frequent of costs (cost → count), the higher one
// on a tie, or DefaultCost when there is none.
func usualCost(costs map[int]int) int {
	best, n := DefaultCost, 0
	for c, k := range costs {
		if k > n || (k == n && c > best) {
			best, n = c, k
		}
	}
	return best
}

// dummyHash returns a well-formed bcrypt hash of the given cost. Comparing
// a password with it costs the full bcrypt work and never succeeds (that
// would take a 184-bit hash collision).
func dummyHash(cost int) []byte {
	return fmt.Appendf(nil, "$2a$%02d$%s", cost, "fleetgate.dummy.salt.and.hash.no.password.matches.any")
}

// Len is the number of devices in the set.
func (d *Devices) Len() int { return len(d.byID) }

// IDs returns the set's device IDs, sorted.
func (d *Devices) IDs() []gateway.DeviceID {
	ids := make([]gateway.DeviceID, 0, len(d.byID))
	for id := range d.byID {
		ids = append(ids, gateway.DeviceID(id))
	}
	slices.Sort(ids)
	return ids
}

// Lease is gateway.LeaseCredentials' Lease: the device's own lease in the
// file, 0 when it has none or is not listed. A lease is no credential:
// it changes no Revision, so a reload that changes only a lease ends no
// session (the front ends apply it to the evidence that follows).
func (d *Devices) Lease(id gateway.DeviceID) time.Duration { return d.byID[string(id)].lease }

// LeaseRange is what the devices' leases come to: how many devices have
// one, the shortest and the longest (zero when none has).
type LeaseRange struct {
	Devices           int
	Shortest, Longest time.Duration
}

// Leases summarises the devices' own leases.
func (d *Devices) Leases() LeaseRange {
	var r LeaseRange
	for _, l := range d.leases {
		if r.Devices == 0 || l.lease < r.Shortest {
			r.Shortest = l.lease
		}
		r.Longest = max(r.Longest, l.lease)
		r.Devices++
	}
	return r
}

// CheckLeases checks every device's lease against the configuration:
// at least lease (presence.lease) and at most maxLease
// (presence.max_lease; at or below lease none may be longer). Each
// problem is placed at its key, "name:line:column: devices[i].lease: ...",
// one a line.
func (d *Devices) CheckLeases(lease, maxLease time.Duration) error {
	var errs []error
	for _, l := range d.leases {
		switch {
		case l.lease < lease:
			errs = append(errs, fmt.Errorf("%s: %s is shorter than presence.lease (%s); a device's lease only lengthens the lease", l.at, l.lease, lease))
		case maxLease <= lease && l.lease > lease:
			errs = append(errs, fmt.Errorf("%s: %s is longer than presence.lease (%s) and presence.max_lease is %s: none may be longer; raise presence.max_lease to at least %s", l.at, l.lease, lease, maxLease, l.lease))
		case l.lease > maxLease:
			errs = append(errs, fmt.Errorf("%s: %s is longer than presence.max_lease (%s); raise presence.max_lease or shorten the lease", l.at, l.lease, maxLease))
		}
	}
	return errors.Join(errs...)
}

// revision is a device's Revision: a digest of its key and hash.
func revision(psk, hash []byte) string {
	h := sha256.New()
	fmt.Fprintf(h, "%d:%x:%d:%x", len(psk), psk, len(hash), hash)
	return hex.EncodeToString(h.Sum(nil)[:16])
}

// CheckPassword is CheckPasswordFrom with no source address known: all
// such checks share one backoff per device.
func (d *Devices) CheckPassword(id gateway.DeviceID, password []byte) error {
	return d.CheckPasswordFrom(id, netip.Addr{}, password)
}

// CheckPasswordFrom verifies device's MQTT password, sent from address
// from, against its bcrypt hash. An unknown device, a device without a
// password and a wrong password all return the same wrapped
// gateway.ErrUnauthorized after about the time of a bcrypt comparison, so
// that neither the answer nor its timing tells whether the device exists;
// the guard (guard.go) decides whether that time is spent comparing or
// waiting (wrong passwords from one address hold up that address, not
// the device's others), and a password verified before is verified again
// from its cache. It returns a wrapped gateway.ErrOverloaded when no
// comparison slot frees up within 2 s. A password longer than
// MaxPasswordLen is refused at once (that depends on the password only,
// not on the device).
func (d *Devices) CheckPasswordFrom(id gateway.DeviceID, from netip.Addr, password []byte) error {
	if len(password) > MaxPasswordLen {
		return errUnauthorized
	}
	dev := d.byID[string(id)] // the zero device when unknown
	g := d.guard
	known := dev.hash != nil
	if known && g.cached(id, dev.rev, password) {
		return nil
	}
	hash := dev.hash
	if !known {
		hash = d.dummy
	}
	now := g.now()
	if !g.mayCompare(id, from, known, now) {
		g.pad(func() error { return d.compare(d.dummy, password) })
		return errUnauthorized
	}
	matched, err := g.compare(func() error { return d.compare(hash, password) }, known)
	if !known {
		g.strangerDone()
	}
	switch {
	case err != nil:
		return err
	case !known:
		return errUnauthorized
	case !matched:
		g.failed(id, from, now)
		return errUnauthorized
	}
	g.succeeded(id, from, dev.rev, password)
	return nil
}

// Revision is gateway.Credentials' Revision: "" for a device not in the
// set, else a digest of its key and password hash.
func (d *Devices) Revision(id gateway.DeviceID) string { return d.byID[string(id)].rev }

// PSK returns the device named by a DTLS PSK identity (the device ID's
// bytes) and a copy of its key. An unknown identity, an identity that is
// not a device ID and a device without a key all return the same wrapped
// gateway.ErrUnauthorized.
func (d *Devices) PSK(identity []byte) (gateway.DeviceID, []byte, error) {
	dev, ok := d.byID[string(identity)]
	if !ok || dev.psk == nil {
		return "", nil, errUnauthorized
	}
	return gateway.DeviceID(identity), slices.Clone(dev.psk), nil
}

// errUnauthorized is the one refusal of this package: its text is the same
// whatever was wrong.
var errUnauthorized = fmt.Errorf("device credentials: %w", gateway.ErrUnauthorized)

// HashPassword returns the bcrypt hash of password at cost, in the form
// the devices file's password_bcrypt takes. The error never contains the
// password.
func HashPassword(password []byte, cost int) (string, error) {
	switch {
	case len(password) == 0:
		return "", errors.New("hash password: the password is empty")
	case len(password) > MaxPasswordLen:
		return "", fmt.Errorf("hash password: the password is %d bytes, bcrypt takes at most %d", len(password), MaxPasswordLen)
	case cost < MinCost || cost > MaxCost:
		return "", fmt.Errorf("hash password: cost %d is not in %d..%d", cost, MinCost, MaxCost)
	}
	h, err := bcrypt.GenerateFromPassword(password, cost)
	if err != nil {
		return "", fmt.Errorf("hash password: %w", err)
	}
	return string(h), nil
}
