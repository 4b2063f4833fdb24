package coap

import (
	"fmt"

	"github.com/plgd-dev/go-coap/v3/message/codes"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/fleetgate/fleetgate/gateway"
	"github.com/fleetgate/fleetgate/internal/promshare"
)

// metrics are the front end's Prometheus counters.
type metrics struct {
	evidence map[gateway.Kind]prometheus.Counter
	requests *prometheus.CounterVec
	// byCode holds the request counter of each code in answeredCodes,
	// so that the hot path does no label hashing.
	byCode  map[codes.Code]prometheus.Counter
	dropped map[dropReason]prometheus.Counter
	rcvbuf  prometheus.Gauge
	// dtlsPeers counts the DTLS peers holding a slot (proven by the
	// cookie round trip).
	dtlsPeers prometheus.Gauge
	// helloVerify counts the DTLS gate's stateless HelloVerifyRequests.
	helloVerify prometheus.Counter
	// dtlsParked counts the parked DTLS sessions, dtlsResumed the
	// resumptions of parked sessions (park.go: a pion connection
	// rebuilt), parkedAnswered the records the parked sessions answered
	// themselves and parkedRefused those they refused (parked.go).
	dtlsParked     prometheus.Gauge
	dtlsResumed    prometheus.Counter
	parkedAnswered prometheus.Counter
	parkedRefused  map[parkedRefusal]prometheus.Counter

	// The data path: messages and their payload bytes handed to the
	// DataSink by QoS, commands by what became of them, data path
	// requests refused by reason, and those queued for a data worker.
	dataMessages [2]prometheus.Counter
	dataBytes    [2]prometheus.Counter
	commands     map[commandResult]prometheus.Counter
	dataRefused  map[refusedReason]prometheus.Counter
	dataQueued   prometheus.Gauge
}

// commandResult says what became of a command at the front end.
type commandResult string

// The results a command is counted under.
const (
	commandDelivered     commandResult = "delivered"     // carried by an answer (again until acknowledged)
	commandWaiting       commandResult = "waiting"       // too large for the request: its marker (Size2) was sent instead
	commandAcknowledged  commandResult = "acknowledged"  // a device's a= taken (Commands.Ack)
	commandUndeliverable commandResult = "undeliverable" // dropped: its answer cannot fit the largest message
)

var commandResults = []commandResult{commandDelivered, commandWaiting, commandAcknowledged, commandUndeliverable}

// refusedReason says why the data path refused a request.
type refusedReason string

// The reasons a data path request is refused.
const (
	refusedInvalid     refusedReason = "invalid"     // 4.00: the message is invalid (gateway.ErrInvalidMessage)
	refusedTooLarge    refusedReason = "too_large"   // 4.13: larger than the data path takes (gateway.ErrTooLarge)
	refusedBusy        refusedReason = "busy"        // 5.03: its data worker's queue was full, or it waited there past dataTimeout
	refusedUnavailable refusedReason = "unavailable" // 5.03: Publish or Ack failed (the queue's disk, its context)
)

var refusedReasons = []refusedReason{refusedInvalid, refusedTooLarge, refusedBusy, refusedUnavailable}

// dropReason says why a datagram got no answer.
type dropReason string

// The reasons a datagram is dropped without an answer; each is counted.
const (
	dropMalformed   dropReason = "malformed"    // not CoAP, or a NON that does not decode
	dropOversized   dropReason = "oversized"    // beyond the size limit, and no request to answer 4.13
	dropRateLimited dropReason = "rate_limited" // plain UDP beyond the source's or the device's rate, or a DTLS handshake beyond its source's
	dropBadOption   dropReason = "bad_option"   // a NON request with an unknown critical option
	dropUnexpected  dropReason = "unexpected"   // an ACK, RST or NON response: the server sends no CON
	dropWriteError  dropReason = "write_error"  // the answer could not be sent
	dropHandshake   dropReason = "handshake"    // a DTLS handshake failed or timed out
	dropDTLSBusy    dropReason = "dtls_busy"    // a proven DTLS ClientHello beyond its address's handshakes or the peer slots; a parked session's record beyond the record layer's queue or without a slot to resume
)

var dropReasons = []dropReason{
	dropMalformed, dropOversized, dropRateLimited, dropBadOption,
	dropUnexpected, dropWriteError, dropHandshake, dropDTLSBusy,
}

