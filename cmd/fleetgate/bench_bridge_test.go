package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/fleetgate/fleetgate/gateway"
	"github.com/fleetgate/fleetgate/internal/mosquittotest"
)

// The data path against its anchor, mosquitto's own bridge: a local
// mosquitto (persistence true) with a `connection` to an upstream
// mosquitto, devices/# out at QoS 1. Both designs get the same fleet of
// 1,000 MQTT 5 devices (rawMQTT, one in flight each), 100-byte payloads
// carrying their send time, and each its own upstream mosquitto, on
// which one subscriber counts what arrives and when.
//
// Environment, to try other loads: DPBENCH_RATE (messages/s of the
// fleet), DPBENCH_SECONDS (of each run), DPBENCH_DEVICES; DPBENCH_PERF=dir
// records a CPU profile of the gateway with perf during fleetgate's
// runs (perf record -g, 499 Hz) into dir and logs where its time went.

const (
	dpDevices  = 1000
	dpPayloadB = 100
)

func envInt(name string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(name)); err == nil && v > 0 {
		return v
	}
	return def
}

// dpSide is what the devices talk to: fleetgate or a mosquitto bridge,
// the process to measure, and its upstream broker.
type dpSide struct {
	name string
	addr string
	pid  int
	up   *mosquittotest.Broker
	gw   *gatewayProc // fleetgate's
}

// shippedTiming is the shipped presence timing (benchGateway's).
var shippedTiming = e2eTiming{lease: gateway.DefaultLease, heartbeat: gateway.DefaultHeartbeatInterval,
	renewEvery: gateway.DefaultRenewEvery, flush: gateway.DefaultFlushInterval, runnerInterval: gateway.DefaultRunnerInterval}

// startSide starts design name ("fleetgate" or "mosquitto") with a
// fresh upstream broker. fleetgate runs on the embedded store with the
// shipped timings and the shipped bridge.queue (commit_interval 10ms).
func startSide(b testing.TB, name string) *dpSide {
	b.Helper()
	s := &dpSide{name: name, up: upstreamBroker(b, 0)}
	switch name {
	case "fleetgate":
		s.gw = bridgeGateway(b, "gw-dp", s.up.Addr, "", shippedTiming)
		s.gw.start()
		s.addr, s.pid = s.gw.mqttAddr, s.gw.cmd.Process.Pid
	case "mosquitto":
		local := mosquittoBridge(b, "mosq", s.up.Addr)
		s.addr, s.pid = local.Addr, brokerPid(b, local)
		// the bridge is up once a message goes through
		ctx, cancel := context.WithCancel(b.Context())
		defer cancel()
		probe := countUpstream(b, ctx, s.up.Addr, "probe", "fleetgate/mosq/devices/#", 1, 1, false)
		c, err := dialRaw(s.addr, "dp0000", rawOptions{})
		if err != nil {
			b.Fatal(err)
		}
		deadline := time.Now().Add(20 * time.Second)
		for probe.counts().arrivals == 0 {
			if time.Now().After(deadline) {
				b.Fatalf("mosquitto's bridge forwarded nothing in 20s\n%s", local.Log())
			}
			if _, err := c.publish("devices/dp0000/t", 0, dpPayload(0, 16)); err != nil {
				b.Fatal(err)
			}
			time.Sleep(50 * time.Millisecond)
		}
		c.disconnect()
	default:
		b.Fatalf("side %q", name)
	}
	return s
}

func (s *dpSide) filter() string {
	if s.name == "fleetgate" {
		return "fleetgate/gw-dp/devices/#"
	}
	return "fleetgate/mosq/devices/#"
}

// dpResult is one run of a fleet against a side.
type dpResult struct {
	sent, acked, forwarded, dups, reordered int64
	refused, failures                       int64
	window                                  time.Duration // first send to last arrival
	cpu, upCPU, selfCPU                     float64       // seconds: the side's process, its upstream, this test process
	lat, ack                                []time.Duration
	drained                                 bool
}

