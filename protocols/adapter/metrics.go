package adapter

import (
	"github.com/prometheus/client_golang/prometheus"
)

// metrics are the host's Prometheus series, labelled by adapter.
type metrics struct {
	up       *prometheus.GaugeVec
	failed   *prometheus.GaugeVec
	restarts *prometheus.CounterVec
	evidence *prometheus.CounterVec
	data     *prometheus.CounterVec
	commands *prometheus.CounterVec
	clamped  *prometheus.CounterVec
}

// adapterCounters are one adapter's evidence, data and command counters.
type adapterCounters struct {
	accepted, rejected, refused, dropped                                             prometheus.Counter
	dataPublished, dataRejected, dataRefused, dataDropped, dataFailed, dataDiscarded prometheus.Counter
	commandsDelivered, commandsRefused, commandsFailed                               prometheus.Counter
	clamped                                                                          prometheus.Counter
}

// Results of the data and commands counters.
var (
	dataResults    = []string{"published", "rejected", "refused", "dropped", "failed", "discarded"}
	commandResults = []string{"delivered", "refused", "failed"}
)

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		up: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "fleetgate_adapter_up",
			Help: "1 while the adapter plugin runs and streams evidence, else 0.",
		}, []string{"adapter"}),
		failed: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "fleetgate_adapter_failed",
			Help: "1 while the adapter plugin is marked failed (too many crashes in the window; retried at the longest backoff).",
		}, []string{"adapter"}),
		restarts: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "fleetgate_adapter_restarts_total",
			Help: "Restarts of the adapter plugin after it exited, failed to start or failed its health ping.",
		}, []string{"adapter"}),
		evidence: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "fleetgate_adapter_evidence_total",
			Help: "Evidence items from the adapter plugin (data items included): accepted, rejected (invalid device, instance or data), refused (a device the adapter may not speak for) or dropped (beyond its limits, or refused by the gateway).",
		}, []string{"adapter", "result"}),
		data: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "fleetgate_adapter_data_total",
			Help: "Data items from the adapter plugin: published (handed to the data path; durable for QoS 1), rejected (invalid, or refused by the data path as such), refused (a device the adapter may not speak for), dropped (beyond its limits), failed (the data path failed or timed out) or discarded (the gateway has no data path).",
		}, []string{"adapter", "result"}),
		commands: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "fleetgate_adapter_commands_total",
			Help: "Command deliveries to the adapter plugin: delivered (it took the command), refused (it said why not) or failed (an error or no answer in time); refused and failed commands stay pending and are tried again.",
		}, []string{"adapter", "result"}),
		clamped: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "fleetgate_adapter_leases_clamped_total",
			Help: "Evidence items from the adapter plugin whose own lease (lease_ms) was beyond presence.max_lease: each held its session for presence.max_lease instead.",
		}, []string{"adapter"}),
	}
	if reg != nil {
		for _, c := range []prometheus.Collector{m.up, m.failed, m.restarts, m.evidence, m.data, m.commands, m.clamped} {
			if err := reg.Register(c); err != nil {
				return nil, err
			}
		}
	}
	return m, nil
}

// start creates every series of an adapter at zero (up 0 until it runs),
// so that a dashboard shows it from its first attempt and the first
// restart counts in increase() and rate().
func (m *metrics) start(name string) {
	m.up.WithLabelValues(name).Set(0)
	m.failed.WithLabelValues(name).Set(0)
	m.restarts.WithLabelValues(name).Add(0)
	m.of(name)
}

func (m *metrics) of(name string) adapterCounters {
	return adapterCounters{
		accepted:          m.evidence.WithLabelValues(name, "accepted"),
		rejected:          m.evidence.WithLabelValues(name, "rejected"),
		refused:           m.evidence.WithLabelValues(name, "refused"),
		dropped:           m.evidence.WithLabelValues(name, "dropped"),
		dataPublished:     m.data.WithLabelValues(name, "published"),
		dataRejected:      m.data.WithLabelValues(name, "rejected"),
		dataRefused:       m.data.WithLabelValues(name, "refused"),
		dataDropped:       m.data.WithLabelValues(name, "dropped"),
		dataFailed:        m.data.WithLabelValues(name, "failed"),
		dataDiscarded:     m.data.WithLabelValues(name, "discarded"),
		commandsDelivered: m.commands.WithLabelValues(name, "delivered"),
		commandsRefused:   m.commands.WithLabelValues(name, "refused"),
		commandsFailed:    m.commands.WithLabelValues(name, "failed"),
		clamped:           m.clamped.WithLabelValues(name),
	}
}

func (m *metrics) setState(name, state string) {
	f := 0.0
	if state == StateFailed {
		f = 1
	}
	m.failed.WithLabelValues(name).Set(f)
}

// forget removes a removed adapter's series.
func (m *metrics) forget(name string) {
	m.up.DeleteLabelValues(name)
	m.failed.DeleteLabelValues(name)
	m.restarts.DeleteLabelValues(name)
	m.clamped.DeleteLabelValues(name)
	for _, r := range []string{"accepted", "rejected", "refused", "dropped"} {
		m.evidence.DeleteLabelValues(name, r)
	}
	for _, r := range dataResults {
		m.data.DeleteLabelValues(name, r)
	}
	for _, r := range commandResults {
		m.commands.DeleteLabelValues(name, r)
	}
}
