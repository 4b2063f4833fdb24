package main

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"

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
			"Devices with a session on this gateway, by state: online (evidence within presence.suspect_after) or suspect (none since, but the lease has not run out).",
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
