package bridge

import (
	"sync"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/fleetgate/fleetgate/gateway"
)

// metrics are the bridge's Prometheus metrics (fleetgate_bridge_*). No
// metric has a device label.
type metrics struct {
	in, inBytes, out, outBytes *prometheus.CounterVec // direction, source
	refused                    prometheus.Counter
	connected                  prometheus.Gauge
	connects                   prometheus.Counter
	latency                    prometheus.Histogram
	queues                     *queueCollector
}

func newMetrics(b *Bridge) *metrics {
	labels := []string{"direction", "source"}
	return &metrics{
		in: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "fleetgate_bridge_messages_in_total",
			Help: "Messages taken by the bridge: up, device messages from the front ends; down, commands from upstream or local clients.",
		}, labels),
		inBytes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "fleetgate_bridge_bytes_in_total",
			Help: "Payload bytes of fleetgate_bridge_messages_in_total.",
		}, labels),
		out: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "fleetgate_bridge_messages_out_total",
			Help: "Messages the bridge is done with: up, acknowledged by the upstream broker (QoS 1) or written to it (QoS 0); down, commands a front end acknowledged.",
		}, labels),
		outBytes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "fleetgate_bridge_bytes_out_total",
			Help: "Payload bytes of fleetgate_bridge_messages_out_total.",
		}, labels),
		refused: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "fleetgate_bridge_refused_total",
			Help: "Publishes the upstream broker refused (a reason code of 0x80 or more, larger than its maximum packet size); a message refused RefusalTries times is dropped (reason refused).",
		}),
		connected: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "fleetgate_bridge_upstream_connected",
			Help: "1 while the bridge is connected to the upstream broker.",
		}),
		connects: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "fleetgate_bridge_upstream_connects_total",
			Help: "Connections made to the upstream broker.",
		}),
		latency: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "fleetgate_bridge_publish_latency_seconds",
			Help:    "From a QoS 1 message's Received to the upstream broker's PUBACK.",
			Buckets: prometheus.ExponentialBuckets(0.001, 4, 10),
		}),
		queues: &queueCollector{b: b, dropped: map[[2]string]uint64{}},
	}
}

func (m *metrics) register(reg prometheus.Registerer) error {
	if reg == nil {
		return nil
	}
	for _, c := range []prometheus.Collector{m.in, m.inBytes, m.out, m.outBytes, m.refused, m.connected, m.connects, m.latency, m.queues} {
		if err := reg.Register(c); err != nil {
			return err
		}
	}
	return nil
}

// sourceLabel bounds the source label: a command's source is "upstream"
// or a local client's name, which is "local" here.
func sourceLabel(direction, source string) string {
	if direction == "down" && source != "upstream" {
		return "local"
	}
	return source
}

// queueCollector reports each queue's Stats at collection and the drops:
// the queues' own (full, expired by max age) and the bridge's (refused,
// device_full, expired by the command TTL, invalid, local).
type queueCollector struct {
	b       *Bridge
	mu      sync.Mutex
	dropped map[[2]string]uint64 // queue, reason
}

var (
	queueMessagesDesc = prometheus.NewDesc("fleetgate_bridge_queue_messages", "Messages held by a queue of the bridge.", []string{"queue"}, nil)
	queueBytesDesc    = prometheus.NewDesc("fleetgate_bridge_queue_bytes", "Bytes (gateway.Message.Size) held by a queue of the bridge.", []string{"queue"}, nil)
	queueAgeDesc      = prometheus.NewDesc("fleetgate_bridge_queue_oldest_age_seconds", "Age of the oldest message of a queue of the bridge (0 when empty).", []string{"queue"}, nil)
	droppedDesc       = prometheus.NewDesc("fleetgate_bridge_dropped_total", "Messages the bridge dropped, by queue and reason.", []string{"queue", "reason"}, nil)
)

func (c *queueCollector) add(queue, reason string, n int) {
	c.mu.Lock()
	c.dropped[[2]string{queue, reason}] += uint64(n)
	c.mu.Unlock()
}

func (c *queueCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- queueMessagesDesc
	ch <- queueBytesDesc
	ch <- queueAgeDesc
	ch <- droppedDesc
}

func (c *queueCollector) Collect(ch chan<- prometheus.Metric) {
	now := c.b.clock.Now()
	dropped := map[[2]string]uint64{}
	for _, q := range c.b.queues() {
		s := q.q.Stats()
		age := 0.0
		if !s.Oldest.IsZero() {
			age = max(0, now.Sub(s.Oldest).Seconds())
		}
		ch <- prometheus.MustNewConstMetric(queueMessagesDesc, prometheus.GaugeValue, float64(s.Messages), q.name)
		ch <- prometheus.MustNewConstMetric(queueBytesDesc, prometheus.GaugeValue, float64(s.Bytes), q.name)
		ch <- prometheus.MustNewConstMetric(queueAgeDesc, prometheus.GaugeValue, age, q.name)
		for r, n := range s.Dropped {
			dropped[[2]string{q.name, string(r)}] += n
		}
	}
	c.mu.Lock()
	for k, n := range c.dropped {
		dropped[k] += n
	}
	c.mu.Unlock()
	for k, n := range dropped {
		ch <- prometheus.MustNewConstMetric(droppedDesc, prometheus.CounterValue, float64(n), k[0], k[1])
	}
}

// namedQueue is one of the bridge's queues with its label.
type namedQueue struct {
	name string
	q    gateway.Queue
}
