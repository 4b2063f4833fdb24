package mqtt

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/fleetgate/fleetgate/gateway"
	"github.com/fleetgate/fleetgate/internal/promshare"
)

// Refusal reasons, the label values of fleetgate_mqtt_refused_total.
const (
	reasonInvalidClientID = "invalid_client_id"
	reasonNotAuthorized   = "not_authorized"
	reasonMaxClients      = "max_clients"
	reasonRate            = "connect_rate"
	reasonOverloaded      = "overloaded"
	reasonError           = "error"
	reasonTooSlow         = "too_slow"
	reasonSessionLimit    = "session_limit"
	reasonRevoked         = "revoked"
	reasonPending         = "pending"
	reasonAnonymousRate   = "anonymous_rate"
	reasonAnonymousLimit  = "anonymous_limit"
)

var refusalReasons = []string{
	reasonInvalidClientID, reasonNotAuthorized, reasonMaxClients,
	reasonRate, reasonOverloaded, reasonError, reasonTooSlow,
	reasonSessionLimit, reasonRevoked, reasonPending,
	reasonAnonymousRate, reasonAnonymousLimit,
}

// metrics are the front end's Prometheus collectors. The counters of
// every label value are resolved once, so that the hot path does no
// label hashing.
type metrics struct {
	evidence    [gateway.Leave + 1]prometheus.Counter // by Kind
	refused     map[string]prometheus.Counter
	connections prometheus.Gauge
	// retainedRefused counts retained messages refused by the quota.
	retainedRefused prometheus.Counter
}

// newMetrics builds the collectors and registers them with reg (nil: not
// registered); retained reports the bytes of retained messages.
// fleetgate_evidence_total is shared with the other front ends: same
// name and help, told apart by the protocol label.
func newMetrics(reg prometheus.Registerer, retained func() int) (*metrics, error) {
	evidence, err := promshare.Register(reg, prometheus.NewCounterVec(prometheus.CounterOpts{
		Name:        "fleetgate_evidence_total",
		Help:        "Evidence accepted by the gateway from protocol front ends, by kind.",
		ConstLabels: prometheus.Labels{"protocol": "mqtt"},
	}, []string{"kind"}))
	if err != nil {
		return nil, err
	}
	refused, err := promshare.Register(reg, prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "fleetgate_mqtt_refused_total",
		Help: "MQTT connections refused or ended by the front end, by reason.",
	}, []string{"reason"}))
	if err != nil {
		return nil, err
	}
	connections, err := promshare.Register(reg, prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "fleetgate_mqtt_connections",
		Help: "MQTT connections admitted and not yet ended.",
	}))
	if err != nil {
		return nil, err
	}
	retainedRefused, err := promshare.Register(reg, prometheus.NewCounter(prometheus.CounterOpts{
		Name: "fleetgate_mqtt_retained_refused_total",
		Help: "Retained MQTT messages refused by the retained quotas (limits.mqtt_max_retained_*).",
	}))
	if err != nil {
		return nil, err
	}
	if _, err := promshare.Register(reg, prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "fleetgate_mqtt_retained_bytes",
		Help: "Bytes of retained MQTT messages held for devices, as counted against limits.mqtt_max_retained_bytes.",
	}, func() float64 { return float64(retained()) })); err != nil {
		return nil, err
	}
	m := &metrics{
		refused:         make(map[string]prometheus.Counter, len(refusalReasons)),
		connections:     connections,
		retainedRefused: retainedRefused,
	}
	for _, k := range []gateway.Kind{gateway.Connect, gateway.Renew, gateway.Leave} {
		m.evidence[k] = evidence.WithLabelValues(k.String())
	}
	for _, r := range refusalReasons {
		m.refused[r] = refused.WithLabelValues(r)
	}
	return m, nil
}

func (m *metrics) accepted(k gateway.Kind) { m.evidence[k].Inc() }

func (m *metrics) refuse(reason string) { m.refused[reason].Inc() }
