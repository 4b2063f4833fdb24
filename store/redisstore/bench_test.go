package redisstore

import (
	"context"
	"fmt"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/fleetgate/fleetgate/gateway"
	"github.com/fleetgate/fleetgate/gateway/clocktest"
	"github.com/fleetgate/fleetgate/internal/redistest"
)

// The benchmarks each start their own redis-server, so that its CPU time
// (/proc/<pid>/stat) and memory are theirs alone, and measure a ceiling
// (what plain Redis commands cost for the same work) in the same run.

// cost is the wall time and Redis CPU time of some work.
type cost struct {
	wall  time.Duration
	ticks int64
}

func measure(b *testing.B, srv *redistest.Server, c *cost, work func()) {
	b.Helper()
	t0, err := redistest.ProcStat(srv.Pid())
	if err != nil {
		b.Fatal(err)
	}
	start := time.Now()
	work()
	c.wall += time.Since(start)
	t1, err := redistest.ProcStat(srv.Pid())
	if err != nil {
		b.Fatal(err)
	}
	c.ticks += t1 - t0
}

// clockTick is the length of a /proc/<pid>/stat tick (USER_HZ, 100 on Linux).
const clockTick = 10 * time.Millisecond

func deviceIDs(n int, prefix string) []gateway.DeviceID {
	ids := make([]gateway.DeviceID, n)
	for i := range ids {
		ids[i] = gateway.DeviceID(fmt.Sprintf("%s-%07d", prefix, i))
	}
	return ids
}

// scriptFloorLua is the least a renewal script can do: read the store
// clock, compute each device's deadline from its age, and move it with one
// variadic ZADD. It reads no record and writes no event.
const scriptFloorLua = `
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local z = {}
for i = 1, #ARGV, 2 do
  z[#z + 1] = now + 90000 - tonumber(ARGV[i + 1])
  z[#z + 1] = ARGV[i]
end
return redis.call('ZADD', KEYS[1], 'XX', 'GT', unpack(z))
`

