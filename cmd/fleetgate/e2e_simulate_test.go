package main

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/fleetgate/fleetgate/gateway"
	"github.com/fleetgate/fleetgate/internal/redistest"
	"github.com/fleetgate/fleetgate/sim"
)

// simTiming: the simulated devices send every second; the gateways ask
// for a heartbeat every 2 s (an MQTT keep-alive of 1 s would give a
// deadline of 1 s in mochi, which rounds keepalive × 1.5 down).
var simTiming = e2eTiming{lease: 6 * time.Second, heartbeat: 2 * time.Second, renewEvery: time.Second, flush: 100 * time.Millisecond, runnerInterval: 100 * time.Millisecond}

// simLimits raise the gateway's rate limits well above a test fleet's.
const simLimits = "limits: { coap_requests_per_second: 100000, mqtt_connects_per_second: 100000 }\n"

// twoSimGateways starts a redis-server and two started simGateways on it,
// gw-a and gw-b.
func twoSimGateways(t testing.TB) (redisAddr string, a, b *gatewayProc) {
	t.Helper()
	srv := redistest.Start(t)
	a, b = simGateway(t, "gw-a", srv.Addr), simGateway(t, "gw-b", srv.Addr)
	a.start()
	b.start()
	return srv.Addr, a, b
}

// simGateway is a gateway whose rate limits let a test fleet through.
func simGateway(t testing.TB, id, redisAddr string) *gatewayProc {
	t.Helper()
	return simGatewayWith(t, id, redisAddr, simTiming)
}

func simGatewayWith(t testing.TB, id, redisAddr string, tm e2eTiming) *gatewayProc {
	t.Helper()
	return simGatewayLimits(t, id, redisAddr, tm, simLimits)
}

