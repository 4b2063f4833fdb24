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

	sent       atomic.Int64 // device messages: CoAP requests, MQTT packets
	answered   atomic.Int64 // of them acknowledged
	unanswered atomic.Int64 // CoAP requests never answered
	sendErrors atomic.Int64
	connects   atomic.Int64 // MQTT connections made
	connectErr atomic.Int64 // MQTT connections refused or failed
	connected  atomic.Int64 // MQTT connections open now
	reconnects atomic.Int64 // MQTT connections lost under a device and made again

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
}

func (s *Stats) snapshot() Snapshot {
	s.mu.Lock()
	codes, errs := maps.Clone(s.codes), maps.Clone(s.connectErrs)
	s.mu.Unlock()
	return Snapshot{Sent: s.sent.Load(), Answered: s.answered.Load(), Unanswered: s.unanswered.Load(),
		SendErrors: s.sendErrors.Load(), Connects: s.connects.Load(), ConnectErrors: s.connectErr.Load(),
		Connected: s.connected.Load(), Reconnects: s.reconnects.Load(), CoAPCodes: codes, ConnectErrorKinds: errs}
}
