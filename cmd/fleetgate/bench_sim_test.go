package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/fleetgate/fleetgate/internal/redistest"
	"github.com/fleetgate/fleetgate/sim"
	"github.com/fleetgate/fleetgate/sim/naive"
)

// BenchmarkSimulateSideBySide plays the same CoAP fleet (sim: NON and
// CON, 5 % frozen, 5 % leaving, 20 % in a storm) against fleetgate (one
// `fleetgate run` on Redis) and against the naive design (sim/naive: one
// SET EX lease per message, offline from keyspace notifications) on the
// same redis-server, then the naive design once more with its
// notification subscriber cut while the frozen devices expire. The
// checker judges all three with the same bound. The fleet is chosen by
// SIDE_FLEET (sideFleets): by default 2,000 devices for 30 s on the
// shipped timings divided by 10; SIDE_FLEET=site is 100,000 devices for
// 5 minutes on the shipped timings. With BENCH_DOC set (`make bench`:
// docs/benchmarks.md) it writes the table, with the date, commit, load
// and command, between that fleet's markers of that file.
func BenchmarkSimulateSideBySide(b *testing.B) {
	name := os.Getenv(sideFleetEnv)
	f, ok := sideFleets[name]
	if !ok {
		b.Fatalf("%s=%q: not a fleet (\"\" or \"site\")", sideFleetEnv, name)
	}
	devices, every, run, cut, tm := f.devices, f.tm.heartbeat, f.run, f.cut, f.tm
	ctx := context.Background()
	doc, docPath := sideBySideDoc(b, f.marker)
	started, loadStart := time.Now(), loadAverage()
	var table string
	for range b.N {
		srv := redistest.Start(b)
		rc := srv.Client(b)
		opts := func(addr string, src sim.Source, prefix string) sim.Options {
			return sim.Options{CoAP: []string{addr}, Source: src, Devices: devices, Duration: run, Heartbeat: every,
				Scenarios: []sim.Churn{sim.Freeze, sim.Leave, sim.Storm}, Seed: 3, Prefix: prefix, Sockets: 64,
				Lease: tm.lease, RenewEvery: tm.renewEvery, RunnerInterval: tm.runnerInterval, FlushInterval: tm.flush,
				Slack: time.Second, Tolerance: 300 * time.Millisecond}
		}
		var reps []sim.Report
		names := []string{"fleetgate", "naive", fmt.Sprintf("naive, subscriber cut %s", cut)}

		g := simGatewayLimits(b, "gw-side", srv.Addr, tm, f.limits)
		g.start()
		src, err := sim.DialRedis(ctx, []string{srv.Addr}, "fleetgate")
		if err != nil {
			b.Fatal(err)
		}
		rep, err := sim.Run(ctx, opts(g.coapAddr, src, "fg-"))
		if err != nil {
			b.Fatal(err)
		}
		reps = append(reps, rep)
		src.Close()
		g.stop()

		for i, prefix := range []string{"nv-", "nc-"} {
			p, err := naive.Start(ctx, rc, tm.lease)
			if err != nil {
				b.Fatal(err)
			}
			done := make(chan struct{})
			go func() {
				defer close(done)
				if i == 1 { // cut while the frozen devices (frozen at 15–45 % of the run) expire
					select {
					case <-time.After(run / 2):
						p.Cut(ctx, cut)
					case <-ctx.Done():
					}
				}
			}()
			rep, err := sim.Run(ctx, opts(p.Addr(), p, prefix))
			<-done
			p.Close()
			if err != nil {
				b.Fatal(err)
			}
			reps = append(reps, rep)
		}

		var tab strings.Builder
		fmt.Fprintln(&tab, "| design | messages | Redis commands / msg | Redis CPU µs / msg | false offline | missed offline | detection p50 / p99 / max ms (bound) |")
		fmt.Fprintln(&tab, "|---|---|---|---|---|---|---|")
		for i, r := range reps {
			fmt.Fprintf(&tab, "| %s | %d | %.3f | %.2f | %d | %d | %d / %d / %d (%d) |\n", names[i], r.HeartbeatsSent,
				r.StoreCallsPerHeartbeat, r.StoreCPUMicrosPerHeartbeat, r.FalseOffline, r.MissedOffline,
				r.Detection.P50, r.Detection.P99, r.Detection.Max, r.BoundMS)
		}
		table = tab.String()
		b.Logf("side by side, %d CoAP devices every %s for %s:\n%s", devices, every, run, table)
		fg, nv, nc := reps[0], reps[1], reps[2]
		b.ReportMetric(fg.StoreCallsPerHeartbeat, "fg-cmds/msg")
		b.ReportMetric(nv.StoreCallsPerHeartbeat, "naive-cmds/msg")
		b.ReportMetric(fg.StoreCPUMicrosPerHeartbeat/max(nv.StoreCPUMicrosPerHeartbeat, 1e-9), "x-naive-cpu")
		b.ReportMetric(float64(fg.MissedOffline), "fg-missed")
		b.ReportMetric(float64(nc.MissedOffline), "naive-cut-missed")
	}
	writeSideBySide(b, doc, docPath, f.marker, started, loadStart, table)
}

