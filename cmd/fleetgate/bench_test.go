package main

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/fleetgate/fleetgate/gateway"
	"github.com/fleetgate/fleetgate/internal/redistest"
	"github.com/fleetgate/fleetgate/sim"
	"github.com/fleetgate/fleetgate/sim/check"
	"github.com/fleetgate/fleetgate/sim/naive"
)

// BenchmarkCommandsPerMessage plays 10,000 CoAP devices, each sending a
// heartbeat every 10 s, first against fleetgate (shipped timings, Redis
// store, runner on) and then against the naive design (one SET key EX
// lease per message) on the same redis-server, and reports per device
// message: the commands clients sent to Redis (counted with MONITOR,
// which tells commands run inside scripts apart), all commands Redis
// executed (INFO commandstats, script internals included) and, in a
// second run of each without MONITOR, Redis CPU (utime + stime from /proc).
// It also reports, from the server side, the round trips per flush of
// fleetgate: the pipelines of apply script calls in MONITOR (see
// pipelines: one connection's calls, the parts Redis read of a large
// pipeline joined) per uplink store call (fleetgate_store_calls_total);
// 1.0 means every flush is one pipeline. monitor-runs/flush counts the
// runs with nothing in between instead (applyRuns), which splits a
// pipeline larger than Redis's 16 KB read when the runner's commands run
// between its parts.
func BenchmarkCommandsPerMessage(b *testing.B) {
	// 16 is the shipped shard count; 4 is the count of the figures
	// measured before (docs/benchmarks.md), kept to compare with them.
	for _, shards := range []int{4, 16} {
		b.Run(fmt.Sprintf("shards=%d", shards), func(b *testing.B) { benchCommandsPerMessage(b, shards) })
	}
}

func benchCommandsPerMessage(b *testing.B, shards int) {
	const devices, every, run = 10000, 10 * time.Second, 40 * time.Second
	for range b.N {
		srv := redistest.Start(b)
		rc := srv.Client(b)
		fleetgate := func() (string, func() float64, func()) { return benchGateway(b, srv.Addr, shards) }
		naive := func() (string, func() float64, func()) {
			addr, stop := startNaive(b, rc)
			return addr, func() float64 { return 0 }, stop
		}
		var res [2][2]load // [design][monitor]
		for d, start := range []func() (string, func() float64, func()){fleetgate, naive} {
			for _, monitor := range []bool{true, false} {
				if err := rc.FlushAll(context.Background()).Err(); err != nil {
					b.Fatal(err)
				}
				res[d][btoi(monitor)] = measure(b, srv, monitor, start, devices, every, run)
			}
		}
		fg, nv := res[0][1], res[1][1]
		fg.ticks, nv.ticks = res[0][0].ticks, res[1][0].ticks
		b.ReportMetric(fg.perMessage(), "client-cmds/msg")
		b.ReportMetric(nv.perMessage(), "naive-client-cmds/msg")
		b.ReportMetric(fg.perMessage()/nv.perMessage(), "x-naive-cmds")
		b.ReportMetric(float64(fg.executed)/float64(fg.messages), "executed-cmds/msg")
		b.ReportMetric(fg.cpuPerMessage()/nv.cpuPerMessage(), "x-naive-cpu")
		b.ReportMetric(float64(fg.pipes)/fg.calls, "round-trips/flush")
		b.ReportMetric(float64(fg.runs)/fg.calls, "monitor-runs/flush")
		b.ReportMetric(float64(fg.applies)/float64(fg.pipes), "script-calls/round-trip")
		for i, l := range []load{fg, nv} {
			b.Logf("%s: %d messages, %d client commands, %d executed (%s), %d Redis CPU ticks in the run without MONITOR",
				[]string{"fleetgate", "naive"}[i], l.messages, l.commands, l.executed, l.breakdown, l.ticks)
		}
		b.Logf("fleetgate: %v uplink store calls, %d pipelines and %d runs of apply script calls on the server, %d apply calls", fg.calls, fg.pipes, fg.runs, fg.applies)
	}
}

func btoi(v bool) int {
	if v {
		return 1
	}
	return 0
}

type load struct {
	messages, commands, executed, ticks int64
	breakdown                           string
	// calls is the uplink's store calls; pipes and runs the pipelines
	// and runs of apply script calls seen by MONITOR, applies those calls
	// (fleetgate only), all up to one moment no call was in flight.
	calls                float64
	pipes, runs, applies int
}

func (l load) perMessage() float64    { return float64(l.commands) / float64(l.messages) }
func (l load) cpuPerMessage() float64 { return float64(max(l.ticks, 1)) / float64(l.messages) }

