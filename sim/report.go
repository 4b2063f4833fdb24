package sim

import (
	"fmt"
	"io"
	"maps"
	"slices"
	"text/tabwriter"
	"time"

	"github.com/fleetgate/fleetgate/sim/check"
)

// Report is the result of a run, as written to --report.
type Report struct {
	Devices        int   `json:"devices"`
	HeartbeatsSent int64 `json:"heartbeats_sent"`
	FalseOffline   int   `json:"false_offline"`
	MissedOffline  int   `json:"missed_offline"`
	LogViolations  int   `json:"log_violations"`
	MissedOnline   int   `json:"missed_online"`
	LateOffline    int   `json:"late_offline"`
	Pending        int   `json:"pending"`

	Detection check.Percentiles `json:"detection_ms"`
	BoundMS   int64             `json:"bound_ms"`

	// StoreCallsPerHeartbeat: Redis commands executed (INFO
	// commandstats, script internals included) per device message.
	StoreCallsPerHeartbeat     float64 `json:"store_calls_per_heartbeat"`
	StoreCalls                 int64   `json:"store_calls"`
	StoreCPUMicrosPerHeartbeat float64 `json:"store_cpu_us_per_heartbeat"`

	Events  int           `json:"events"`
	Stopped int           `json:"stopped"`
	Fleet   Snapshot      `json:"fleet"`
	ByChurn []ChurnResult `json:"scenarios"`
	// ByPeriod is the checker's result per heartbeat interval of a
	// fleet of mixed periods (Options.Periods), shortest first.
	ByPeriod []PeriodResult  `json:"periods,omitempty"`
	Params   ReportParams    `json:"params"`
	Sample   []check.Finding `json:"examples,omitempty"`
}

// ChurnResult is the checker's result for the devices of one churn.
type ChurnResult struct {
	Scenario      string            `json:"scenario"`
	Devices       int               `json:"devices"`
	FalseOffline  int               `json:"false_offline"`
	MissedOffline int               `json:"missed_offline"`
	LogViolations int               `json:"log_violations"`
	MissedOnline  int               `json:"missed_online"`
	Detection     check.Percentiles `json:"detection_ms"`
}

// PeriodResult is the checker's result for the devices of one heartbeat
// interval: their detection is that of their lease.
type PeriodResult struct {
	Period        string            `json:"period"`
	Devices       int               `json:"devices"`
	Stopped       int               `json:"stopped"`
	FalseOffline  int               `json:"false_offline"`
	MissedOffline int               `json:"missed_offline"`
	LogViolations int               `json:"log_violations"`
	MissedOnline  int               `json:"missed_online"`
	Detection     check.Percentiles `json:"detection_ms"`
}

// ReportParams are what the run was asked to do.
type ReportParams struct {
	CoAP           []string `json:"coap,omitempty"`
	MQTT           []string `json:"mqtt,omitempty"`
	MQTTShare      float64  `json:"mqtt_share"`
	Duration       string   `json:"duration"`
	Ran            string   `json:"ran"`
	Heartbeat      string   `json:"heartbeat"`
	Lease          string   `json:"lease"`
	MaxLease       string   `json:"max_lease,omitempty"`
	Periods        []string `json:"periods,omitempty"`
	ChurnAfter     string   `json:"churn_after,omitempty"`
	ChurnShare     float64  `json:"churn_share,omitempty"`
	RenewEvery     string   `json:"renew_every"`
	RunnerInterval string   `json:"runner_interval"`
	FlushInterval  string   `json:"flush_interval"`
	Slack          string   `json:"slack"`
	Tolerance      string   `json:"tolerance"`
	Seed           uint64   `json:"seed"`
	Prefix         string   `json:"prefix"`
	Scenarios      []string `json:"scenarios"`
}

