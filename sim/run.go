package sim

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"slices"
	"time"

	"github.com/fleetgate/fleetgate/gateway"
	"github.com/fleetgate/fleetgate/sim/check"
	"github.com/fleetgate/fleetgate/sim/mqttc"
)

// Options of a run. Lease, RenewEvery and RunnerInterval are the
// gateways' settings: the checker judges with them.
type Options struct {
	CoAP, MQTT []string // gateway addresses
	// DTLS are the CoAP gateways' DTLS listeners, in the order of CoAP:
	// DTLSShare of the CoAP devices speak DTLS with a PSK (their devices
	// file: WriteDevicesFile).
	DTLS      []string
	DTLSShare float64
	Source    Source // where the events are read

	Devices   int
	MQTTShare float64
	Duration  time.Duration
	Heartbeat time.Duration
	Scenarios []Churn
	Seed      uint64
	Prefix    string // device ID prefix
	Sockets   int    // UDP sockets of the CoAP devices
	Topic     string // MQTT topic prefix (auth.topic_prefix)
	// Part and Parts split the fleet: this run plays the devices whose
	// index is Part modulo Parts (Parts 0 or 1: all of them). Other
	// runs, here or on other hosts, play the rest of the same seeded
	// fleet; CheckTruths judges the union of their truths.
	Part, Parts int
	// TruthOut, when set, gets the truth of the devices played (JSON),
	// for CheckTruths.
	TruthOut io.Writer

	Lease, RenewEvery, RunnerInterval time.Duration
	// MaxLease is the gateways' presence.max_lease when their devices
	// hold longer leases than Lease (learned, or their own): the bound
	// is its. 0: Lease.
	MaxLease time.Duration
	// Periods, ChurnAfter and ChurnShare are PlanOptions'.
	Periods    []time.Duration
	ChurnAfter time.Duration
	ChurnShare float64
	// FlushInterval is the gateways' uplink.flush_interval: an online
	// event may come up to FlushInterval + Slack after a device's first
	// acknowledged evidence.
	FlushInterval time.Duration
	// Slack is the processing time added to lease + runner interval in
	// the bound; Tolerance absorbs clock skew and time in flight.
	Slack, Tolerance time.Duration
	// MaxWait bounds the wait for offline events after the fleet stops;
	// default the bound plus 10 s.
	MaxWait time.Duration

	// Progress, when set, gets a live progress line every second; with
	// ProgressLines each on its own line (for a log), else redrawn.
	Progress      io.Writer
	ProgressLines bool
}

func (o *Options) validate() error {
	switch {
	case o.Devices < 1:
		return errors.New("devices must be > 0")
	case o.Duration <= 0 || o.Heartbeat <= 0 || o.Lease <= 0:
		return errors.New("duration, heartbeat and lease must be > 0")
	case o.MQTTShare < 0 || o.MQTTShare > 1:
		return errors.New("mqtt share must be within [0, 1]")
	case len(o.CoAP) == 0 && len(o.MQTT) == 0:
		return errors.New("no gateway: give a CoAP or an MQTT address")
	case o.Source == nil:
		return errors.New("no event source")
	case o.DTLSShare < 0 || o.DTLSShare > 1:
		return errors.New("dtls share must be within [0, 1]")
	case o.DTLSShare > 0 && len(o.DTLS) != len(o.CoAP):
		return errors.New("a DTLS share needs a DTLS address for each CoAP gateway")
	case slices.ContainsFunc(o.Periods, func(p time.Duration) bool { return p <= 0 }):
		return errors.New("periods must be > 0")
	case o.ChurnShare < 0 || o.ChurnShare > 1:
		return errors.New("churn share must be within [0, 1]")
	case o.Parts > 1 && (o.Part < 0 || o.Part >= o.Parts):
		return fmt.Errorf("part %d of %d: want 0 to %d", o.Part, o.Parts, o.Parts-1)
	}
	if o.Parts < 1 {
		o.Parts = 1
	}
	for _, a := range slices.Concat(o.CoAP, o.MQTT, o.DTLS) {
		if err := loopback(a); err != nil {
			return err
		}
	}
	if len(o.MQTT) == 0 {
		o.MQTTShare = 0
	}
	if len(o.CoAP) == 0 {
		o.DTLSShare = 0
	}
	if o.Sockets < 1 {
		o.Sockets = 16
	}
	if o.Topic == "" {
		o.Topic = "devices"
	}
	return nil
}