// sideFleetEnv names the side-by-side fleet (sideFleets).
const sideFleetEnv = "SIDE_FLEET"

// sideFleet is one fleet of BenchmarkSimulateSideBySide: its size, the
// gateway's timings (the device heartbeat is tm.heartbeat), how long it
// plays, how long the naive design's subscriber is cut at half-time, the
// gateway's limits line, and the marker of docs/benchmarks.md its table
// goes between.
type sideFleet struct {
	devices  int
	tm       e2eTiming
	run, cut time.Duration
	limits   string
	marker   string
}

var sideFleets = map[string]sideFleet{
	"": {devices: 2000, run: 30 * time.Second, cut: 4 * time.Second, limits: simLimits, marker: "side-by-side",
		tm: e2eTiming{lease: 9 * time.Second, heartbeat: 3 * time.Second, renewEvery: 2 * time.Second,
			flush: 100 * time.Millisecond, runnerInterval: 100 * time.Millisecond}},
	// A site: the shipped timings; the fleet-wide bounds raised (not the
	// per-source ones: every device sends from an address of its own);
	// frozen devices (at 15–45 % of the run) expire 90 s later, inside it.
	"site": {devices: 100000, run: 5 * time.Minute, cut: 40 * time.Second, marker: "side-by-side-site",
		limits: "limits: { anonymous_max_devices: 1000000 }\n",
		tm: e2eTiming{lease: 90 * time.Second, heartbeat: 30 * time.Second, renewEvery: 20 * time.Second,
			flush: time.Second, runnerInterval: time.Second}},
}

// BenchmarkSimulatorCost measures what `fleetgate simulate` itself
// spends (its process's user + system CPU, from the start of the
// command to its end, the check included) per heartbeat, by kind of
// device: plain CoAP (NON and CON), MQTT (3.1.1 and 5, a PUBLISH or a
// PINGREQ each), and CoAP over DTLS (a handshake per heartbeat, as the
// gateway closes a session idle for 5 s). Each fleet heartbeats every
// second for 20 s against one `fleetgate run` on the embedded store.
func BenchmarkSimulatorCost(b *testing.B) {
	for _, tc := range []struct {
		name    string
		devices int
		args    []string
	}{
		{"coap", 2000, []string{"--mqtt-share", "0"}},
		{"mqtt", 1000, []string{"--mqtt-share", "1"}},
		{"dtls", 200, []string{"--mqtt-share", "0", "--dtls-share", "1"}},
	} {
		b.Run(tc.name, func(b *testing.B) {
			for range b.N {
				// the anonymous fleet's cap above the fleet
				g := simGatewayLimits(b, "gw-cost", "", simTiming, "limits: { coap_requests_per_second: 100000, mqtt_connects_per_second: 100000, anonymous_max_devices: 100000 }\n")
				fleet := append([]string{"--coap", g.coapAddr, "--mqtt", g.mqttAddr, "--devices", strconv.Itoa(tc.devices),
					"--prefix", "cost-"}, tc.args...)
				if tc.name == "dtls" {
					devices := filepath.Join(b.TempDir(), "devices.yaml")
					var out, errOut strings.Builder
					if code := dispatch(context.Background(), append([]string{"simulate", "--write-devices", devices}, fleet...), &out, &errOut); code != 0 {
						b.Fatalf("write-devices: %s%s", out.String(), errOut.String())
					}
					g.useDevicesFile(devices)
					fleet = append(fleet, "--dtls", g.dtlsAddr)
				}
				g.start()
				report := filepath.Join(b.TempDir(), "report.json")
				cmd := exec.Command(binary, append([]string{"simulate", "--admin", g.admin, "--heartbeat", "1s", "--duration", "20s",
					"--scenario", "none", "--lease", simTiming.lease.String(), "--renew-every", simTiming.renewEvery.String(),
					"--runner-interval", simTiming.runnerInterval.String(), "--flush-interval", simTiming.flush.String(),
					"--report", report}, fleet...)...)
				out, err := cmd.CombinedOutput()
				if err != nil {
					b.Fatalf("simulate: %v\n%s", err, out)
				}
				var rep sim.Report
				if raw, err := os.ReadFile(report); err != nil || json.Unmarshal(raw, &rep) != nil {
					b.Fatalf("report: %v", err)
				}
				cpu := cmd.ProcessState.UserTime() + cmd.ProcessState.SystemTime()
				f := rep.Fleet
				b.Logf("%s: %d devices, %d heartbeats (%d answered, %d DTLS handshakes), %.2f %% on schedule, CPU %s",
					tc.name, tc.devices, f.Heartbeats, f.Answered, f.DTLSHandshakes, 100*f.OnTime, cpu)
				b.ReportMetric(float64(cpu.Microseconds())/float64(f.Heartbeats), "µs/heartbeat")
				b.ReportMetric(100*f.OnTime, "%on-time")
			}
		})
	}
}