func (r dpResult) perCPU() float64 { return float64(r.forwarded) / max(r.cpu, 0.01) }

// measureSide runs devices at rate messages/s in all for dur at qos
// against s and measures: the messages forwarded (distinct arrivals
// upstream), the CPU of s's process from the first send until every
// acknowledged (QoS 0: sent) message arrived or 30 s more, and the
// latencies.
func measureSide(b *testing.B, s *dpSide, devices, rate int, dur time.Duration, qos byte) dpResult {
	b.Helper()
	ctx, cancel := context.WithCancel(b.Context())
	defer cancel()
	counter := countUpstream(b, ctx, s.up.Addr, "counter-"+s.name, s.filter(), 0, devices, false)
	f := connectFleet(b, func() string { return s.addr }, dpDeviceIDs(devices))
	time.Sleep(3 * time.Second) // the connect burst's flushes
	every := time.Duration(float64(devices) / float64(rate) * float64(time.Second))
	count := int(dur / every)
	perf := startPerf(b, s, qos)
	upPid := brokerPid(b, s.up)
	self := os.Getpid()
	c0, u0, s0 := procTicks(b, s.pid), procTicks(b, upPid), procTicks(b, self)
	counter.record(true)
	f.recordAcks()
	start := time.Now().Add(50 * time.Millisecond)
	f.run(dpLoad{qos: qos, every: every, count: count, size: dpPayloadB, prefix: "devices",
		start: start, deadline: start.Add(dur + 60*time.Second)})
	want := f.acked()
	r := dpResult{drained: counter.awaitUnique(want, 30*time.Second)}
	if !r.drained && qos == 0 {
		r.drained = true // QoS 0 may lose; the wait ran out
	}
	last := time.Now()
	c1, u1, s1 := procTicks(b, s.pid), procTicks(b, upPid), procTicks(b, self)
	perf()
	cnt := counter.counts()
	r.sent, r.acked, r.forwarded, r.dups, r.reordered = f.sent.Load(), want, cnt.unique, cnt.dups, cnt.reordered
	r.refused, r.failures = f.refused.Load(), f.failures.Load()
	r.window = last.Sub(start)
	r.cpu = float64(c1-c0) / ticksPerSecond
	r.upCPU = float64(u1-u0) / ticksPerSecond
	r.selfCPU = float64(s1-s0) / ticksPerSecond
	r.lat, r.ack = counter.latencies(), f.ackLatencies()
	f.disconnect()
	if r.failures > 0 {
		f.mu.Lock()
		b.Logf("%s: %d failures, first: %v", s.name, r.failures, f.errs)
		f.mu.Unlock()
	}
	return r
}

func (r dpResult) String() string {
	return fmt.Sprintf("sent %d, acknowledged %d, forwarded %d (dups %d, reordered %d, refused %d, failures %d) in %.1fs, all arrived: %v; "+
		"CPU %.2fs (%.0f msgs/CPU-s), upstream %.2fs, test process %.2fs; latency p50 %v p99 %v max %v; PUBACK p50 %v p99 %v",
		r.sent, r.acked, r.forwarded, r.dups, r.reordered, r.refused, r.failures, r.window.Seconds(), r.drained,
		r.cpu, r.perCPU(), r.upCPU, r.selfCPU, quantile(r.lat, 0.5).Round(10*time.Microsecond), quantile(r.lat, 0.99).Round(10*time.Microsecond),
		quantile(r.lat, 1).Round(10*time.Microsecond), quantile(r.ack, 0.5).Round(10*time.Microsecond), quantile(r.ack, 0.99).Round(10*time.Microsecond))
}

