package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/fleetgate/fleetgate/gateway"
	"github.com/fleetgate/fleetgate/sim"
)

// cmdSimulate plays a fleet of CoAP and MQTT devices, with churn, against
// one or more gateways, reads the presence events they wrote (from Redis,
// or from a gateway's admin API for the embedded store) and compares them
// with what the fleet did. It exits 1 when fleetgate reported a false
// offline, missed an offline or an online, or wrote a broken log.
func cmdSimulate(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newBareFlags("simulate", "simulate (--coap HOST:PORT[,...] | --mqtt HOST:PORT[,...] | --check-only FILE[,...]) (--redis ADDR[,...] | --admin HOST:PORT) [flags]")
	coapAddrs := fs.String("coap", "", "gateways' CoAP UDP addresses, comma-separated")
	mqttAddrs := fs.String("mqtt", "", "gateways' MQTT TCP addresses, comma-separated")
	dtlsAddrs := fs.String("dtls", "", "gateways' CoAP DTLS addresses, comma-separated, in the order of --coap")
	dtlsShare := fs.Float64("dtls-share", 0, "share of the CoAP devices that speak DTLS with a PSK (the gateways load the devices file of --write-devices)")
	writeDevices := fs.String("write-devices", "", "write the devices file (auth.devices_file) of the fleet's DTLS devices to this file and exit")
	redisAddrs := fs.String("redis", "", "the Redis store the gateways write (standalone, or Cluster nodes), comma-separated")
	keyPrefix := fs.String("key-prefix", "fleetgate", "the store's key prefix (store.redis.key_prefix)")
	adminAddr := fs.String("admin", "", "a gateway's admin API, to read the events of the embedded store")
	devices := fs.Int("devices", 100, "number of devices")
	mqttShare := fs.Float64("mqtt-share", 0.1, "share of the devices that speak MQTT (half MQTT 5, half 3.1.1)")
	duration := fs.Duration("duration", 40*time.Second, "how long the fleet runs")
	heartbeat := fs.Duration("heartbeat", gateway.DefaultHeartbeatInterval, "each device's heartbeat interval (±10 % jitter)")
	periods := fs.String("periods", "", "`D,...`: a mix of heartbeat intervals for the CoAP devices (the k-th CoAP device sends every k-th of them, ±10 %; the MQTT devices keep --heartbeat): a device that keeps its period must never be reported offline, and the report gives the detection per period")
	lease := fs.Duration("lease", gateway.DefaultLease, "presence.lease of the gateways, for the bounds")
	maxLease := fs.Duration("max-lease", 0, "presence.max_lease of the gateways whose devices hold longer leases than --lease (learned, presence.learn_lease, or their own): the detection bound is its")
	churnAfter := fs.Duration("churn-after", 0, "no churn before this long after the start (learned leases: once the devices' periods are learned)")
	churnShare := fs.Float64("churn-share", 0, "the share of the devices each scenario takes (0: its own, 5 % for freeze)")
	renewEvery := fs.Duration("renew-every", gateway.DefaultRenewEvery, "presence.renew_every of the gateways, for the bounds")
	runnerInterval := fs.Duration("runner-interval", gateway.DefaultRunnerInterval, "runner.interval of the gateways, for the bounds")
	flushInterval := fs.Duration("flush-interval", gateway.DefaultFlushInterval, "uplink.flush_interval of the gateways: how long an online event may lag a device's first message")
	slack := fs.Duration("slack", time.Second, "processing time allowed on top of lease + runner interval")
	tolerance := fs.Duration("tolerance", 300*time.Millisecond, "clock skew and time in flight the checker forgives")
	maxWait := fs.Duration("max-wait", 0, "longest wait for offline events after the fleet stops (default bound + 10s)")
	report := fs.String("report", "", "write the JSON report to this file (- for stdout)")
	seed := fs.Uint64("seed", 1, "seed of the fleet plan (who speaks what, who churns how and when)")
	scenario := fs.String("scenario", "all", "churn: freeze, leave, roam, move, dual, storm, visit, all or none (comma-separated)")
	prefix := fs.String("prefix", "", "device ID prefix (default sim<time>-, new each run)")
	sockets := fs.Int("sockets", 16, "UDP sockets (source ports) the CoAP devices share; each device sends from its own 127.0.0.0/8 address")
	progress := fs.Bool("progress", false, "print a progress line every second on stderr even when it is not a terminal")
	topic := fs.String("topic-prefix", "devices", "auth.topic_prefix of the gateways: MQTT devices publish under <prefix>/<device>/")
	split := fs.String("split", "", "I/N: play part I (0 to N-1) of the fleet, the devices whose index is I modulo N; N runs with the same seed, prefix and fleet flags play all of it")
	truthFile := fs.String("truth", "", "write what the devices played did to this file, for --check-only")
	checkOnly := fs.String("check-only", "", "play nothing: judge the union of the parts whose --truth files are given (comma-separated) against the events")
	if err := parse(fs, args); err != nil {
		return err
	}
	if err := noArgs(fs); err != nil {
		return err
	}
	part, parts, err := parseSplit(*split)
	if err != nil {
		return fmt.Errorf("%w: --split: %v", errUsage, err)
	}
	scen, err := sim.ParseScenarios(*scenario)
	if err != nil {
		return fmt.Errorf("%w: --scenario: %v", errUsage, err)
	}
	mix, err := sim.ParsePeriods(*periods)
	if err != nil {
		return fmt.Errorf("%w: --periods: %v", errUsage, err)
	}
	if *maxLease < 0 || *churnAfter < 0 || *churnAfter >= *duration || *churnShare < 0 || *churnShare > 1 {
		return fmt.Errorf("%w: --max-lease must not be negative, --churn-after within [0, --duration), --churn-share within [0, 1]", errUsage)
	}
	o := sim.Options{
		CoAP: splitList(*coapAddrs), MQTT: splitList(*mqttAddrs), DTLS: splitList(*dtlsAddrs), DTLSShare: *dtlsShare,
		Devices: *devices, MQTTShare: *mqttShare, Duration: *duration, Heartbeat: *heartbeat,
		Scenarios: scen, Seed: *seed, Prefix: *prefix, Sockets: *sockets, Topic: *topic, Part: part, Parts: parts,
		Lease: *lease, MaxLease: *maxLease, Periods: mix, ChurnAfter: *churnAfter, ChurnShare: *churnShare,
		RenewEvery: *renewEvery, RunnerInterval: *runnerInterval, FlushInterval: *flushInterval,
		Slack: *slack, Tolerance: *tolerance, MaxWait: *maxWait,
	}
	if *dtlsShare < 0 || *dtlsShare > 1 || *dtlsShare > 0 && *writeDevices == "" && len(o.DTLS) != len(o.CoAP) {
		return fmt.Errorf("%w: --dtls-share within [0, 1], with a --dtls address for each --coap one", errUsage)
	}
	if *writeDevices != "" {
		return writeDevicesFile(*writeDevices, o, stdout)
	}
	if o.Prefix == "" && (parts > 1 || o.DTLSShare > 0) {
		return fmt.Errorf("%w: --split and --dtls-share need a --prefix (that all parts share, that the devices file lists)", errUsage)
	}
	if o.Prefix == "" {
		o.Prefix = fmt.Sprintf("sim%d-", time.Now().Unix()%1_000_000)
	}
	var truths []sim.Truth
	if *checkOnly != "" {
		if len(o.CoAP)+len(o.MQTT) > 0 || *truthFile != "" || *split != "" {
			return fmt.Errorf("%w: --check-only plays nothing: no --coap, --mqtt, --split or --truth", errUsage)
		}
		for _, name := range splitList(*checkOnly) {
			t, err := readTruth(name)
			if err != nil {
				return err
			}
			truths = append(truths, t)
		}
	} else if len(o.CoAP) == 0 && len(o.MQTT) == 0 {
		return fmt.Errorf("%w: give the gateways' --coap and/or --mqtt addresses", errUsage)
	}
	if len(o.MQTT) == 0 {
		o.MQTTShare = 0
	}
	if len(o.CoAP) == 0 {
		o.MQTTShare = 1
	}
	if *devices < 1 || *duration <= 0 || *heartbeat <= 0 || *lease <= 0 || *mqttShare < 0 || *mqttShare > 1 {
		return fmt.Errorf("%w: --devices, --duration, --heartbeat and --lease must be > 0, --mqtt-share within [0, 1]", errUsage)
	}
	switch {
	case *redisAddrs != "" && *adminAddr != "":
		return fmt.Errorf("%w: --redis and --admin exclude each other", errUsage)
	case *redisAddrs != "":
		src, err := sim.DialRedis(ctx, splitList(*redisAddrs), *keyPrefix)
		if err != nil {
			return err
		}
		defer src.Close()
		o.Source = src
	case *adminAddr != "":
		o.Source = sim.NewAdminSource(*adminAddr)
	default:
		return fmt.Errorf("%w: give --redis (the store) or --admin (a gateway on the embedded store) to read the events", errUsage)
	}
	if isTerminal(stderr) {
		o.Progress = stderr
	} else if *progress {
		o.Progress, o.ProgressLines = stderr, true
	}
	var rep sim.Report
	if truths != nil {
		rep, err = sim.CheckTruths(ctx, o, truths)
	} else {
		rep, err = runFleet(ctx, o, *truthFile)
	}
	if err != nil {
		return err
	}
	if *report != "" {
		b, err := json.MarshalIndent(rep, "", "  ")
		if err != nil {
			return err
		}
		b = append(b, '\n')
		if *report == "-" {
			_, err = stdout.Write(b)
		} else {
			err = os.WriteFile(*report, b, 0o644)
		}
		if err != nil {
			return fmt.Errorf("write report: %w", err)
		}
	}
	if *report != "-" {
		rep.WriteTable(stdout)
	}
	if rep.Failed() {
		return fmt.Errorf("%d false offline, %d missed offline, %d missed online, %d log violations",
			rep.FalseOffline, rep.MissedOffline, rep.MissedOnline, rep.LogViolations)
	}
	return nil
}