func newReport(o Options, plans []DevicePlan, devices []check.Device, events []check.Event, p check.Params, res check.Result, s Snapshot, ran time.Duration) Report {
	r := Report{
		Devices: res.Devices, HeartbeatsSent: s.Sent, FalseOffline: res.FalseOffline, MissedOffline: res.MissedOffline,
		LogViolations: res.LogViolations, MissedOnline: res.MissedOnline, LateOffline: res.LateOffline, Pending: res.Pending,
		Detection: res.Detection, BoundMS: res.BoundMS, Events: res.Events, Stopped: res.Stopped, Fleet: s, Sample: res.Examples,
		Params: ReportParams{CoAP: o.CoAP, MQTT: o.MQTT, MQTTShare: o.MQTTShare, Duration: o.Duration.String(), Ran: ran.Round(time.Millisecond).String(),
			Heartbeat: o.Heartbeat.String(), Lease: o.Lease.String(), RenewEvery: o.RenewEvery.String(),
			RunnerInterval: o.RunnerInterval.String(), FlushInterval: o.FlushInterval.String(), Slack: o.Slack.String(), Tolerance: o.Tolerance.String(),
			Seed: o.Seed, Prefix: o.Prefix, Scenarios: scenarioNames(o.Scenarios)},
	}
	if o.MaxLease > 0 {
		r.Params.MaxLease = o.MaxLease.String()
	}
	if o.ChurnAfter > 0 {
		r.Params.ChurnAfter = o.ChurnAfter.String()
	}
	r.Params.ChurnShare = o.ChurnShare
	for _, p := range o.Periods {
		r.Params.Periods = append(r.Params.Periods, p.String())
	}
	if len(o.Periods) > 0 {
		r.ByPeriod = byPeriod(plans, devices, events, p)
	}
	churns := churnOf(plans)
	groups := map[Churn][]check.Device{}
	for _, d := range devices {
		groups[churns[d.ID]] = append(groups[churns[d.ID]], d)
	}
	for c := Steady; c <= Visit; c++ {
		g := groups[c]
		if len(g) == 0 {
			continue
		}
		cr := check.Compare(g, events, p)
		r.ByChurn = append(r.ByChurn, ChurnResult{Scenario: c.String(), Devices: len(g), FalseOffline: cr.FalseOffline,
			MissedOffline: cr.MissedOffline, LogViolations: cr.LogViolations, MissedOnline: cr.MissedOnline, Detection: cr.Detection})
	}
	return r
}

// byPeriod judges the devices of each heartbeat interval apart.
func byPeriod(plans []DevicePlan, devices []check.Device, events []check.Event, p check.Params) []PeriodResult {
	period := make(map[string]time.Duration, len(plans))
	for _, pl := range plans {
		period[pl.ID] = pl.Period
	}
	groups := map[time.Duration][]check.Device{}
	for _, d := range devices {
		groups[period[d.ID]] = append(groups[period[d.ID]], d)
	}
	var out []PeriodResult
	for _, h := range slices.Sorted(maps.Keys(groups)) {
		g := groups[h]
		cr := check.Compare(g, events, p)
		out = append(out, PeriodResult{Period: h.String(), Devices: len(g), Stopped: cr.Stopped, FalseOffline: cr.FalseOffline,
			MissedOffline: cr.MissedOffline, LogViolations: cr.LogViolations, MissedOnline: cr.MissedOnline, Detection: cr.Detection})
	}
	return out
}

// Failed reports whether a count that must be zero is not.
func (r Report) Failed() bool {
	return r.FalseOffline > 0 || r.MissedOffline > 0 || r.LogViolations > 0 || r.MissedOnline > 0
}

