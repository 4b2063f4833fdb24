package main

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

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
func BenchmarkCommandsPerMessage(b *testing.B) {
	const devices, every, run = 10000, 10 * time.Second, 40 * time.Second
	for range b.N {
		srv := redistest.Start(b)
		rc := srv.Client(b)
		fleetgate := func() (string, func()) { return benchGateway(b, srv.Addr) }
		naivePeer := func() (string, func()) { return startNaive(b, rc) }
		var res [2][2]load // [design][monitor]
		for d, start := range []func() (string, func()){fleetgate, naivePeer} {
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
		for i, l := range []load{fg, nv} {
			b.Logf("%s: %d messages, %d client commands, %d executed (%s), %d Redis CPU ticks in the run without MONITOR",
				[]string{"fleetgate", "naive"}[i], l.messages, l.commands, l.executed, l.breakdown, l.ticks)
		}
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
}

func (l load) perMessage() float64    { return float64(l.commands) / float64(l.messages) }
func (l load) cpuPerMessage() float64 { return float64(max(l.ticks, 1)) / float64(l.messages) }

// measure starts a design (start returns its address and stop), resets
// Redis's statistics, plays the devices against it, stops it, and reads
// the counters. With monitor, a MONITOR connection counts the commands
// clients sent (lines not marked "lua").
func measure(b *testing.B, srv *redistest.Server, monitor bool, start func() (string, func()), devices int, every, run time.Duration) load {
	ctx := context.Background()
	rc := srv.Client(b)
	addr, stop := start()
	if err := rc.ConfigResetStat(ctx).Err(); err != nil {
		b.Fatal(err)
	}
	var client atomic.Int64
	stopMon := func() {}
	if monitor {
		stopMon = monitorCommands(b, srv.Addr, &client)
	}
	t0, err := redistest.ProcStat(srv.Pid())
	if err != nil {
		b.Fatal(err)
	}
	msgs := simulateLoad(b, addr, devices, every, run)
	stop()
	t1, _ := redistest.ProcStat(srv.Pid())
	stopMon()
	info, err := rc.Info(ctx, "commandstats").Result()
	if err != nil {
		b.Fatal(err)
	}
	executed, parts := commandCalls(info)
	return load{messages: msgs, commands: client.Load(), executed: executed, ticks: t1 - t0, breakdown: parts}
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

// benchGateway starts fleetgate with the shipped timings on Redis and
// returns its CoAP address and a clean stop (SIGTERM).
func benchGateway(b *testing.B, redisAddr string) (string, func()) {
	shipped := e2eTiming{lease: 90 * time.Second, heartbeat: 30 * time.Second, renewEvery: 20 * time.Second, flush: time.Second, runnerInterval: time.Second}
	g := newGateway(b, "gw-bench", redisAddr, shipped)
	g.start()
	return g.coapAddr, g.stop
}

// monitorCommands counts, on a MONITOR connection, the commands clients
// send (script internals are marked "[0 lua]" and not counted).
func monitorCommands(b *testing.B, addr string, client *atomic.Int64) (stop func()) {
	c, err := net.Dial("tcp", addr)
	if err != nil {
		b.Fatal(err)
	}
	if _, err := c.Write([]byte("MONITOR\r\n")); err != nil {
		b.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		sc := bufio.NewScanner(c)
		sc.Buffer(make([]byte, 1<<20), 1<<24)
		for sc.Scan() {
			line := sc.Text()
			if strings.HasPrefix(line, "+") && !strings.HasPrefix(line, "+OK") && !strings.Contains(line, " lua] ") {
				client.Add(1)
			}
		}
	}()
	return func() { c.Close(); <-done }
}

// simulateLoad plays the CoAP fleet of sim (steady devices, no churn)
// and returns the requests sent.
func simulateLoad(b *testing.B, addr string, devices int, every, run time.Duration) int64 {
	rep, err := sim.Run(context.Background(), sim.Options{CoAP: []string{addr}, Source: nullSource{}, Devices: devices,
		Duration: run, Heartbeat: every, Sockets: 64, Prefix: "sim-",
		Lease: 90 * time.Second, RenewEvery: 20 * time.Second, RunnerInterval: time.Second})
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
	p, err := naive.Start(context.Background(), rc, 90*time.Second)
	if err != nil {
		b.Fatal(err)
	}
	return p.Addr(), func() { p.Close() }
}