// parkedRefusal says why a parked DTLS session refused a record.
type parkedRefusal string

// The reasons a parked session refuses a record; each is counted.
const (
	parkedUnauthentic parkedRefusal = "authentication" // forged, corrupted or truncated: it does not authenticate
	parkedReplayed    parkedRefusal = "replay"         // numbered at or below a record the session accepted
)

var parkedRefusals = []parkedRefusal{parkedUnauthentic, parkedReplayed}

// answeredCodes are the codes the handler answers with.
var answeredCodes = []codes.Code{
	codes.Changed, codes.BadRequest, codes.Unauthorized, codes.Forbidden,
	codes.BadOption, codes.NotFound, codes.MethodNotAllowed, codes.RequestEntityTooLarge,
	codes.TooManyRequests, codes.InternalServerError, codes.ServiceUnavailable,
}

// newMetrics builds the counters and registers them with reg (nil: not
// registered).
func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	evidence := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name:        "fleetgate_evidence_total",
		Help:        "Evidence accepted by the gateway from protocol front ends, by kind.",
		ConstLabels: prometheus.Labels{"protocol": "coap"},
	}, []string{"kind"})
	requests := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "fleetgate_coap_requests_total",
		Help: "CoAP requests answered by the front end, by response code.",
	}, []string{"code"})
	dropped := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "fleetgate_coap_dropped_total",
		Help: "CoAP datagrams and DTLS peers dropped without an answer, by reason.",
	}, []string{"reason"})
	rcvbuf := prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "fleetgate_coap_receive_buffer_bytes",
		Help: "Receive buffer the kernel granted the CoAP UDP socket.",
	})
	dtlsPeers := prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "fleetgate_coap_dtls_peers",
		Help: "DTLS peers holding a peer slot: past the cookie round trip, not yet closed.",
	})
	helloVerify := prometheus.NewCounter(prometheus.CounterOpts{
		Name: "fleetgate_coap_dtls_hello_verify_total",
		Help: "HelloVerifyRequests sent to DTLS ClientHellos without a valid cookie (stateless: no peer state).",
	})
	dtlsParked := prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "fleetgate_coap_dtls_parked",
		Help: "DTLS sessions closed for idleness and kept as their exported state, for the device's next record to resume without a handshake.",
	})
	dtlsResumed := prometheus.NewCounter(prometheus.CounterOpts{
		Name: "fleetgate_coap_dtls_resumed_total",
		Help: "Parked DTLS sessions resumed by a record of the device (no handshake).",
	})
	parkedAnswered := prometheus.NewCounter(prometheus.CounterOpts{
		Name: "fleetgate_coap_dtls_parked_answered_total",
		Help: "Requests (heartbeats) answered by parked DTLS sessions with their parked keys, without a pion connection.",
	})
	parkedRefused := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "fleetgate_coap_dtls_parked_refused_total",
		Help: "Records refused by parked DTLS sessions, by reason (authentication, replay).",
	}, []string{"reason"})
	dataMessages := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "fleetgate_coap_data_messages_total",
		Help: "Device messages (POST /d) the CoAP front end handed to the data path, by QoS (1: CON, acknowledged once durable; 0: NON).",
	}, []string{"qos"})
	dataBytes := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "fleetgate_coap_data_bytes_total",
		Help: "Payload bytes of the device messages the CoAP front end handed to the data path, by QoS.",
	}, []string{"qos"})
	commands := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "fleetgate_coap_commands_total",
		Help: "Commands to CoAP devices by what became of them: delivered (in an answer, again until acknowledged), waiting (a marker instead: too large for the request), acknowledged (a=), undeliverable (dropped: too large for any message).",
	}, []string{"result"})
	dataRefused := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "fleetgate_coap_data_refused_total",
		Help: "CoAP data path requests refused, by reason (invalid, too_large, busy, unavailable).",
	}, []string{"reason"})
	dataQueued := prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "fleetgate_coap_data_queued",
		Help: "CoAP data path requests queued for or in a data worker.",
	})
	var err error
	if dataMessages, err = promshare.Register(reg, dataMessages); err != nil {
		return nil, err
	}
	if dataBytes, err = promshare.Register(reg, dataBytes); err != nil {
		return nil, err
	}
	if commands, err = promshare.Register(reg, commands); err != nil {
		return nil, err
	}
	if dataRefused, err = promshare.Register(reg, dataRefused); err != nil {
		return nil, err
	}
	if dataQueued, err = promshare.Register(reg, dataQueued); err != nil {
		return nil, err
	}
	if dtlsPeers, err = promshare.Register(reg, dtlsPeers); err != nil {
		return nil, err
	}
	if helloVerify, err = promshare.Register(reg, helloVerify); err != nil {
		return nil, err
	}
	if dtlsParked, err = promshare.Register(reg, dtlsParked); err != nil {
		return nil, err
	}
	if dtlsResumed, err = promshare.Register(reg, dtlsResumed); err != nil {
		return nil, err
	}
	if parkedAnswered, err = promshare.Register(reg, parkedAnswered); err != nil {
		return nil, err
	}
	if parkedRefused, err = promshare.Register(reg, parkedRefused); err != nil {
		return nil, err
	}
	if evidence, err = promshare.Register(reg, evidence); err != nil {
		return nil, err
	}
	if requests, err = promshare.Register(reg, requests); err != nil {
		return nil, err
	}
	if dropped, err = promshare.Register(reg, dropped); err != nil {
		return nil, err
	}
	if rcvbuf, err = promshare.Register(reg, rcvbuf); err != nil {
		return nil, err
	}
	m := &metrics{
		evidence: make(map[gateway.Kind]prometheus.Counter),
		requests: requests,
		byCode:   make(map[codes.Code]prometheus.Counter, len(answeredCodes)),
		dropped:  make(map[dropReason]prometheus.Counter, len(dropReasons)),
		rcvbuf:   rcvbuf,

		dtlsPeers:   dtlsPeers,
		helloVerify: helloVerify,
		dtlsParked:  dtlsParked,
		dtlsResumed: dtlsResumed,

		parkedAnswered: parkedAnswered,
		parkedRefused:  make(map[parkedRefusal]prometheus.Counter, len(parkedRefusals)),

		commands:    make(map[commandResult]prometheus.Counter, len(commandResults)),
		dataRefused: make(map[refusedReason]prometheus.Counter, len(refusedReasons)),
		dataQueued:  dataQueued,
	}
	for qos := range m.dataMessages {
		m.dataMessages[qos] = dataMessages.WithLabelValues(fmt.Sprint(qos))
		m.dataBytes[qos] = dataBytes.WithLabelValues(fmt.Sprint(qos))
	}
	for _, r := range commandResults {
		m.commands[r] = commands.WithLabelValues(string(r))
	}
	for _, r := range refusedReasons {
		m.dataRefused[r] = dataRefused.WithLabelValues(string(r))
	}
	for _, r := range dropReasons {
		m.dropped[r] = dropped.WithLabelValues(string(r))
	}
	for _, r := range parkedRefusals {
		m.parkedRefused[r] = parkedRefused.WithLabelValues(string(r))
	}
	for _, k := range []gateway.Kind{gateway.Renew, gateway.Leave} {
		m.evidence[k] = evidence.WithLabelValues(k.String())
	}
	for _, c := range answeredCodes {
		m.byCode[c] = requests.WithLabelValues(codeLabel(c))
	}
	return m, nil
}

