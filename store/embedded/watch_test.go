package embedded_test

import (
	"log/slog"
	"path/filepath"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/fleetgate/fleetgate/gateway"
	"github.com/fleetgate/fleetgate/store/embedded"
	"github.com/fleetgate/fleetgate/store/storetest"
)

func TestWatchConformance(t *testing.T) {
	storetest.RunWatch(t, func(t *testing.T, shards int, maxLen int64, now func() time.Time) gateway.Store {
		t.Helper()
		db, err := bolt.Open(filepath.Join(t.TempDir(), "fleetgate.db"), 0o600, &bolt.Options{Timeout: time.Second, NoSync: true})
		if err != nil {
			t.Fatalf("open bbolt: %v", err)
		}
		t.Cleanup(func() { db.Close() })
		s, err := embedded.Open(db, embedded.Options{
			Shards: shards, EventsMaxLen: maxLen, Now: now,
			Logger: slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelWarn})),
		})
		if err != nil {
			t.Fatalf("embedded.Open: %v", err)
		}
		t.Cleanup(func() { s.Close() })
		return s
	})
}
