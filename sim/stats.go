package sim

import (
	"maps"
	"sync"
	"sync/atomic"
	"time"
)

// Stats are the fleet's live counters.
type Stats struct {
	heartbeat time.Duration

	sent           atomic.Int64 // device messages: CoAP requests, MQTT packets
	answered       atomic.Int64 // of them acknowledged
	unanswered     atomic.Int64 // CoAP requests never answered
	sendErrors     atomic.Int64
	connects       atomic.Int64 // MQTT connections made
	connectErr     atomic.Int64 // MQTT connections refused or failed
	connected      atomic.Int64 // MQTT connections open now
	reconnects     atomic.Int64 // MQTT connections lost under a device and made again
	retransmits    atomic.Int64 // CoAP CON requests sent again
	misrouted      atomic.Int64 // CoAP answers that came to another device's address
	dtlsHandshakes atomic.Int64
	dtlsFailures   atomic.Int64 // handshakes that failed
	// dtlsResumes counts the kept DTLS sessions resumed, and
	// dtlsResumeFailures those whose first request got no answer (a
	// handshake followed).
	dtlsResumes        atomic.Int64
	dtlsResumeFailures atomic.Int64

	// heartbeats by how late the scheduler sent them
	scheduled, onTime atomic.Int64 // all, and those within onTimeBound
	maxLate           atomic.Int64 // nanoseconds

	mu          sync.Mutex
	codes       map[string]int64
	connectErrs map[string]int64 // by message, at most maxErrorKinds of them
}

// maxErrorKinds bounds the distinct connect error messages kept; the
// rest are counted as "other".
const maxErrorKinds = 8

func newStats(heartbeat time.Duration) *Stats {
	return &Stats{heartbeat: heartbeat, codes: map[string]int64{}, connectErrs: map[string]int64{}}
}

// connectError counts a refused or failed MQTT connection and why.
func (s *Stats) connectError(err error) {
	s.connectErr.Add(1)
	k := err.Error()
	s.mu.Lock()
	if _, ok := s.connectErrs[k]; !ok && len(s.connectErrs) >= maxErrorKinds {
		k = "other"
	}
	s.connectErrs[k]++
	s.mu.Unlock()
}

// onTimeBound is how late a heartbeat may go and still count as on
// schedule.
const onTimeBound = 100 * time.Millisecond

// late counts a heartbeat sent d after its schedule.
func (s *Stats) late(d time.Duration) {
	s.scheduled.Add(1)
	if d <= onTimeBound {
		s.onTime.Add(1)
	}
	for {
		m := s.maxLate.Load()
		if int64(d) <= m || s.maxLate.CompareAndSwap(m, int64(d)) {
			return
		}
	}
}

func (s *Stats) code(c string) {
	s.mu.Lock()
	s.codes[c]++
	s.mu.Unlock()
}

// Snapshot is a copy of the counters.
type Snapshot struct {
	Sent          int64 `json:"sent"`
	Answered      int64 `json:"answered"`
	Unanswered    int64 `json:"coap_unanswered"`
	SendErrors    int64 `json:"send_errors"`
	Connects      int64 `json:"mqtt_connects"`
	ConnectErrors int64 `json:"mqtt_connect_errors"`
	// ConnectErrorKinds counts the connect errors by message.
	ConnectErrorKinds map[string]int64 `json:"mqtt_connect_error_kinds,omitempty"`
	Connected         int64            `json:"mqtt_connected"`
	Reconnects        int64            `json:"mqtt_reconnects"`
	CoAPCodes         map[string]int64 `json:"coap_codes"`
	Retransmits       int64            `json:"coap_retransmits"`
	Misrouted         int64            `json:"coap_misrouted"`
	DTLSHandshakes    int64            `json:"dtls_handshakes"`
	DTLSFailures      int64            `json:"dtls_handshake_failures"`
	DTLSResumes       int64            `json:"dtls_resumes"`
	DTLSResumeFailed  int64            `json:"dtls_resume_failures"`
	// Heartbeats is how many heartbeats the devices' schedule had them
	// send, OnTime those sent within 100 ms of it, MaxLateMS the latest.
	Heartbeats int64   `json:"heartbeats"`
	OnTime     float64 `json:"heartbeats_on_time"`
	MaxLateMS  float64 `json:"heartbeat_max_late_ms"`
}

func (s *Stats) snapshot() Snapshot {
	s.mu.Lock()
	codes, errs := maps.Clone(s.codes), maps.Clone(s.connectErrs)
	s.mu.Unlock()
	n, on := s.scheduled.Load(), s.onTime.Load()
	share := 1.0
	if n > 0 {
		share = float64(on) / float64(n)
	}
	return Snapshot{Heartbeats: n, OnTime: share, MaxLateMS: float64(s.maxLate.Load()) / 1e6,
		DTLSHandshakes: s.dtlsHandshakes.Load(), DTLSFailures: s.dtlsFailures.Load(),
		DTLSResumes: s.dtlsResumes.Load(), DTLSResumeFailed: s.dtlsResumeFailures.Load(),
		Retransmits: s.retransmits.Load(), Misrouted: s.misrouted.Load(), Sent: s.sent.Load(), Answered: s.answered.Load(), Unanswered: s.unanswered.Load(),
		SendErrors: s.sendErrors.Load(), Connects: s.connects.Load(), ConnectErrors: s.connectErr.Load(),
		Connected: s.connected.Load(), Reconnects: s.reconnects.Load(), CoAPCodes: codes, ConnectErrorKinds: errs}
}
