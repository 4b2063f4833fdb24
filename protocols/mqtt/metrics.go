package mqtt

import (
	"strconv"

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

// Reasons a PUBLISH or SUBSCRIBE is refused, the label values of
// fleetgate_mqtt_messages_refused_total.
const (
	// reasonPublishDenied: a PUBLISH outside the device's subtree or a
	// local client's write list.
	reasonPublishDenied = "publish_denied"
	// reasonSubscribeDenied: a SUBSCRIBE outside the device's subtree or
	// a local client's read list.
	reasonSubscribeDenied = "subscribe_denied"
	// reasonCommandTopic: a device's PUBLISH to its own command subtree.
	reasonCommandTopic = "command_topic"
	// reasonInvalid, reasonTooLarge, reasonFailed: the DataSink or
	// Commands refused the message (gateway.ErrInvalidMessage,
	// gateway.ErrTooLarge, any other error).
	reasonInvalid  = "invalid"
	reasonTooLarge = "too_large"
	reasonFailed   = "failed"
)

var messageRefusalReasons = []string{
	reasonPublishDenied, reasonSubscribeDenied, reasonCommandTopic,
	reasonInvalid, reasonTooLarge, reasonFailed,
}

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
	// upMessages and upBytes (payload) count the devices' messages the
	// DataSink took, by QoS (0, 1: a QoS 2 PUBLISH goes up as 1).
	upMessages, upBytes [2]prometheus.Counter
	// messagesRefused counts refused PUBLISHes and SUBSCRIBEs by reason.
	messagesRefused map[string]prometheus.Counter
	// commandsDelivered counts the commands the broker took for a
	// device; commandsSubmitted those local clients submitted.
	commandsDelivered, commandsSubmitted prometheus.Counter
	// localClients is the local clients connected.
	localClients prometheus.Gauge
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
		messagesRefused: make(map[string]prometheus.Counter, len(messageRefusalReasons)),
	}
	if err := m.registerData(reg); err != nil {
		return nil, err
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

// registerData builds and registers the data path's collectors.
func (m *metrics) registerData(reg prometheus.Registerer) error {
	upMessages, err := promshare.Register(reg, prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "fleetgate_mqtt_messages_up_total",
		Help: "Devices' MQTT messages the data path took, by QoS (a QoS 2 PUBLISH counts as 1).",
	}, []string{"qos"}))
	if err != nil {
		return err
	}
	upBytes, err := promshare.Register(reg, prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "fleetgate_mqtt_bytes_up_total",
		Help: "Payload bytes of the devices' MQTT messages the data path took, by QoS.",
	}, []string{"qos"}))
	if err != nil {
		return err
	}
	refused, err := promshare.Register(reg, prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "fleetgate_mqtt_messages_refused_total",
		Help: "MQTT PUBLISHes and SUBSCRIBEs refused by the front end, by reason.",
	}, []string{"reason"}))
	if err != nil {
		return err
	}
	if m.commandsDelivered, err = promshare.Register(reg, prometheus.NewCounter(prometheus.CounterOpts{
		Name: "fleetgate_mqtt_commands_delivered_total",
		Help: "Commands the MQTT broker took for a connected device (and acknowledged to the command queue).",
	})); err != nil {
		return err
	}
	if m.commandsSubmitted, err = promshare.Register(reg, prometheus.NewCounter(prometheus.CounterOpts{
		Name: "fleetgate_mqtt_commands_submitted_total",
		Help: "Commands local MQTT clients submitted.",
	})); err != nil {
		return err
	}
	if m.localClients, err = promshare.Register(reg, prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "fleetgate_mqtt_local_clients",
		Help: "Local MQTT clients (auth.clients) connected.",
	})); err != nil {
		return err
	}
	for q := range m.upMessages {
		label := strconv.Itoa(q)
		m.upMessages[q] = upMessages.WithLabelValues(label)
		m.upBytes[q] = upBytes.WithLabelValues(label)
	}
	for _, r := range messageRefusalReasons {
		m.messagesRefused[r] = refused.WithLabelValues(r)
	}
	return nil
}

// up counts a message of the given QoS (0 or 1) and payload bytes that
// the DataSink took.
func (m *metrics) up(qos byte, bytes int) {
	m.upMessages[qos].Inc()
	m.upBytes[qos].Add(float64(bytes))
}

func (m *metrics) messageRefused(reason string) { m.messagesRefused[reason].Inc() }
