package main

import (
	"cmp"
	"context"
	wire "encoding/binary"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/paho"
	bolt "go.etcd.io/bbolt"

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
// fleet), DPBENCH_SECONDS (of each run), DPBENCH_DEVICES,
// DPBENCH_COMMIT_INTERVAL (fleetgate's bridge.queue.commit_interval,
// default the shipped 10ms), DPBENCH_UPSTREAM_CONF (more lines of the
// upstream mosquitto's configuration, ";"-separated); DPBENCH_PERF=dir
// records a CPU profile of the gateway with perf during fleetgate's
// runs (perf record -g, 499 Hz) into dir and logs where its time went;
// DPBENCH_TRACE=1 logs BenchmarkBridgeForwardingCap second by second.

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
		queue := ""
		if v := os.Getenv("DPBENCH_COMMIT_INTERVAL"); v != "" {
			queue = ", commit_interval: " + v
		}
		s.gw = bridgeGateway(b, "gw-dp", s.up.Addr, queue, shippedTiming)
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
	idle                                    float64       // the side's CPU (cores) with the fleet connected and silent
	lat, ack                                []time.Duration
	drained                                 bool
}

func (r dpResult) perCPU() float64 { return float64(r.forwarded) / max(r.cpu, 0.01) }

// marginal is perCPU without the idle cost over the window.
func (r dpResult) marginal() float64 {
	return float64(r.forwarded) / max(r.cpu-r.idle*r.window.Seconds(), 0.01)
}

// idleFor is how long measureSide measures the idle cost.
const idleFor = 10 * time.Second

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
	// the fixed cost: the fleet connected and silent
	i0, idleStart := procTicks(b, s.pid), time.Now()
	time.Sleep(idleFor)
	idle := float64(procTicks(b, s.pid)-i0) / ticksPerSecond / time.Since(idleStart).Seconds()
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
	r := dpResult{drained: counter.awaitUnique(want, 30*time.Second), idle: idle}
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
		"CPU %.2fs (%.0f msgs/CPU-s; idle %.3f of a core, without it %.0f msgs/CPU-s), upstream %.2fs, test process %.2fs; "+
		"latency p50 %v p99 %v max %v; PUBACK p50 %v p99 %v",
		r.sent, r.acked, r.forwarded, r.dups, r.reordered, r.refused, r.failures, r.window.Seconds(), r.drained,
		r.cpu, r.perCPU(), r.idle, r.marginal(), r.upCPU, r.selfCPU, quantile(r.lat, 0.5).Round(10*time.Microsecond), quantile(r.lat, 0.99).Round(10*time.Microsecond),
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
				b.ReportMetric(fg.marginal()/mq.marginal(), "ratio-without-idle")
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
// (fleetgate: the commit and its fsync). The floor of fleetgate's: a
// commit interval's wait and a raw bbolt commit of as many messages (its
// p99), measured first.
func BenchmarkBridgeLatency(b *testing.B) {
	devices := envInt("DPBENCH_DEVICES", dpDevices)
	rate := envInt("DPBENCH_RATE", 2000)
	dur := time.Duration(envInt("DPBENCH_SECONDS", 30)) * time.Second
	for range b.N {
		interval := 10 * time.Millisecond // the shipped commit_interval
		if v := os.Getenv("DPBENCH_COMMIT_INTERVAL"); v != "" {
			d, err := time.ParseDuration(v)
			if err != nil {
				b.Fatal(err)
			}
			interval = d
		}
		per := max(1, int(float64(rate)*interval.Seconds()))
		commit := boltCommits(b, per, interval, 500)
		b.Logf("a raw bbolt commit of %d messages every %v: p50 %v p99 %v max %v", per, interval,
			quantile(commit, 0.5).Round(10*time.Microsecond), quantile(commit, 0.99).Round(10*time.Microsecond), quantile(commit, 1).Round(10*time.Microsecond))
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
		// the floor of fleetgate's: a full commit interval's wait and a commit
		b.ReportMetric(ms(interval+quantile(commit, 0.99)), "floor-p99-ms")
		b.ReportMetric(fg.perCPU()/mq.perCPU(), "cpu-ratio")
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
		incl, err := exec.Command("perf", "report", "-i", data, "--stdio", "--children", "-g", "none",
			"--sort", "sym", "--percent-limit", "0").Output()
		if err != nil {
			b.Logf("perf report --children: %v", err)
		}
		b.Logf("perf profile of fleetgate (%s):\n%s%s", data, perfSummary(string(rep), 25), perfRootShares(string(incl)))
	}
}

