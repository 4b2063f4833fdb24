package redisstore

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/fleetgate/fleetgate/gateway"
	"github.com/fleetgate/fleetgate/internal/redistest"
)

// BenchmarkWaitReplicasCluster measures what store.redis.wait_replicas: 1
// costs on a Cluster of 3 masters with a replica each: ApplyShards calls
// over 8 shards, one after the other (as one uplink sends them), from a
// store without the wait and one with it, in turns. "renew" calls hold
// 500 renewals of connected devices per shard: they write no event and
// wait for nothing, but with the wait they go on one connection per
// master instead of the Cluster pipeline. "event" calls hold 499
// renewals and one connect per shard, "connect" calls one connect per
// shard: every master waits. Reported per store (wait0, wait1) and kind:
// writes per second and the call latency's median and 99th percentile.
func BenchmarkWaitReplicasCluster(b *testing.B) {
	const shards, perBatch, rounds = 8, 500, 100
	cl := redistest.StartClusterWithReplicas(b, 3)
	ctx := b.Context()
	stores := make([]*Store, 2)
	for wait := range stores {
		s, err := Dial(ctx, DialConfig{Addrs: cl.Addrs(), Options: Options{
			Prefix: fmt.Sprintf("bench-wait%d", wait), Shards: shards, WaitReplicas: wait}})
		if err != nil {
			b.Fatal(err)
		}
		defer s.Close()
		stores[wait] = s
	}
	devs := make([][]gateway.DeviceID, shards)
	for sh := range devs {
		devs[sh] = devicesIn(b, shards, sh, perBatch+2*rounds*b.N, "bench")
	}
	// call is a call of n writes per shard: renewals, with the last one a
	// connect of the fresh device fresh when it is ≥ 0.
	call := func(n, fresh int) []gateway.ShardBatch {
		bs := make([]gateway.ShardBatch, shards)
		for sh := range bs {
			bt := batch("gw-1", 1)
			for _, d := range devs[sh][:n] {
				bt.Writes = append(bt.Writes, write(d, "coap/default", gateway.Renew, 0))
			}
			if fresh >= 0 {
				bt.Writes[n-1] = write(devs[sh][perBatch+fresh], "coap/default", gateway.Connect, 0)
			}
			bs[sh] = gateway.ShardBatch{Shard: sh, Batch: bt}
		}
		return bs
	}
	apply := func(s *Store, bs []gateway.ShardBatch) time.Duration {
		start := time.Now()
		for sh, r := range s.ApplyShards(ctx, bs) {
			if r.Err != nil {
				b.Fatalf("shard %d: %v", sh, r.Err)
			}
		}
		return time.Since(start)
	}
	for _, s := range stores {
		bs := call(perBatch, -1)
		for _, sb := range bs {
			for i := range sb.Batch.Writes {
				sb.Batch.Writes[i].Kind = gateway.Connect
			}
		}
		apply(s, bs)
		apply(s, call(perBatch, -1))
	}
	kinds := []string{"renew", "event", "connect"}
	var took [2][3][]time.Duration // [wait][kind]
	b.ResetTimer()
	for n := range b.N {
		for r := range rounds {
			fresh := 2 * (n*rounds + r)
			for wait, s := range stores {
				took[wait][0] = append(took[wait][0], apply(s, call(perBatch, -1)))
				took[wait][1] = append(took[wait][1], apply(s, call(perBatch, fresh)))
				took[wait][2] = append(took[wait][2], apply(s, call(1, fresh+1)))
			}
		}
	}
	b.StopTimer()
	for wait := range took {
		for k, kind := range kinds {
			d := took[wait][k]
			var sum time.Duration
			for _, t := range d {
				sum += t
			}
			slices.Sort(d)
			name := fmt.Sprintf("wait%d-%s", wait, kind)
			if kind != "connect" {
				b.ReportMetric(float64(len(d)*shards*perBatch)/sum.Seconds(), name+"-writes/s")
			}
			b.ReportMetric(float64(d[len(d)/2].Microseconds())/1000, name+"-p50-ms")
			b.ReportMetric(float64(d[len(d)*99/100].Microseconds())/1000, name+"-p99-ms")
		}
	}
}
