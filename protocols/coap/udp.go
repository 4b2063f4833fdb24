package coap

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"syscall"
	"time"

	"github.com/plgd-dev/go-coap/v3/message"
	"github.com/plgd-dev/go-coap/v3/message/codes"
	"github.com/plgd-dev/go-coap/v3/udp/coder"

	"github.com/fleetgate/fleetgate/gateway"
)

// maxOptions bounds the options of a decoded message; a request with more
// is refused with 4.00 (a heartbeat needs a handful).
const maxOptions = 32

// maxAnswer bounds an encoded answer without a command: header, token,
// three options and a diagnostic of at most maxDiagnosticLen bytes.
const maxAnswer = 4 + message.MaxTokenSize + 3*6 + 1 + maxDiagnosticLen

// worker is the scratch space of one goroutine reading the UDP socket or
// serving the data path, so that handling a datagram allocates little.
type worker struct {
	in      []byte // MaxMessageSize + 1, to tell an oversized datagram
	out     []byte // an answer: at most maxAnswer, or MaxMessageSize with a command
	opts    message.Options
	path    []string
	queries []string
	sc      scratch

	// ctx is the Observer's context, shared by the requests the worker
	// handles within observeSlack (see observeContext).
	ctx      context.Context
	cancel   context.CancelFunc
	deadline time.Time
}

// observeSlack is how long a worker reuses the Observer's context: the
// Observer gets between observeTimeout-observeSlack and observeTimeout,
// and a worker starts a timer every observeSlack instead of one per
// request (which cost a third of the request path).
const observeSlack = 100 * time.Millisecond

// observeContext returns a context derived from parent that ends in
// observeTimeout-observeSlack to observeTimeout from now.
func (w *worker) observeContext(parent context.Context) context.Context {
	now := time.Now()
	if w.ctx == nil || w.deadline.Sub(now) < observeTimeout-observeSlack {
		w.stop()
		w.deadline = now.Add(observeTimeout)
		w.ctx, w.cancel = context.WithDeadline(parent, w.deadline)
	}
	return w.ctx
}

// stop releases the worker's context.
func (w *worker) stop() {
	if w.cancel != nil {
		w.cancel()
	}
}

func (s *Server) newWorker() *worker {
	return &worker{
		in:      make([]byte, s.maxSize+1),
		out:     make([]byte, max(maxAnswer, s.maxSize)),
		opts:    make(message.Options, 0, maxOptions),
		path:    make([]string, 0, maxOptions),
		queries: make([]string, 0, maxOptions),
		sc:      scratch{opts: make(message.Options, 0, maxOptions)},
	}
}

// readLoop answers datagrams on the UDP socket until it is closed.
func (s *Server) readLoop() {
	w := s.newWorker()
	defer w.stop()
	for {
		n, src, err := s.udp.ReadFromUDPAddrPort(w.in)
		if errors.Is(err, net.ErrClosed) {
			return
		}
		if err != nil {
			// A read error on UDP concerns one datagram (a truncation
			// notice, an ICMP error queued on the socket); go on.
			s.log.Debug("coap read", "err", err)
			continue
		}
		out, j := s.handle(w, src, w.in[:n])
		if j != nil {
			if a := s.dispatch(w.observeContext(s.ctx), j); a != nil {
				out = s.encodeAnswer(w, j.ex, *a)
			}
		}
		if out != nil && !s.send(out, src) {
			return
		}
	}
}

// send writes answer out to dst; it returns false once the socket is
// closed.
func (s *Server) send(out []byte, dst netip.AddrPort) bool {
	if _, err := s.udp.WriteToUDPAddrPort(out, dst); err != nil {
		if errors.Is(err, net.ErrClosed) {
			return false
		}
		s.metrics.drop(dropWriteError)
		s.log.Debug("coap write", "peer", dst.String(), "err", err)
	}
	return true
}

// header is what can be read of a datagram that does not decode.
type header struct {
	typ   message.Type
	code  codes.Code
	mid   uint16
	token []byte
	ok    bool // the token is there too
}

func parseHeader(b []byte) header {
	h := header{
		typ:  message.Type(b[0] >> 4 & 3),
		code: codes.Code(b[1]),
		mid:  binary.BigEndian.Uint16(b[2:4]),
	}
	if tkl := int(b[0] & 0xf); tkl <= message.MaxTokenSize && len(b) >= 4+tkl {
		h.token, h.ok = b[4:4+tkl], true
	}
	return h
}

// isRequest reports a CON or NON message with a method code (class 0,
// 0.01 to 0.31).
func (h header) isRequest() bool {
	return (h.typ == message.Confirmable || h.typ == message.NonConfirmable) &&
		h.code >= codes.GET && h.code < 32
}

