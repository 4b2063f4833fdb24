package coap

import (
	"errors"
	"log/slog"
	"strings"
	"time"

	"github.com/plgd-dev/go-coap/v3/message/codes"

	"github.com/fleetgate/fleetgate/gateway"
)

// retryAfterSeconds is the Max-Age of a 5.03 answer: when an overloaded
// gateway wants the device to try again.
const retryAfterSeconds = 5

// observeTimeout bounds how long a request waits for the Observer, which
// may block for backpressure (a full uplink queue) and then refuses with
// gateway.ErrOverloaded: the device gets 5.03 before its first CoAP
// retransmission (ACK_TIMEOUT is 2 s).
const observeTimeout = time.Second

// errDeviceRate refuses a device beyond its rate limit (4.29).
var errDeviceRate = errors.New("device request rate exceeded")

// admit turns a request (method, Uri-Path and Uri-Query options, and the
// device the transport authenticated, "" for none) read at now into what
// it asks for (parseRequest), refusing an anonymous request for a device
// of the devices file and a device beyond its rate (errDeviceRate). A
// refusal also returns what was understood, for the caller to log with
// the peer.
func (s *Server) admit(method codes.Code, path, queries []string, identity string, now time.Time) (intent, error) {
	rq, err := parseRequest(method, path, queries, identity, s.allowAnon, s.sink != nil, s.cmds != nil)
	if err != nil {
		return rq, err
	}
	if identity == "" && s.listed(rq.device) {
		// Anonymous access never covers a device of the devices file: it
		// must use its credentials (DTLS), also to renew or leave.
		return rq, refuse(codes.Unauthorized, "credentials required for this device")
	}
	// Per device, whichever endpoint (or DTLS session) it comes from.
	if ok, _ := s.devices.Allow(rq.device, now); !ok {
		return rq, errDeviceRate
	}
	return rq, nil
}

// logRefusal logs a refused request: at debug level when the device is
// at fault, as an error when the gateway is; and reports it to the
// Refusals as a refusal of the device it names (rq's, else claim: the
// DTLS identity or the d= query), if it names one.
func (s *Server) logRefusal(code codes.Code, rq intent, claim, peer string, err error) {
	level := slog.LevelDebug
	if code == codes.InternalServerError {
		level = slog.LevelError
	}
	s.log.Log(s.ctx, level, "coap request refused", "code", codeLabel(code), "device", rq.device,
		"session", rq.session, "peer", peer, "err", err)
	if rq.device != "" {
		claim = string(rq.device)
	}
	if claim == "" {
		return // no device: the request is only counted
	}
	s.refusals.Refuse(gateway.Refusal{
		Protocol: "coap", Device: claim, Reason: s.refusedAs(code, claim, err),
		Detail: codeLabel(code) + " " + err.Error(), Remote: peer, At: s.clock.Now(),
	})
}

// refusedAs is the gateway's reason for a request refused with code
// and err, of a client claiming device claim.
func (s *Server) refusedAs(code codes.Code, claim string, err error) string {
	switch code {
	case codes.Unauthorized:
		switch {
		case errors.Is(err, gateway.ErrUnauthorized):
			// A DTLS session whose identity a reload removed.
			return gateway.RefusedRevoked
		case s.listed(gateway.DeviceID(claim)):
			return gateway.RefusedBadCredentials
		}
		return gateway.RefusedUnknownDevice
	case codes.Forbidden:
		if errors.Is(err, gateway.ErrSessionLimit) {
			return gateway.RefusedLimit
		}
		return gateway.RefusedNotAuthorized
	case codes.TooManyRequests:
		return gateway.RefusedRate
	case codes.ServiceUnavailable:
		return gateway.RefusedOverloaded
	case codes.InternalServerError:
		return gateway.RefusedError
	}
	return gateway.RefusedBadRequest
}

// claimOf is the device a request claims: the DTLS identity, else its
// d= query; "" for none.
func claimOf(identity string, queries []string) string {
	if identity != "" {
		return identity
	}
	for _, q := range queries {
		if v, ok := strings.CutPrefix(q, "d="); ok {
			return v
		}
	}
	return ""
}

// deviceLease is device's own lease in the credentials (the devices
// file's lease), 0 when it has none.
func (s *Server) deviceLease(device gateway.DeviceID) time.Duration {
	c := s.creds.Load()
	if c == nil {
		return 0
	}
	return gateway.DeviceLease(c.Credentials, device)
}

// listed reports whether device is in the credentials (the devices file).
func (s *Server) listed(device gateway.DeviceID) bool {
	c := s.creds.Load()
	return c != nil && c.Revision(device) != ""
}
