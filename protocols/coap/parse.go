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

// The resources of the front end (docs/design.md §6.7): HeartbeatPath
// always, DataPath with a DataSink.
const (
	HeartbeatPath = "/hb"
	DataPath      = "/d"
)

// maxDiagnosticLen bounds the diagnostic payload of an error response so
// that a hostile request never makes the gateway echo much back.
const maxDiagnosticLen = 128

// intent is what a valid request asks for: the evidence minus the
// time it was observed and the protocol, and what it does on the data
// path.
type intent struct {
	device  gateway.DeviceID
	session gateway.SessionID
	kind    gateway.Kind
	// lease is the lease a renewal asks for (l=<seconds>); 0 for none.
	lease time.Duration
	// data is set for POST /d: the request's payload is a message of the
	// device with topic (its Uri-Path after "d", joined by "/").
	data  bool
	topic string
	// ack is the command the device acknowledges (a=<id>); 0 for none.
	ack uint64
}

// maxLeaseDigits bounds the digits of l=: more than a lease can be
// (presence.max_lease is at most a week) but no overflow.
const maxLeaseDigits = 9

// maxAckDigits bounds the digits of a=: every uint64.
const maxAckDigits = 20

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

// parseRequest decides what a CoAP request means, without I/O. path is
// its Uri-Path options, queries its Uri-Query options.
//
// POST /hb is a renewal, DELETE /hb a leave. With up (a DataSink), POST
// /d/<level>/... is a renewal too that carries a message: each Uri-Path
// option after "d" is one topic level (non-empty, without "/", "+", "#"
// or NUL; the first not starting with "$"). The device is identity (the
// DTLS PSK identity) when there is one, else the query d=<device> when
// anonymous devices are allowed; s=<instance> names the session
// ("coap/<instance>", "coap/default" without it); l=<seconds> asks for a
// longer lease for this renewal (a whole number of seconds, 1 or more;
// the server grants it up to presence.max_lease and ignores it on a
// leave). With down (Commands), a=<id> acknowledges the device's command
// id (a decimal number from 1), on any of these requests. Queries other
// than d, s, l and a are ignored so that devices can send more later; a
// without down is one of them.
//
// A refusal is a *requestError (4.01, 4.03, 4.04, 4.05, or 4.00 for a
// malformed query or topic) or wraps gateway.ErrInvalidDeviceID or
// gateway.ErrInvalidSessionID (4.00); errorResponse maps them.
func parseRequest(method codes.Code, path, queries []string, identity string, allowAnon, up, down bool) (intent, error) {
	var rq intent
	switch {
	case len(path) == 1 && path[0] == HeartbeatPath[1:]:
		switch method {
		case codes.POST:
			rq.kind = gateway.Renew
		case codes.DELETE:
			rq.kind = gateway.Leave
		default:
			return intent{}, refuse(codes.MethodNotAllowed, "%s allows POST and DELETE", HeartbeatPath)
		}
	case up && len(path) > 0 && path[0] == DataPath[1:]:
		if method != codes.POST {
			return intent{}, refuse(codes.MethodNotAllowed, "%s allows POST", DataPath)
		}
		topic, err := topicOf(path[1:])
		if err != nil {
			return intent{}, err
		}
		rq.kind, rq.data, rq.topic = gateway.Renew, true, topic
	case up:
		return intent{}, refuse(codes.NotFound, "no resource here; use %s or %s", HeartbeatPath, DataPath)
	default:
		return intent{}, refuse(codes.NotFound, "no resource here; use %s", HeartbeatPath)
	}

	var device, instance, lease, ack string
	var haveDevice, haveInstance, haveLease, haveAck bool
	for _, q := range queries {
		key, value, _ := strings.Cut(q, "=")
		switch {
		case key == "d":
			if haveDevice {
				return intent{}, refuse(codes.BadRequest, "query d= given twice")
			}
			device, haveDevice = value, true
		case key == "s":
			if haveInstance {
				return intent{}, refuse(codes.BadRequest, "query s= given twice")
			}
			instance, haveInstance = value, true
		case key == "l":
			if haveLease {
				return intent{}, refuse(codes.BadRequest, "query l= given twice")
			}
			lease, haveLease = value, true
		case key == "a" && down:
			if haveAck {
				return intent{}, refuse(codes.BadRequest, "query a= given twice")
			}
			ack, haveAck = value, true
		}
	}
	if haveLease {
		n, err := strconv.ParseUint(lease, 10, 32)
		if err != nil || n == 0 || len(lease) > maxLeaseDigits {
			return intent{}, refuse(codes.BadRequest, "query l=<seconds> wants a whole number of seconds from 1 to %d digits", maxLeaseDigits)
		}
		if rq.kind == gateway.Renew {
			rq.lease = time.Duration(n) * time.Second
		}
	}
	if haveAck {
		n, err := strconv.ParseUint(ack, 10, 64)
		if err != nil || n == 0 || len(ack) > maxAckDigits {
			return intent{}, refuse(codes.BadRequest, "query a=<id> wants a command id, a whole number from 1")
		}
		rq.ack = n
	}

	switch {
	case identity != "":
		if haveDevice && device != identity {
			return intent{}, refuse(codes.Forbidden, "d= names another device than the credentials")
		}
		device = identity
	case !allowAnon:
		return intent{}, refuse(codes.Unauthorized, "credentials required")
	case !haveDevice:
		return intent{}, refuse(codes.BadRequest, "query d=<device> required")
	}

	dev, err := gateway.ParseDeviceID(device)
	if err != nil {
		return intent{}, fmt.Errorf("device: %w", err)
	}
	if haveInstance && instance == "" {
		// An empty s= is not the same as none: it is a device bug.
		return intent{}, fmt.Errorf("s=: %w: empty instance", gateway.ErrInvalidSessionID)
	}
	sess, err := gateway.InstanceSessionID("coap", instance)
	if err != nil {
		return intent{}, fmt.Errorf("s=: %w", err)
	}
	rq.device, rq.session = dev, sess
	return rq, nil
}

// topicOf joins the Uri-Path options after "d" into a topic below the
// device's root, each option one level: "" for none.
func topicOf(levels []string) (string, error) {
	for i, l := range levels {
		switch {
		case l == "":
			return "", refuse(codes.BadRequest, "empty topic level %d in %s/...", i+1, DataPath)
		case strings.ContainsAny(l, "/+#\x00"):
			return "", refuse(codes.BadRequest, "topic level %d has /, +, # or NUL", i+1)
		}
	}
	topic := strings.Join(levels, "/")
	if !gateway.ValidTopicRest(topic) {
		// What is left: a first level starting with $, or too long.
		return "", refuse(codes.BadRequest, "topic must not start with $ nor pass 1024 bytes")
	}
	return topic, nil
}

// errorResponse maps a refusal from parseRequest or the Observer to the
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
