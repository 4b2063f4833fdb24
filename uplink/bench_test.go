package uplink

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/fleetgate/fleetgate/gateway"
	"github.com/fleetgate/fleetgate/internal/redistest"
	"github.com/fleetgate/fleetgate/internal/statefile"
	"github.com/fleetgate/fleetgate/store/redisstore"
)

const benchShards = 16

// benchClient is a client for a loaded machine: 16 batches of 1000
// writes queue behind each other in the single-threaded server.
func benchClient(b *testing.B, addr string) *redis.Client {
	c := redis.NewClient(&redis.Options{Addr: addr, ContextTimeoutEnabled: true, ReadTimeout: 30 * time.Second})
	b.Cleanup(func() { c.Close() })
	return c
}

func benchStore(b *testing.B, c redis.UniversalClient, prefix string) *redisstore.Store {
	b.Helper()
	s, err := redisstore.Open(context.Background(), c, redisstore.Options{Prefix: prefix, Shards: benchShards})
	if err != nil {
		b.Fatal(err)
	}
	return s
}

// BenchmarkOutboxReplay100k replays an outbox of 100,000 sessions into a
// real Redis store and, as its ceiling in the same run, applies the same
// writes directly (same batches of MaxBatch per shard, shards
// concurrently). Reported: both rates, replay/direct time, and the CPU
// time per session of this process and of redis-server in each phase
// (on a loaded machine the wall-clock rates mostly measure waiting for a
// core; the CPU figures do not).
func BenchmarkOutboxReplay100k(b *testing.B) {
	const sessions, maxBatch = 100_000, 1000
	srv := redistest.Start(b)
	c := benchClient(b, srv.Addr)
	ctx := context.Background()
	for i := range b.N {
		b.StopTimer()
		db, err := statefile.Open(filepath.Join(b.TempDir(), "state.db"), nil, Migrations)
		if err != nil {
			b.Fatal(err)
		}
		ob, err := OpenOutbox(db, OutboxOptions{Shards: benchShards})
		if err != nil {
			b.Fatal(err)
		}
		now := time.Now()
		items := make([]item, sessions)
		for j := range items {
			items[j] = item{key{gateway.DeviceID(fmt.Sprintf("bench-%d", j)), "coap/default"}, slot{kind: gateway.Connect, at: now.Add(-time.Duration(sessions-j) * time.Microsecond)}}
		}
		putStart := time.Now()
		for j := 0; j < sessions; j += 10_000 {
			if _, _, err := ob.put(items[j : j+10_000]); err != nil {
				b.Fatal(err)
			}
		}
		putTook := time.Since(putStart)

		u := New(benchStore(b, c, fmt.Sprintf("replay%d", i)), ob, Options{Gateway: "gw-bench", Epoch: 1, MaxBatch: maxBatch, Timeout: 30 * time.Second})
		b.StartTimer()
		cpu := startCPU(b, srv.Pid())
		start := time.Now()
		rp := &replayer{u: u}
		for round := 0; ob.Len() > 0; round++ {
			if round > sessions {
				b.Fatal("replay made no progress")
			}
			if err := rp.round(ctx); err != nil {
				b.Fatal(err)
			}
		}
		replayTook := time.Since(start)
		replayGw, replayRedis := cpu()
		b.StopTimer()

		direct := benchStore(b, c, fmt.Sprintf("direct%d", i))
		perShard := make([][]item, benchShards)
		for _, it := range items {
			sh := gateway.ShardOf(it.device, benchShards)
			perShard[sh] = append(perShard[sh], it)
		}
		cpu = startCPU(b, srv.Pid())
		start = time.Now()
		var wg sync.WaitGroup
		for sh, its := range perShard {
			wg.Go(func() {
				for k := 0; k < len(its); k += maxBatch {
					ws := withAges(appendWrites(nil, its[k:min(k+maxBatch, len(its))]), time.Now())
					if _, err := direct.Apply(ctx, sh, gateway.Batch{Gateway: "gw-bench", Epoch: 1, Lease: gateway.DefaultLease, Writes: ws}); err != nil {
						b.Error(err)
						return
					}
				}
			})
		}
		wg.Wait()
		directTook := time.Since(start)
		directGw, directRedis := cpu()
		if err := db.Close(); err != nil {
			b.Fatal(err)
		}
		b.ReportMetric(sessions/replayTook.Seconds(), "replay-sessions/s")
		b.ReportMetric(sessions/directTook.Seconds(), "direct-sessions/s")
		b.ReportMetric(replayTook.Seconds()/directTook.Seconds(), "replay/direct")
		b.ReportMetric(sessions/putTook.Seconds(), "outbox-put-sessions/s")
		b.ReportMetric(replayGw.Seconds()*1e6/sessions, "replay-gw-cpu-µs/session")
		b.ReportMetric(replayRedis.Seconds()*1e6/sessions, "replay-redis-cpu-µs/session")
		b.ReportMetric(directGw.Seconds()*1e6/sessions, "direct-gw-cpu-µs/session")
		b.ReportMetric(directRedis.Seconds()*1e6/sessions, "direct-redis-cpu-µs/session")
	}
}