func splitList(s string) []string {
	var out []string
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}

// parseSplit parses --split I/N; "" is the whole fleet (0, 1).
func parseSplit(s string) (part, parts int, err error) {
	if s == "" {
		return 0, 1, nil
	}
	if _, err := fmt.Sscanf(s, "%d/%d", &part, &parts); err != nil || parts < 1 || part < 0 || part >= parts || fmt.Sprintf("%d/%d", part, parts) != s {
		return 0, 0, fmt.Errorf("%q: want I/N with 0 <= I < N", s)
	}
	return part, parts, nil
}

// runFleet runs o, writing its truth to the file truth unless "".
func runFleet(ctx context.Context, o sim.Options, truth string) (sim.Report, error) {
	if truth == "" {
		return sim.Run(ctx, o)
	}
	f, err := os.Create(truth)
	if err != nil {
		return sim.Report{}, err
	}
	o.TruthOut = f
	rep, err := sim.Run(ctx, o)
	if cerr := f.Close(); err == nil && cerr != nil {
		err = fmt.Errorf("write the truth: %w", cerr)
	}
	return rep, err
}

func readTruth(name string) (sim.Truth, error) {
	f, err := os.Open(name)
	if err != nil {
		return sim.Truth{}, err
	}
	defer f.Close()
	t, err := sim.ReadTruth(f)
	if err != nil {
		return sim.Truth{}, fmt.Errorf("%s: %w", name, err)
	}
	return t, nil
}

// writeDevicesFile writes the devices file of o's DTLS devices (mode
// 0600: it holds their keys). The fleet's flags (--coap and --mqtt
// included: they decide who speaks what) must be those of the runs.
func writeDevicesFile(name string, o sim.Options, stdout io.Writer) error {
	if o.Prefix == "" || o.DTLSShare == 0 || len(o.CoAP) == 0 {
		return fmt.Errorf("%w: --write-devices needs the runs' --prefix, --coap (and --mqtt) and a --dtls-share", errUsage)
	}
	if len(o.MQTT) == 0 {
		o.MQTTShare = 0 // as the runs do
	}
	po := o.PlanOptions()
	f, err := os.OpenFile(name, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	n, err := sim.WriteDevicesFile(f, po)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("write %s: %w", name, err)
	}
	fmt.Fprintf(stdout, "%s: %d DTLS devices\n", name, n)
	return nil
}