func (m *metrics) answered(c codes.Code) {
	if ctr, ok := m.byCode[c]; ok {
		ctr.Inc()
		return
	}
	m.requests.WithLabelValues(codeLabel(c)).Inc()
}

func (m *metrics) drop(r dropReason) { m.dropped[r].Inc() }

// published counts a message the DataSink took.
func (m *metrics) published(msg *gateway.Message) {
	m.dataMessages[msg.QoS].Inc()
	m.dataBytes[msg.QoS].Add(float64(len(msg.Payload)))
}

func (m *metrics) command(r commandResult) { m.commands[r].Inc() }

// carried counts what an answer did with its command.
func (m *metrics) carried(c carried) {
	switch c {
	case carriedCommand:
		m.command(commandDelivered)
	case carriedMarker:
		m.command(commandWaiting)
	}
}

func (m *metrics) refused(r refusedReason) { m.dataRefused[r].Inc() }

func (m *metrics) accepted(k gateway.Kind) {
	if ctr, ok := m.evidence[k]; ok {
		ctr.Inc()
	}
}

// codeLabel writes a code the way CoAP documents do: "2.04", "4.00".
func codeLabel(c codes.Code) string {
	return fmt.Sprintf("%d.%02d", uint16(c)>>5, uint16(c)&0x1f)
}
