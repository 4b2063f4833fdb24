package main

import (
	"context"
	"crypto/x509"
	"encoding/pem"
	"os"
	"runtime"
	"runtime/debug"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/fleetgate/fleetgate/configs"
	"github.com/fleetgate/fleetgate/gateway"
)

// deviceStates exports fleetgate_devices{state}: the devices with a
// session on this gateway, online or suspect (gateway.Table.Devices),
// counted from the session table at each scrape with the suspect_after
// in force. Offline devices are the store's to count: they have no
// session here.
type deviceStates struct {
	table  *gateway.Table
	timing func() (lease, suspectAfter time.Duration)
	desc   *prometheus.Desc
}

var _ prometheus.Collector = (*deviceStates)(nil)

func newDeviceStates(table *gateway.Table, timing func() (time.Duration, time.Duration)) *deviceStates {
	return &deviceStates{
		table: table, timing: timing,
		desc: prometheus.NewDesc("fleetgate_devices",
			"Devices with a session on this gateway, by state: online (evidence within presence.suspect_after) or suspect (none since, but the lease has not run out; a device with a longer lease of its own: in the last presence.lease - presence.suspect_after of it).",
			[]string{"state"}, nil),
	}
}

func (d *deviceStates) Describe(ch chan<- *prometheus.Desc) { ch <- d.desc }

func (d *deviceStates) Collect(ch chan<- prometheus.Metric) {
	_, suspectAfter := d.timing()
	c := d.table.Devices(time.Now(), suspectAfter)
	ch <- prometheus.MustNewConstMetric(d.desc, prometheus.GaugeValue, float64(c.Online), string(gateway.Online))
	ch <- prometheus.MustNewConstMetric(d.desc, prometheus.GaugeValue, float64(c.Suspect), string(gateway.Suspect))
}

// registerProcessMetrics registers what every process exports about
// itself and its configuration (run and runner): fleetgate_build_info,
// the lease and the detection bound in force (for alert thresholds that
// follow the configuration), and the expiry of the certificates its
// configuration names.
func registerProcessMetrics(reg prometheus.Registerer, cfg func() configs.Config, served func() *x509.Certificate) {
	revision := ""
	if bi, ok := debug.ReadBuildInfo(); ok {
		for _, s := range bi.Settings {
			if s.Key == "vcs.revision" {
				revision = s.Value
			}
		}
	}
	reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name:        "fleetgate_build_info",
		Help:        "1, labelled with the build: version, the VCS revision (when the binary was built from a checkout), the Go version.",
		ConstLabels: prometheus.Labels{"version": version, "revision": revision, "goversion": runtime.Version()},
	}, func() float64 { return 1 }))
	reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "fleetgate_presence_lease_seconds",
		Help: "presence.lease in force.",
	}, func() float64 { return cfg().Presence.Lease.Std().Seconds() }))
	reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "fleetgate_detection_bound_seconds",
		Help: "The worst-case detection bound in force (docs/design.md §6.6, as check-config prints it).",
	}, func() float64 { return cfg().Bounds().WorstCaseDetection.Std().Seconds() }))
	reg.MustRegister(&certExpiry{cfg: cfg, served: served, desc: prometheus.NewDesc("fleetgate_certificate_expiry_timestamp_seconds",
		"When a certificate the configuration names expires (Unix time; a bundle: its earliest), by configuration key. listen.mqtt is the certificate served; the others are read from their files at each scrape.",
		[]string{"key"}, nil)})
}

// certExpiry exports fleetgate_certificate_expiry_timestamp_seconds{key}.
type certExpiry struct {
	cfg    func() configs.Config
	served func() *x509.Certificate // listen.mqtt's, nil without
	desc   *prometheus.Desc
}

var _ prometheus.Collector = (*certExpiry)(nil)

func (c *certExpiry) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }

func (c *certExpiry) Collect(ch chan<- prometheus.Metric) {
	var served *x509.Certificate
	if c.served != nil {
		served = c.served()
	}
	for _, e := range certificateExpiries(c.cfg(), served) {
		ch <- prometheus.MustNewConstMetric(c.desc, prometheus.GaugeValue, float64(e.NotAfter.Unix()), e.Key)
	}
}

// certificateExpiry is when one certificate the configuration names
// expires: /v1/status "certificates" and
// fleetgate_certificate_expiry_timestamp_seconds.
type certificateExpiry struct {
	Key      string    `json:"key"` // the configuration key
	NotAfter time.Time `json:"not_after"`
}

// certificateExpiries are the expiries of the certificates cfg names:
// listen.mqtt's as served (nil: none), the others read from their files
// (a bundle: its earliest; a file that cannot be read or holds no
// certificate is left out).
func certificateExpiries(cfg configs.Config, served *x509.Certificate) []certificateExpiry {
	var out []certificateExpiry
	if served != nil {
		out = append(out, certificateExpiry{"listen.mqtt", served.NotAfter})
	}
	for _, f := range []struct{ key, path string }{
		{"listen.admin", cfg.Listen.Admin.CertFile},
		{"events.mqtt.tls.ca", cfg.Events.MQTT.TLS.CA},
		{"events.mqtt.tls.cert", cfg.Events.MQTT.TLS.Cert},
		{"bridge.mqtt.tls.ca", cfg.Bridge.MQTT.TLS.CA},
		{"bridge.mqtt.tls.cert", cfg.Bridge.MQTT.TLS.Cert},
		{"store.redis.tls_ca_file", cfg.Store.Redis.TLSCAFile},
		{"store.redis.tls_cert_file", cfg.Store.Redis.TLSCertFile},
	} {
		if f.path == "" {
			continue
		}
		if t, ok := earliestExpiry(f.path); ok {
			out = append(out, certificateExpiry{f.key, t})
		}
	}
	return out
}

