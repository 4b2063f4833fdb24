package redisstore

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/fleetgate/fleetgate/gateway"
	"github.com/fleetgate/fleetgate/internal/redistest"
)

// devicesPerShard returns one device ID hashing to each shard.
func devicesPerShard(shards int, prefix string) []gateway.DeviceID {
	devs := make([]gateway.DeviceID, shards)
	for i, found := 0, 0; found < shards && i < 100000; i++ {
		d := gateway.DeviceID(fmt.Sprintf("%s-%d", prefix, i))
		if sh := gateway.ShardOf(d, shards); devs[sh] == "" {
			devs[sh] = d
			found++
		}
	}
	return devs
}

// masters is the number of masters holding s's shards (1 on a
// standalone server).
func masters(t *testing.T, c redis.UniversalClient, s *Store) int64 {
	t.Helper()
	cc, ok := c.(*redis.ClusterClient)
	if !ok {
		return 1
	}
	addrs := map[string]bool{}
	for _, k := range s.keys {
		m, err := cc.MasterForKey(t.Context(), k.data[0])
		if err != nil {
			t.Fatal(err)
		}
		addrs[m.Options().Addr] = true
	}
	return int64(len(addrs))
}

// ApplyShards sends every shard's batch in one pipeline per master; a batch is
// fenced on its own; after SCRIPT FLUSH the NOSCRIPT replies are sent
// again with EVAL and succeed.
func TestApplyShardsOnePipelinePerMaster(t *testing.T) {
	forBackends(t, func(t *testing.T, c redis.UniversalClient) {
		const shards = 8
		e := newEnv(t, c, shards)
		rt := &redistest.RoundTrips{}
		c.AddHook(rt)
		devs := devicesPerShard(shards, "multi")
		batches := func(epoch uint64, kind gateway.Kind) []gateway.ShardBatch {
			var bs []gateway.ShardBatch
			for sh, d := range devs {
				bs = append(bs, gateway.ShardBatch{Shard: sh, Batch: gateway.Batch{
					Gateway: "gw-m", Epoch: epoch, Lease: 90 * time.Second,
					Writes: []gateway.Write{{Device: d, Session: "coap/default", Kind: kind}},
				}})
			}
			return bs
		}
		before := rt.Singles()
		res := e.store.ApplyShards(e.ctx, batches(2, gateway.Connect))
		if p, s, want := rt.Pipelines(), rt.Singles()-before, masters(t, c, e.store); p != want || s != 0 {
			t.Fatalf("ApplyShards made %d pipelines and %d single calls, want %d (one per master) and 0", p, s, want)
		}
		for sh, r := range res {
			if r.Err != nil || len(r.Result.Events) != 1 || r.Result.Events[0].State != gateway.Online || r.Result.Events[0].Device != devs[sh] {
				t.Fatalf("shard %d: %+v %v, want one online event of %s", sh, r.Result, r.Err, devs[sh])
			}
		}

		// One stale batch among current ones: only it is refused.
		bs := batches(2, gateway.Renew)
		bs[3].Batch.Epoch = 1
		bs[5].Batch.Writes[0].Device = devs[6]
		res = e.store.ApplyShards(e.ctx, bs)
		for sh, r := range res {
			switch sh {
			case 3:
				if !errors.Is(r.Err, gateway.ErrFenced) {
					t.Fatalf("stale shard 3: %v, want ErrFenced", r.Err)
				}
			case 5:
				if !errors.Is(r.Err, gateway.ErrWrongShard) {
					t.Fatalf("misrouted shard 5: %v, want ErrWrongShard", r.Err)
				}
			default:
				if r.Err != nil || len(r.Result.Events) != 0 {
					t.Fatalf("shard %d: %+v %v, want applied with no event", sh, r.Result, r.Err)
				}
			}
		}

		if err := c.ScriptFlush(e.ctx).Err(); err != nil {
			t.Fatal(err)
		}
		if cc, ok := c.(*redis.ClusterClient); ok {
			if err := cc.ForEachMaster(e.ctx, func(ctx context.Context, m *redis.Client) error { return m.ScriptFlush(ctx).Err() }); err != nil {
				t.Fatal(err)
			}
		}
		res = e.store.ApplyShards(e.ctx, batches(2, gateway.Leave))
		for sh, r := range res {
			if r.Err != nil || len(r.Result.Events) != 1 || r.Result.Events[0].State != gateway.Offline {
				t.Fatalf("after SCRIPT FLUSH, shard %d: %+v %v, want one offline event", sh, r.Result, r.Err)
			}
		}
	})
}

// The event stream is capped near EventsMaxLen (MAXLEN ~, trimmed once
// per script call): it neither grows without bound nor drops below the cap.
func TestEventsStreamCapped(t *testing.T) {
	c := sharedServer().Client(t)
	const maxLen = 200
	prefix := uniquePrefix()
	s, err := Open(t.Context(), c, Options{Prefix: prefix, Shards: 1, EventsMaxLen: maxLen})
	if err != nil {
		t.Fatal(err)
	}
	for round := 0; round < 20; round++ {
		var ws []gateway.Write
		for i := 0; i < 50; i++ {
			d := gateway.DeviceID(fmt.Sprintf("cap-%d", i))
			ws = append(ws, gateway.Write{Device: d, Session: "coap/default", Kind: gateway.Connect},
				gateway.Write{Device: d, Session: "coap/default", Kind: gateway.Leave})
		}
		if _, err := s.Apply(t.Context(), 0, gateway.Batch{Gateway: "gw-cap", Epoch: 1, Lease: time.Minute, Writes: ws}); err != nil {
			t.Fatal(err)
		}
	}
	n, err := c.XLen(t.Context(), "{"+prefix+":0}:events").Result()
	if err != nil {
		t.Fatal(err)
	}
	// 2,000 events written; a radix-tree node holds up to 100 entries, so
	// approximate trimming keeps between maxLen and maxLen+100.
	if n < maxLen || n > maxLen+100 {
		t.Fatalf("stream length %d after 2000 events, want %d..%d", n, maxLen, maxLen+100)
	}
}
