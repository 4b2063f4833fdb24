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
)

// maxOptions bounds the options of a decoded message; a request with more
// is refused with 4.00 (a heartbeat needs a handful).
const maxOptions = 32

// maxAnswer bounds an encoded answer: header, token, three options and a
// diagnostic of at most maxDiagnosticLen bytes.
const maxAnswer = 4 + message.MaxTokenSize + 3*6 + 1 + maxDiagnosticLen

// worker is the scratch space of one goroutine reading the UDP socket,
// so that handling a datagram allocates little.
type worker struct {
	in      []byte // MaxMessageSize + 1, to tell an oversized datagram
	out     []byte
	opts    message.Options
	queries []string
	val     [4]byte // the uint option value of an answer
	// limit is the size of the datagram being answered: no answer to it
	// is larger (encodeResponse).
	limit int

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
		out:     make([]byte, maxAnswer),
		opts:    make(message.Options, 0, maxOptions),
		queries: make([]string, 0, maxOptions),
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
		out := s.handle(w, src, w.in[:n])
		if out == nil {
			continue
		}
		if _, err := s.udp.WriteToUDPAddrPort(out, src); err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			s.metrics.drop(dropWriteError)
			s.log.Debug("coap write", "peer", src.String(), "err", err)
		}
	}
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
// encoded in w.out, or nil when there is none. It is the whole UDP
// request path except the socket: limits first, then the codec, then
// the heartbeat.
//
// Nothing proves that a plain UDP source receives at its address (it may
// be spoofed, to aim the answers at a victim), so no answer is larger
// than its request, and a datagram beyond a rate limit (of its source or
// of its device) gets none: it is only counted.
func (s *Server) handle(w *worker, src netip.AddrPort, b []byte) []byte {
	if len(b) < 4 || b[0]>>6 != 1 {
		// Not CoAP version 1: nothing to answer (RFC 7252 §3).
		s.metrics.drop(dropMalformed)
		return nil
	}
	w.limit = len(b)
	h := parseHeader(b)
	now := s.clock.Now()
	if ok, _ := s.unproven.allow(src, now); !ok {
		s.metrics.drop(dropRateLimited)
		return nil
	}
	if len(b) > s.maxSize {
		if !h.isRequest() || !h.ok {
			s.metrics.drop(dropOversized)
			return nil
		}
		// RFC 7252 §5.9.2.9: Size1 tells the largest acceptable size.
		return s.encodeResponse(w, h, codes.RequestEntityTooLarge,
			fmt.Sprintf("message larger than %d bytes", s.maxSize), message.Size1, uint32(s.maxSize))
	}

	m := message.Message{Options: w.opts[:0]}
	if _, err := coder.DefaultCoder.Decode(b, &m); err != nil {
		switch {
		case errors.Is(err, message.ErrOptionsTooSmall) && h.isRequest() && h.ok:
			return s.encodeResponse(w, h, codes.BadRequest, "too many options", 0, 0)
		case h.typ == message.Confirmable:
			// RFC 7252 §4.2: a CON that does not parse is rejected with
			// a Reset.
			s.metrics.drop(dropMalformed)
			return s.encode(w, message.Message{Type: message.Reset, Code: codes.Empty, MessageID: int32(h.mid)})
		default:
			s.metrics.drop(dropMalformed)
			return nil
		}
	}
	switch {
	case h.isRequest():
	case m.Type == message.Confirmable && m.Code == codes.Empty:
		// A CoAP ping (RFC 7252 §4.3) is answered with a Reset.
		return s.encode(w, message.Message{Type: message.Reset, Code: codes.Empty, MessageID: m.MessageID})
	case m.Type == message.Confirmable:
		// A stray CON response: acknowledged, and otherwise ignored.
		return s.encode(w, message.Message{Type: message.Acknowledgement, Code: codes.Empty, MessageID: m.MessageID})
	default:
		s.metrics.drop(dropUnexpected)
		return nil
	}
	if id, ok := unknownCritical(m.Options); ok {
		if m.Type == message.NonConfirmable {
			// RFC 7252 §5.4.1: a NON with an unrecognised critical option
			// is rejected without an answer.
			s.metrics.drop(dropBadOption)
			return nil
		}
		return s.encodeResponse(w, h, codes.BadOption, fmt.Sprintf("unrecognised critical option %d", id), 0, 0)
	}

	path := ""
	if isHeartbeatPath(m.Options) {
		path = HeartbeatPath
	}
	queries := w.queries[:0]
	for _, o := range m.Options {
		if o.ID == message.URIQuery {
			queries = append(queries, string(o.Value))
		}
	}
	code, diag, maxAge, hb, err := s.decide(w.observeContext(s.ctx), m.Code, path, queries, "", now)
	if errors.Is(err, errDeviceRate) {
		s.metrics.drop(dropRateLimited)
		return nil
	}
	if err != nil {
		s.logRefusal(code, hb, src.String(), err)
	}
	return s.encodeAnswer(w, &m, code, diag, maxAge)
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

// isHeartbeatPath reports whether the Uri-Path options spell exactly
// HeartbeatPath.
func isHeartbeatPath(opts message.Options) bool {
	n := 0
	for _, o := range opts {
		if o.ID != message.URIPath {
			continue
		}
		if n++; n > 1 || string(o.Value) != HeartbeatPath[1:] {
			return false
		}
	}
	return n == 1
}

// encodeAnswer encodes the answer to request r: piggybacked on the ACK
// of a CON, a NON for a NON. A code the request's No-Response option
// (RFC 7967) suppresses leaves a NON unanswered and a CON with an empty
// ACK.
func (s *Server) encodeAnswer(w *worker, r *message.Message, code codes.Code, diag string, maxAge uint32) []byte {
	if suppressed(r.Options, code) {
		s.metrics.answered(code)
		if r.Type == message.NonConfirmable {
			return nil
		}
		return s.encode(w, message.Message{Type: message.Acknowledgement, Code: codes.Empty, MessageID: r.MessageID})
	}
	h := header{typ: r.Type, mid: uint16(r.MessageID), token: r.Token, ok: true}
	switch code {
	case codes.Changed:
		return s.encodeResponse(w, h, code, "", message.MaxAge, maxAge)
	case codes.ServiceUnavailable:
		return s.encodeResponse(w, h, code, diag, message.MaxAge, retryAfterSeconds)
	}
	return s.encodeResponse(w, h, code, diag, 0, 0)
}

// suppressed reports whether the No-Response option of a request asks
// for no answer with code: bit 2^(class-1) of its value (RFC 7967 §2).
func suppressed(opts message.Options, code codes.Code) bool {
	v, err := opts.GetUint32(message.NoResponse)
	if err != nil {
		return false
	}
	class := uint32(code) >> 5
	return class > 0 && v&(1<<(class-1)) != 0
}

// encodeResponse encodes and counts the answer to request h with code,
// diagnostic diag (text/plain) and, unless opt is 0, option opt = val,
// in at most w.limit bytes: what does not fit is left out, the diagnostic
// first, then the option. The header and the request's token always fit.
func (s *Server) encodeResponse(w *worker, h header, code codes.Code, diag string, opt message.OptionID, val uint32) []byte {
	s.metrics.answered(code)
	m := message.Message{Token: h.token, Code: code, Options: w.opts[:0]}
	if h.typ == message.Confirmable {
		m.Type, m.MessageID = message.Acknowledgement, int32(h.mid)
	} else {
		m.Type, m.MessageID = message.NonConfirmable, int32(uint16(s.mid.Add(1)))
	}
	// Options in ascending number: Content-Format 12, Max-Age 14, Size1 60.
	if diag != "" {
		// text/plain is 0, which encodes as no bytes.
		m.Options = append(m.Options, message.Option{ID: message.ContentFormat})
		m.Payload = []byte(diag)
	}
	if opt != 0 {
		n, _ := message.EncodeUint32(w.val[:], val)
		m.Options = append(m.Options, message.Option{ID: opt, Value: w.val[:n]})
	}
	out := s.encode(w, m)
	if len(out) > w.limit && diag != "" {
		m.Options, m.Payload = m.Options[1:], nil
		out = s.encode(w, m)
	}
	if len(out) > w.limit && opt != 0 {
		m.Options = nil
		out = s.encode(w, m)
	}
	return out
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