// earliestExpiry is the earliest NotAfter of the PEM certificates in
// path; false when it holds none that parses or cannot be read.
func earliestExpiry(path string) (time.Time, bool) {
	b, err := os.ReadFile(path)
	if err != nil {
		return time.Time{}, false
	}
	var out time.Time
	for {
		var blk *pem.Block
		if blk, b = pem.Decode(b); blk == nil {
			break
		}
		if blk.Type != "CERTIFICATE" {
			continue
		}
		if c, err := x509.ParseCertificate(blk.Bytes); err == nil && (out.IsZero() || c.NotAfter.Before(out)) {
			out = c.NotAfter
		}
	}
	return out, !out.IsZero()
}

// reloads counts reloads by result and keeps whether the last one was
// applied whole: fleetgate_reloads_total{result}, fleetgate_reload_last_success.
type reloads struct {
	total *prometheus.CounterVec
	last  prometheus.Gauge
}

func newReloads(reg prometheus.Registerer) *reloads {
	r := &reloads{
		total: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "fleetgate_reloads_total",
			Help: "Reloads (SIGHUP), by result: applied, or refused when the configuration or a file it names (devices file, certificate, secret) was refused.",
		}, []string{"result"}),
		last: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "fleetgate_reload_last_success",
			Help: "1 when the last reload was applied whole (or none happened since the start), 0 when something of it was refused.",
		}),
	}
	r.total.WithLabelValues("applied")
	r.total.WithLabelValues("refused")
	r.last.Set(1)
	reg.MustRegister(r.total, r.last)
	return r
}

func (r *reloads) done(ok bool) {
	if ok {
		r.total.WithLabelValues("applied").Inc()
		r.last.Set(1)
		return
	}
	r.total.WithLabelValues("refused").Inc()
	r.last.Set(0)
}

// coverageTimeout bounds the store read of one scrape of the coverage,
// and of the fleet's counts.
const coverageTimeout = 2 * time.Second

// runnerCoverage exports fleetgate_runner_shards_covered (the shards some
// runner, of any process, holds a lease on, read from the store at each
// scrape; absent while the store does not answer) and
// fleetgate_store_shards.
type runnerCoverage struct {
	store           gateway.Reaper
	covered, shards *prometheus.Desc
}

var _ prometheus.Collector = (*runnerCoverage)(nil)

func newRunnerCoverage(store gateway.Reaper) *runnerCoverage {
	return &runnerCoverage{
		store: store,
		covered: prometheus.NewDesc("fleetgate_runner_shards_covered",
			"Shards some runner (of any process) holds a lease on, read from the store; the others get no offline events.", nil, nil),
		shards: prometheus.NewDesc("fleetgate_store_shards", "presence.shards: the store's shards.", nil, nil),
	}
}

func (c *runnerCoverage) Describe(ch chan<- *prometheus.Desc) { ch <- c.covered; ch <- c.shards }

func (c *runnerCoverage) Collect(ch chan<- prometheus.Metric) {
	ch <- prometheus.MustNewConstMetric(c.shards, prometheus.GaugeValue, float64(c.store.Shards()))
	ctx, cancel := context.WithTimeout(context.Background(), coverageTimeout)
	defer cancel()
	held, err := c.store.RunnerLeases(ctx)
	if err != nil {
		return
	}
	n := 0
	for _, h := range held {
		if h {
			n++
		}
	}
	ch <- prometheus.MustNewConstMetric(c.covered, prometheus.GaugeValue, float64(n))
}

// fleetCounts exports fleetgate_fleet_devices{state}: the fleet's devices
// by stored state (gateway.Reader.Counts), and the suspect ones among the
// online (by the lease and suspect_after of timing, read at each scrape:
// a reload shows), read from the store at each scrape within
// coverageTimeout; absent while the store does not answer.
type fleetCounts struct {
	store  gateway.Reader
	timing func() (lease, suspectAfter time.Duration)
	desc   *prometheus.Desc
}

var _ prometheus.Collector = (*fleetCounts)(nil)

func newFleetCounts(store gateway.Reader, timing func() (lease, suspectAfter time.Duration)) *fleetCounts {
	return &fleetCounts{store: store, timing: timing, desc: prometheus.NewDesc("fleetgate_fleet_devices",
		"The fleet's devices by the state the store holds (every gateway's, read from the store at each scrape): online (including suspect devices, and those whose lease ran out that no reap has ended yet) or offline; and suspect, those of the online whose deadline is within presence.lease - presence.suspect_after.",
		[]string{"state"}, nil)}
}

func (c *fleetCounts) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }

func (c *fleetCounts) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), coverageTimeout)
	defer cancel()
	n, err := c.store.Counts(ctx, gateway.SuspectWindow(c.timing()))
	if err != nil {
		return
	}
	ch <- prometheus.MustNewConstMetric(c.desc, prometheus.GaugeValue, float64(n.Online), string(gateway.Online))
	ch <- prometheus.MustNewConstMetric(c.desc, prometheus.GaugeValue, float64(n.Offline), string(gateway.Offline))
	ch <- prometheus.MustNewConstMetric(c.desc, prometheus.GaugeValue, float64(n.Suspect), string(gateway.Suspect))
}
