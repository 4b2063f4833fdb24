package runner

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fleetgate/fleetgate/gateway"
	"github.com/fleetgate/fleetgate/gateway/clocktest"
	"github.com/fleetgate/fleetgate/internal/redistest"
	"github.com/fleetgate/fleetgate/store/redisstore"
)

// BenchmarkReapRunnerVsDirect measures offline events per second reaped
// through a Runner on the Redis store against the ceiling measured in the
// same run: direct Store.Reap calls in a loop over the shards, same batch,
// on an identical backlog. Each iteration makes benchDevices entries due
// in each of two key prefixes (one jump of each prefix's manual store
// clock) and drains one with the runner and the other directly,
// alternating which goes first. runner/direct is the median over the
// iterations of the ratio of the two rates.
func BenchmarkReapRunnerVsDirect(b *testing.B) {
	const (
		benchDevices = 10_000
		shards       = 16
		batch        = gateway.DefaultRunnerBatch
		lease        = time.Minute
	)
	srv := redistest.Start(b)
	client := srv.Client(b)
	// Each side has its own store clock, so that one side's backlog falls
	// due only when it is measured.
	clk, clkDirect := clocktest.New(t0), clocktest.New(t0)
	open := func(prefix string, c *clocktest.Clock) *redisstore.Store {
		s, err := redisstore.Open(context.Background(), client, redisstore.Options{
			Prefix: prefix, Shards: shards, Now: c.Now, Logger: slog.New(slog.DiscardHandler),
		})
		if err != nil {
			b.Fatalf("open redis store: %v", err)
		}
		return s
	}
	viaRunner, direct := open("bench-runner", clk), open("bench-direct", clkDirect)

	// The runner sleeps at most 2 minutes of the manual clock, so that one
	// Advance(2*lease) wakes it with the whole backlog due; its lease
	// rounds are an hour apart.
	var reaped, want atomic.Int64
	finished := make(chan time.Time, 1)
	r := New(viaRunner, Options{
		Owner: "bench", Clock: clk, Interval: 2 * lease, LockTTL: 3 * time.Hour, Batch: batch,
		OnEvent: func(gateway.Event) {
			if reaped.Add(1) == want.Load() {
				finished <- time.Now()
			}
		},
	})
	start(b, r)
	asleep(b, clk, 1)
	step(b, clk, time.Hour, 1) // the second lease round takes every shard
	if n := len(r.Status().Shards); n != shards {
		b.Fatalf("runner holds %d shards, want %d", n, shards)
	}

	drainRunner := func() time.Duration {
		since := time.Now()
		clk.Advance(2 * lease)
		d := (<-finished).Sub(since)
		asleep(b, clk, 1)
		return d
	}
	drainDirect := func() time.Duration {
		clkDirect.Advance(2 * lease)
		t := time.Now()
		n := 0
		for shard := range shards {
			for range benchDevices {
				res, err := direct.Reap(context.Background(), shard, batch)
				if err != nil {
					b.Fatalf("reap shard %d: %v", shard, err)
				}
				n += len(res.Offline)
				if !res.More {
					break
				}
			}
		}
		d := time.Since(t)
		if n != benchDevices {
			b.Fatalf("direct reaps wrote %d events, want %d", n, benchDevices)
		}
		return d
	}

	var runnerTime, directTime time.Duration
	var ratios []float64 // per iteration: runner rate / direct rate
	b.ResetTimer()
	for i := range b.N {
		b.StopTimer()
		connect(b, viaRunner, deviceIDs(fmt.Sprintf("r%d", i), benchDevices), lease)
		connect(b, direct, deviceIDs(fmt.Sprintf("d%d", i), benchDevices), lease)
		want.Store(reaped.Load() + benchDevices)
		b.StartTimer()
		var viaR, viaD time.Duration
		if i%2 == 0 {
			viaR = drainRunner()
			viaD = drainDirect()
		} else {
			viaD = drainDirect()
			viaR = drainRunner()
		}
		runnerTime += viaR
		directTime += viaD
		ratios = append(ratios, viaD.Seconds()/viaR.Seconds())
	}
	b.StopTimer()
	total := float64(b.N * benchDevices)
	runnerRate, directRate := total/runnerTime.Seconds(), total/directTime.Seconds()
	b.ReportMetric(runnerRate, "runner_reaps/s")
	b.ReportMetric(directRate, "direct_reaps/s")
	// The median of the paired ratios: the machine is shared, and one
	// slow iteration should not decide the figure.
	slices.Sort(ratios)
	b.ReportMetric(ratios[len(ratios)/2], "runner/direct")
}