// WriteTable writes the summary a person reads.
func (r Report) WriteTable(w io.Writer) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "devices\t%d\t(%d stopped during the run)\n", r.Devices, r.Stopped)
	fmt.Fprintf(tw, "messages sent\t%d\t(%d acknowledged, %d CoAP unanswered, %d send errors)\n", r.HeartbeatsSent, r.Fleet.Answered, r.Fleet.Unanswered, r.Fleet.SendErrors)
	if r.Fleet.Connects+r.Fleet.ConnectErrors > 0 {
		fmt.Fprintf(tw, "mqtt connects\t%d\t(%d failed)\n", r.Fleet.Connects, r.Fleet.ConnectErrors)
		for _, k := range slices.Sorted(maps.Keys(r.Fleet.ConnectErrorKinds)) {
			fmt.Fprintf(tw, "\t%d\t%s\n", r.Fleet.ConnectErrorKinds[k], k)
		}
	}
	if r.Fleet.Heartbeats > 0 {
		fmt.Fprintf(tw, "heartbeats on schedule\t%.2f %%\t(of %d within 100 ms; latest %.0f ms late)\n", 100*r.Fleet.OnTime, r.Fleet.Heartbeats, r.Fleet.MaxLateMS)
	}
	fmt.Fprintf(tw, "events read\t%d\t\n", r.Events)
	fmt.Fprintf(tw, "false offline\t%d\t%s\n", r.FalseOffline, mark(r.FalseOffline))
	fmt.Fprintf(tw, "missed offline\t%d\t%s\n", r.MissedOffline, markLate(r.MissedOffline, r.LateOffline))
	fmt.Fprintf(tw, "log violations\t%d\t%s\n", r.LogViolations, mark(r.LogViolations))
	fmt.Fprintf(tw, "missed online\t%d\t%s\n", r.MissedOnline, mark(r.MissedOnline))
	if r.Pending > 0 {
		fmt.Fprintf(tw, "pending\t%d\t(bound not passed when the wait ended)\n", r.Pending)
	}
	fmt.Fprintf(tw, "detection ms\tp50 %d  p99 %d  max %d\t(n=%d, bound %d)\n", r.Detection.P50, r.Detection.P99, r.Detection.Max, r.Detection.N, r.BoundMS)
	if r.StoreCalls > 0 {
		fmt.Fprintf(tw, "store calls / message\t%.3f\t(%d calls; %.1f µs Redis CPU / message)\n", r.StoreCallsPerHeartbeat, r.StoreCalls, r.StoreCPUMicrosPerHeartbeat)
	}
	tw.Flush()
	if len(r.ByChurn) > 0 {
		fmt.Fprintln(w)
		tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
		fmt.Fprintln(tw, "scenario\tdevices\tfalse off\tmissed off\tlog viol\tmissed on\tdetect p50\tp99\tmax\t")
		for _, c := range r.ByChurn {
			fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t\n", c.Scenario, c.Devices, c.FalseOffline, c.MissedOffline,
				c.LogViolations, c.MissedOnline, c.Detection.P50, c.Detection.P99, c.Detection.Max)
		}
		tw.Flush()
	}
	if len(r.ByPeriod) > 0 {
		fmt.Fprintln(w)
		tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
		fmt.Fprintln(tw, "period\tdevices\tstopped\tfalse off\tmissed off\tlog viol\tmissed on\tdetect p50\tp99\tmax\t")
		for _, c := range r.ByPeriod {
			fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t\n", c.Period, c.Devices, c.Stopped, c.FalseOffline, c.MissedOffline,
				c.LogViolations, c.MissedOnline, c.Detection.P50, c.Detection.P99, c.Detection.Max)
		}
		tw.Flush()
	}
	if len(r.Sample) > 0 {
		fmt.Fprintln(w, "\nfirst findings:")
		for _, f := range r.Sample[:min(len(r.Sample), 10)] {
			fmt.Fprintf(w, "  %s %s: %s\n", f.Kind, f.Device, f.Detail)
		}
	}
	if r.Failed() {
		fmt.Fprintln(w, "\nFAIL: fleetgate's events disagree with what the fleet did")
	} else {
		fmt.Fprintln(w, "\nOK")
	}
}

func mark(n int) string {
	if n > 0 {
		return "FAIL"
	}
	return "ok"
}

func markLate(n, late int) string {
	if n == 0 {
		return "ok"
	}
	return fmt.Sprintf("FAIL (%d came after the bound)", late)
}
