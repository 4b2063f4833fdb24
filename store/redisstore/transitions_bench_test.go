package redisstore

import (
	"context"
	"testing"
	"time"

	"github.com/fleetgate/fleetgate/gateway"
	"github.com/fleetgate/fleetgate/gateway/clocktest"
	"github.com/fleetgate/fleetgate/internal/redistest"
)

// BenchmarkTransitions measures the apply script where a write changes a
// device's state, the part of its work that the renewals' fast path
// skips: 20,000 single-session devices on one shard (their records made
// before the timer starts), then rounds of an Apply of 500 connects
// (each an online event) and one of the same 500 leaves (each an
// offline event), timed with the Redis server's CPU. It reports the
// wall time and the Redis CPU per transition.
func BenchmarkTransitions(b *testing.B) {
	const batchSize, devices = 500, 20_000
	srv := redistest.Start(b)
	c := srv.Client(b)
	ctx := context.Background()
	clock := clocktest.New(time.UnixMilli(startMs))
	s, err := Open(ctx, c, Options{Prefix: "bench", Shards: 1, Now: clock.Now})
	if err != nil {
		b.Fatal(err)
	}
	ids := deviceIDs(devices, "dev")
	batch := func(i int, kind gateway.Kind) gateway.Batch {
		bt := gateway.Batch{Gateway: "gw-1", Epoch: 1, Lease: 90 * time.Second}
		for _, id := range ids[i : i+batchSize] {
			bt.Writes = append(bt.Writes, gateway.Write{Device: id, Session: "coap/default", Kind: kind})
		}
		return bt
	}
	apply := func(bt gateway.Batch) int {
		res, err := s.Apply(ctx, 0, bt)
		if err != nil {
			b.Fatal(err)
		}
		return len(res.Events)
	}
	for i := 0; i < devices; i += batchSize {
		apply(batch(i, gateway.Connect))
		apply(batch(i, gateway.Leave))
	}
	var spent cost
	transitions := 0
	b.ResetTimer()
	for range b.N {
		for i := 0; i < devices; i += batchSize {
			clock.Advance(time.Millisecond)
			on, off := batch(i, gateway.Connect), batch(i, gateway.Leave)
			measure(b, srv, &spent, func() {
				transitions += apply(on)
				transitions += apply(off)
			})
		}
	}
	b.StopTimer()
	if transitions != b.N*2*devices {
		b.Fatalf("%d transitions, want %d", transitions, b.N*2*devices)
	}
	b.ReportMetric(float64(transitions)/spent.wall.Seconds(), "transitions/s")
	b.ReportMetric(float64(spent.ticks)*float64(clockTick.Microseconds())/float64(transitions), "redis-cpu-us/transition")
}