// perfRoots are the parts of fleetgate's work, by the function each
// runs under (inclusive shares: a part's callees count in it).
var perfRoots = []struct{ label, sym string }{
	{"devices: mochi reading and handling their packets", "github.com/mochi-mqtt/server/v2.(*Client).Read"},
	{"  its PUBACK writes", "github.com/mochi-mqtt/server/v2.(*Client).WritePacket"},
	{"  the data path's hand-off (publishUp: bridge.Publish, the queue Put)", "github.com/fleetgate/fleetgate/protocols/mqtt.(*Server).publishUp"},
	{"  presence: evidence to the session table", "github.com/fleetgate/fleetgate/protocols/mqtt.(*Server).observe"},
	{"forwarding: lanes publishing upstream (paho)", "github.com/fleetgate/fleetgate/bridge.(*forwarder).runLane"},
	{"forwarding: paho reading PUBACKs", "github.com/eclipse/paho.golang/paho.(*Client).incoming"},
	{"forwarding: reading the queue", "github.com/fleetgate/fleetgate/bridge.(*forwarder).read"},
	{"forwarding: acknowledging in the queue", "github.com/fleetgate/fleetgate/bridge.(*forwarder).runAcker"},
	{"durable queue: commits (bbolt)", "github.com/fleetgate/fleetgate/queue/diskq.(*Queue).commitLoop"},
	{"presence: uplink flushes", "github.com/fleetgate/fleetgate/uplink.(*Uplink).Run.func1"},
	{"presence: expiry runner", "github.com/fleetgate/fleetgate/runner.(*Runner).Run"},
	{"Go runtime: sysmon", "runtime.sysmon"},
	{"Go runtime: scheduling (park, find work)", "runtime.mcall"},
	{"Go runtime: GC mark workers", "runtime.gcBgMarkWorker"},
}

