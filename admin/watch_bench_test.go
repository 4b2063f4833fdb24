package admin_test

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	bolt "go.etcd.io/bbolt"

	"github.com/fleetgate/fleetgate/admin"
	"github.com/fleetgate/fleetgate/gateway"
	"github.com/fleetgate/fleetgate/internal/redistest"
	"github.com/fleetgate/fleetgate/store/embedded"
	"github.com/fleetgate/fleetgate/store/redisstore"
)

// BenchmarkWatch streams 200,000 events (4 shards) from the start of the
// logs to one JSON lines consumer through /v1/watch, and, as the
// ceiling, reads the same events straight from the store with
// ReadEvents (batches of 1000, shard after shard): events/s of each and
// their ratio. Run against Redis and the embedded store.
func BenchmarkWatch(b *testing.B) {
	const events = 200_000
	b.Run("redis", func(b *testing.B) {
		srv := redistest.Start(b)
		s, err := redisstore.Open(context.Background(), srv.Client(b), redisstore.Options{Prefix: "bench", Shards: shards, EventsMaxLen: events})
		if err != nil {
			b.Fatal(err)
		}
		benchWatch(b, s, events)
	})
	b.Run("embedded", func(b *testing.B) {
		db, err := bolt.Open(filepath.Join(b.TempDir(), "state.db"), 0o600, &bolt.Options{NoSync: true})
		if err != nil {
			b.Fatal(err)
		}
		defer db.Close()
		s, err := embedded.Open(db, embedded.Options{Shards: shards, EventsMaxLen: events})
		if err != nil {
			b.Fatal(err)
		}
		benchWatch(b, s, events)
	})
}

func benchWatch(b *testing.B, store gateway.Store, events int) {
	ctx := context.Background()
	devs := make([]gateway.DeviceID, events/2)
	for i := range devs {
		devs[i] = gateway.DeviceID(fmt.Sprintf("dev-%07d", i))
	}
	for i := 0; i < len(devs); i += 2000 {
		write(b, store, "gw", gateway.Connect, devs[i:min(i+2000, len(devs))]...)
		write(b, store, "gw", gateway.Leave, devs[i:min(i+2000, len(devs))]...)
	}
	srv, err := admin.Listen(admin.Options{Addr: "127.0.0.1:0", Store: store, Gatherer: prometheus.NewRegistry(),
		Status: func() admin.Status { return admin.Status{} }, Timing: func() (time.Duration, time.Duration) { return lease, suspect }})
	if err != nil {
		b.Fatal(err)
	}
	go srv.Serve()
	defer srv.Shutdown(ctx)
	c := admin.NewClient(srv.Addr().String())
	start := make(gateway.Cursor, shards)
	for i := range start {
		p, err := store.SnapshotShard(ctx, i, "", 0)
		if err != nil {
			b.Fatal(err)
		}
		start[i] = gateway.Position{Incarnation: p.At.Incarnation, ID: "0"}
	}
	errDone := errors.New("done")
	var watchTime, readTime time.Duration
	b.ResetTimer()
	for range b.N {
		n := 0
		t0 := time.Now()
		err := c.Watch(ctx, start.String(), 0, func(gateway.Envelope) error {
			if n++; n == events {
				return errDone
			}
			return nil
		})
		watchTime += time.Since(t0)
		if !errors.Is(err, errDone) {
			b.Fatalf("watch: %v after %d events", err, n)
		}
		m := 0
		t0 = time.Now()
		for shard := range shards {
			pos := start[shard]
			for {
				evs, err := store.ReadEvents(ctx, shard, pos, 1000, 0)
				if err != nil {
					b.Fatal(err)
				}
				if len(evs) == 0 {
					break
				}
				m += len(evs)
				pos.ID = evs[len(evs)-1].ID
			}
		}
		readTime += time.Since(t0)
		if m != events {
			b.Fatalf("read %d events, want %d", m, events)
		}
	}
	b.StopTimer()
	total := float64(events * b.N)
	b.ReportMetric(total/watchTime.Seconds(), "watch-events/s")
	b.ReportMetric(total/readTime.Seconds(), "store-events/s")
	b.ReportMetric(readTime.Seconds()/watchTime.Seconds(), "ratio")
}
