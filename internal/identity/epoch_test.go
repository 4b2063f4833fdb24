package identity

import (
	"path/filepath"
	"testing"

	bolt "go.etcd.io/bbolt"
)

func TestNextEpochSurvivesReopen(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state.db")
	for want := uint64(1); want <= 3; want++ {
		db, err := bolt.Open(path, 0o600, nil)
		if err != nil {
			t.Fatal(err)
		}
		got, err := NextEpoch(db)
		if err != nil {
			t.Fatal(err)
		}
		if got != want {
			t.Fatalf("start %d: epoch %d, want %d", want, got, want)
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
	if _, err := NextEpoch(db); err == nil {
		t.Fatal("NextEpoch accepted a 3-byte epoch")
	}
}