// perfRootShares reads `perf report --children --sort sym` for the
// perfRoots.
func perfRootShares(report string) string {
	shares := map[string]string{}
	for _, line := range strings.Split(report, "\n") {
		f := strings.Fields(line)
		if len(f) >= 4 && strings.HasSuffix(f[0], "%") {
			shares[strings.Join(f[3:], " ")] = f[0]
		}
	}
	var sb strings.Builder
	sb.WriteString("by part (inclusive):\n")
	for _, r := range perfRoots {
		fmt.Fprintf(&sb, "  %7s  %s\n", cmp.Or(shares[r.sym], "0%"), r.label)
	}
	return sb.String()
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

// BenchmarkDeviceClients: what the devices of these benchmarks cost the
// test process, which shares the 2 cores with the processes measured:
// 1,000 paho.golang clients against 1,000 rawMQTT ones, each publishing
// QoS 1 (one in flight) to a plain mosquitto, 5,000 msg/s in all for
// 10 s. Reported: the test process's CPU per message of each, and the
// goroutines each fleet adds.
func BenchmarkDeviceClients(b *testing.B) {
	const devices, rate, dur = 1000, 5000, 10 * time.Second
	every := time.Duration(float64(devices) / rate * float64(time.Second))
	count := int(dur / every)
	for range b.N {
		broker := mosquittotest.Start(b, mosquittotest.Options{Config: []string{"max_queued_messages 0"}})
		ids := dpDeviceIDs(devices)
		self := os.Getpid()

		g0 := runtime.NumGoroutine()
		f := connectFleet(b, func() string { return broker.Addr }, ids)
		rawG := runtime.NumGoroutine() - g0
		t0 := procTicks(b, self)
		start := time.Now().Add(50 * time.Millisecond)
		f.run(dpLoad{qos: 1, every: every, count: count, size: dpPayloadB, prefix: "devices", start: start, deadline: start.Add(dur + time.Minute)})
		rawCPU := float64(procTicks(b, self)-t0) / ticksPerSecond
		rawMsgs := f.acked()
		f.disconnect()

		g0 = runtime.NumGoroutine()
		clients := make([]*paho.Client, devices)
		for i, id := range ids {
			nc, err := net.Dial("tcp", broker.Addr)
			if err != nil {
				b.Fatal(err)
			}
			c := paho.NewClient(paho.ClientConfig{Conn: nc, OnClientError: func(error) {}})
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			if _, err := c.Connect(ctx, &paho.Connect{ClientID: id, KeepAlive: 60, CleanStart: true}); err != nil {
				b.Fatalf("paho connect %s: %v", id, err)
			}
			cancel()
			clients[i] = c
		}
		pahoG := runtime.NumGoroutine() - g0
		var pahoMsgs atomic.Int64
		t0 = procTicks(b, self)
		start = time.Now().Add(50 * time.Millisecond)
		var wg sync.WaitGroup
		for i, c := range clients {
			wg.Go(func() {
				offset := every * time.Duration(i) / devices
				for k := range count {
					time.Sleep(time.Until(start.Add(offset + time.Duration(k)*every)))
					ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
					_, err := c.Publish(ctx, &paho.Publish{Topic: "devices/" + ids[i] + "/t", QoS: 1, Payload: dpPayload(uint64(k), dpPayloadB)})
					cancel()
					if err != nil {
						return
					}
					pahoMsgs.Add(1)
				}
			})
		}
		wg.Wait()
		pahoCPU := float64(procTicks(b, self)-t0) / ticksPerSecond
		for _, c := range clients {
			_ = c.Disconnect(&paho.Disconnect{})
		}
		b.Logf("raw: %d messages, %.2f CPU-s, %d goroutines; paho: %d messages, %.2f CPU-s, %d goroutines",
			rawMsgs, rawCPU, rawG, pahoMsgs.Load(), pahoCPU, pahoG)
		b.ReportMetric(rawCPU*1e6/float64(rawMsgs), "raw-cpu-us/msg")
		b.ReportMetric(pahoCPU*1e6/float64(pahoMsgs.Load()), "paho-cpu-us/msg")
		b.ReportMetric(pahoCPU/rawCPU*float64(rawMsgs)/float64(pahoMsgs.Load()), "paho/raw")
	}
}

// BenchmarkBridgeForwardingCap: the most fleetgate forwards upstream at
// QoS 1, and its ceiling. The fleet offers 10,000 msg/s for 10 s, more
// than fleetgate forwards; the rate is the distinct messages arrived
// upstream over the time from the first to the last. The ceiling, in the
// same run: a bare paho.golang client (the bridge's) on one connection
// to a fresh upstream mosquitto, 64 goroutines (the bridge's lanes) each
// publishing 100-byte QoS 1 messages one at a time for 10 s. mosquitto
// grants both a receive maximum of 20 (its max_inflight_messages).
func BenchmarkBridgeForwardingCap(b *testing.B) {
	const devices, rate, dur, lanes = 1000, 10000, 10 * time.Second, 64
	for range b.N {
		s := startSide(b, "fleetgate")
		ctx, cancel := context.WithCancel(b.Context())
		counter := countUpstream(b, ctx, s.up.Addr, "counter", s.filter(), 0, devices, false)
		f := connectFleet(b, func() string { return s.addr }, dpDeviceIDs(devices))
		time.Sleep(3 * time.Second)
		every := time.Duration(float64(devices) / rate * float64(time.Second))
		c0 := procTicks(b, s.pid)
		start := time.Now().Add(50 * time.Millisecond)
		go f.run(dpLoad{qos: 1, every: every, count: int(dur / every), size: dpPayloadB, prefix: "devices", start: start, deadline: start.Add(dur + time.Minute)})
		var first time.Time
		for counter.counts().unique == 0 && time.Since(start) < 10*time.Second {
			time.Sleep(time.Millisecond)
		}
		first = time.Now()
		n0 := counter.counts().unique
		if os.Getenv("DPBENCH_TRACE") != "" {
			for range 25 {
				time.Sleep(time.Second)
				m := scrape(b, "http://"+s.gw.admin+"/metrics")
				b.Logf("%v: arrived %d, acked %d, queue %.0f, out %.0f", time.Since(start).Round(time.Second), counter.counts().unique, f.acked(),
					metric(m, "fleetgate_bridge_queue_messages", `queue="durable"`), metric(m, "fleetgate_bridge_messages_out_total"))
			}
		}
		time.Sleep(dur)
		n1 := counter.counts().unique
		fgRate := float64(n1-n0) / time.Since(first).Seconds()
		fgCPU := float64(procTicks(b, s.pid)-c0) / ticksPerSecond / time.Since(start).Seconds()
		cancel()
		f.close()
		s.gw.stop()

		up := upstreamBroker(b, 0)
		nc, err := net.Dial("tcp", up.Addr)
		if err != nil {
			b.Fatal(err)
		}
		c := paho.NewClient(paho.ClientConfig{Conn: nc, OnClientError: func(error) {}})
		cctx, ccancel := context.WithTimeout(b.Context(), 10*time.Second)
		ack, err := c.Connect(cctx, &paho.Connect{ClientID: "bare", KeepAlive: 30, CleanStart: true})
		ccancel()
		if err != nil {
			b.Fatal(err)
		}
		rm := 0
		if ack.Properties != nil && ack.Properties.ReceiveMaximum != nil {
			rm = int(*ack.Properties.ReceiveMaximum)
		}
		self := os.Getpid()
		t0 := procTicks(b, self)
		var bare atomic.Int64
		end := time.Now().Add(dur)
		var wg sync.WaitGroup
		for l := range lanes {
			wg.Go(func() {
				topic := fmt.Sprintf("fleetgate/bare/devices/dp%04d/t", l)
				for k := 0; time.Now().Before(end); k++ {
					pctx, pcancel := context.WithTimeout(b.Context(), 10*time.Second)
					_, err := c.Publish(pctx, &paho.Publish{Topic: topic, QoS: 1, Payload: dpPayload(uint64(k), dpPayloadB)})
					pcancel()
					if err != nil {
						b.Errorf("bare publish: %v", err)
						return
					}
					bare.Add(1)
				}
			})
		}
		wg.Wait()
		bareRate := float64(bare.Load()) / dur.Seconds()
		bareCPU := float64(procTicks(b, self)-t0) / ticksPerSecond / dur.Seconds()
		_ = c.Disconnect(&paho.Disconnect{})
		b.Logf("fleetgate forwarded %.0f msg/s using %.2f of a core; a bare paho client (receive maximum %d, %d goroutines) %.0f msg/s using %.2f of a core",
			fgRate, fgCPU, rm, lanes, bareRate, bareCPU)
		b.ReportMetric(fgRate, "fleetgate-msgs/s")
		b.ReportMetric(bareRate, "bare-paho-msgs/s")
		b.ReportMetric(fgRate/bareRate, "ratio")
	}
}

// boltCommits is the ceiling of the durable queue's commits: n raw bbolt
// transactions (the file options of diskq.OpenFile), every apart, each
// putting per values of a message's size (165 bytes) under sequential
// keys, in a file on the file system of the tests' state directories;
// it returns their durations (write and fsync), sorted.
func boltCommits(b *testing.B, per int, every time.Duration, n int) []time.Duration {
	b.Helper()
	db, err := bolt.Open(filepath.Join(b.TempDir(), "raw.db"), 0o600, &bolt.Options{NoFreelistSync: true, FreelistType: bolt.FreelistMapType})
	if err != nil {
		b.Fatal(err)
	}
	defer db.Close()
	val := make([]byte, 165)
	out := make([]time.Duration, 0, n)
	var key uint64
	next := time.Now()
	for range n {
		time.Sleep(time.Until(next))
		next = next.Add(every)
		t0 := time.Now()
		err := db.Update(func(tx *bolt.Tx) error {
			bk, err := tx.CreateBucketIfNotExists([]byte("up"))
			if err != nil {
				return err
			}
			for range per {
				key++
				if err := bk.Put(wire.BigEndian.AppendUint64(nil, key), val); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			b.Fatal(err)
		}
		out = append(out, time.Since(t0))
	}
	slices.Sort(out)
	return out
}

// BenchmarkBridgeQueueFull: presence while the durable queue is full.
// 1,000 MQTT devices on fleetgate (embedded store; lease 10 s, heartbeat
// 2 s, renew_every 1 s, flush_interval 100 ms: about 1,000 renewals/s in
// 10 flushes/s) with bridge.queue.max_bytes 1MiB, in three phases of 30 s:
// idle (a PINGREQ a second per device, no data: the ceiling), forwarding
// (2,000 msg/s QoS 1 in all, the upstream up, the queue about empty),
// full (the same load, the upstream killed, the queue full and dropping
// its oldest at every commit). Reported per phase: the uplink's flush
// duration (fleetgate_flush_duration_seconds: mean, and p99 interpolated
// in its ×2 buckets), and the ratios of the full phase's to the others'.
func BenchmarkBridgeQueueFull(b *testing.B) {
	const devices, every, phase = 1000, 500 * time.Millisecond, 30 * time.Second
	tm := e2eTiming{lease: 10 * time.Second, heartbeat: 2 * time.Second, renewEvery: time.Second, flush: 100 * time.Millisecond, runnerInterval: 100 * time.Millisecond}
	for range b.N {
		up := upstreamBroker(b, 0)
		gw := bridgeGateway(b, "gw-qf", up.Addr, ", max_bytes: 1MiB", tm)
		gw.start()
		url := "http://" + gw.admin + "/metrics"
		f := connectFleet(b, func() string { return gw.mqttAddr }, dpDeviceIDs(devices))
		type result struct {
			name              string
			flush             histogram
			cpu, ackP99       float64
			dropped, in       float64
			online, refusedUp float64
		}
		var res []result
		measure := func(name string, run func()) {
			m0, c0, t0 := scrape(b, url), procTicks(b, gw.cmd.Process.Pid), time.Now()
			f.recordAcks()
			run()
			m1, c1 := scrape(b, url), procTicks(b, gw.cmd.Process.Pid)
			h := "fleetgate_flush_duration_seconds"
			r := result{name: name, flush: readHistogram(m1, h).minus(readHistogram(m0, h)),
				cpu:     float64(c1-c0) / ticksPerSecond / time.Since(t0).Seconds(),
				ackP99:  float64(quantile(f.ackLatencies(), 0.99)) / float64(time.Millisecond),
				dropped: metric(m1, "fleetgate_bridge_dropped_total", `queue="durable"`, `reason="full"`) - metric(m0, "fleetgate_bridge_dropped_total", `queue="durable"`, `reason="full"`),
				in:      metric(m1, "fleetgate_bridge_messages_in_total", `direction="up"`) - metric(m0, "fleetgate_bridge_messages_in_total", `direction="up"`),
				online:  metric(m1, "fleetgate_devices", `state="online"`), refusedUp: float64(f.refused.Load())}
			res = append(res, r)
			b.Logf("%-10s %5.0f flushes, mean %.2f ms, p50 ≈ %.2f ms, p99 ≈ %.1f ms; gateway %.2f of a core; %.0f messages in, %.0f dropped as full; PUBACK p99 %.1f ms; %.0f devices online, %.0f messages refused",
				name, r.flush.count, 1000*r.flush.mean(), 1000*r.flush.quantile(0.5), 1000*r.flush.quantile(0.99), r.cpu, r.in, r.dropped, r.ackP99, r.online, r.refusedUp)
		}
		// pings from the start (an MQTT device silent for 1.5 × the
		// heartbeat is disconnected), 5 s for the connect burst, then the
		// idle phase
		stop := make(chan struct{})
		pinged := make(chan struct{})
		go func() {
			defer close(pinged)
			f.idle(time.Second, stop)
		}()
		time.Sleep(5 * time.Second)
		measure("idle", func() {
			time.Sleep(phase)
			close(stop)
			<-pinged
		})
		data := func(d time.Duration) dpLoad {
			start := time.Now().Add(10 * time.Millisecond)
			return dpLoad{qos: 1, every: every, count: int(d / every), size: dpPayloadB, prefix: "devices", start: start, deadline: start.Add(d + time.Minute)}
		}
		measure("forwarding", func() { f.run(data(phase)) })
		up.Kill()
		// the queue fills (about 3 s at 2,000 msg/s), then the phase
		fill := make(chan struct{})
		go func() {
			defer close(fill)
			f.run(data(5*time.Second + phase))
		}()
		waitFor(b, 20*time.Second, "the queue full", func() bool {
			return metric(scrape(b, url), "fleetgate_bridge_dropped_total", `queue="durable"`, `reason="full"`) > 0
		})
		measure("full", func() { <-fill })
		if f.failures.Load() > 0 {
			b.Errorf("%d device failures: %v", f.failures.Load(), f.errs)
		}
		idle, fwd, full := res[0], res[1], res[2]
		b.ReportMetric(1000*idle.flush.mean(), "idle-flush-ms")
		b.ReportMetric(1000*fwd.flush.mean(), "forwarding-flush-ms")
		b.ReportMetric(1000*full.flush.mean(), "full-flush-ms")
		b.ReportMetric(1000*full.flush.quantile(0.99), "full-flush-p99-ms")
		b.ReportMetric(1000*fwd.flush.quantile(0.99), "forwarding-flush-p99-ms")
		b.ReportMetric(full.flush.mean()/fwd.flush.mean(), "full/forwarding")
		b.ReportMetric(full.flush.mean()/idle.flush.mean(), "full/idle")
		b.ReportMetric(full.dropped, "dropped")
		f.disconnect()
		gw.stop()
	}
}