// BenchmarkBridgeAgainstMosquitto: messages forwarded upstream per CPU
// second of the process the devices talk to (utime + stime from /proc,
// from the first send until the last message arrived upstream):
// fleetgate (embedded store, shipped timings and bridge.queue; presence
// on, the QoS 1 messages fsynced to bridge.db before their PUBACK)
// against mosquitto's bridge (the local mosquitto; its persistence is a
// snapshot every autosave_interval, 30 min: nothing is written to disk
// per message), at QoS 1 and at QoS 0, 1,000 devices, 5,000 msg/s in
// all for 20 s. ratio is fleetgate's figure over mosquitto's (goal
// ≥ 0.5).
func BenchmarkBridgeAgainstMosquitto(b *testing.B) {
	devices := envInt("DPBENCH_DEVICES", dpDevices)
	rate := envInt("DPBENCH_RATE", 5000)
	dur := time.Duration(envInt("DPBENCH_SECONDS", 20)) * time.Second
	for _, qos := range []byte{1, 0} {
		b.Run(fmt.Sprintf("qos=%d", qos), func(b *testing.B) {
			for range b.N {
				var res [2]dpResult
				for i, name := range []string{"fleetgate", "mosquitto"} {
					s := startSide(b, name)
					res[i] = measureSide(b, s, devices, rate, dur, qos)
					b.Logf("%s qos %d, %d devices, %d msg/s: %v", name, qos, devices, rate, res[i])
					if s.gw != nil {
						s.gw.stop()
					}
				}
				fg, mq := res[0], res[1]
				b.ReportMetric(fg.perCPU(), "fleetgate-msgs/cpu-s")
				b.ReportMetric(mq.perCPU(), "mosquitto-msgs/cpu-s")
				b.ReportMetric(fg.perCPU()/mq.perCPU(), "ratio")
				b.ReportMetric(float64(fg.forwarded)/fg.window.Seconds(), "fleetgate-msgs/s")
				b.ReportMetric(fg.upCPU/max(mq.upCPU, 0.01), "upstream-cpu-ratio")
				if !fg.drained || !mq.drained {
					b.Errorf("not every acknowledged message arrived: fleetgate %v, mosquitto %v", fg.drained, mq.drained)
				}
			}
		})
	}
}

// BenchmarkBridgeLatency: device-to-upstream latency (the arrival at
// the upstream subscriber − the send time in the payload, same clock),
// QoS 1, 1,000 devices at 2,000 msg/s in all for 30 s, fleetgate with
// the shipped commit_interval (10ms) against mosquitto's bridge. Goal:
// fleetgate's p99 ≤ 20 ms. ack is the device's PUBLISH-to-PUBACK time
// (fleetgate: the commit and its fsync).
func BenchmarkBridgeLatency(b *testing.B) {
	devices := envInt("DPBENCH_DEVICES", dpDevices)
	rate := envInt("DPBENCH_RATE", 2000)
	dur := time.Duration(envInt("DPBENCH_SECONDS", 30)) * time.Second
	for range b.N {
		var res [2]dpResult
		for i, name := range []string{"fleetgate", "mosquitto"} {
			s := startSide(b, name)
			res[i] = measureSide(b, s, devices, rate, dur, 1)
			b.Logf("%s qos 1, %d devices, %d msg/s: %v", name, devices, rate, res[i])
			if s.gw != nil {
				s.gw.stop()
			}
		}
		ms := func(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
		fg, mq := res[0], res[1]
		b.ReportMetric(ms(quantile(fg.lat, 0.5)), "fleetgate-p50-ms")
		b.ReportMetric(ms(quantile(fg.lat, 0.99)), "fleetgate-p99-ms")
		b.ReportMetric(ms(quantile(fg.lat, 1)), "fleetgate-max-ms")
		b.ReportMetric(ms(quantile(fg.ack, 0.99)), "fleetgate-ack-p99-ms")
		b.ReportMetric(ms(quantile(mq.lat, 0.5)), "mosquitto-p50-ms")
		b.ReportMetric(ms(quantile(mq.lat, 0.99)), "mosquitto-p99-ms")
		b.ReportMetric(ms(quantile(mq.lat, 1)), "mosquitto-max-ms")
		if !fg.drained || !mq.drained {
			b.Errorf("not every acknowledged message arrived: fleetgate %v, mosquitto %v", fg.drained, mq.drained)
		}
	}
}

// startPerf records fleetgate's CPU with perf while the returned stop is
// not called, when DPBENCH_PERF names a directory; stop then logs the
// hottest symbols and the share of each Go package.
func startPerf(b *testing.B, s *dpSide, qos byte) (stop func()) {
	dir := os.Getenv("DPBENCH_PERF")
	if dir == "" || s.gw == nil {
		return func() {}
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		b.Fatal(err)
	}
	data := filepath.Join(dir, fmt.Sprintf("%s-%s-qos%d.perf.data", s.name, strings.ReplaceAll(b.Name(), "/", "_"), qos))
	cmd := exec.Command("perf", "record", "-F", "499", "-g", "-p", strconv.Itoa(s.pid), "-o", data)
	out := &syncBuffer{}
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		b.Fatalf("perf: %v", err)
	}
	return func() {
		_ = cmd.Process.Signal(syscall.SIGINT)
		_ = cmd.Wait()
		rep, err := exec.Command("perf", "report", "-i", data, "--stdio", "--no-children", "-g", "none",
			"--sort", "sym", "--percent-limit", "0").Output()
		if err != nil {
			b.Logf("perf report: %v\n%s", err, out)
			return
		}
		b.Logf("perf profile of fleetgate (%s):\n%s", data, perfSummary(string(rep), 25))
	}
}