// BenchmarkFlushRoundTrips flushes one write into each of 16 shards of a
// real Redis store, 20 times per op after a warm-up, and checks that a
// flush is one round trip (one pipeline, counted by a go-redis hook) of
// one script command per shard: its time is compared with one
// single-write Apply (one round trip) and with the same 16 calls made one
// after the other.
func BenchmarkFlushRoundTrips(b *testing.B) {
	const flushes = 20
	srv := redistest.Start(b)
	c := benchClient(b, srv.Addr)
	rt := &redistest.RoundTrips{}
	c.AddHook(rt)
	ctx := context.Background()
	db, err := statefile.Open(filepath.Join(b.TempDir(), "state.db"), nil, Migrations)
	if err != nil {
		b.Fatal(err)
	}
	defer db.Close()
	ob, err := OpenOutbox(db, OutboxOptions{Shards: benchShards})
	if err != nil {
		b.Fatal(err)
	}
	store := benchStore(b, c, "flush")
	u := New(store, ob, Options{Gateway: "gw-bench", Epoch: 1, Timeout: 30 * time.Second})
	devs := onePerShard(benchShards, "rt")
	flush := func() {
		for _, d := range devs {
			mustEnqueue(b, u, evidence(d, gateway.Renew, time.Now()))
		}
		if err := u.flushOnce(ctx, true); err != nil {
			b.Fatal(err)
		}
	}
	apply := func(sh int) {
		w := []gateway.Write{{Device: devs[sh], Session: "coap/default", Kind: gateway.Renew}}
		if _, err := store.Apply(ctx, sh, gateway.Batch{Gateway: "gw-bench", Epoch: 1, Lease: gateway.DefaultLease, Writes: w}); err != nil {
			b.Fatal(err)
		}
	}
	flush() // warm-up: dial the pool's connections
	var flushTook, oneTook, seqTook time.Duration
	var trips, cmds int64
	b.ResetTimer()
	for range b.N {
		for range flushes {
			evalBefore := evalshaCalls(b, c)
			before := rt.Total()
			start := time.Now()
			flush()
			flushTook += time.Since(start)
			trips += rt.Total() - before
			cmds += int64(evalshaCalls(b, c) - evalBefore)

			start = time.Now()
			apply(0)
			oneTook += time.Since(start)
			start = time.Now()
			for sh := range devs {
				apply(sh)
			}
			seqTook += time.Since(start)
		}
	}
	n := int64(b.N * flushes)
	if trips != n || cmds != n*benchShards {
		b.Fatalf("%d flushes made %d round trips and %d script commands, want %d and %d", n, trips, cmds, n, n*benchShards)
	}
	b.ReportMetric(float64(trips)/float64(n), "round-trips/flush")
	b.ReportMetric(float64(cmds)/float64(n), "redis-cmds/flush")
	b.ReportMetric(flushTook.Seconds()/oneTook.Seconds(), "flush/one-call")
	b.ReportMetric(flushTook.Seconds()/seqTook.Seconds(), "flush/sequential")
}

// evalshaCalls reads how many EVALSHA commands the server has run.
func evalshaCalls(b *testing.B, c *redis.Client) int {
	b.Helper()
	info, err := c.Info(context.Background(), "commandstats").Result()
	if err != nil {
		b.Fatal(err)
	}
	for line := range strings.SplitSeq(info, "\n") {
		if rest, ok := strings.CutPrefix(strings.TrimSpace(line), "cmdstat_evalsha:calls="); ok {
			n, err := strconv.Atoi(rest[:strings.IndexByte(rest, ',')])
			if err != nil {
				b.Fatal(err)
			}
			return n
		}
	}
	return 0
}

// startCPU starts measuring the CPU time of this process and of the
// process pid; the returned function reads both since the start.
func startCPU(b *testing.B, pid int) func() (self, other time.Duration) {
	self0, other0 := selfCPU(b), procCPU(b, pid)
	return func() (time.Duration, time.Duration) {
		return selfCPU(b) - self0, procCPU(b, pid) - other0
	}
}

func selfCPU(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// procCPU reads utime+stime of pid from /proc (clock ticks of 10 ms, the
// Linux USER_HZ).
func procCPU(b *testing.B, pid int) time.Duration {
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		b.Fatal(err)
	}
	// Fields after the command name, which is in parentheses.
	f := strings.Fields(string(raw[bytes.LastIndexByte(raw, ')')+1:]))
	utime, err1 := strconv.Atoi(f[11])
	stime, err2 := strconv.Atoi(f[12])
	if err1 != nil || err2 != nil {
		b.Fatalf("parse /proc/%d/stat: %v %v", pid, err1, err2)
	}
	return time.Duration(utime+stime) * 10 * time.Millisecond
}

// BenchmarkLedgerRewrite100k: one rewrite of the session ledger of a
// gateway whose table holds 100,000 sessions (every quarter lease: 22.5 s
// with the shipped lease), as the uplink's ledger loop does it: the
// table's restorable sessions encoded, written to a new file, fsynced
// and renamed.
func BenchmarkLedgerRewrite100k(b *testing.B) {
	table := gateway.NewTable(discard{}, gateway.TableOptions{Lease: 90 * time.Second, RenewEvery: 30 * time.Second})
	for i := 0; i < 100_000; i++ {
		ev := gateway.Evidence{Device: gateway.DeviceID(fmt.Sprintf("dev-%06d", i)), Session: "coap/default", Kind: gateway.Renew, ObservedAt: time.Now()}
		if err := table.Observe(context.Background(), ev); err != nil {
			b.Fatal(err)
		}
	}
	path := filepath.Join(b.TempDir(), LedgerFile)
	l, _, err := OpenLedger(path, time.Now(), time.Minute)
	if err != nil {
		b.Fatal(err)
	}
	u := &Uplink{ledger: l, sessions: table.Restorable, tm: timing{lease: 90 * time.Second}}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if err := u.rewriteLedger(time.Now()); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	if st, err := os.Stat(path); err == nil {
		b.ReportMetric(float64(st.Size())/1e6, "file-MB")
	}
}

// discard takes every piece of evidence.
type discard struct{}

func (discard) Enqueue(context.Context, gateway.Evidence) error { return nil }
