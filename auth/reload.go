package auth

import (
	"fmt"
	"net/netip"
	"sync/atomic"
	"time"

	"github.com/fleetgate/fleetgate/gateway"
)

var (
	_ gateway.SourceCredentials = (*Reloadable)(nil)
	_ gateway.LeaseCredentials  = (*Reloadable)(nil)
)

// Reloadable holds the current devices set for front ends that keep
// running while the devices file changes: they keep the *Reloadable, and
// Reload (on SIGHUP) swaps the set atomically. A check in flight finishes
// with the set it started with. Make one with NewReloadable; it is safe
// for concurrent use.
type Reloadable struct {
	cur atomic.Pointer[Devices]
}

// NewReloadable returns a Reloadable holding d, which must not be nil.
func NewReloadable(d *Devices) *Reloadable {
	if d == nil {
		panic("auth: NewReloadable with a nil *Devices")
	}
	r := new(Reloadable)
	r.cur.Store(d)
	return r
}

// Current returns the set in use.
func (r *Reloadable) Current() *Devices { return r.cur.Load() }

// Reload loads the devices file at path and makes it the current set. If
// the file cannot be read or is invalid, or a device's lease is beyond b
// (CheckLeases), the current set stays in use and the error says so.
// Passwords verified before stay verified for the devices whose entry did
// not change.
func (r *Reloadable) Reload(path string, b LeaseBounds) error {
	d, err := Load(path)
	if err == nil {
		err = d.CheckLeases(b.Lease, b.MaxLease)
	}
	if err != nil {
		return fmt.Errorf("devices file not reloaded, keeping the %d devices in use:\n%w", r.Current().Len(), err)
	}
	r.Set(d)
	return nil
}

// Set makes d, which must not be nil, the current set (a reload of a
// set not read from a file: NewPasswords). As with Reload, passwords
// verified before stay verified, and wrong ones keep their backoff, for
// the entries that did not change.
func (r *Reloadable) Set(d *Devices) {
	if d == nil {
		panic("auth: Reloadable.Set with a nil *Devices")
	}
	r.Current().guard.carry(d)
	r.cur.Store(d)
}

// CheckPassword is Devices.CheckPassword on the current set.
func (r *Reloadable) CheckPassword(id gateway.DeviceID, password []byte) error {
	return r.Current().CheckPassword(id, password)
}

// CheckPasswordFrom is Devices.CheckPasswordFrom on the current set.
func (r *Reloadable) CheckPasswordFrom(id gateway.DeviceID, from netip.Addr, password []byte) error {
	return r.Current().CheckPasswordFrom(id, from, password)
}

// PSK is Devices.PSK on the current set.
func (r *Reloadable) PSK(identity []byte) (gateway.DeviceID, []byte, error) {
	return r.Current().PSK(identity)
}

// Lease is Devices.Lease on the current set.
func (r *Reloadable) Lease(id gateway.DeviceID) time.Duration { return r.Current().Lease(id) }

// Revision is Devices.Revision on the current set.
func (r *Reloadable) Revision(id gateway.DeviceID) string { return r.Current().Revision(id) }
