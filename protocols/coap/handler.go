package coap

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"time"

	"github.com/plgd-dev/go-coap/v3/message"
	"github.com/plgd-dev/go-coap/v3/message/codes"
	"github.com/plgd-dev/go-coap/v3/message/pool"
	"github.com/plgd-dev/go-coap/v3/net/responsewriter"
	"github.com/plgd-dev/go-coap/v3/options/config"
	udpClient "github.com/plgd-dev/go-coap/v3/udp/client"

	"github.com/fleetgate/fleetgate/gateway"
)

// retryAfterSeconds is the Max-Age of a 5.03 answer: when an overloaded
// gateway wants the device to try again.
const retryAfterSeconds = 5

// observeTimeout bounds how long a request waits for the Observer, which
// may block for backpressure (a full uplink queue) and then refuses with
// gateway.ErrOverloaded: the device gets 5.03 before its first CoAP
// retransmission (ACK_TIMEOUT is 2 s), and a peer's handler goroutine is
// never held for long.
const observeTimeout = time.Second

// identityFunc names the device a transport authenticated on a peer
// connection, "" when the transport does not authenticate (plain UDP).
// A DTLS transport returns the PSK identity of the handshake.
type identityFunc func(cc *udpClient.Conn) string

func anonymous(*udpClient.Conn) string { return "" }

// processor returns the go-coap hook through which every datagram
// transport (UDP and, with identity from the handshake, DTLS) hands
// received messages to the front end.
//
// Requests are answered here directly rather than through go-coap's
// default path, for two reasons: go-coap answers a NON request with a CON
// response, which the device then has to acknowledge, where RFC 7252
// §5.2.3 prefers NON; and it caches every response per peer for
// EXCHANGE_LIFETIME (247 s) and scans that cache on each datagram. Both heartbeat operations are idempotent, so a duplicate is
// processed again instead (RFC 7252 §4.5 allows this relaxation) and the
// only per-peer state left is the connection the inactivity sweep evicts.
// Everything that is not a CON or NON request (responses, stray ACKs)
// still takes go-coap's path.
func (s *Server) processor(identity identityFunc) config.ProcessReceivedMessageFunc[*udpClient.Conn] {
	return func(req *pool.Message, cc *udpClient.Conn, next config.HandlerFunc[*udpClient.Conn]) {
		if !isRequest(req) {
			cc.ProcessReceivedMessageWithHandler(req, next)
			return
		}
		if !s.enter() {
			cc.ReleaseMessage(req)
			return
		}
		defer s.work.Done()
		cc.ProcessReceivedMessageWithHandler(req, func(w *responsewriter.ResponseWriter[*udpClient.Conn], r *pool.Message) {
			s.respond(w, r, cc, identity(cc))
		})
	}
}

// ignore is go-coap's handler for what processor passes on: messages
// that are not requests (a stray response, an ACK with a request code).
// Leaving the answer unset makes go-coap send nothing, or an empty ACK
// for a CON, instead of its default handler's 4.04 sent as a CON.
func ignore(*responsewriter.ResponseWriter[*udpClient.Conn], *pool.Message) {}

// isRequest reports a CON or NON message with a method code (class 0,
// 0.01 to 0.31).
func isRequest(m *pool.Message) bool {
	t := m.Type()
	return (t == message.Confirmable || t == message.NonConfirmable) &&
		m.Code() >= codes.GET && m.Code() < 32
}

// respond fills in the answer to request r: piggybacked on the ACK of a
// CON request, a NON message for a NON request.
func (s *Server) respond(w *responsewriter.ResponseWriter[*udpClient.Conn], r *pool.Message, cc *udpClient.Conn, identity string) {
	code, diag := s.answer(r.Context(), r, cc, identity)
	s.metrics.answered(code)
	var body io.ReadSeeker
	if diag != "" {
		body = strings.NewReader(diag)
	}
	resp := w.Message()
	// SetResponse refuses codes the request's No-Response option (RFC
	// 7967) suppresses; a CON request then still gets an empty ACK.
	suppressed := w.SetResponse(code, message.TextPlain, body) != nil
	switch {
	case suppressed && r.Type() == message.NonConfirmable:
		return
	case suppressed:
		resp.SetCode(codes.Empty)
		resp.SetToken(nil)
	case code == codes.Changed:
		resp.SetOptionUint32(message.MaxAge, s.maxAge.Load())
	case code == codes.ServiceUnavailable:
		resp.SetOptionUint32(message.MaxAge, retryAfterSeconds)
	}
	if r.Type() == message.Confirmable {
		resp.SetType(message.Acknowledgement)
		resp.SetMessageID(r.MessageID())
		return
	}
	resp.SetType(message.NonConfirmable)
	resp.SetMessageID(cc.GetMessageID())
}

// answer turns request r into evidence for the Observer and returns the
// code and diagnostic payload to answer with.
func (s *Server) answer(ctx context.Context, r *pool.Message, cc *udpClient.Conn, identity string) (codes.Code, string) {
	path, err := r.Path()
	if err != nil {
		path = "" // no Uri-Path, or one that cannot name /hb
	}
	var hb heartbeat
	queries, err := r.Queries()
	if err != nil {
		err = refuse(codes.BadRequest, "malformed Uri-Query")
	} else {
		hb, err = parseHeartbeat(r.Code(), path, queries, identity, s.allowAnon)
	}
	if err == nil {
		ev := gateway.Evidence{
			Device:     hb.device,
			Session:    hb.session,
			Kind:       hb.kind,
			ObservedAt: s.clock.Now(),
			Protocol:   "coap",
		}
		octx, cancel := context.WithTimeout(ctx, observeTimeout)
		err = s.obs.Observe(octx, ev)
		cancel()
		if err == nil {
			s.metrics.accepted(hb.kind)
			return codes.Changed, ""
		}
		err = fmt.Errorf("observe: %w", err)
	}
	code, diag := errorResponse(err)
	level := slog.LevelDebug
	if code == codes.InternalServerError {
		level = slog.LevelError
	}
	s.log.Log(ctx, level, "coap request refused", "code", codeLabel(code), "device", hb.device,
		"session", hb.session, "peer", cc.RemoteAddr().String(), "err", err)
	return code, diag
}
