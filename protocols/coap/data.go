package coap

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"time"

	"github.com/plgd-dev/go-coap/v3/message"
	"github.com/plgd-dev/go-coap/v3/message/codes"

	"github.com/fleetgate/fleetgate/gateway"
)

// The data path's requests (POST /d, an acknowledgement a=, a renewal of
// a device with a pending command) wait for a disk: DataSink.Publish of
// a QoS 1 message returns once it is durable, and Commands.Ack removes a
// command from a durable queue. They are served by the data workers, not
// by the goroutines that read the UDP socket or the DTLS peers, so that
// a slow disk never holds up the heartbeats of other devices.
//
// A reader hands such a request to the worker of its device's shard
// (one device's requests keep their order) without waiting: when that
// worker's queue is full, a POST /d gets 5.03 at once, and a heartbeat
// is served as a plain heartbeat by the reader (its acknowledgement and
// its command wait for a later request). At most dataShards ×
// (dataShardQueue + 1) requests are queued or in a worker, each holding
// at most one message (limits.coap_max_message_size); the worker answers
// it itself (over plain UDP it writes to the socket; a DTLS peer waits
// for it), by dataTimeout after it was read.
//
// The queues take a burst of 4,000 data requests of as many devices (a
// fleet that wakes at once) with a disk that keeps up, and hold at most
// 4,160 × (limits.coap_max_message_size + 0.4 KB) when it does not: 6.5
// MB by default.
const (
	dataShards     = 64
	dataShardQueue = 64
	// dataTimeout bounds the time from reading a data path request to its
	// answer (the wait in the queue, the Observer, Publish, Ack): the
	// device gets 5.03 before its first CoAP retransmission (ACK_TIMEOUT
	// is 2 s), so a retransmitted CON is published again only when the
	// answer was lost (at least once).
	dataTimeout = 1500 * time.Millisecond
)

// job is a data path request handed to a data worker.
type job struct {
	rq intent
	// msg is the message of a POST /d.
	msg       gateway.Message
	anonymous bool
	// now is the clock's time when the request was read; deadline is the
	// wall-clock time by which it is answered.
	now      time.Time
	deadline time.Time
	// src is the request's source. The answer goes to done, for a DTLS
	// peer that waits for it, or else over plain UDP to src, as the answer
	// to ex.
	src  netip.AddrPort
	done chan<- answer
	ex   udpExchange
}

// peer is the job's source address for a log.
func (j *job) peer() string { return j.src.String() }

// shardOf is the data worker of device: FNV-1a of its ID.
func shardOf(device gateway.DeviceID) int {
	h := uint32(2166136261)
	for i := 0; i < len(device); i++ {
		h = (h ^ uint32(device[i])) * 16777619
	}
	return int(h % dataShards)
}

// newData makes the data workers' queues when there is a data path.
func (s *Server) newData() {
	if s.sink == nil && s.cmds == nil {
		return
	}
	s.shards = make([]chan *job, dataShards)
	for i := range s.shards {
		s.shards[i] = make(chan *job, dataShardQueue)
	}
}

// startData starts the data workers, one per queue; Serve ends them with
// stopData once no reader or DTLS peer can hand them a request any more.
func (s *Server) startData() {
	for _, ch := range s.shards {
		s.dataDone.Go(func() {
			w := s.newWorker()
			for j := range ch {
				s.runJob(w, j)
			}
		})
	}
}

// stopData closes the queues: the workers serve what is left (their
// contexts have ended) and return.
func (s *Server) stopData() {
	for _, ch := range s.shards {
		close(ch)
	}
	s.dataDone.Wait()
}

// viaWorkers reports whether request rq, made at now, is served by the
// data workers: a POST /d, an acknowledgement, or a renewal of a device
// with a pending command.
func (s *Server) viaWorkers(rq intent, now time.Time) bool {
	return rq.data || rq.ack != 0 ||
		(s.cmds != nil && rq.kind == gateway.Renew && len(s.cmds.Pending(rq.device, now, 1)) > 0)
}

// submit hands j to its device's data worker, unless that worker's
// queue is full.
func (s *Server) submit(j *job) bool {
	s.metrics.dataQueued.Inc() // before the worker can take it
	select {
	case s.shards[shardOf(j.rq.device)] <- j:
		return true
	default:
		s.metrics.dataQueued.Dec()
		return false
	}
}

// runJob serves j in a data worker and sends the answer.
func (s *Server) runJob(w *worker, j *job) {
	defer s.metrics.dataQueued.Dec()
	a := s.process(j)
	if j.done != nil {
		j.done <- a
		return
	}
	if out := s.encodeAnswer(w, j.ex, a); out != nil {
		s.send(out, j.src)
	}
}

// process serves data path request j and returns its answer.
func (s *Server) process(j *job) answer {
	if time.Now().After(j.deadline) {
		// It waited its time out in the queue: the disk is too slow.
		s.metrics.refused(refusedBusy)
		return busy()
	}
	ctx, cancel := context.WithDeadline(s.ctx, j.deadline)
	defer cancel()
	var msg *gateway.Message
	if j.rq.data {
		msg = &j.msg
	}
	a, err := s.serve(ctx, j.rq, msg, j.anonymous, j.now, s.cmds != nil)
	if err != nil {
		s.logRefusal(a.code, j.rq, "", j.peer(), err)
	}
	return a
}

