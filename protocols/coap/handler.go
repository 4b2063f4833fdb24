package coap

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
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

// errDeviceRate refuses a device beyond its rate limit (4.29; its bucket
// gives a token back within a second, the Max-Age of the answer).
var errDeviceRate = errors.New("device request rate exceeded")

// decide turns a request (method, Uri-Path, Uri-Query options, and the
// device the transport authenticated, "" for none) into evidence for the
// Observer, which gets ctx (bounded by about observeTimeout), and returns
// the code and diagnostic payload to answer with, and the Max-Age of a
// 2.04: the heartbeat interval that fits the lease the device was
// granted (gateway.Timing.HeartbeatFor).
// A refusal also returns why (err) and what was understood (hb), for the
// caller to log with the peer.
func (s *Server) decide(ctx context.Context, method codes.Code, path string, queries []string, identity string, now time.Time) (codes.Code, string, uint32, heartbeat, error) {
	hb, err := parseHeartbeat(method, path, queries, identity, s.allowAnon)
	if err == nil && identity == "" && s.listed(hb.device) {
		// Anonymous access never covers a device of the devices file: it
		// must use its credentials (DTLS), also to renew or leave.
		err = refuse(codes.Unauthorized, "credentials required for this device")
	}
	if err == nil {
		// Per device, whichever endpoint (or DTLS session) it comes from.
		if ok, _ := s.devices.Allow(hb.device, now); !ok {
			return codes.TooManyRequests, "too many requests, retry after Max-Age", 0, hb, errDeviceRate
		}
		tm := s.timing.Load()
		var granted time.Duration // 0: presence.lease
		if hb.lease > 0 {
			granted = tm.Grant(hb.lease)
		}
		ev := gateway.Evidence{
			Device:     hb.device,
			Session:    hb.session,
			Kind:       hb.kind,
			ObservedAt: now,
			Protocol:   "coap",
			Lease:      granted,
			Anonymous:  identity == "", // bounded by the table's anonymous_max_devices
		}
		if err = s.obs.Observe(ctx, ev); err == nil {
			s.metrics.accepted(hb.kind)
			return codes.Changed, "", maxAgeSeconds(tm.HeartbeatFor(tm.Grant(granted))), hb, nil
		}
		err = fmt.Errorf("observe: %w", err)
	}
	code, diag := errorResponse(err)
	return code, diag, 0, hb, err
}

// logRefusal logs a refused request: at debug level when the device is
// at fault, as an error when the gateway is.
func (s *Server) logRefusal(code codes.Code, hb heartbeat, peer string, err error) {
	level := slog.LevelDebug
	if code == codes.InternalServerError {
		level = slog.LevelError
	}
	s.log.Log(s.ctx, level, "coap request refused", "code", codeLabel(code), "device", hb.device,
		"session", hb.session, "peer", peer, "err", err)
}

// listed reports whether device is in the credentials (the devices file).
func (s *Server) listed(device gateway.DeviceID) bool {
	c := s.creds.Load()
	return c != nil && c.Revision(device) != ""
}