// handle decides the answer to datagram b from src, and returns it
// encoded in w.out, or nil when there is none; or it returns a data path
// request for dispatch, whose answer is then the data worker's. It is
// the whole UDP request path except the socket and the data workers:
// limits first, then the codec, then the request.
//
// Nothing proves that a plain UDP source receives at its address (it may
// be spoofed, to aim the answers at a victim), so no answer is larger
// than its request, and a datagram beyond a rate limit (of its source or
// of its device) gets none: it is only counted.
func (s *Server) handle(w *worker, src netip.AddrPort, b []byte) ([]byte, *job) {
	if len(b) < 4 || b[0]>>6 != 1 {
		// Not CoAP version 1: nothing to answer (RFC 7252 §3).
		s.metrics.drop(dropMalformed)
		return nil, nil
	}
	ex := udpExchange{header: parseHeader(b), limit: len(b)}
	now := s.clock.Now()
	if ok, _ := s.unproven.allow(src, now); !ok {
		s.metrics.drop(dropRateLimited)
		return nil, nil
	}
	if len(b) > s.maxSize {
		if !ex.isRequest() || !ex.ok {
			s.metrics.drop(dropOversized)
			return nil, nil
		}
		// RFC 7252 §5.9.2.9: Size1 tells the largest acceptable size.
		return s.encodeResponse(w, ex, answer{code: codes.RequestEntityTooLarge,
			diag: fmt.Sprintf("message larger than %d bytes", s.maxSize), opt: uintOption{message.Size1, uint32(s.maxSize)}}), nil
	}

	m := message.Message{Options: w.opts[:0]}
	if _, err := coder.DefaultCoder.Decode(b, &m); err != nil {
		switch {
		case errors.Is(err, message.ErrOptionsTooSmall) && ex.isRequest() && ex.ok:
			return s.encodeResponse(w, ex, answer{code: codes.BadRequest, diag: "too many options"}), nil
		case ex.typ == message.Confirmable:
			// RFC 7252 §4.2: a CON that does not parse is rejected with
			// a Reset.
			s.metrics.drop(dropMalformed)
			return s.encode(w, message.Message{Type: message.Reset, Code: codes.Empty, MessageID: int32(ex.mid)}), nil
		default:
			s.metrics.drop(dropMalformed)
			return nil, nil
		}
	}
	switch {
	case ex.isRequest():
	case m.Type == message.Confirmable && m.Code == codes.Empty:
		// A CoAP ping (RFC 7252 §4.3) is answered with a Reset.
		return s.encode(w, message.Message{Type: message.Reset, Code: codes.Empty, MessageID: m.MessageID}), nil
	case m.Type == message.Confirmable:
		// A stray CON response: acknowledged, and otherwise ignored.
		return s.encode(w, message.Message{Type: message.Acknowledgement, Code: codes.Empty, MessageID: m.MessageID}), nil
	default:
		s.metrics.drop(dropUnexpected)
		return nil, nil
	}
	if id, ok := unknownCritical(m.Options); ok {
		if m.Type == message.NonConfirmable {
			// RFC 7252 §5.4.1: a NON with an unrecognised critical option
			// is rejected without an answer.
			s.metrics.drop(dropBadOption)
			return nil, nil
		}
		return s.encodeResponse(w, ex, answer{code: codes.BadOption, diag: fmt.Sprintf("unrecognised critical option %d", id)}), nil
	}

	ex.noResponse, ex.hasNoResponse = noResponse(m.Options)
	path, queries := w.path[:0], w.queries[:0]
	for _, o := range m.Options {
		switch o.ID {
		case message.URIPath:
			path = append(path, pathSegment(o.Value))
		case message.URIQuery:
			queries = append(queries, string(o.Value))
		}
	}
	rq, err := s.admit(m.Code, path, queries, "", now)
	switch {
	case errors.Is(err, errDeviceRate):
		s.metrics.drop(dropRateLimited)
		s.refusals.Refuse(gateway.Refusal{Protocol: "coap", Device: string(rq.device), Reason: gateway.RefusedRate,
			Detail: "requests beyond limits.coap_requests_per_second (dropped, no answer)", Remote: src.String(), At: now})
		return nil, nil
	case err != nil:
		a := refusal(err)
		s.logRefusal(a.code, rq, claimOf("", queries), src.String(), err)
		return s.encodeAnswer(w, ex, a), nil
	}
	if s.viaWorkers(rq, now) {
		j := &job{rq: rq, anonymous: true, now: now, deadline: time.Now().Add(dataTimeout), src: src, ex: ex}
		if rq.data {
			cf, cfErr := m.Options.GetUint32(message.ContentFormat)
			j.msg = dataMessage(rq, m.Type, m.Payload, cf, cfErr == nil, now)
			if err := gateway.ValidateMessage(j.msg); err != nil {
				a, reason := publishRefusal(err)
				s.metrics.refused(reason)
				s.logRefusal(a.code, rq, "", src.String(), err)
				return s.encodeAnswer(w, ex, a), nil
			}
		}
		j.ex.token = append(message.Token(nil), ex.token...) // b is the reader's
		return nil, j
	}
	a, err := s.serve(w.observeContext(s.ctx), rq, nil, true, now, false)
	if err != nil {
		s.logRefusal(a.code, rq, "", src.String(), err)
	}
	return s.encodeAnswer(w, ex, a), nil
}