// measure starts a design (start returns its address and stop), resets
// Redis's statistics, plays the devices against it, stops it, and reads
// the counters. With monitor, a MONITOR connection counts the commands
// clients sent (lines not marked "lua").
func measure(b *testing.B, srv *redistest.Server, monitor bool, start func() (string, func() float64, func()), devices int, every, run time.Duration) load {
	ctx := context.Background()
	rc := srv.Client(b)
	var mon *monitorLog
	if monitor {
		mon = startMonitor(b, srv.Addr)
	}
	addr, calls, stop := start()
	if err := rc.ConfigResetStat(ctx).Err(); err != nil {
		b.Fatal(err)
	}
	t0, err := redistest.ProcStat(srv.Pid())
	if err != nil {
		b.Fatal(err)
	}
	msgs := simulateLoad(b, addr, devices, every, run)
	// the calls and MONITOR's lines at a moment no call is in flight (the
	// counter the same before and after the snapshot), before the stop's
	// last flush
	var (
		ncalls float64
		upTo   []monitorLine
	)
	for deadline := time.Now().Add(10 * time.Second); ; {
		before := calls()
		if mon != nil {
			upTo = mon.snapshot()
		}
		ncalls = calls()
		if before == ncalls || time.Now().After(deadline) {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	stop()
	t1, _ := redistest.ProcStat(srv.Pid())
	info, err := rc.Info(ctx, "commandstats").Result()
	if err != nil {
		b.Fatal(err)
	}
	executed, parts := commandCalls(info)
	l := load{messages: msgs, executed: executed, ticks: t1 - t0, breakdown: parts, calls: ncalls}
	if mon != nil {
		mon.stop()
		lines := mon.snapshot()
		for _, ln := range lines {
			// the commands clients sent: not a script's own, not the
			// CONFIG RESETSTAT above
			if ln.client != "lua" && ln.name != "CONFIG" {
				l.commands++
			}
		}
		pipes := pipelines(upTo)
		l.pipes, l.runs = len(pipes), len(applyRuns(upTo))
		for _, p := range pipes {
			l.applies += len(p)
		}
	}
	return l
}

// commandCalls sums calls= over cmdstat_ lines of INFO commandstats.
func commandCalls(info string) (int64, string) {
	var total int64
	var parts []string
	for _, line := range strings.Split(info, "\n") {
		name, rest, ok := strings.Cut(strings.TrimSpace(line), ":calls=")
		if !ok {
			continue
		}
		n, _ := strconv.ParseInt(strings.SplitN(rest, ",", 2)[0], 10, 64)
		total += n
		parts = append(parts, fmt.Sprintf("%s=%d", strings.TrimPrefix(name, "cmdstat_"), n))
	}
	return total, strings.Join(parts, " ")
}

// benchGateway starts fleetgate with the shipped timings and the given
// shard count on Redis and returns its CoAP address, a reader of its uplink store
// calls, and a clean stop (SIGTERM).
func benchGateway(b *testing.B, redisAddr string, shards int) (string, func() float64, func()) {
	shipped := e2eTiming{lease: gateway.DefaultLease, heartbeat: gateway.DefaultHeartbeatInterval, renewEvery: gateway.DefaultRenewEvery,
		flush: gateway.DefaultFlushInterval, runnerInterval: gateway.DefaultRunnerInterval, shards: shards}
	g := newGateway(b, "gw-bench", redisAddr, shipped)
	g.start()
	calls := func() float64 { return scrapeCounter(b, "http://"+g.admin+"/metrics", "fleetgate_store_calls_total") }
	return g.coapAddr, calls, g.stop
}

// simulateLoad plays the CoAP fleet of sim (steady devices, no churn)
// and returns the requests sent.
func simulateLoad(b *testing.B, addr string, devices int, every, run time.Duration) int64 {
	rep, err := sim.Run(context.Background(), sim.Options{CoAP: []string{addr}, Source: nullSource{}, Devices: devices,
		Duration: run, Heartbeat: every, Sockets: 64, Prefix: "sim-",
		Lease: gateway.DefaultLease, RenewEvery: gateway.DefaultRenewEvery, RunnerInterval: gateway.DefaultRunnerInterval})
	if err != nil {
		b.Fatalf("simulate: %v", err)
	}
	b.Logf("simulate: %d requests, %d answered, codes %v", rep.HeartbeatsSent, rep.Fleet.Answered, rep.Fleet.CoAPCodes)
	return rep.HeartbeatsSent
}

// nullSource reads nothing: the load runs only count.
type nullSource struct{}

func (nullSource) Events(context.Context, time.Time) ([]check.Event, error) { return nil, nil }
func (nullSource) Counters(context.Context) (sim.Counters, bool, error) {
	return sim.Counters{}, false, nil
}
func (nullSource) Close() error { return nil }

// startNaive runs the naive design (sim/naive) with the shipped lease.
func startNaive(b *testing.B, rc *redis.Client) (string, func()) {
	p, err := naive.Start(context.Background(), rc, gateway.DefaultLease)
	if err != nil {
		b.Fatal(err)
	}
	return p.Addr(), func() { p.Close() }
}
