package embedded

import (
	"context"
	"fmt"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/fleetgate/fleetgate/gateway"
)

// benchBatch is the batch size of the benchmarks: the runner's default
// reap batch and a typical uplink flush.
const benchBatch = 500

const benchShards = 16

// benchDevices returns n devices of shard 0.
func benchDevices(n int) []gateway.DeviceID {
	var ds []gateway.DeviceID
	for i := 0; len(ds) < n; i++ {
		d := gateway.DeviceID(fmt.Sprintf("bench-device-%06d", i))
		if gateway.ShardOf(d, benchShards) == 0 {
			ds = append(ds, d)
		}
	}
	return ds
}

// ceiling is the raw bbolt cost the benchmarks are measured against: one
// Update putting the same keys, with values the size of a one-session
// device record, in a bucket of the same file.
type ceiling struct {
	db    *bolt.DB
	keys  [][]byte
	value []byte
	spent time.Duration
}

func newCeiling(b *testing.B, db *bolt.DB, devs []gateway.DeviceID) *ceiling {
	c := &ceiling{db: db}
	for _, d := range devs {
		c.keys = append(c.keys, []byte(d))
	}
	r := record{online: true, ver: 1, since: t0.UnixMilli(), gw: "bench-gw", session: "mqtt/bench-gw/1/1",
		sessions: []session{{id: "mqtt/bench-gw/1/1", deadline: t0.UnixMilli(), gw: "bench-gw", epoch: 1}}}
	c.value = encodeRecord(&r)
	if err := db.Update(func(tx *bolt.Tx) error {
		_, err := tx.CreateBucketIfNotExists([]byte("bench.raw"))
		return err
	}); err != nil {
		b.Fatal(err)
	}
	return c
}

// run times one raw Update outside the benchmark's timer.
func (c *ceiling) run(b *testing.B) {
	b.StopTimer()
	start := time.Now()
	err := c.db.Update(func(tx *bolt.Tx) error {
		bk := tx.Bucket([]byte("bench.raw"))
		for _, k := range c.keys {
			if err := bk.Put(k, c.value); err != nil {
				return err
			}
		}
		return nil
	})
	c.spent += time.Since(start)
	if err != nil {
		b.Fatal(err)
	}
	b.StartTimer()
}

// report gives the store's rate, the ceiling's and their ratio (store
// time per batch over raw time per batch; 1 would be the ceiling).
func (c *ceiling) report(b *testing.B, unit string) {
	n := float64(b.N * benchBatch)
	b.ReportMetric(n/b.Elapsed().Seconds(), unit)
	b.ReportMetric(n/c.spent.Seconds(), "raw-puts/s")
	b.ReportMetric(b.Elapsed().Seconds()/c.spent.Seconds(), "x-raw")
}

// BenchmarkApplyRenew applies batches of 500 renewals of live sessions
// (every one moves its device's deadline and index entry).
func BenchmarkApplyRenew(b *testing.B) {
	f := newFixture(b, Options{Shards: benchShards})
	devs := benchDevices(benchBatch)
	c := newCeiling(b, f.db, devs)
	ctx := context.Background()
	bt := gateway.Batch{Gateway: "bench-gw", Epoch: 1, Lease: lease}
	for _, d := range devs {
		bt.Writes = append(bt.Writes, renew(d, "mqtt/bench-gw/1/1", 0))
	}
	if _, err := f.s.Apply(ctx, 0, bt); err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	for range b.N {
		c.run(b)
		f.clk.Advance(20 * time.Second)
		res, err := f.s.Apply(ctx, 0, bt)
		if err != nil || len(res.Events) != 0 {
			b.Fatalf("Apply: %d events, %v", len(res.Events), err)
		}
	}
	c.report(b, "renewals/s")
}

// BenchmarkReap reaps 500 due devices per call, each writing its offline
// event and leaving the index; the connects that make them due are not
// timed.
func BenchmarkReap(b *testing.B) {
	f := newFixture(b, Options{Shards: benchShards})
	devs := benchDevices(benchBatch)
	c := newCeiling(b, f.db, devs)
	ctx := context.Background()
	bt := gateway.Batch{Gateway: "bench-gw", Epoch: 1, Lease: lease}
	for _, d := range devs {
		bt.Writes = append(bt.Writes, connect(d, "mqtt/bench-gw/1/1", 0))
	}
	b.ResetTimer()
	for range b.N {
		b.StopTimer()
		if _, err := f.s.Apply(ctx, 0, bt); err != nil {
			b.Fatal(err)
		}
		f.clk.Advance(lease)
		b.StartTimer()
		c.run(b)
		res, err := f.s.Reap(ctx, 0, benchBatch)
		if err != nil || len(res.Offline) != benchBatch || res.More {
			b.Fatalf("Reap: %d offline, more %v, %v", len(res.Offline), res.More, err)
		}
	}
	c.report(b, "reaped/s")
}