// pathSegment is a Uri-Path option's value as a string; those of the
// front end's resources without allocating.
func pathSegment(v []byte) string {
	switch string(v) {
	case HeartbeatPath[1:]:
		return HeartbeatPath[1:]
	case DataPath[1:]:
		return DataPath[1:]
	}
	return string(v)
}

// unknownCritical returns the first option of opts that is critical (odd
// number) and not one CoAP defines.
func unknownCritical(opts message.Options) (message.OptionID, bool) {
	for _, o := range opts {
		if _, known := message.CoapOptionDefs[o.ID]; o.ID&1 == 1 && !known {
			return o.ID, true
		}
	}
	return 0, false
}

// udpExchange is what the answer to a UDP request needs of it.
type udpExchange struct {
	header
	// noResponse is the request's No-Response option (RFC 7967).
	noResponse    uint32
	hasNoResponse bool
	// limit is the size of the request: no answer to it is larger.
	limit int
}

// noResponse is the value of the No-Response option of opts, if any.
func noResponse(opts message.Options) (uint32, bool) {
	v, err := opts.GetUint32(message.NoResponse)
	return v, err == nil
}

// suppressed reports whether the request's No-Response option asks for
// no answer with code: bit 2^(class-1) of its value (RFC 7967 §2).
func (ex udpExchange) suppressed(code codes.Code) bool {
	class := uint32(code) >> 5
	return ex.hasNoResponse && class > 0 && ex.noResponse&(1<<(class-1)) != 0
}

// encodeAnswer encodes answer a to request ex: piggybacked on the ACK of
// a CON, a NON for a NON. A code the request's No-Response option
// suppresses leaves a NON unanswered and a CON with an empty ACK.
func (s *Server) encodeAnswer(w *worker, ex udpExchange, a answer) []byte {
	if ex.suppressed(a.code) {
		s.metrics.answered(a.code)
		if ex.typ == message.NonConfirmable {
			return nil
		}
		return s.encode(w, message.Message{Type: message.Acknowledgement, Code: codes.Empty, MessageID: int32(ex.mid)})
	}
	return s.encodeResponse(w, ex, a)
}

// encodeResponse encodes and counts answer a to request ex in at most
// ex.limit bytes (answer.build: what does not fit is left out).
func (s *Server) encodeResponse(w *worker, ex udpExchange, a answer) []byte {
	s.metrics.answered(a.code)
	m := message.Message{Token: ex.token}
	if ex.typ == message.Confirmable {
		m.Type, m.MessageID = message.Acknowledgement, int32(ex.mid)
	} else {
		m.Type, m.MessageID = message.NonConfirmable, int32(uint16(s.mid.Add(1)))
	}
	s.metrics.carried(a.build(&m, ex.limit, &w.sc))
	return s.encode(w, m)
}

// encode marshals m into w.out; m is always small enough.
func (s *Server) encode(w *worker, m message.Message) []byte {
	n, err := coder.DefaultCoder.Encode(m, w.out)
	if err != nil {
		s.log.Error("coap encode", "err", err)
		return nil
	}
	return w.out[:n]
}

// receiveBufferSize reads SO_RCVBUF of c: what the kernel granted, which
// on Linux is twice the request capped at net.core.rmem_max.
func receiveBufferSize(c *net.UDPConn) (int, error) {
	rc, err := c.SyscallConn()
	if err != nil {
		return 0, fmt.Errorf("receive buffer: %w", err)
	}
	var size int
	var serr error
	if err := rc.Control(func(fd uintptr) {
		size, serr = syscall.GetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF)
	}); err != nil {
		return 0, fmt.Errorf("receive buffer: %w", err)
	}
	if serr != nil {
		return 0, fmt.Errorf("receive buffer: %w", serr)
	}
	return size, nil
}
