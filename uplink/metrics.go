package uplink

import (
	"github.com/fleetgate/fleetgate/gateway"
	"github.com/prometheus/client_golang/prometheus"
)

// metrics are the uplink's Prometheus series (no device labels).
type metrics struct {
	written      *prometheus.CounterVec // by kind
	flushes      prometheus.Counter
	calls        prometheus.Counter
	flushErrors  prometheus.Counter
	flushSeconds prometheus.Histogram
	dropped      *prometheus.CounterVec // outbox drops by reason
	refused      *prometheus.CounterVec // writes the store refused, by reason
	restored     prometheus.Counter
	ledgerErrors prometheus.Counter
}

func newMetrics(u *Uplink, reg prometheus.Registerer) *metrics {
	m := &metrics{
		written: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "fleetgate_renewals_written_total",
			Help: "Session writes the central store acknowledged (flushed, replayed or restored), by kind.",
		}, []string{"kind"}),
		flushes: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "fleetgate_flushes_total",
			Help: "Batches sent to the central store (one per shard in each store call: flushes, outbox replay and restores).",
		}),
		calls: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "fleetgate_store_calls_total",
			Help: "Store calls of the uplink: one per flush, replay step or restore round, carrying a batch for each shard that has writes (one round trip with Redis).",
		}),
		flushErrors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "fleetgate_flush_errors_total",
			Help: "Batches the central store did not acknowledge.",
		}),
		flushSeconds: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "fleetgate_flush_duration_seconds",
			Help:    "Duration of one batch call to the central store.",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 16),
		}),
		dropped: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "fleetgate_outbox_dropped_total",
			Help: "Writes dropped from the outbox: overflow (oldest entries over outbox_max_sessions), lapsed (lease ran out more than presence.gateway_grace before replay) or unknown_age (observed before a reboot, or ahead of the boot clock).",
		}, []string{"reason"}),
		restored: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "fleetgate_uplink_restored_sessions_total",
			Help: "Live sessions re-sent to the central store after it lost or replaced a shard's state (a restart without persistence, FLUSHALL, a failover).",
		}),
		ledgerErrors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "fleetgate_uplink_ledger_errors_total",
			Help: "Writes of the session ledger (the sessions this process holds, in the state file) that failed, or connects left out of one.",
		}),
		refused: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "fleetgate_uplink_refused_total",
			Help: "Writes the central store refused and that were dropped: fenced (a newer process of this gateway exists) or rejected (a bug: bad or wrong shard).",
		}, []string{"reason"}),
	}
	for _, k := range []gateway.Kind{gateway.Connect, gateway.Renew, gateway.Leave} {
		m.written.WithLabelValues(k.String())
	}
	for _, r := range []string{reasonOverflow, reasonLapsed, reasonUnknownAge} {
		m.dropped.WithLabelValues(r)
	}
	for _, r := range []string{reasonFenced, reasonRejected} {
		m.refused.WithLabelValues(r)
	}
	if reg == nil {
		return m
	}
	reg.MustRegister(m.written, m.flushes, m.calls, m.flushErrors, m.flushSeconds, m.dropped, m.refused, m.restored, m.ledgerErrors,
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "fleetgate_outbox_sessions",
			Help: "Sessions buffered in the outbox.",
		}, func() float64 { return float64(u.ob.Len()) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "fleetgate_outbox_oldest_age_seconds",
			Help: "Age of the oldest evidence buffered in the outbox (0 when empty).",
		}, func() float64 { return u.outboxOldest().Seconds() }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "fleetgate_uplink_up",
			Help: "1 while the central store answers for every shard, 0 while one is down.",
		}, func() float64 {
			if u.isUp() {
				return 1
			}
			return 0
		}),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "fleetgate_uplink_shards_down",
			Help: "Shards the central store does not answer for: their writes go to the outbox until a probe succeeds (which ones: /v1/status uplink.shards_down).",
		}, func() float64 { return float64(u.shardsDown()) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "fleetgate_uplink_pending",
			Help: "Writes waiting in the batcher's queues.",
		}, func() float64 { return float64(u.pending()) }),
	)
	return m
}

const (
	reasonOverflow   = "overflow"
	reasonLapsed     = "lapsed"
	reasonUnknownAge = "unknown_age"
	reasonFenced     = "fenced"
	reasonRejected   = "rejected"
)
