package coap

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/plgd-dev/go-coap/v3/message/codes"

	"github.com/fleetgate/fleetgate/gateway"
)

// HeartbeatPath is the one resource of the front end (docs/design.md §6.7).
const HeartbeatPath = "/hb"

// maxDiagnosticLen bounds the diagnostic payload of an error response so
// that a hostile request never makes the gateway echo much back.
const maxDiagnosticLen = 128

// heartbeat is what a valid request asks for: the evidence minus the
// time it was observed and the protocol.
type heartbeat struct {
	device  gateway.DeviceID
	session gateway.SessionID
	kind    gateway.Kind
	// lease is the lease a renewal asks for (l=<seconds>); 0 for none.
	lease time.Duration
}

// maxLeaseDigits bounds the digits of l=: more than a lease can be
// (presence.max_lease is at most a week) but no overflow.
const maxLeaseDigits = 9

// requestError refuses a request with a CoAP error code and a short
// diagnostic for the device.
type requestError struct {
	code codes.Code
	msg  string
}

func (e *requestError) Error() string { return e.msg }

func refuse(code codes.Code, format string, args ...any) error {
	return &requestError{code: code, msg: fmt.Sprintf(format, args...)}
}

// parseHeartbeat decides what a CoAP request means, without I/O: POST
// /hb is a renewal, DELETE /hb a leave. The device is identity (the DTLS
// PSK identity) when there is one, else the query d=<device> when
// anonymous devices are allowed; s=<instance> names the session
// ("coap/<instance>", "coap/default" without it); l=<seconds> asks for a
// longer lease for this renewal (a whole number of seconds, 1 or more;
// the server grants it up to presence.max_lease and ignores it on a
// leave). Queries other than d, s and l are ignored so that devices can
// send more later.
//
// A refusal is a *requestError (4.01, 4.03, 4.04, 4.05, or 4.00 for a
// malformed query) or wraps gateway.ErrInvalidDeviceID or
// gateway.ErrInvalidSessionID (4.00); errorResponse maps them.
func parseHeartbeat(method codes.Code, path string, queries []string, identity string, allowAnon bool) (heartbeat, error) {
	if path != HeartbeatPath {
		return heartbeat{}, refuse(codes.NotFound, "no resource here; use %s", HeartbeatPath)
	}
	var kind gateway.Kind
	switch method {
	case codes.POST:
		kind = gateway.Renew
	case codes.DELETE:
		kind = gateway.Leave
	default:
		return heartbeat{}, refuse(codes.MethodNotAllowed, "%s allows POST and DELETE", HeartbeatPath)
	}

	var device, instance, lease string
	var haveDevice, haveInstance, haveLease bool
	for _, q := range queries {
		key, value, _ := strings.Cut(q, "=")
		switch key {
		case "d":
			if haveDevice {
				return heartbeat{}, refuse(codes.BadRequest, "query d= given twice")
			}
			device, haveDevice = value, true
		case "s":
			if haveInstance {
				return heartbeat{}, refuse(codes.BadRequest, "query s= given twice")
			}
			instance, haveInstance = value, true
		case "l":
			if haveLease {
				return heartbeat{}, refuse(codes.BadRequest, "query l= given twice")
			}
			lease, haveLease = value, true
		}
	}
	var asked time.Duration
	if haveLease {
		n, err := strconv.ParseUint(lease, 10, 32)
		if err != nil || n == 0 || len(lease) > maxLeaseDigits {
			return heartbeat{}, refuse(codes.BadRequest, "query l=<seconds> wants a whole number of seconds from 1 to %d digits", maxLeaseDigits)
		}
		if kind == gateway.Renew {
			asked = time.Duration(n) * time.Second
		}
	}

	switch {
	case identity != "":
		if haveDevice && device != identity {
			return heartbeat{}, refuse(codes.Forbidden, "d= names another device than the credentials")
		}
		device = identity
	case !allowAnon:
		return heartbeat{}, refuse(codes.Unauthorized, "credentials required")
	case !haveDevice:
		return heartbeat{}, refuse(codes.BadRequest, "query d=<device> required")
	}

	dev, err := gateway.ParseDeviceID(device)
	if err != nil {
		return heartbeat{}, fmt.Errorf("device: %w", err)
	}
	if haveInstance && instance == "" {
		// An empty s= is not the same as none: it is a device bug.
		return heartbeat{}, fmt.Errorf("s=: %w: empty instance", gateway.ErrInvalidSessionID)
	}
	sess, err := gateway.InstanceSessionID("coap", instance)
	if err != nil {
		return heartbeat{}, fmt.Errorf("s=: %w", err)
	}
	return heartbeat{device: dev, session: sess, kind: kind, lease: asked}, nil
}

// errorResponse maps a refusal from parseHeartbeat or the Observer to the
// CoAP code and diagnostic payload the device gets. Errors that are not
// the device's fault get a generic diagnostic; the caller logs them.
func errorResponse(err error) (codes.Code, string) {
	var re *requestError
	switch {
	case errors.As(err, &re):
		return re.code, re.msg
	case errors.Is(err, gateway.ErrInvalidDeviceID), errors.Is(err, gateway.ErrInvalidSessionID):
		return codes.BadRequest, diagnostic(err.Error())
	case errors.Is(err, gateway.ErrSessionLimit):
		return codes.Forbidden, "too many sessions for this device"
	case errors.Is(err, gateway.ErrOverloaded):
		return codes.ServiceUnavailable, "overloaded, retry after Max-Age"
	}
	return codes.InternalServerError, "internal error"
}

// diagnostic cuts s to maxDiagnosticLen bytes of valid UTF-8 (a CoAP
// diagnostic payload is UTF-8 text).
func diagnostic(s string) string {
	if len(s) > maxDiagnosticLen {
		s = s[:maxDiagnosticLen]
	}
	return strings.ToValidUTF8(s, "")
}
