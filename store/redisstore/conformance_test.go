package redisstore

import (
	"log/slog"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/fleetgate/fleetgate/gateway"
	"github.com/fleetgate/fleetgate/store/storetest"
)

// TestConformance runs the store conformance suite and its properties
// against the shared standalone server and the shared 3-master cluster;
// every store the suite opens gets its own key prefix.
func TestConformance(t *testing.T) {
	forBackends(t, func(t *testing.T, c redis.UniversalClient) {
		open := conformanceOpener(c)
		t.Run("Run", func(t *testing.T) { storetest.Run(t, open) })
		t.Run("Properties", func(t *testing.T) { storetest.RunProperties(t, open) })
		t.Run("Coverage", func(t *testing.T) { storetest.RunCoverage(t, graceOpener(c)) })
	})
}

func conformanceOpener(c redis.UniversalClient) storetest.Opener {
	open := graceOpener(c)
	return func(t *testing.T, shards int, now func() time.Time) gateway.Store {
		t.Helper()
		return open(t, shards, now, 0)
	}
}

func graceOpener(c redis.UniversalClient) storetest.GraceOpener {
	return func(t *testing.T, shards int, now func() time.Time, grace time.Duration) gateway.Store {
		t.Helper()
		s, err := Open(t.Context(), c, Options{
			Prefix:       uniquePrefix(),
			Shards:       shards,
			EventsMaxLen: 100_000,
			Now:          now,
			Logger:       slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelWarn})),

			GatewayGrace:   grace,
			GatewayRecheck: storetest.CoverRecheck,
			GatewayHorizon: storetest.CoverHorizon,
			GatewaySilence: storetest.CoverSilence,
		})
		if err != nil {
			t.Fatalf("redisstore.Open: %v", err)
		}
		t.Cleanup(func() {
			if err := s.Close(); err != nil {
				t.Errorf("close store: %v", err)
			}
		})
		return inspected{s, c}
	}
}
