package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/plgd-dev/go-coap/v3/message"
	"github.com/plgd-dev/go-coap/v3/message/codes"
	"github.com/plgd-dev/go-coap/v3/message/pool"
	"github.com/plgd-dev/go-coap/v3/udp/coder"
	"github.com/redis/go-redis/v9"

	"github.com/fleetgate/fleetgate/internal/redistest"
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
		naive := func() (string, func()) { return startNaive(b, rc) }
		var res [2][2]load // [design][monitor]
		for d, start := range []func() (string, func()){fleetgate, naive} {
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

// simulateLoad runs `fleetgate simulate` and returns the requests sent.
func simulateLoad(b *testing.B, addr string, devices int, every, run time.Duration) int64 {
	var out, errb bytes.Buffer
	code := dispatch(context.Background(), []string{"simulate", "--coap", addr, "--devices", strconv.Itoa(devices),
		"--interval", every.String(), "--duration", run.String(), "--sockets", "64"}, &out, &errb)
	if code != 0 {
		b.Fatalf("simulate: %d %s", code, errb.String())
	}
	var sent int64
	if _, err := fmt.Sscanf(out.String(), "sent %d requests", &sent); err != nil {
		b.Fatalf("simulate output %q: %v", out.String(), err)
	}
	b.Logf("simulate: %s", strings.TrimSpace(out.String()))
	return sent
}

// startNaive runs the naive design: a UDP server that answers each CoAP
// heartbeat after one SET <device> 1 EX 90 on Redis.
func startNaive(b *testing.B, rc *redis.Client) (string, func()) {
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		buf := make([]byte, 1500)
		for {
			n, from, err := pc.ReadFrom(buf)
			if errors.Is(err, net.ErrClosed) {
				return
			}
			if err != nil {
				continue
			}
			req := pool.NewMessage(context.Background())
			if _, err := req.UnmarshalWithDecoder(coder.DefaultCoder, buf[:n]); err != nil {
				continue
			}
			q, _ := req.Queries()
			dev := ""
			for _, kv := range q {
				if v, ok := strings.CutPrefix(kv, "d="); ok {
					dev = v
				}
			}
			rc.Set(context.Background(), "naive:"+dev, "1", 90*time.Second)
			resp := pool.NewMessage(context.Background())
			resp.SetCode(codes.Changed)
			resp.SetType(message.NonConfirmable)
			resp.SetMessageID(req.MessageID())
			resp.SetToken(req.Token())
			if out, err := resp.MarshalWithEncoder(coder.DefaultCoder); err == nil {
				_, _ = pc.WriteTo(out, from)
			}
		}
	}()
	return pc.LocalAddr().String(), func() { pc.Close(); wg.Wait() }
}
