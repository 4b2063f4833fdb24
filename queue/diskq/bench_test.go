package diskq

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/fleetgate/fleetgate/gateway"
)

// benchMessage is a device message with a 100-byte payload.
var benchMessage = gateway.Message{Device: "bench-device-000001", Topic: "telemetry/temp", Payload: make([]byte, 100),
	ContentType: "application/json", QoS: 1, Received: time.Now(), Source: "mqtt"}

// ceiling is the disk's pace in the benchmark's own file: commits/s of
// a bare bbolt Update putting one value of a message's size under the
// next 8-byte key, and fsyncs/s of a bare os.File.Sync after a 4 KiB
// write beside the file.
type ceiling struct{ commitsPerSec, fsyncsPerSec float64 }

// around measures the ceiling for d before and d after run (outside the
// benchmark's timer) and returns the mean of the two: the machine's
// disk is shared and its pace moves within seconds.
func around(b *testing.B, db *bolt.DB, d time.Duration, run func()) ceiling {
	b.Helper()
	before := measureCeiling(b, db, d)
	b.ResetTimer()
	run()
	b.StopTimer()
	after := measureCeiling(b, db, d)
	return ceiling{(before.commitsPerSec + after.commitsPerSec) / 2, (before.fsyncsPerSec + after.fsyncsPerSec) / 2}
}

// measureCeiling runs each ceiling loop for about d.
func measureCeiling(b *testing.B, db *bolt.DB, d time.Duration) ceiling {
	b.Helper()
	bucket := []byte("bench.raw")
	value := encode(benchMessage)
	var c ceiling
	n, start := uint64(0), time.Now()
	for time.Since(start) < d {
		n++
		if err := db.Update(func(tx *bolt.Tx) error {
			bk, err := tx.CreateBucketIfNotExists(bucket)
			if err != nil {
				return err
			}
			return bk.Put(idKey(n), value)
		}); err != nil {
			b.Fatal(err)
		}
	}
	c.commitsPerSec = float64(n) / time.Since(start).Seconds()
	f, err := os.Create(filepath.Join(filepath.Dir(db.Path()), "fsync.raw"))
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	page := make([]byte, 4096)
	n, start = 0, time.Now()
	for time.Since(start) < d {
		n++
		if _, err := f.WriteAt(page, int64(n%64)*4096); err != nil {
			b.Fatal(err)
		}
		if err := f.Sync(); err != nil {
			b.Fatal(err)
		}
	}
	c.fsyncsPerSec = float64(n) / time.Since(start).Seconds()
	return c
}

// BenchmarkPut measures Puts of one message (100-byte payload) from
// many goroutines at once, fsync on every commit, with and without a
// commit interval: ns/op is per Put, msgs/s the throughput, msgs/commit
// how many Puts shared a commit, commits/s the queue's, p50-ms and
// p99-ms a Put's latency. Around the run it measures the disk's ceiling
// (around): x-commit is msgs/s over bare bbolt commits/s (above 1: group
// commit carries more messages than the disk has commits), and fsyncs/s
// a bare os.File.Sync loop.
func BenchmarkPut(b *testing.B) {
	for _, every := range []time.Duration{0, 10 * time.Millisecond} {
		for _, putters := range []int{1, 16, 256} {
			b.Run(fmt.Sprintf("interval=%v/putters=%d", every, putters), func(b *testing.B) {
				q, err := Open(Options{Path: filepath.Join(b.TempDir(), "bridge.db"), MaxBytes: 1 << 30, CommitInterval: every})
				if err != nil {
					b.Fatal(err)
				}
				defer q.Close()
				ctx := context.Background()
				msgs := []gateway.Message{benchMessage}
				lat := make([][]time.Duration, putters)
				var next atomic.Int64
				commits := q.commits.Load()
				var elapsed time.Duration
				ceil := around(b, q.db, 250*time.Millisecond, func() {
					var wg sync.WaitGroup
					start := time.Now()
					for p := range putters {
						wg.Go(func() {
							for next.Add(1) <= int64(b.N) {
								t := time.Now()
								if err := q.Put(ctx, msgs); err != nil {
									b.Error(err)
									return
								}
								lat[p] = append(lat[p], time.Since(t))
							}
						})
					}
					wg.Wait()
					elapsed = time.Since(start)
				})
				commits = q.commits.Load() - commits
				all := slices.Concat(lat...)
				slices.Sort(all)
				rate := float64(b.N) / elapsed.Seconds()
				b.ReportMetric(rate, "msgs/s")
				b.ReportMetric(float64(b.N)/float64(commits), "msgs/commit")
				b.ReportMetric(float64(commits)/elapsed.Seconds(), "commits/s")
				b.ReportMetric(ms(all[len(all)/2]), "p50-ms")
				b.ReportMetric(ms(all[len(all)*99/100]), "p99-ms")
				b.ReportMetric(ceil.commitsPerSec, "ceiling-commits/s")
				b.ReportMetric(ceil.fsyncsPerSec, "fsyncs/s")
				b.ReportMetric(rate/ceil.commitsPerSec, "x-commit")
			})
		}
	}
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// BenchmarkReadAck measures the reader: Read of 100 messages after the
// last one read, then Ack of them (one commit, fsync), over a queue
// filled beforehand. ns/op is per message; x-commit is messages/s over
// the bare bbolt commits/s of the same run.
func BenchmarkReadAck(b *testing.B) {
	const page = 100
	q, err := Open(Options{Path: filepath.Join(b.TempDir(), "bridge.db"), MaxBytes: 1 << 34})
	if err != nil {
		b.Fatal(err)
	}
	defer q.Close()
	ctx := context.Background()
	batch := slices.Repeat([]gateway.Message{benchMessage}, 1000)
	for n := 0; n < b.N; n += len(batch) {
		if err := q.Put(ctx, batch); err != nil {
			b.Fatal(err)
		}
	}
	var elapsed time.Duration
	ceil := around(b, q.db, 250*time.Millisecond, func() {
		start := time.Now()
		var after uint64
		for read := 0; read < b.N; {
			got, err := q.Read(ctx, after, min(page, b.N-read))
			if err != nil {
				b.Fatal(err)
			}
			ids := make([]uint64, len(got))
			for i, m := range got {
				ids[i] = m.ID
			}
			if err := q.Ack(ids); err != nil {
				b.Fatal(err)
			}
			after = ids[len(ids)-1]
			read += len(got)
		}
		elapsed = time.Since(start)
	})
	rate := float64(b.N) / elapsed.Seconds()
	b.ReportMetric(rate, "msgs/s")
	b.ReportMetric(ceil.commitsPerSec, "ceiling-commits/s")
	b.ReportMetric(rate/ceil.commitsPerSec, "x-commit")
}