// simGatewayLimits is a gateway with the limits line given.
func simGatewayLimits(t testing.TB, id, redisAddr string, tm e2eTiming, limits string) *gatewayProc {
	t.Helper()
	g := newGateway(t, id, redisAddr, tm)
	f, err := os.OpenFile(g.config, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteString(limits); err != nil {
		t.Fatal(err)
	}
	return g
}

// runSimulate runs the fleetgate binary's simulate with args and the
// timings of simTiming; it returns the exit code, the output and the
// report.
func runSimulate(t *testing.T, args ...string) (int, string, sim.Report) {
	t.Helper()
	return runSimulateHB(t, "1s", args...)
}

// runSimulateHB is runSimulate with a device heartbeat of hb.
func runSimulateHB(t *testing.T, hb string, args ...string) (int, string, sim.Report) {
	t.Helper()
	report := filepath.Join(t.TempDir(), "report.json")
	args = append([]string{"simulate", "--heartbeat", hb, "--lease", simTiming.lease.String(),
		"--renew-every", simTiming.renewEvery.String(), "--runner-interval", simTiming.runnerInterval.String(),
		"--flush-interval", simTiming.flush.String(),
		"--report", report}, args...)
	cmd := exec.Command(binary, args...)
	out, err := cmd.CombinedOutput()
	code := 0
	if err != nil {
		ee, ok := err.(*exec.ExitError)
		if !ok {
			t.Fatalf("simulate: %v", err)
		}
		code = ee.ExitCode()
	}
	var rep sim.Report
	if b, err := os.ReadFile(report); err == nil {
		if err := json.Unmarshal(b, &rep); err != nil {
			t.Fatalf("report: %v\n%s", err, b)
		}
	}
	return code, string(out), rep
}

// scenarioOf returns the report's line for one scenario.
func scenarioOf(t *testing.T, rep sim.Report, name string) sim.ChurnResult {
	t.Helper()
	for _, c := range rep.ByChurn {
		if c.Scenario == name {
			return c
		}
	}
	t.Fatalf("report has no scenario %s: %+v", name, rep.ByChurn)
	return sim.ChurnResult{}
}

// Two gateways on one Redis, a few hundred CoAP (CON and NON) and MQTT
// (5 and 3.1.1) devices with churn (freeze, leave, roam, dual, storm):
// the report finds no false offline, no missed offline, no broken log,
// and every detection inside the bound.
func TestE2ESimulateTwoGatewaysWithChurn(t *testing.T) {
	t.Parallel()
	redisAddr, a, b := twoSimGateways(t)
	scenarios := "freeze,leave,roam,dual,storm"
	code, out, rep := runSimulate(t, "--coap", a.coapAddr+","+b.coapAddr, "--mqtt", a.mqttAddr+","+b.mqttAddr,
		"--redis", redisAddr, "--devices", "300", "--mqtt-share", "0.3", "--duration", "12s", "--seed", "7",
		"--scenario", scenarios)
	t.Logf("simulate:\n%s", out)
	if code != 0 {
		t.Fatalf("simulate exited %d", code)
	}
	if rep.Devices != 300 || rep.FalseOffline != 0 || rep.MissedOffline != 0 || rep.LogViolations != 0 || rep.MissedOnline != 0 || rep.Pending != 0 {
		t.Fatalf("report %+v", rep)
	}
	if rep.HeartbeatsSent < 300*8 || rep.Fleet.Answered < rep.HeartbeatsSent*95/100 || rep.StoreCallsPerHeartbeat <= 0 {
		t.Fatalf("fleet %+v, store calls/message %v: too little got through", rep.Fleet, rep.StoreCallsPerHeartbeat)
	}
	bound := simTiming.lease + gateway.CoverageWait(simTiming.flush) + simTiming.runnerInterval + time.Second
	if rep.BoundMS != bound.Milliseconds() || rep.Detection.N == 0 || rep.Detection.P99 > rep.BoundMS {
		t.Fatalf("detection %+v, bound %d", rep.Detection, rep.BoundMS)
	}
	for _, s := range strings.Split(scenarios, ",") {
		if c := scenarioOf(t, rep, s); c.Devices == 0 {
			t.Fatalf("scenario %s has no devices", s)
		}
	}
	// A frozen device goes offline no earlier than lease − renew_every.
	if c := scenarioOf(t, rep, "freeze"); c.Detection.P50 < (simTiming.lease - simTiming.renewEvery - 300*time.Millisecond).Milliseconds() {
		t.Fatalf("freeze detection %+v: earlier than lease − renew_every", c.Detection)
	}
	for _, want := range []string{"false offline", "missed offline", "log violations", "detection ms", "OK"} {
		if !strings.Contains(out, want) {
			t.Fatalf("summary lacks %q:\n%s", want, out)
		}
	}
}

// The embedded store: the events come from the gateway's admin API.
func TestE2ESimulateEmbeddedStore(t *testing.T) {
	t.Parallel()
	g := simGateway(t, "gw-e", "")
	g.start()
	code, out, rep := runSimulate(t, "--coap", g.coapAddr, "--mqtt", g.mqttAddr, "--admin", g.admin,
		"--devices", "60", "--mqtt-share", "0.2", "--duration", "8s", "--scenario", "freeze,leave,storm")
	t.Logf("simulate:\n%s", out)
	if code != 0 || rep.Devices != 60 || rep.Detection.N == 0 || rep.Events == 0 {
		t.Fatalf("exit %d, report %+v", code, rep)
	}
}

// Bad command lines are usage errors (exit 2), a gateway off loopback
// is refused, and a fleet nobody answers is a failure, not a pass.
func TestSimulateUsageAndNobodyAnswers(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{
		{"simulate", "--redis", "127.0.0.1:1"},
		{"simulate", "--coap", "127.0.0.1:1"},
		{"simulate", "--coap", "127.0.0.1:1", "--redis", "x:1", "--admin", "y:2"},
		{"simulate", "--coap", "127.0.0.1:1", "--admin", "y:2", "--scenario", "meteor"},
		{"simulate", "--coap", "127.0.0.1:1", "--admin", "y:2", "extra"},
		{"simulate", "--coap", "127.0.0.1:1", "--admin", "y:2", "--prefix", "p-", "--split", "3/3"},
		{"simulate", "--coap", "127.0.0.1:1", "--admin", "y:2", "--prefix", "p-", "--split", "1/2x"},
		{"simulate", "--coap", "127.0.0.1:1", "--admin", "y:2", "--split", "0/2"},
		{"simulate", "--coap", "127.0.0.1:1", "--admin", "y:2", "--check-only", "t.json"},
	} {
		if code, _, errOut := runCLI(t, args...); code != 2 {
			t.Errorf("%v: exit %d (%s), want 2", args, code, errOut)
		}
	}
	if code, _, errOut := runCLI(t, "simulate", "--coap", "192.0.2.1:5683", "--admin", "127.0.0.1:1"); code != 1 || !strings.Contains(errOut, "not a loopback address") {
		t.Errorf("a gateway off loopback: exit %d (%s), want 1", code, errOut)
	}
	g := simGateway(t, "gw-q", "")
	g.start()
	code, _, errOut := runCLI(t, "simulate", "--coap", "127.0.0.1:9", "--admin", g.admin, "--devices", "3",
		"--duration", "1s", "--heartbeat", "200ms", "--scenario", "none")
	if code != 1 || !strings.Contains(errOut, "no gateway answered") {
		t.Fatalf("exit %d, %q: want 1 and no gateway answered", code, errOut)
	}
}

// A run whose report counts a missed offline exits 1 and says FAIL: the
// simulator is told a lease of 2 s (bound 3.1 s) while the gateway holds
// 6 s, so every frozen device's offline comes after the bound.
func TestE2ESimulateExitsOneOnMissedOffline(t *testing.T) {
	t.Parallel()
	g := simGateway(t, "gw-m", "")
	g.start()
	code, out, rep := runSimulate(t, "--coap", g.coapAddr, "--admin", g.admin, "--devices", "20",
		"--duration", "4s", "--scenario", "freeze", "--lease", "2s", "--max-wait", "5s")
	t.Logf("simulate:\n%s", out)
	if code != 1 || rep.MissedOffline == 0 || rep.FalseOffline != 0 || rep.LogViolations != 0 {
		t.Fatalf("exit %d, report %+v: want 1 with missed offline only", code, rep)
	}
	for _, want := range []string{"missed offline", "FAIL", "fleetgate simulate: 0 false offline, " + strconv.Itoa(rep.MissedOffline) + " missed offline"} {
		if !strings.Contains(out, want) {
			t.Fatalf("output lacks %q:\n%s", want, out)
		}
	}
}

// Moves and visits through two gateways: the checker finds nothing.
func TestE2ESimulateMovesAndVisits(t *testing.T) {
	for _, tc := range []struct{ scenario, rule string }{
		// A make-before-break move with a clean goodbye on the old
		// gateway: its leave must not reach the store before the new
		// gateway's connect.
		{"move", "the leave grace"},
		// A visit shorter than a flush keeps its online and offline.
		{"visit", "a visit keeps its events"},
	} {
		t.Run(tc.scenario, func(t *testing.T) {
			t.Parallel()
			redisAddr, a, b := twoSimGateways(t)
			code, out, rep := runSimulate(t, "--coap", a.coapAddr+","+b.coapAddr, "--mqtt", a.mqttAddr+","+b.mqttAddr,
				"--redis", redisAddr, "--devices", "300", "--mqtt-share", "0.3", "--duration", "10s", "--scenario", tc.scenario)
			t.Logf("simulate:\n%s", out)
			if code != 0 || rep.Failed() {
				t.Fatalf("%s: exit %d, report %+v", tc.rule, code, scenarioOf(t, rep, tc.scenario))
			}
		})
	}
}

// Every device has a source endpoint of its own, as the gateway sees
// it: with one CoAP request per second per source endpoint and one
// anonymous MQTT CONNECT per second per source /24, a fleet sharing a
// few endpoints (or one address) would be refused most of the time;
// this one is never refused, and no answer reaches another device's
// address.
func TestE2ESimulateOwnSourceEndpoints(t *testing.T) {
	t.Parallel()
	g := simGatewayLimits(t, "gw-s", "", simTiming, "limits: { coap_requests_per_second: 1, anonymous_connects_per_second: 1, mqtt_connects_per_second: 1 }\n")
	g.start()
	code, out, rep := runSimulateHB(t, "2s", "--coap", g.coapAddr, "--mqtt", g.mqttAddr, "--admin", g.admin,
		"--devices", "200", "--mqtt-share", "0.2", "--duration", "8s", "--scenario", "freeze", "--sockets", "2")
	t.Logf("simulate:\n%s", out)
	f := rep.Fleet
	if code != 0 || rep.Devices != 200 || f.ConnectErrors != 0 || f.Unanswered != 0 || f.Misrouted != 0 || f.SendErrors != 0 {
		t.Fatalf("exit %d, report %+v", code, rep)
	}
	if len(f.CoAPCodes) != 1 || f.CoAPCodes["Changed"] == 0 || f.Heartbeats == 0 || f.OnTime < 0.99 {
		t.Fatalf("fleet %+v", f)
	}
}

// Three simulate processes play the three parts of one seeded fleet at
// once, each writing its truth; --check-only judges the union: every
// device of the plan exactly once, and the verdict of a whole run.
// Parts that do not cover the fleet are refused.
func TestE2ESimulateSplitFleet(t *testing.T) {
	t.Parallel()
	redisAddr, a, b := twoSimGateways(t)
	dir := t.TempDir()
	const parts = 3
	var truths []string
	codes := make(chan int, parts)
	for i := range parts {
		truth := filepath.Join(dir, fmt.Sprintf("truth-%d.json", i))
		truths = append(truths, truth)
		go func() {
			code, out, rep := runSimulate(t, "--coap", a.coapAddr+","+b.coapAddr, "--mqtt", a.mqttAddr+","+b.mqttAddr,
				"--redis", redisAddr, "--devices", "301", "--mqtt-share", "0.3", "--duration", "8s", "--seed", "5",
				"--scenario", "freeze,leave,roam,storm", "--prefix", "split-", "--split", fmt.Sprintf("%d/%d", i, parts), "--truth", truth)
			t.Logf("part %d (%d devices):\n%s", i, rep.Devices, out)
			codes <- code
		}()
	}
	for range parts {
		if code := <-codes; code != 0 {
			t.Fatalf("a part exited %d", code)
		}
	}
	code, out, rep := runSimulate(t, "--redis", redisAddr, "--check-only", strings.Join(truths, ","))
	t.Logf("check-only:\n%s", out)
	if code != 0 || rep.Devices != 301 || rep.Failed() || rep.Pending != 0 || rep.Detection.N == 0 {
		t.Fatalf("exit %d, report %+v", code, rep)
	}
	if code, _, errOut := runCLI(t, "simulate", "--redis", redisAddr, "--check-only", truths[0]+","+truths[2]); code != 1 || !strings.Contains(errOut, "part 1/3 is missing") {
		t.Fatalf("two parts of three: exit %d, %s", code, errOut)
	}
}

// A share of the CoAP devices speaks DTLS with the PSKs of the devices
// file simulate writes, beside anonymous CoAP and MQTT devices: every
// handshake succeeds, the devices keep their sessions and resume them
// after the gateway parked them (no resumption fails), and the checker
// finds nothing.
func TestE2ESimulateDTLSShare(t *testing.T) {
	t.Parallel()
	g := simGateway(t, "gw-d", "")
	devices := filepath.Join(t.TempDir(), "devices.yaml")
	fleet := []string{"--coap", g.coapAddr, "--mqtt", g.mqttAddr, "--devices", "120", "--mqtt-share", "0.2",
		"--prefix", "dt-", "--dtls-share", "0.5", "--seed", "4"}
	if code, out, errOut := runCLI(t, append([]string{"simulate", "--write-devices", devices}, fleet...)...); code != 0 || !strings.Contains(out, ": 48 DTLS devices") {
		t.Fatalf("write-devices: exit %d, %s%s", code, out, errOut)
	}
	g.useDevicesFile(devices)
	b, err := os.ReadFile(g.config)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(g.config, []byte(strings.Replace(string(b), "allow_anonymous: false", "allow_anonymous: true", 1)), 0o600); err != nil {
		t.Fatal(err)
	}
	g.start()
	code, out, rep := runSimulate(t, append(fleet, "--dtls", g.dtlsAddr, "--admin", g.admin, "--duration", "8s", "--scenario", "freeze,leave,storm")...)
	t.Logf("simulate:\n%s", out)
	f := rep.Fleet
	if code != 0 || rep.Failed() || rep.Devices != 120 || f.DTLSHandshakes+f.DTLSResumes < 48*5 || f.DTLSResumes == 0 ||
		f.DTLSResumeFailed != 0 || f.DTLSFailures != 0 || f.Unanswered != 0 {
		t.Fatalf("exit %d, report %+v", code, rep)
	}
}

// MQTT devices (sim/mqttc) whose gateway restarts under them (SIGTERM,
// then started again on the same ports) see their connections end,
// connect again with their backoff, and the checker finds nothing.
func TestE2ESimulateMQTTReconnectsAfterRestart(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	g := simGateway(t, "gw-r", srv.Addr)
	g.start()
	type result struct {
		code int
		out  string
		rep  sim.Report
	}
	done := make(chan result, 1)
	go func() {
		code, out, rep := runSimulate(t, "--mqtt", g.mqttAddr, "--redis", srv.Addr, "--devices", "60", "--mqtt-share", "1",
			"--duration", "12s", "--scenario", "none")
		done <- result{code, out, rep}
	}()
	time.Sleep(5 * time.Second) // every device connected, heartbeats going
	g.stop()
	g.start()
	r := <-done
	t.Logf("simulate:\n%s", r.out)
	if r.code != 0 || r.rep.Failed() || r.rep.Fleet.Reconnects < 60 || r.rep.Fleet.Connects < 120 {
		t.Fatalf("exit %d, report %+v", r.code, r.rep)
	}
}

// A fleet of mixed periods (every 500 ms, 2 s and 5 s; the lease is 6 s)
// against a gateway that learns leases (max_lease 20 s), the devices
// frozen once their periods are learned: no device that keeps its period
// is reported offline, and the fastest are detected within their learned
// lease (the floor, presence.lease), far inside max_lease.
func TestE2ESimulateLearnedLeases(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	g := simGateway(t, "gw-ll", srv.Addr)
	g.setPresence("max_lease: 20s, learn_lease: true")
	g.start()
	code, out, rep := runSimulate(t, "--coap", g.coapAddr, "--redis", srv.Addr, "--devices", "300", "--duration", "45s",
		"--periods", "500ms,2s,5s", "--max-lease", "20s", "--churn-after", "22s", "--scenario", "freeze")
	t.Logf("simulate:\n%s", out)
	if code != 0 || rep.Failed() || rep.Pending != 0 || len(rep.ByPeriod) != 3 {
		t.Fatalf("exit %d, report %+v", code, rep)
	}
	for _, p := range rep.ByPeriod {
		if p.Devices != 100 || p.FalseOffline != 0 || p.Stopped == 0 || p.Detection.N != p.Stopped {
			t.Fatalf("period %s: %+v", p.Period, p)
		}
	}
	bound := simTiming.lease + gateway.CoverageWait(simTiming.flush) + simTiming.runnerInterval + time.Second
	if fast := rep.ByPeriod[0]; fast.Period != "500ms" || fast.Detection.Max > bound.Milliseconds() {
		t.Fatalf("the 500ms devices: detection %+v, want within the lease's bound %v (not max_lease's)", fast.Detection, bound)
	}
}