// loopback checks that addr is a loopback address: the devices play
// from addresses of their own in 127.0.0.0/8, which reach no other host.
func loopback(addr string) error {
	a, err := net.ResolveTCPAddr("tcp4", addr)
	if err != nil {
		return fmt.Errorf("gateway %s: %w", addr, err)
	}
	if !a.IP.IsLoopback() {
		return fmt.Errorf("gateway %s: not a loopback address; the simulated devices send from addresses of their own in 127.0.0.0/8", addr)
	}
	return nil
}

// Bound is the worst-case detection the run is judged against: the
// bound check-config prints (the longest lease, the wait for the
// gateways' coverage, the runner's interval) and the slack.
func (o Options) Bound() time.Duration {
	return max(o.Lease, o.MaxLease) + gateway.CoverageWait(o.FlushInterval) + o.RunnerInterval + o.Slack
}

// maxJittered is the longest interval jitter makes of h.
func maxJittered(h time.Duration) time.Duration { return h - h/10 + h/5 }

// Run plays the fleet, waits for what should follow, reads the events
// and compares them with the truth.
func Run(ctx context.Context, o Options) (Report, error) {
	if err := o.validate(); err != nil {
		return Report{}, err
	}
	plans := Plan(o.PlanOptions())
	stats := newStats(o.Heartbeat)
	var truths []*truth
	var cf *coapFleet
	var err error
	if len(o.CoAP) > 0 {
		if cf, err = newCoAPFleet(ctx, o.CoAP, o.DTLS, o.Sockets, o.Seed, stats); err != nil {
			return Report{}, err
		}
	}
	// the devices are made before the clock starts: at 100,000 that
	// takes a while, and their first heartbeats are due from the start
	mf := &mqttFleet{gws: o.MQTT, stats: stats, keepAlive: keepAlive(o.Heartbeat), timeout: 5 * time.Second, topic: o.Topic,
		open: map[*mqttc.Conn]struct{}{}}
	for i, p := range plans {
		if !inPart(i, o.Part, o.Parts) {
			continue // another part's
		}
		t := &truth{id: p.ID, active: true}
		if len(o.Periods) > 0 {
			t.period = maxJittered(p.Period)
		}
		truths = append(truths, t)
		if p.Proto.mqtt() {
			mf.add(i, p, t)
		} else {
			cf.add(i, p, t)
		}
	}
	before, haveCounters, err := o.Source.Counters(ctx)
	if err != nil {
		return Report{}, err
	}
	start := time.Now()
	fleetCtx, stop := context.WithTimeout(ctx, o.Duration)
	defer stop()
	// the wheel spans a heartbeat and its jitter: most entries fire in
	// their first revolution
	longest := o.PlanOptions().MaxPeriod()
	sched := newScheduler(start, longest+longest/5+time.Second)
	mf.ctx, mf.sched, mf.start = fleetCtx, sched, start
	if cf != nil {
		cf.start, cf.ctx = start, fleetCtx
		sched.add(sweeper{cf}, start.Add(sweepEvery))
		sched.flushers = append(sched.flushers, cf.flush)
		for _, d := range cf.devs {
			sched.add(d, d.first())
		}
	}
	for _, d := range mf.devs {
		d.id = sched.add(d, d.first())
	}
	progressDone := make(chan struct{})
	go func() {
		defer close(progressDone)
		o.progress(fleetCtx, start, stats)
	}()
	sched.run(fleetCtx)
	<-progressDone
	mf.stop(5 * time.Second)
	if cf != nil {
		cf.drain(time.Second)
		cf.close()
	}
	end := time.Now()
	if n := stats.snapshot(); n.Answered == 0 {
		return Report{}, fmt.Errorf("no gateway answered any of the %d messages sent (%d connections refused or failed): are the addresses right?", n.Sent, n.ConnectErrors)
	}
	after, _, err := o.Source.Counters(ctx)
	if err != nil {
		return Report{}, err
	}

	devices := make([]check.Device, len(truths))
	for i, t := range truths {
		devices[i] = t.device()
	}
	played := Truth{Part: o.Part, Parts: o.Parts, Plan: o.PlanOptions(), Start: start, End: end, Fleet: stats.snapshot(), Devices: devices}
	if o.TruthOut != nil {
		if err := json.NewEncoder(o.TruthOut).Encode(played); err != nil {
			return Report{}, fmt.Errorf("write the truth: %w", err)
		}
	}
	rep, err := o.judge(ctx, plans, played)
	if err != nil {
		return Report{}, err
	}
	if haveCounters && rep.HeartbeatsSent > 0 {
		rep.StoreCalls = after.Calls - before.Calls
		rep.StoreCallsPerHeartbeat = float64(rep.StoreCalls) / float64(rep.HeartbeatsSent)
		rep.StoreCPUMicrosPerHeartbeat = float64((after.CPU - before.CPU).Microseconds()) / float64(rep.HeartbeatsSent)
	}
	return rep, nil
}

