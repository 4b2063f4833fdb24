package embedded

import (
	"context"
	"testing"

	bolt "go.etcd.io/bbolt"

	"github.com/fleetgate/fleetgate/gateway"
	"github.com/fleetgate/fleetgate/internal/statefile"
)

// dropCounts removes every shard's counts, as in a file an older release
// wrote.
func (f *fixture) dropCounts() {
	f.t.Helper()
	err := f.db.Update(func(tx *bolt.Tx) error {
		for n := range f.opts.Shards {
			if err := tx.Bucket(shardBucket(n)).Delete(keyCounts); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		f.t.Fatal(err)
	}
}

func (f *fixture) wantCounts(what string, online, offline int64) {
	f.t.Helper()
	got, err := f.s.Counts(context.Background(), 0)
	if err != nil {
		f.t.Fatalf("%s: Counts: %v", what, err)
	}
	if want := (gateway.Counts{Online: online, Offline: offline}); got != want {
		f.t.Fatalf("%s: Counts = %+v, want %+v", what, got, want)
	}
}

// TestCountsOfAnOlderFile: a file without counts (written by a release
// before them) is counted by the state file migration to format 4, and
// by Open when the migration did not run; the counts move from then on.
func TestCountsOfAnOlderFile(t *testing.T) {
	f := newFixture(t, Options{Shards: 2})
	a, b, c := deviceIn("old", 0, 2, 0), deviceIn("old", 1, 2, 0), deviceIn("old", 1, 2, 1)
	f.apply(0, batch("gw-a", 1, connect(a, "s1", 0)))
	f.apply(1, batch("gw-a", 1, connect(b, "s1", 0), connect(c, "s1", 0)))
	f.apply(1, batch("gw-a", 1, leave(c, "s1", 0)))
	f.wantCounts("written", 2, 1)

	f.dropCounts()
	if _, err := f.s.Counts(context.Background(), 0); err == nil {
		t.Fatal("Counts of shards without counts: no error")
	}
	var migrate statefile.Migration
	for _, m := range Migrations {
		if m.To == 4 {
			migrate = m
		}
	}
	if migrate.Run == nil {
		t.Fatal("no migration to format 4")
	}
	if err := f.db.Update(migrate.Run); err != nil {
		t.Fatalf("migration: %v", err)
	}
	f.wantCounts("migrated", 2, 1)

	f.dropCounts()
	f.reopen()
	f.wantCounts("reopened", 2, 1)
	f.apply(1, batch("gw-a", 1, connect(c, "s2", 0)))
	f.wantCounts("after a connect", 3, 0)
}
