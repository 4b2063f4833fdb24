package redisstore

import (
	"log/slog"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/fleetgate/fleetgate/gateway"
	"github.com/fleetgate/fleetgate/uplink/storetest"
)

// TestWatchConformance runs the event log cases of the suite against the
// shared standalone server and the shared cluster.
func TestWatchConformance(t *testing.T) {
	forBackends(t, func(t *testing.T, c redis.UniversalClient) {
		storetest.RunWatch(t, watchOpener(c))
	})
}

func watchOpener(c redis.UniversalClient) storetest.WatchOpener {
	return func(t *testing.T, shards int, maxLen int64, now func() time.Time) gateway.Store {
		t.Helper()
		s, err := Open(t.Context(), c, Options{
			Prefix:       uniquePrefix(),
			Shards:       shards,
			EventsMaxLen: maxLen,
			Now:          now,
			Logger:       slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelWarn})),
		})
		if err != nil {
			t.Fatalf("redisstore.Open: %v", err)
		}
		t.Cleanup(func() {
			if err := s.Close(); err != nil {
				t.Errorf("close store: %v", err)
			}
		})
		return s
	}
}
