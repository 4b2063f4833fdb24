package gatewaytest

import (
	"sync/atomic"

	"github.com/fleetgate/fleetgate/gateway"
)

// Credentials is a gateway.Credentials whose devices a test replaces with
// Set, as a SIGHUP reload of the devices file does in production (the
// front ends hold one Credentials and ask it at every check).
type Credentials struct {
	cur atomic.Pointer[gateway.Credentials]
}

var _ gateway.Credentials = (*Credentials)(nil)

// NewCredentials returns Credentials answering from c.
func NewCredentials(c gateway.Credentials) *Credentials {
	s := &Credentials{}
	s.Set(c)
	return s
}

// Set makes later checks answer from c.
func (s *Credentials) Set(c gateway.Credentials) { s.cur.Store(&c) }

// CheckPassword asks the current devices.
func (s *Credentials) CheckPassword(d gateway.DeviceID, password []byte) error {
	return (*s.cur.Load()).CheckPassword(d, password)
}

// PSK asks the current devices.
func (s *Credentials) PSK(identity []byte) (gateway.DeviceID, []byte, error) {
	return (*s.cur.Load()).PSK(identity)
}

// Revision asks the current devices.
func (s *Credentials) Revision(d gateway.DeviceID) string {
	return (*s.cur.Load()).Revision(d)
}
