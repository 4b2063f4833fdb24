package canary

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
)

// boundShares are the detection histogram's buckets, as shares of the
// bound: fine around it, where the question is on which side it fell.
var boundShares = []float64{0.5, 0.75, 0.9, 0.95, 0.98, 1, 1.02, 1.05, 1.1, 1.25, 1.5, 2}

type metrics struct {
	detection    *prometheus.HistogramVec
	last         *prometheus.GaugeVec
	falseOffline prometheus.Counter
	missed       *prometheus.CounterVec
	beatFailures prometheus.Counter
}

// newMetrics creates the canary's metrics and registers them with reg
// unless it is nil; the upstream path's series exist only with a
// publisher.
func newMetrics(reg prometheus.Registerer, bound time.Duration, upstream bool) *metrics {
	f := promauto.With(reg)
	buckets := make([]float64, len(boundShares))
	for i, s := range boundShares {
		buckets[i] = s * bound.Seconds()
	}
	m := &metrics{
		detection: f.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "fleetgate_canary_detection_seconds",
			Help:    "The canary's detection time: from its last acknowledged heartbeat to its offline event out of the store's log (path=log) or acknowledged by the upstream broker (path=upstream). Buckets are shares of fleetgate_canary_bound_seconds.",
			Buckets: buckets,
		}, []string{"path"}),
		last: f.NewGaugeVec(prometheus.GaugeOpts{
			Name: "fleetgate_canary_last_detection_seconds",
			Help: "The canary's last detection time, by path (0 before the first).",
		}, []string{"path"}),
		falseOffline: f.NewCounter(prometheus.CounterOpts{
			Name: "fleetgate_canary_false_offline_total",
			Help: "Offline events of the canary while it heartbeats (its live phase).",
		}),
		missed: f.NewCounterVec(prometheus.CounterOpts{
			Name: "fleetgate_canary_missed_total",
			Help: "Stops of the canary whose offline event did not come within twice the bound, by path.",
		}, []string{"path"}),
		beatFailures: f.NewCounter(prometheus.CounterOpts{
			Name: "fleetgate_canary_heartbeat_failures_total",
			Help: "Canary heartbeats the gateway's CoAP front end did not acknowledge with 2.04.",
		}),
	}
	f.NewGauge(prometheus.GaugeOpts{
		Name: "fleetgate_canary_bound_seconds",
		Help: "The worst-case detection bound the canary is held to (docs/design.md §6.6, as check-config prints it).",
	}).Set(bound.Seconds())
	for _, p := range []Path{Log, Upstream} {
		if p == Upstream && !upstream {
			continue
		}
		m.detection.WithLabelValues(p.String())
		m.last.WithLabelValues(p.String())
		m.missed.WithLabelValues(p.String())
	}
	return m
}
