package diskq

import (
	"context"
	"errors"
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
								if _, err := q.Put(ctx, msgs); err != nil {
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
		if _, err := q.Put(ctx, batch); err != nil {
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

// BenchmarkPutAfterBacklog measures Puts from one goroutine into a
// queue that held a backlog of 200,000 messages (about 45 MB) and was
// emptied: the file keeps the backlog's pages as free pages, and
// bbolt's free list is written by every commit unless the file is
// opened with NoFreelistSync. x-fresh is the Put rate over that of a
// queue in a new file, timed in turns with it.
func BenchmarkPutAfterBacklog(b *testing.B) {
	for _, noFreelistSync := range []bool{false, true} {
		b.Run(fmt.Sprintf("NoFreelistSync=%v", noFreelistSync), func(b *testing.B) {
			open := func(name string) *Queue {
				db, err := bolt.Open(filepath.Join(b.TempDir(), name), 0o600, &bolt.Options{NoFreelistSync: noFreelistSync, FreelistType: bolt.FreelistMapType})
				if err != nil {
					b.Fatal(err)
				}
				b.Cleanup(func() { db.Close() })
				q, err := OpenDB(db, Options{MaxBytes: 1 << 30})
				if err != nil {
					b.Fatal(err)
				}
				b.Cleanup(func() { q.Close() })
				return q
			}
			drained, fresh := open("drained.db"), open("fresh.db")
			ctx := context.Background()
			batch := slices.Repeat([]gateway.Message{benchMessage}, 1000)
			for range 200 {
				if _, err := drained.Put(ctx, batch); err != nil {
					b.Fatal(err)
				}
			}
			var after uint64
			for {
				got, err := drained.Read(done(), after, 1000)
				if len(got) == 0 {
					break
				}
				if err != nil {
					b.Fatal(err)
				}
				ids := make([]uint64, len(got))
				for i, m := range got {
					ids[i] = m.ID
				}
				if err := drained.Ack(ids); err != nil {
					b.Fatal(err)
				}
				after = ids[len(ids)-1]
			}
			stats := drained.db.Stats()
			msgs := []gateway.Message{benchMessage}
			var drainedTime, freshTime time.Duration
			b.ResetTimer()
			for n := 0; n < b.N; n += 10 {
				k := min(10, b.N-n)
				start := time.Now()
				for range k {
					if _, err := drained.Put(ctx, msgs); err != nil {
						b.Fatal(err)
					}
				}
				drainedTime += time.Since(start)
				b.StopTimer()
				start = time.Now()
				for range k {
					if _, err := fresh.Put(ctx, msgs); err != nil {
						b.Fatal(err)
					}
				}
				freshTime += time.Since(start)
				b.StartTimer()
			}
			b.ReportMetric(float64(b.N)/drainedTime.Seconds(), "msgs/s")
			b.ReportMetric(float64(b.N)/freshTime.Seconds(), "fresh-msgs/s")
			b.ReportMetric(freshTime.Seconds()/drainedTime.Seconds(), "x-fresh")
			b.ReportMetric(float64(stats.FreePageN), "free-pages")
		})
	}
}

// BenchmarkOpen measures Open of a file holding 200,000 messages (about
// 45 MB) after a clean close, warm in the page cache: bbolt rebuilds
// its free list from the tree (Open's NoFreelistSync) and the queue
// reads its meta record, no scan of the messages. Its ceiling,
// freelist-synced, is bbolt's default open (which reads the free list
// written by the last commit) and OpenDB of a file of its own with the
// same messages.
func BenchmarkOpen(b *testing.B) {
	batch := slices.Repeat([]gateway.Message{benchMessage}, 1000)
	fill := func(q *Queue) {
		for range 200 {
			if _, err := q.Put(context.Background(), batch); err != nil {
				b.Fatal(err)
			}
		}
	}
	o := Options{Path: filepath.Join(b.TempDir(), "bridge.db"), MaxBytes: 1 << 30}
	synced := filepath.Join(b.TempDir(), "synced.db")
	openSynced := func() (*Queue, func() error) {
		db, err := bolt.Open(synced, 0o600, &bolt.Options{Timeout: LockTimeout})
		if err != nil {
			b.Fatal(err)
		}
		q, err := OpenDB(db, o)
		if err != nil {
			b.Fatal(err)
		}
		return q, func() error { return errors.Join(q.Close(), db.Close()) }
	}
	for _, c := range []struct {
		name string
		open func() (*Queue, func() error)
	}{
		{"Open", func() (*Queue, func() error) {
			q, err := Open(o)
			if err != nil {
				b.Fatal(err)
			}
			return q, q.Close
		}},
		{"freelist-synced", openSynced},
	} {
		b.Run(c.name, func(b *testing.B) {
			q, closeQ := c.open()
			if q.Stats().Messages == 0 {
				fill(q)
			}
			if err := closeQ(); err != nil {
				b.Fatal(err)
			}
			for b.Loop() {
				q, closeQ := c.open()
				b.StopTimer()
				if s := q.Stats(); s.Messages != 200_000 {
					b.Fatalf("opened %d messages", s.Messages)
				}
				if err := closeQ(); err != nil {
					b.Fatal(err)
				}
				b.StartTimer()
			}
		})
	}
}
