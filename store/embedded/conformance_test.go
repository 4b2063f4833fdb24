package embedded_test

import (
	"context"
	"log/slog"
	"path/filepath"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/fleetgate/fleetgate/gateway"
	"github.com/fleetgate/fleetgate/store/embedded"
	"github.com/fleetgate/fleetgate/store/storetest"
)

// open gives every call its own bbolt file in the test's directory. The
// suite checks semantics, not durability (crash_test.go does), so the
// file skips fsync: the property runs open hundreds of stores.
func open(t *testing.T, shards int, now func() time.Time) gateway.Store {
	t.Helper()
	return openGrace(t, shards, now, 0)
}

// openGrace is open with a gateway grace (storetest.GraceOpener).
func openGrace(t *testing.T, shards int, now func() time.Time, grace time.Duration) gateway.Store {
	t.Helper()
	db, err := bolt.Open(filepath.Join(t.TempDir(), "fleetgate.db"), 0o600, &bolt.Options{Timeout: time.Second, NoSync: true})
	if err != nil {
		t.Fatalf("open bbolt: %v", err)
	}
	t.Cleanup(func() {
		if err := db.Close(); err != nil {
			t.Errorf("close bbolt: %v", err)
		}
	})
	s, err := embedded.Open(db, embedded.Options{
		Shards:       shards,
		EventsMaxLen: 100_000,
		Now:          now,
		Logger:       slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelWarn})),

		GatewayGrace:   grace,
		GatewayRecheck: storetest.CoverRecheck,
		GatewayHorizon: storetest.CoverHorizon,
	})
	if err != nil {
		t.Fatalf("embedded.Open: %v", err)
	}
	t.Cleanup(func() {
		if err := s.Close(); err != nil {
			t.Errorf("close store: %v", err)
		}
	})
	return inspected{s, db, shards}
}

// inspected is a store the suite checks inside too (storetest.Inspector):
// its change index and session counts against its records.
type inspected struct {
	gateway.Store
	db     *bolt.DB
	shards int
}

var _ storetest.Inspector = inspected{}

func (s inspected) Inspect(context.Context) error { return embedded.CheckIndexes(s.db, s.shards) }

func TestConformance(t *testing.T) { storetest.Run(t, open) }

func TestProperties(t *testing.T) { storetest.RunProperties(t, open) }

func TestCoverage(t *testing.T) { storetest.RunCoverage(t, openGrace) }
