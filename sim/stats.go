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

	mu    sync.Mutex
	codes map[string]int64
}

func newStats(heartbeat time.Duration) *Stats {
	return &Stats{heartbeat: heartbeat, codes: map[string]int64{}}
}

func (s *Stats) code(c string) {
	s.mu.Lock()
	s.codes[c]++
	s.mu.Unlock()
}

// Snapshot is a copy of the counters.
type Snapshot struct {
	Sent          int64            `json:"sent"`
	Answered      int64            `json:"answered"`
	Unanswered    int64            `json:"coap_unanswered"`
	SendErrors    int64            `json:"send_errors"`
	Connects      int64            `json:"mqtt_connects"`
	ConnectErrors int64            `json:"mqtt_connect_errors"`
	Connected     int64            `json:"mqtt_connected"`
	Reconnects    int64            `json:"mqtt_reconnects"`
	CoAPCodes     map[string]int64 `json:"coap_codes"`
}

func (s *Stats) snapshot() Snapshot {
	s.mu.Lock()
	codes := maps.Clone(s.codes)
	s.mu.Unlock()
	return Snapshot{Sent: s.sent.Load(), Answered: s.answered.Load(), Unanswered: s.unanswered.Load(),
		SendErrors: s.sendErrors.Load(), Connects: s.connects.Load(), ConnectErrors: s.connectErr.Load(),
		Connected: s.connected.Load(), Reconnects: s.reconnects.Load(), CoAPCodes: codes}
}