// dispatch hands j to its data worker and returns nil, or, when the
// worker's queue is full, the answer to it: 5.03 to a POST /d; a
// heartbeat is served here all the same, without its acknowledgement and
// command (a later request carries them). ctx bounds the Observer.
func (s *Server) dispatch(ctx context.Context, j *job) *answer {
	if s.submit(j) {
		return nil
	}
	if j.rq.data {
		s.metrics.refused(refusedBusy)
		a := busy()
		return &a
	}
	rq := j.rq
	rq.ack = 0
	a, err := s.serve(ctx, rq, nil, j.anonymous, j.now, false)
	if err != nil {
		s.logRefusal(a.code, rq, "", j.peer(), err)
	}
	return &a
}

// busy is the answer to a data path request that found its worker's
// queue full, or waited there past dataTimeout.
func busy() answer {
	return answer{code: codes.ServiceUnavailable, diag: "busy, retry after Max-Age", opt: uintOption{message.MaxAge, retryAfterSeconds}}
}

// unavailable is the answer to a data path request that the DataSink or
// Commands failed (the queue's disk, its context).
func unavailable() answer {
	return answer{code: codes.ServiceUnavailable, diag: "data path unavailable, retry after Max-Age", opt: uintOption{message.MaxAge, retryAfterSeconds}}
}

// serve turns admitted request rq, read at now, into evidence for the
// Observer (ctx bounds the calls) and, once that is taken: with down,
// the acknowledgement of its command (Commands.Ack); its message msg
// (POST /d) for the DataSink; and, with down, the command its 2.04
// carries. It returns the answer, and why a refusal was made.
func (s *Server) serve(ctx context.Context, rq intent, msg *gateway.Message, anonymous bool, now time.Time, down bool) (answer, error) {
	tm := s.timing.Load()
	var granted time.Duration // 0: the table's (presence.lease, or the learned one)
	switch {
	case rq.lease > 0:
		granted = tm.Grant(rq.lease)
	case !anonymous:
		if l := s.deviceLease(rq.device); l > 0 {
			granted = tm.Grant(l)
		}
	}
	ev := gateway.Evidence{
		Device:     rq.device,
		Session:    rq.session,
		Kind:       rq.kind,
		ObservedAt: now,
		Protocol:   "coap",
		Lease:      granted,
		Anonymous:  anonymous, // bounded by the table's anonymous_max_devices
	}
	if err := s.obs.Observe(ctx, ev); err != nil {
		return refusal(err), fmt.Errorf("observe: %w", err)
	}
	s.metrics.accepted(rq.kind)
	if down && rq.ack != 0 {
		if err := s.cmds.Ack(rq.device, rq.ack); err != nil {
			s.metrics.refused(refusedUnavailable)
			return unavailable(), fmt.Errorf("acknowledge command %d: %w", rq.ack, err)
		}
		s.metrics.command(commandAcknowledged)
	}
	if msg != nil {
		if err := s.sink.Publish(ctx, []gateway.Message{*msg}); err != nil {
			a, reason := publishRefusal(err)
			s.metrics.refused(reason)
			return a, fmt.Errorf("publish: %w", err)
		}
		s.metrics.published(msg)
	}
	a := answer{code: codes.Changed, opt: uintOption{message.MaxAge, maxAgeSeconds(tm.HeartbeatFor(tm.Grant(granted)))}}
	if down && rq.kind == gateway.Renew {
		pick, drop := pickCommand(s.cmds.Pending(rq.device, now, pendingLookahead), now, s.maxSize)
		for _, c := range drop {
			// It would be sent again and again and never fit: only an
			// expiry would end it, and it holds up the commands behind it.
			if err := s.cmds.Ack(rq.device, c.ID); err != nil {
				s.log.Error("coap command that cannot fit the largest message not dropped", "device", rq.device, "command", c.ID, "err", err)
				continue
			}
			s.metrics.command(commandUndeliverable)
			s.log.Warn("coap command dropped: its answer cannot fit the largest message",
				"device", rq.device, "command", c.ID, "topic", c.Topic, "bytes", len(c.Payload), "max", s.maxSize)
		}
		a.cmd = pick
	}
	return a, nil
}

// dataMessage is the message of POST /d request rq read at now: its
// payload (copied), its Content-Format (cf when hasCF) named as a MIME
// type, QoS 1 for a CON (acknowledged once durable) and 0 for a NON.
func dataMessage(rq intent, typ message.Type, payload []byte, cf uint32, hasCF bool, now time.Time) gateway.Message {
	m := gateway.Message{
		Device:   rq.device,
		Topic:    rq.topic,
		Payload:  append([]byte(nil), payload...),
		Received: now,
		Source:   "coap",
	}
	if hasCF {
		m.ContentType = contentType(uint16(cf))
	}
	if typ == message.Confirmable {
		m.QoS = 1
	}
	return m
}

// publishRefusal is the answer to a message that the data path refused
// with err (gateway.ValidateMessage, DataSink.Publish), and the reason
// it is counted under: 4.00 for an invalid message, 4.13 for one too
// large, else 5.03 (the context ended, the queue failed or closed).
func publishRefusal(err error) (answer, refusedReason) {
	switch {
	case errors.Is(err, gateway.ErrTooLarge):
		return answer{code: codes.RequestEntityTooLarge, diag: "message too large for the data path"}, refusedTooLarge
	case errors.Is(err, gateway.ErrInvalidMessage):
		return answer{code: codes.BadRequest, diag: diagnostic(strings.ReplaceAll(err.Error(), "\n", ": "))}, refusedInvalid
	}
	return unavailable(), refusedUnavailable
}
