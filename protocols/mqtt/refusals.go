package mqtt

import (
	"errors"

	mochi "github.com/mochi-mqtt/server/v2"

	"github.com/fleetgate/fleetgate/gateway"
)

// denied is a CONNECT refused as not authorized, with why for the
// operator (gateway.Refusal): the client is told "not authorized" and
// nothing more.
type denied struct{ reason, detail string }

func (d *denied) Error() string { return "not authorized: " + d.detail }

// Is makes a denied errNotAuthorized.
func (d *denied) Is(target error) bool { return target == errNotAuthorized }

// The refusals of authorize and of the admission after it.
var (
	deniedUnknown     = &denied{gateway.RefusedUnknownDevice, "not in the devices file, and anonymous access is off"}
	deniedNoPassword  = &denied{gateway.RefusedBadCredentials, "no password, and the device is in the devices file"}
	deniedPassword    = &denied{gateway.RefusedBadCredentials, "wrong password (or no password_bcrypt in the devices file)"}
	deniedWill        = &denied{gateway.RefusedNotAuthorized, "will topic outside the device's topic subtree (or in its command subtree)"}
	deniedRevokedRace = &denied{gateway.RefusedRevoked, "a devices file reload changed its credentials during the check"}
)

// deniedOf is why err (of authorize or the admission) refused a
// CONNECT.
func deniedOf(err error) *denied {
	if d, ok := errors.AsType[*denied](err); ok {
		return d
	}
	return &denied{gateway.RefusedNotAuthorized, err.Error()}
}

// refusedAs is the gateway's reason for a refusal this front end counts
// under reason (fleetgate_mqtt_refused_total's finer ones).
var refusedAs = map[string]string{
	reasonInvalidClientID: gateway.RefusedBadRequest,
	reasonNotAuthorized:   gateway.RefusedNotAuthorized,
	reasonMaxClients:      gateway.RefusedLimit,
	reasonRate:            gateway.RefusedRate,
	reasonOverloaded:      gateway.RefusedOverloaded,
	reasonError:           gateway.RefusedError,
	reasonTooSlow:         gateway.RefusedLimit,
	reasonSessionLimit:    gateway.RefusedLimit,
	reasonRevoked:         gateway.RefusedRevoked,
	reasonAnonymousRate:   gateway.RefusedRate,
	reasonAnonymousLimit:  gateway.RefusedLimit,
}

// refused counts a refusal of the client claiming device (counted under
// this front end's reason) and reports it to the Refusals: as as the
// gateway's reason ("" for refusedAs[reason]).
func (s *Server) refused(reason, as, device, remote, detail string) {
	s.metrics.refuse(reason)
	if as == "" {
		as = refusedAs[reason]
	}
	s.refusals.Refuse(gateway.Refusal{
		Protocol: "mqtt", Device: device, Reason: as, Detail: detail, Remote: remote, At: s.clock.Now(),
	})
}

// aclRefused reports a device's PUBLISH or SUBSCRIBE refused by the
// ACL (counted by the caller in fleetgate_mqtt_messages_refused_total).
func (s *Server) aclRefused(cl *mochi.Client, c *conn, detail string) {
	if c.session == "" {
		return // a local client, or no admitted device
	}
	s.refusals.Refuse(gateway.Refusal{
		Protocol: "mqtt", Device: string(c.device), Reason: gateway.RefusedNotAuthorized, Detail: detail,
		Remote: cl.Net.Remote, At: s.clock.Now(),
	})
}
