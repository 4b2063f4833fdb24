package gateway

import (
	"context"
	"net/netip"
	"time"
)

// Observer takes evidence from a protocol front end (the session table
// implements it). An error means the evidence was refused: ErrInvalidDeviceID
// and ErrInvalidSessionID for bad input, ErrOverloaded when the gateway
// sheds load; front ends map them to protocol codes at the edge.
type Observer interface {
	Observe(ctx context.Context, ev Evidence) error
}

// Uplink takes the writes the session table decided to send centrally
// (after the throttle): connects, leaves, and renewals that move the
// deadline by at least renew_every. The uplink batches them per shard.
// Enqueue may block for backpressure until ctx is done.
type Uplink interface {
	Enqueue(ctx context.Context, ev Evidence) error
}

// Credentials checks device secrets (the devices file). Front ends ask it
// before any evidence exists: a device that fails it never becomes
// evidence. Both methods answer ErrUnauthorized for an unknown device and
// for a wrong secret alike, so that an error never tells which part was
// wrong; the implementation can be swapped at runtime (SIGHUP reload).
type Credentials interface {
	// CheckPassword verifies an MQTT password of device.
	CheckPassword(device DeviceID, password []byte) error
	// PSK returns the device named by a DTLS PSK identity and its key.
	PSK(identity []byte) (DeviceID, []byte, error)
	// Revision is an opaque value that changes whenever device's
	// credentials change (removed, a new key or password), and "" for a
	// device that is not listed. A listed device must always
	// authenticate: anonymous access never covers it. Front ends compare
	// revisions at a reload to end the sessions of revoked devices.
	Revision(device DeviceID) string
}

// SourceCredentials are Credentials whose password check also takes the
// address the client connects from, so that failed checks from one
// address do not hold up the device's checks from another (the devices
// file's backoff is kept per source address and device). A front end
// that knows the address checks with CheckPasswordFrom when its
// Credentials offer it.
type SourceCredentials interface {
	Credentials
	// CheckPasswordFrom verifies an MQTT password of device sent from
	// address from.
	CheckPasswordFrom(device DeviceID, from netip.Addr, password []byte) error
}

// LeaseCredentials are Credentials that also give devices a lease of
// their own (the devices file's lease): a front end holds the evidence of
// such a device for it (within Timing.Grant) when the device asks for
// none.
type LeaseCredentials interface {
	Credentials
	// Lease is device's lease, 0 when it has none.
	Lease(device DeviceID) time.Duration
}

// DeviceLease is device's own lease in c (LeaseCredentials), 0 when c
// gives none.
func DeviceLease(c Credentials, device DeviceID) time.Duration {
	if l, ok := c.(LeaseCredentials); ok {
		return l.Lease(device)
	}
	return 0
}

// Timing is the presence timing the front ends answer devices with
// (presence.lease, heartbeat_interval and max_lease); a reload hands the
// new one to every front end.
type Timing struct {
	Lease, HeartbeatInterval time.Duration
	// MaxLease is the longest lease a device may ask for (CoAP "l="); at
	// most Lease means none longer.
	MaxLease time.Duration
}

// Grant is the lease a device that asked for asked gets: Lease when it
// asked for no more, else asked up to MaxLease.
func (t Timing) Grant(asked time.Duration) time.Duration {
	return min(max(asked, t.Lease), max(t.MaxLease, t.Lease))
}

// HeartbeatFor is the heartbeat interval to ask of a device whose
// lease is lease: one that leaves the same margin before the lease ends
// as HeartbeatInterval leaves before Lease (HeartbeatInterval itself for
// Lease).
func (t Timing) HeartbeatFor(lease time.Duration) time.Duration {
	return lease - (t.Lease - t.HeartbeatInterval)
}
