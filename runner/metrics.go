package runner

import (
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
)

// metrics are the runner's Prometheus metrics (no device label: the
// cardinality stays fixed whatever the fleet's size).
type metrics struct {
	reaped       prometheus.Counter
	trimmed      prometheus.Counter
	held         prometheus.Counter
	gaps         prometheus.Counter
	reapCalls    prometheus.Counter
	reapErrors   prometheus.Counter
	lag          prometheus.Histogram
	reapDuration prometheus.Histogram
	shardsOwned  prometheus.Gauge
}

// newMetrics creates the metrics and registers them with reg unless it
// is nil.
func newMetrics(reg prometheus.Registerer) *metrics {
	f := promauto.With(reg)
	return &metrics{
		reaped: f.NewCounter(prometheus.CounterOpts{
			Name: "fleetgate_runner_reaped_total",
			Help: "Offline events written by reap calls of this runner (devices whose last session expired).",
		}),
		trimmed: f.NewCounter(prometheus.CounterOpts{
			Name: "fleetgate_runner_trimmed_total",
			Help: "Devices that had expired sessions dropped by a reap call but kept a live one.",
		}),
		held: f.NewCounter(prometheus.CounterOpts{
			Name: "fleetgate_runner_held_total",
			Help: "Due devices held for the gateway grace instead of reaped, because the gateway that wrote them last was not heard.",
		}),
		gaps: f.NewCounter(prometheus.CounterOpts{
			Name: "fleetgate_runner_reap_gaps_total",
			Help: "Reaps that found their shard unreaped for longer than the reap gap (the store, every runner or the host stopped): they judged no gateway and held due devices for the grace.",
		}),
		reapCalls: f.NewCounter(prometheus.CounterOpts{
			Name: "fleetgate_runner_reap_calls_total",
			Help: "Store reap calls, each bounded by runner.batch entries.",
		}),
		reapErrors: f.NewCounter(prometheus.CounterOpts{
			Name: "fleetgate_runner_reap_errors_total",
			Help: "Store reap calls that failed (retried in a later cycle).",
		}),
		lag: f.NewHistogram(prometheus.HistogramOpts{
			Name:    "fleetgate_runner_reap_lag_seconds",
			Help:    "Detection lag of each offline event: event time minus the lease deadline that ran out (store clock).",
			Buckets: prometheus.ExponentialBuckets(0.005, 2, 15), // 5ms .. 82s
		}),
		reapDuration: f.NewHistogram(prometheus.HistogramOpts{
			Name:    "fleetgate_runner_reap_duration_seconds",
			Help:    "Duration of one store reap call.",
			Buckets: prometheus.ExponentialBuckets(0.0001, 2, 16), // 0.1ms .. 3.3s
		}),
		shardsOwned: f.NewGauge(prometheus.GaugeOpts{
			Name: "fleetgate_runner_shards_owned",
			Help: "Shards this runner holds a lease on.",
		}),
	}
}
