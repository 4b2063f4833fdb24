package coap

import (
	"context"
	"errors"
	"net"

	"github.com/plgd-dev/go-coap/v3/message"
	"github.com/plgd-dev/go-coap/v3/message/codes"
	"github.com/plgd-dev/go-coap/v3/message/pool"
	"github.com/plgd-dev/go-coap/v3/net/responsewriter"
	"github.com/plgd-dev/go-coap/v3/udp/coder"
)

// The record layer's workers answer the records the gate takes from
// parked sessions (park.go): a fixed set of goroutines, as many as the
// UDP readers and for the same reason (an Observer that applies
// backpressure holds one for up to observeTimeout), so that the gate's
// read loop never waits for an answer and no goroutine is started per
// device.

// answerParkedRecords runs the record layer's workers until the gate's
// listener is closed.
func (s *Server) answerParkedRecords(g *gate) {
	for range udpReaders() {
		go func() {
			for {
				select {
				case r := <-g.records:
					s.serveParked(g, r)
				case <-g.done:
					return
				}
			}
		}()
	}
}

// serveParked answers, refuses or hands to a resumption record r of a
// parked session, and parks the session again unless it resumes or its
// device was revoked.
func (s *Server) serveParked(g *gate, r parkedRecord) {
	if !s.enter() {
		return
	}
	defer s.work.Done()
	seq, plain, err := openRecord(&r.session.keys, &r.session.state, r.datagram)
	switch {
	case errors.Is(err, errReplayedRecord):
		s.metrics.parkedRefused[parkedReplayed].Inc()
		g.putBack(r.from, r.session, false)
		return
	case errors.Is(err, errUnauthenticRecord):
		s.metrics.parkedRefused[parkedUnauthentic].Inc()
		g.putBack(r.from, r.session, false)
		return
	case err != nil:
		g.fallBack(r.from, r.session, r.datagram)
		return
	}
	req, ok := parkedRequest(s.ctx, plain, s.maxSize)
	if !ok {
		g.fallBack(r.from, r.session, r.datagram)
		return
	}
	peer := net.UDPAddrFromAddrPort(r.from)
	if refuseRevoked(s.refusals, s.credentials(), r.session, peer.String(), s.clock.Now()) {
		return // not parked again
	}
	rec, err := s.answerParked(&r, req, peer)
	if err != nil {
		s.log.Debug("coap dtls parked session: no answer", "peer", peer, "err", err)
	}
	r.session.state.RemoteSequenceNumber = seq + 1
	r.session.at = s.clock.Now()
	// Parked again before the answer leaves, so that the device's next
	// record, sent as soon as the answer arrives, finds it.
	g.putBack(r.from, r.session, true)
	s.metrics.parkedAnswered.Inc()
	if rec == nil {
		return
	}
	if _, err := g.sock.WriteToUDPAddrPort(rec, r.from); err != nil {
		s.metrics.drop(dropWriteError)
	}
}

// answerParked answers request req of parked session r at peer, as a
// live session would (respondDTLS), and returns the answer sealed in a
// record numbered with the session's next number, which it takes (nil:
// no answer, a NON whose No-Response option suppresses it).
func (s *Server) answerParked(r *parkedRecord, req *pool.Message, peer *net.UDPAddr) ([]byte, error) {
	resp := pool.NewMessage(req.Context())
	resp.SetToken(req.Token())
	w := responsewriter.New(resp, parkedConn{}, req.Options()...)
	respondDTLS(s, w, req, peer, r.session.state.IdentityHint, s.nextMID)
	if !resp.IsModified() {
		return nil, nil
	}
	out, err := resp.MarshalWithEncoder(coder.DefaultCoder)
	if err != nil {
		return nil, err
	}
	st := &r.session.state
	rec, err := sealRecord(&r.session.keys, st.LocalEpoch, st.SequenceNumber, out)
	if err != nil {
		return nil, err
	}
	st.SequenceNumber++
	return rec, nil
}

// nextMID numbers the NON answers of parked sessions, which keep no
// message ID counter of their own (as plain UDP's answers).
func (s *Server) nextMID() int32 { return int32(uint16(s.mid.Add(1))) }

// parkedRequest decodes plaintext b as a request a parked session
// answers itself (answeredParked), unless it is larger than maxSize (the
// live session's 4.13 answers it). ctx is the request's context.
func parkedRequest(ctx context.Context, b []byte, maxSize int) (*pool.Message, bool) {
	if len(b) > maxSize {
		return nil, false
	}
	m := pool.NewMessage(ctx)
	if _, err := m.UnmarshalWithDecoder(coder.DefaultCoder, b); err != nil {
		return nil, false
	}
	return m, answeredParked(m.Type(), m.Code(), m.Options())
}

// answeredParked reports whether a parked session answers a request of
// type typ and code with options opts itself: a heartbeat, POST /hb (a
// renewal, with any queries), CON or NON. Everything else needs what
// only a live session has (go-coap's handling of other requests and of
// responses, pings, resets) and resumes it.
func answeredParked(typ message.Type, code codes.Code, opts message.Options) bool {
	if (typ != message.Confirmable && typ != message.NonConfirmable) || code != codes.POST {
		return false
	}
	var path []string
	for _, o := range opts {
		if o.ID == message.URIPath {
			path = append(path, string(o.Value))
		}
	}
	return len(path) == 1 && path[0] == "hb"
}

// parkedConn is the go-coap connection a parked session's answer is
// written for: it has no messages of its own to release.
type parkedConn struct{}

var _ responsewriter.Client = parkedConn{}

// ReleaseMessage does nothing: the record layer's messages are not
// pooled.
func (parkedConn) ReleaseMessage(*pool.Message) {}