// perfSummary condenses `perf report --sort sym`: the top symbols and
// the share of each Go package (kernel symbols as "kernel").
func perfSummary(report string, top int) string {
	type entry struct {
		pct float64
		sym string
	}
	var syms []entry
	pkgs := map[string]float64{}
	for _, line := range strings.Split(report, "\n") {
		f := strings.Fields(line)
		if len(f) < 3 || !strings.HasSuffix(f[0], "%") {
			continue
		}
		pct, err := strconv.ParseFloat(strings.TrimSuffix(f[0], "%"), 64)
		if err != nil {
			continue
		}
		kernel := f[1] == "[k]"
		sym := strings.Join(f[2:], " ")
		syms = append(syms, entry{pct, sym})
		pkgs[goPackage(sym, kernel)] += pct
	}
	var sb strings.Builder
	fmt.Fprintf(&sb, "top symbols:\n")
	for i, e := range syms {
		if i == top {
			break
		}
		fmt.Fprintf(&sb, "  %6.2f%%  %s\n", e.pct, e.sym)
	}
	type pkg struct {
		name string
		pct  float64
	}
	var ps []pkg
	for n, p := range pkgs {
		ps = append(ps, pkg{n, p})
	}
	sortByPct := func(a, b pkg) int {
		switch {
		case a.pct > b.pct:
			return -1
		case a.pct < b.pct:
			return 1
		}
		return strings.Compare(a.name, b.name)
	}
	slices.SortFunc(ps, sortByPct)
	fmt.Fprintf(&sb, "by package:\n")
	for i, p := range ps {
		if i == top || p.pct < 0.5 {
			break
		}
		fmt.Fprintf(&sb, "  %6.2f%%  %s\n", p.pct, p.name)
	}
	return sb.String()
}

// goPackage is the package of a Go symbol (github.com/x/y.(*T).M:
// github.com/x/y), "kernel" for the kernel's.
func goPackage(sym string, kernel bool) string {
	if kernel {
		return "kernel"
	}
	slash := strings.LastIndexByte(sym, '/')
	dot := strings.IndexByte(sym[slash+1:], '.')
	if dot < 0 {
		return sym
	}
	return sym[:slash+1+dot]
}
