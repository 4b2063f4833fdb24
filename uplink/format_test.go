package uplink

import (
	"compress/gzip"
	"context"
	"io"
	"os"
	"path/filepath"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/fleetgate/fleetgate/gateway"
	"github.com/fleetgate/fleetgate/gateway/clocktest"
	"github.com/fleetgate/fleetgate/internal/identity"
	"github.com/fleetgate/fleetgate/internal/statefile"
	"github.com/fleetgate/fleetgate/store/embedded"
)

// The state file format this release writes: a change to the outbox's
// records needs a migration, and the format number follows the list.
func TestStateFileFormat(t *testing.T) {
	if v := statefile.Version(Migrations); v != 2 {
		t.Fatalf("state file format %d, want 2 (a new migration changes this test)", v)
	}
}

// unpackV1 writes testdata/state-v1.db.gz (a file of the release before
// format versions) to dir and returns its path.
func unpackV1(t *testing.T, dir string) string {
	t.Helper()
	f, err := os.Open(filepath.Join("testdata", "state-v1.db.gz"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	zr, err := gzip.NewReader(f)
	if err != nil {
		t.Fatal(err)
	}
	b, err := io.ReadAll(zr)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "fleetgate.db")
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

func formatOf(t *testing.T, db *bolt.DB) uint64 {
	t.Helper()
	var v uint64
	if err := db.View(func(tx *bolt.Tx) (err error) { v, err = statefile.Format(tx); return err }); err != nil {
		t.Fatal(err)
	}
	return v
}

// A state file of the previous release, holding an outbox, is opened by
// this one (migrated to statefile.Version(Migrations)) and its outbox replayed into the
// store: an upgrade in the middle of an uplink outage loses nothing.
func TestStateFileV1OutboxReplayed(t *testing.T) {
	path := unpackV1(t, t.TempDir())
	db, err := statefile.Open(path, testLogger(t), Migrations)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	if v := formatOf(t, db); v != statefile.Version(Migrations) {
		t.Fatalf("format %d after open, want %d", v, statefile.Version(Migrations))
	}
	epoch, err := identity.NextEpoch(db, t0)
	if err != nil || epoch != uint64(t0.Unix())+1 {
		t.Fatalf("epoch %d (%v), want the old file's epoch + 1 = %d", epoch, err, t0.Unix()+1)
	}
	clock := clocktest.New(t0.Add(30 * time.Second)) // inside the 90 s lease of every entry
	store, err := embedded.Open(db, embedded.Options{Shards: testShards, Now: clock.Now})
	if err != nil {
		t.Fatal(err)
	}
	ob, err := OpenOutbox(db, OutboxOptions{Shards: testShards, Logger: testLogger(t), Clock: clock})
	if err != nil {
		t.Fatal(err)
	}
	if ob.Len() != 20 {
		t.Fatalf("outbox of the old file has %d entries, want 20", ob.Len())
	}
	e := &env{t: t, clock: clock, db: db, ob: ob, store: &countingStore{Store: store}}
	e.u = New(e.store, ob, Options{Gateway: "gw-old", Epoch: epoch, Lease: 90 * time.Second, Clock: clock, Logger: testLogger(t)})
	e.run()
	waitFor(t, "the old outbox replayed", 10*time.Second, nil, func() bool { return ob.Len() == 0 })
	online := map[gateway.DeviceID]bool{}
	for _, ev := range allEvents(t, store) {
		if ev.State == gateway.Online {
			online[ev.Device] = true
		}
	}
	if len(online) != 20 {
		t.Fatalf("%d devices online after the replay, want 20: %v", len(online), online)
	}
	for _, d := range []gateway.DeviceID{"dev-00", "dev-19"} {
		if _, err := store.Device(context.Background(), d); err != nil {
			t.Errorf("device %s: %v", d, err)
		}
	}
}

// setFormat writes version v into the state file at path directly.
