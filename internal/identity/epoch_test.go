package identity

import (
	"path/filepath"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"
)

func TestNextEpochSurvivesReopen(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state.db")
	start := time.Unix(1_800_000_000, 0)
	for i := uint64(0); i < 3; i++ {
		want := uint64(start.Unix()) + i
		db, err := bolt.Open(path, 0o600, nil)
		if err != nil {
			t.Fatal(err)
		}
		// The clock stands still (or steps back): the epoch still rises.
		got, err := NextEpoch(db, start.Add(-time.Duration(i)*time.Hour))
		if err != nil {
			t.Fatal(err)
		}
		if got != want {
			t.Fatalf("start %d: epoch %d, want %d", i, got, want)
		}
		if err := db.Close(); err != nil {
			t.Fatal(err)
		}
	}
}

func TestNextEpochRejectsGarbage(t *testing.T) {
	db, err := bolt.Open(filepath.Join(t.TempDir(), "state.db"), 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if err := db.Update(func(tx *bolt.Tx) error {
		b, _ := tx.CreateBucketIfNotExists(bucket)
		return b.Put(key, []byte("xyz"))
	}); err != nil {
		t.Fatal(err)
	}
	if _, err := NextEpoch(db, time.Now()); err == nil {
		t.Fatal("NextEpoch accepted a 3-byte epoch")
	}
}

// A lost state file starts again from the clock, above every epoch the
// store has seen from earlier starts.
func TestNextEpochAfterLostFile(t *testing.T) {
	dir := t.TempDir()
	old, err := bolt.Open(filepath.Join(dir, "a.db"), 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer old.Close()
	t0 := time.Unix(1_800_000_000, 0)
	before, err := NextEpoch(old, t0)
	if err != nil {
		t.Fatal(err)
	}
	fresh, err := bolt.Open(filepath.Join(dir, "b.db"), 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer fresh.Close()
	after, err := NextEpoch(fresh, t0.Add(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if after <= before {
		t.Fatalf("epoch after losing the file %d, want > %d", after, before)
	}
}
