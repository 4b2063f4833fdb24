package redisstore

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/fleetgate/fleetgate/gateway"
	"github.com/fleetgate/fleetgate/internal/redistest"
)

// BenchmarkReadEvents reads a shard's log of 200,000 events through
// ReadEvents (batches of 1000: one MULTI of the position script and an
// XREAD COUNT each) and, as the ceiling, with a bare XREAD COUNT 1000
// loop over the same stream: events/s and Redis CPU per event delivered,
// each read twice per iteration in ABBA order.
func BenchmarkReadEvents(b *testing.B) {
	const events, batch = 200_000, 1000
	srv := redistest.Start(b)
	c := srv.Client(b)
	ctx := context.Background()
	s, err := Open(ctx, c, Options{Prefix: "bench", Shards: 1, EventsMaxLen: 2 * events})
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	ids := deviceIDs(events/2, "dev")
	for i := 0; i < len(ids); i += 500 {
		for _, kind := range []gateway.Kind{gateway.Connect, gateway.Leave} {
			bt := gateway.Batch{Gateway: "gw-1", Epoch: 1, Lease: time.Hour}
			for _, id := range ids[i:min(i+500, len(ids))] {
				bt.Writes = append(bt.Writes, gateway.Write{Device: id, Session: "s", Kind: kind})
			}
			if _, err := s.Apply(ctx, 0, bt); err != nil {
				b.Fatal(err)
			}
		}
	}
	head, err := s.SnapshotShard(ctx, 0, "", 0)
	if err != nil {
		b.Fatal(err)
	}
	key := s.keys[0].data[2]
	var store, bare cost
	b.ResetTimer()
	readStore := func() {
		n := 0
		measure(b, srv, &store, func() {
			pos := gateway.Position{Incarnation: head.At.Incarnation, ID: "0"}
			for {
				evs, err := s.ReadEvents(ctx, 0, pos, batch, 0)
				if err != nil {
					b.Fatal(err)
				}
				if len(evs) == 0 {
					break
				}
				n += len(evs)
				pos.ID = evs[len(evs)-1].ID
			}
		})
		if n != events {
			b.Fatalf("ReadEvents read %d events, want %d", n, events)
		}
	}
	readBare := func() {
		m := 0
		measure(b, srv, &bare, func() {
			id := "0"
			for {
				res, err := s.reader().c.XRead(ctx, &redis.XReadArgs{Streams: []string{key, id}, Count: batch, Block: -1}).Result()
				if err == redis.Nil {
					break
				}
				if err != nil {
					b.Fatal(err)
				}
				msgs := res[0].Messages
				// the same decoding as ReadEvents, so that the ceiling
				// differs by the position script only
				for _, msg := range msgs {
					if _, err := streamEvent(0, msg); err != nil {
						b.Fatal(err)
					}
				}
				m += len(msgs)
				id = msgs[len(msgs)-1].ID
			}
		})
		if m != events {
			b.Fatalf("XREAD read %d events, want %d", m, events)
		}
	}
	// ABBA order, so that a drift of the shared machine's load weighs
	// on both alike
	for range b.N {
		readStore()
		readBare()
		readBare()
		readStore()
	}
	b.StopTimer()
	total := float64(2 * events * b.N)
	cpu := func(c cost) float64 { return float64(c.ticks*int64(clockTick)) / total }
	b.ReportMetric(total/store.wall.Seconds(), "events/s")
	b.ReportMetric(total/bare.wall.Seconds(), "xread-events/s")
	b.ReportMetric(cpu(store), "redis-cpu-ns/event")
	b.ReportMetric(cpu(bare), "xread-redis-cpu-ns/event")
	if bare.ticks > 0 {
		b.ReportMetric(float64(store.ticks)/float64(bare.ticks), "cpu-ratio")
	}
}