// BenchmarkRenewals compares renewals through Apply, in batches of 500 on
// one shard, with a plain variadic ZADD of the same members (the ceiling)
// and with scriptFloorLua (what any script costs): throughput, Redis CPU
// per renewal, and script calls per batch.
func BenchmarkRenewals(b *testing.B) {
	const batchSize, devices, rounds = 500, 20_000, 30
	srv := redistest.Start(b)
	c := srv.Client(b)
	ctx := context.Background()
	s, err := Open(ctx, c, Options{Prefix: "bench", Shards: 1})
	if err != nil {
		b.Fatal(err)
	}
	ids := deviceIDs(devices, "dev")
	var batches []gateway.Batch
	var zsets [][]redis.Z
	for i := 0; i < devices; i += batchSize {
		bt := gateway.Batch{Gateway: "gw-1", Epoch: 1, Lease: 90 * time.Second}
		var zs []redis.Z
		for _, id := range ids[i : i+batchSize] {
			bt.Writes = append(bt.Writes, gateway.Write{Device: id, Session: "coap/default", Kind: gateway.Renew})
			zs = append(zs, redis.Z{Member: string(id)})
		}
		if _, err := s.Apply(ctx, 0, bt); err != nil {
			b.Fatal(err)
		}
		batches = append(batches, bt)
		zsets = append(zsets, zs)
	}
	const ceilingKey, floorKey = "ceiling:exp", "floor:exp"
	floorScript := redis.NewScript(scriptFloorLua)
	if err := floorScript.Load(ctx, c).Err(); err != nil {
		b.Fatal(err)
	}
	var floorArgs [][]any
	for _, zs := range zsets {
		var a []any
		for _, z := range zs {
			a = append(a, z.Member, 0)
		}
		if err := c.ZAdd(ctx, floorKey, zs...).Err(); err != nil {
			b.Fatal(err)
		}
		floorArgs = append(floorArgs, a)
	}
	var store, zadd, floor cost
	var applies int
	calls0 := commandCalls(b, ctx, []string{srv.Addr}, "evalsha") + commandCalls(b, ctx, []string{srv.Addr}, "eval")
	b.ResetTimer()
	for range b.N {
		for range rounds {
			measure(b, srv, &store, func() {
				for _, bt := range batches {
					if _, err := s.Apply(ctx, 0, bt); err != nil {
						b.Fatal(err)
					}
					applies++
				}
			})
			measure(b, srv, &zadd, func() {
				score := float64(time.Now().UnixMilli() + 90_000)
				for _, zs := range zsets {
					for i := range zs {
						zs[i].Score = score
					}
					if err := c.ZAdd(ctx, ceilingKey, zs...).Err(); err != nil {
						b.Fatal(err)
					}
				}
			})
			measure(b, srv, &floor, func() {
				for _, a := range floorArgs {
					if err := floorScript.Run(ctx, c, []string{floorKey}, a...).Err(); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
	b.StopTimer()
	calls := commandCalls(b, ctx, []string{srv.Addr}, "evalsha") + commandCalls(b, ctx, []string{srv.Addr}, "eval") - calls0 -
		int64(b.N*rounds*len(floorArgs))
	n := float64(applies * batchSize)
	storeRate, zaddRate := n/store.wall.Seconds(), n/zadd.wall.Seconds()
	storeCPU := float64(store.ticks) * float64(clockTick.Microseconds()) / n
	zaddCPU := float64(zadd.ticks) * float64(clockTick.Microseconds()) / n
	b.ReportMetric(storeRate, "renewals/s")
	b.ReportMetric(zaddRate, "zadd-members/s")
	b.ReportMetric(storeRate/zaddRate, "throughput-ratio")
	b.ReportMetric(storeCPU, "redis-cpu-us/renewal")
	b.ReportMetric(zaddCPU, "redis-cpu-us/zadd-member")
	b.ReportMetric(storeCPU/zaddCPU, "cpu-ratio")
	floorCPU := float64(floor.ticks) * float64(clockTick.Microseconds()) / n
	b.ReportMetric(n/floor.wall.Seconds()/zaddRate, "floor-throughput-ratio")
	b.ReportMetric(floorCPU/zaddCPU, "floor-cpu-ratio")
	b.ReportMetric(float64(calls)/float64(applies), "script-calls/batch")
	b.ReportMetric(float64(calls)/n, "redis-calls/renewal")
}

// ceilingReapLua is the least an atomic reap can do: pick 500 due
// entries, append an event for each, remove them.
const ceilingReapLua = `
local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1], 'LIMIT', 0, ARGV[2])
for _, d in ipairs(due) do
  redis.call('XADD', KEYS[2], 'MAXLEN', '~', ARGV[3], '*', 'device', d, 'state', 'offline',
    'ver', 2, 'at', ARGV[1], 'reason', 'expired', 'gw', 'gw-1', 'session', 'coap/default', 'deadline', ARGV[1])
end
if #due > 0 then redis.call('ZREM', KEYS[1], unpack(due)) end
return #due
`

// BenchmarkReap drains 100,000 due devices with Reap(limit) and compares
// it with ceilingReapLua over as many plain ZSET entries; the longest
// script call comes from SLOWLOG (every command logged). limit 500 is
// runner.batch's default, 250 what keeps a call near 2 ms here.
func BenchmarkReap(b *testing.B) {
	for _, limit := range []int{500, 250} {
		b.Run(fmt.Sprintf("limit=%d", limit), func(b *testing.B) { benchmarkReap(b, limit) })
	}
}

func benchmarkReap(b *testing.B, limit int) {
	const devices = 100_000
	srv := redistest.Start(b, "--slowlog-log-slower-than", "0", "--slowlog-max-len", "100000")
	c := srv.Client(b)
	ctx := context.Background()
	clock := clocktest.New(time.UnixMilli(startMs))
	s, err := Open(ctx, c, Options{Prefix: "bench", Shards: 1, Now: clock.Now})
	if err != nil {
		b.Fatal(err)
	}
	ceiling := redis.NewScript(ceilingReapLua)
	ceilingKeys := []string{"{ceiling}:exp", "{ceiling}:events"}
	ids := deviceIDs(devices, "dev")
	var store, floor cost
	var reaped, floorReaped int
	var storeCalls, floorCalls []time.Duration
	b.ResetTimer()
	for range b.N {
		b.StopTimer()
		for i := 0; i < devices; i += 1000 {
			bt := gateway.Batch{Gateway: "gw-1", Epoch: 1, Lease: time.Second}
			zs := make([]redis.Z, 0, 1000)
			for _, id := range ids[i : i+1000] {
				bt.Writes = append(bt.Writes, gateway.Write{Device: id, Session: "coap/default", Kind: gateway.Connect})
				zs = append(zs, redis.Z{Member: string(id), Score: float64(clock.Now().UnixMilli() + 1000)})
			}
			if _, err := s.Apply(ctx, 0, bt); err != nil {
				b.Fatal(err)
			}
			if err := c.ZAdd(ctx, ceilingKeys[0], zs...).Err(); err != nil {
				b.Fatal(err)
			}
		}
		clock.Advance(2 * time.Second)
		now := strconv.FormatInt(clock.Now().UnixMilli(), 10)
		b.StartTimer()

		c.SlowLogReset(ctx)
		measure(b, srv, &store, func() {
			for i := 0; i <= devices/limit; i++ {
				res, err := s.Reap(ctx, 0, limit)
				if err != nil {
					b.Fatal(err)
				}
				reaped += len(res.Offline)
				if !res.More {
					return
				}
			}
			b.Fatal("reap did not drain the shard")
		})
		storeCalls = append(storeCalls, scriptDurations(b, ctx, c)...)
		c.SlowLogReset(ctx)
		measure(b, srv, &floor, func() {
			for i := 0; i <= devices/limit+1; i++ {
				n, err := ceiling.Run(ctx, c, ceilingKeys, now, limit, s.maxLen).Int()
				if err != nil {
					b.Fatal(err)
				}
				floorReaped += n
				if n == 0 {
					return
				}
			}
			b.Fatal("ceiling reap did not drain")
		})
		floorCalls = append(floorCalls, scriptDurations(b, ctx, c)...)
	}
	b.StopTimer()
	if reaped != b.N*devices || floorReaped != b.N*devices {
		b.Fatalf("reaped %d and %d, want %d each", reaped, floorReaped, b.N*devices)
	}
	storeRate, floorRate := float64(reaped)/store.wall.Seconds(), float64(floorReaped)/floor.wall.Seconds()
	b.ReportMetric(storeRate, "reaps/s")
	b.ReportMetric(floorRate, "ceiling-reaps/s")
	b.ReportMetric(storeRate/floorRate, "throughput-ratio")
	storeCPU := float64(store.ticks) * float64(clockTick.Microseconds()) / float64(reaped)
	floorCPU := float64(floor.ticks) * float64(clockTick.Microseconds()) / float64(floorReaped)
	b.ReportMetric(storeCPU, "redis-cpu-us/reap")
	b.ReportMetric(floorCPU, "ceiling-redis-cpu-us/reap")
	b.ReportMetric(storeCPU/floorCPU, "cpu-ratio")
	slices.Sort(storeCalls)
	slices.Sort(floorCalls)
	msOf := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
	b.ReportMetric(msOf(storeCalls[len(storeCalls)-1]), "max-script-ms")
	b.ReportMetric(msOf(storeCalls[len(storeCalls)/2]), "p50-script-ms")
	b.ReportMetric(msOf(floorCalls[len(floorCalls)-1]), "ceiling-max-script-ms")
	b.ReportMetric(msOf(floorCalls[len(floorCalls)/2]), "ceiling-p50-script-ms")
}

// scriptDurations lists the EVAL/EVALSHA durations in the server's slow
// log (the server logs every command).
func scriptDurations(b *testing.B, ctx context.Context, c *redis.Client) []time.Duration {
	b.Helper()
	logs, err := c.SlowLogGet(ctx, -1).Result()
	if err != nil {
		b.Fatal(err)
	}
	var ds []time.Duration
	for _, l := range logs {
		if len(l.Args) > 0 && strings.HasPrefix(strings.ToLower(l.Args[0]), "eval") {
			ds = append(ds, l.Duration)
		}
	}
	if len(ds) == 0 {
		b.Fatal("no script calls in the slow log")
	}
	return ds
}

func usedMemory(b *testing.B, ctx context.Context, c *redis.Client) int64 {
	b.Helper()
	info, err := c.Info(ctx, "memory").Result()
	if err != nil {
		b.Fatal(err)
	}
	for _, line := range strings.Split(info, "\r\n") {
		if v, ok := strings.CutPrefix(line, "used_memory:"); ok {
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil {
				b.Fatal(err)
			}
			return n
		}
	}
	b.Fatal("no used_memory in INFO memory")
	return 0
}

// BenchmarkMemoryPerDevice measures Redis used_memory per single-session
// device over 1,000,000 devices in 16 shards, with the connectionless
// session "coap/default" (a 25-byte record; a connection session
// "<gw>/<epoch>/<n>" packs to 15 bytes, in the same 32-byte allocation),
// against a plain ZSET of the same members as the ceiling. The presence
// state (the deadline index and the records) is reported apart from the
// event streams, which hold the 1,000,000 online events.
func BenchmarkMemoryPerDevice(b *testing.B) {
	const devices, shards, batchSize = 1_000_000, 16, 1000
	srv := redistest.Start(b)
	c := srv.Client(b)
	ctx := context.Background()
	ids := deviceIDs(devices, "dev")
	for range b.N {
		if err := c.FlushAll(ctx).Err(); err != nil {
			b.Fatal(err)
		}
		used0 := usedMemory(b, ctx, c)
		s, err := Open(ctx, c, Options{Prefix: "mem", Shards: shards})
		if err != nil {
			b.Fatal(err)
		}
		pending := make([]gateway.Batch, shards)
		for shard := range pending {
			pending[shard] = gateway.Batch{Gateway: "site-a-1", Epoch: 3, Lease: time.Hour}
		}
		flush := func(shard int) {
			if len(pending[shard].Writes) == 0 {
				return
			}
			if _, err := s.Apply(ctx, shard, pending[shard]); err != nil {
				b.Fatal(err)
			}
			pending[shard].Writes = pending[shard].Writes[:0]
		}
		for _, id := range ids {
			shard := gateway.ShardOf(id, shards)
			pending[shard].Writes = append(pending[shard].Writes,
				gateway.Write{Device: id, Session: "coap/default", Kind: gateway.Connect})
			if len(pending[shard].Writes) == batchSize {
				flush(shard)
			}
		}
		for shard := range pending {
			flush(shard)
		}
		total := usedMemory(b, ctx, c) - used0
		var streams int64
		for shard := 0; shard < shards; shard++ {
			n, err := c.MemoryUsage(ctx, s.keys[shard].data[2], 0).Result()
			if err != nil {
				b.Fatal(err)
			}
			streams += n
		}

		if err := c.FlushAll(ctx).Err(); err != nil {
			b.Fatal(err)
		}
		zused0 := usedMemory(b, ctx, c)
		zs := make([]redis.Z, 0, batchSize)
		for i, id := range ids {
			zs = append(zs, redis.Z{Member: string(id), Score: float64(startMs) + float64(i)})
			if len(zs) == batchSize {
				key := fmt.Sprintf("{ceiling:%d}:exp", (i/batchSize)%shards)
				if err := c.ZAdd(ctx, key, zs...).Err(); err != nil {
					b.Fatal(err)
				}
				zs = zs[:0]
			}
		}
		zset := usedMemory(b, ctx, c) - zused0
		b.ReportMetric(float64(total-streams)/devices, "state-B/device")
		b.ReportMetric(float64(zset)/devices, "zset-only-B/device")
		b.ReportMetric(float64(total-streams)/float64(zset), "state/zset-ratio")
		b.ReportMetric(float64(streams)/devices, "stream-B/event")
		b.ReportMetric(float64(total)/devices, "total-B/device")
	}
}

// BenchmarkBeliefMemory measures the gateway memory a belief costs per
// device (100,000 devices, one session each, learned from one reply whose
// strings are copies of the batch's, which the session table holds),
// against a plain set of the same device IDs.
func BenchmarkBeliefMemory(b *testing.B) {
	const n = 100_000
	ids := deviceIDs(n, "dev")
	// the reply's strings are copies; the beliefs keep the batch's own
	status := make([]any, 0, 2*n)
	writes := make([]gateway.Write, 0, n)
	for _, id := range ids {
		status = append(status, strings.Clone(string(id)), strings.Clone("coap/default"))
		writes = append(writes, gateway.Write{Device: id, Session: "coap/default", Kind: gateway.Renew})
	}
	heap := func() uint64 {
		runtime.GC()
		runtime.GC()
		var m runtime.MemStats
		runtime.ReadMemStats(&m)
		return m.HeapAlloc
	}
	var perBelief, perSet float64
	for range b.N {
		h0 := heap()
		bel := &beliefs{steady: make(map[gateway.DeviceID]belief)}
		bel.learn("inc", status, writes, 0)
		h1 := heap()
		set := make(map[gateway.DeviceID]struct{})
		for _, id := range ids {
			set[id] = struct{}{}
		}
		h2 := heap()
		if len(bel.steady) != n || len(set) != n {
			b.Fatalf("%d beliefs, %d set members, want %d", len(bel.steady), len(set), n)
		}
		perBelief += float64(h1-h0) / n
		perSet += float64(h2-h1) / n
	}
	b.ReportMetric(perBelief/float64(b.N), "B/belief")
	b.ReportMetric(perSet/float64(b.N), "B/set-member")
	b.ReportMetric(perBelief/perSet, "ratio")
}