// inPart reports whether device i of the plan is played by part of
// parts.
func inPart(i, part, parts int) bool { return i%parts == part }

// PlanOptions are the options of o's fleet plan.
func (o Options) PlanOptions() PlanOptions {
	return PlanOptions{Devices: o.Devices, MQTTShare: o.MQTTShare, Duration: o.Duration, Heartbeat: o.Heartbeat,
		CoAPGateways: len(o.CoAP), MQTTGateways: len(o.MQTT), Scenarios: o.Scenarios, Seed: o.Seed, Prefix: o.Prefix,
		DTLSShare: o.DTLSShare, Periods: o.Periods, ChurnAfter: o.ChurnAfter, ChurnShare: o.ChurnShare}
}

// judge waits until every stopped device's bound has passed or its
// offline event is in, and every online event is in or overdue
// (bounded by MaxWait), and compares the events with the truth.
func (o Options) judge(ctx context.Context, plans []DevicePlan, t Truth) (Report, error) {
	params := check.Params{Lease: o.Lease, RenewEvery: o.RenewEvery, Bound: o.Bound(), Tolerance: o.Tolerance,
		OnlineBound: o.FlushInterval + o.Slack}
	maxWait := o.MaxWait
	if maxWait <= 0 {
		maxWait = o.Bound() + 10*time.Second
	}
	waitUntil := t.End.Add(maxWait)
	var events []check.Event
	var res check.Result
	for {
		var err error
		events, err = o.Source.Events(ctx, t.Start.Add(-time.Second))
		if err != nil {
			return Report{}, err
		}
		params.End = time.Now().Add(-o.Tolerance)
		res = check.Compare(t.Devices, events, params)
		if res.Pending == 0 || time.Now().After(waitUntil) || ctx.Err() != nil {
			break
		}
		if o.Progress != nil && !o.ProgressLines {
			fmt.Fprintf(o.Progress, "\rwaiting for the events of %d devices (offline bound %s) ...   ", res.Pending, o.Bound())
		}
		select {
		case <-ctx.Done():
		case <-time.After(max(500*time.Millisecond, o.Bound()/20)):
		}
	}
	if o.Progress != nil && !o.ProgressLines {
		fmt.Fprintln(o.Progress)
	}
	return newReport(o, plans, t.Devices, events, params, res, t.Fleet, t.End.Sub(t.Start)), nil
}

// keepAlive is what MQTT devices ask for: twice their heartbeat, at
// least 2 s (mochi's keep-alive deadline is keepalive + keepalive/2 in
// whole seconds, so a keep-alive of 1 s gives 1 s, not 1.5 s). The
// gateway clamps it to its heartbeat interval.
func keepAlive(hb time.Duration) time.Duration {
	return max(2*time.Second, (2 * hb).Round(time.Second))
}

// progress writes a live line every second until ctx ends.
func (o Options) progress(ctx context.Context, start time.Time, s *Stats) {
	if o.Progress == nil {
		<-ctx.Done()
		return
	}
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		n := s.snapshot()
		lead, end := "\r", "   "
		if o.ProgressLines {
			lead, end = time.Now().UTC().Format("15:04:05.000 "), "\n"
		}
		fmt.Fprintf(o.Progress, "%s%5.0fs/%s  sent %d  acked %d  mqtt connected %d  reconnects %d  errors %d  on schedule %.2f %%%s",
			lead, time.Since(start).Seconds(), o.Duration, n.Sent, n.Answered, n.Connected, n.Reconnects, n.SendErrors+n.ConnectErrors+n.Unanswered, 100*n.OnTime, end)
	}
}

// churnOf maps device IDs to their churn.
func churnOf(plans []DevicePlan) map[string]Churn {
	m := make(map[string]Churn, len(plans))
	for _, p := range plans {
		m[p.ID] = p.Churn
	}
	return m
}

func scenarioNames(cs []Churn) []string {
	out := make([]string, 0, len(cs))
	for _, c := range cs {
		out = append(out, c.String())
	}
	slices.Sort(out)
	return out
}
