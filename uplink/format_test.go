package uplink

import (
	"bytes"
	"compress/gzip"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/fleetgate/fleetgate/gateway"
	"github.com/fleetgate/fleetgate/gateway/clocktest"
	"github.com/fleetgate/fleetgate/internal/identity"
	"github.com/fleetgate/fleetgate/uplink/embedded"
)

func TestFormatVersionFollowsMigrations(t *testing.T) {
	if FormatVersion != 1+len(migrations) {
		t.Fatalf("FormatVersion %d, want 1+len(migrations) = %d", FormatVersion, 1+len(migrations))
	}
	for i, m := range migrations {
		if m.to != uint64(i+2) {
			t.Errorf("migrations[%d] goes to format %d, want %d", i, m.to, i+2)
		}
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
	if err := db.View(func(tx *bolt.Tx) (err error) { v, err = readFormat(tx); return err }); err != nil {
		t.Fatal(err)
	}
	return v
}

// A state file of the previous release, holding an outbox, is opened by
// this one (migrated to FormatVersion) and its outbox replayed into the
// store: an upgrade in the middle of an uplink outage loses nothing.
func TestStateFileV1OutboxReplayed(t *testing.T) {
	path := unpackV1(t, t.TempDir())
	db, err := OpenDB(path, testLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	if v := formatOf(t, db); v != FormatVersion {
		t.Fatalf("format %d after open, want %d", v, FormatVersion)
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
	ob, err := OpenOutbox(db, OutboxOptions{Logger: testLogger(t), Clock: clock})
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
func setFormat(t *testing.T, path string, v uint64) {
	t.Helper()
	db, err := bolt.Open(path, 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if err := db.Update(func(tx *bolt.Tx) error {
		b, err := tx.CreateBucketIfNotExists(bucketFormat)
		if err != nil {
			return err
		}
		var buf [8]byte
		binary.BigEndian.PutUint64(buf[:], v)
		return b.Put(keyVersion, buf[:])
	}); err != nil {
		t.Fatal(err)
	}
}

// A file of a newer format is refused with a clear error and left byte
// for byte as it was, whether it was closed cleanly or not (an unclean
// file must not be "checked", marked or moved aside as corrupt).
func TestStateFileNewerFormatRefusedUnchanged(t *testing.T) {
	for _, clean := range []bool{true, false} {
		dir := t.TempDir()
		path := filepath.Join(dir, "fleetgate.db")
		if clean {
			fillStateFile(t, path, 10)
		} else {
			path = fillStateFile(t, path, 10) // the copy taken while open
		}
		setFormat(t, path, FormatVersion+1)
		before, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		db, err := OpenDB(path, testLogger(t))
		if err == nil {
			db.Close()
			t.Fatalf("clean=%v: a file of format %d was opened", clean, FormatVersion+1)
		}
		if !errors.Is(err, ErrNewerFormat) || !bytes.Contains([]byte(err.Error()), []byte(fmt.Sprintf("format version %d, this binary reads up to %d", FormatVersion+1, FormatVersion))) {
			t.Fatalf("clean=%v: error %q, want ErrNewerFormat naming both versions", clean, err)
		}
		after, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(before, after) {
			t.Fatalf("clean=%v: the refused file changed", clean)
		}
		if m, _ := filepath.Glob(path + ".corrupt-*"); len(m) > 0 {
			t.Fatalf("clean=%v: the refused file was moved aside: %v", clean, m)
		}
	}
}

// Migrations run in order, once, and atomically: one that fails leaves
// the file as it was, earlier migrations of the same run included.
func TestMigrationsAtomicAndOrdered(t *testing.T) {
	path := unpackV1(t, t.TempDir())
	db, err := bolt.Open(path, 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	var ran []uint64
	step := func(to uint64, fail bool) migration {
		return migration{to: to, what: "test", run: func(tx *bolt.Tx) error {
			ran = append(ran, to)
			if _, err := tx.CreateBucket([]byte{byte('0' + to)}); err != nil {
				return err
			}
			if fail {
				return errors.New("boom")
			}
			return nil
		}}
	}
	err = db.Update(func(tx *bolt.Tx) error {
		_, err := migrate(tx, []migration{step(2, false), step(3, true)}, false)
		return err
	})
	if err == nil || formatOf(t, db) != 1 {
		t.Fatalf("failed migration: err %v, format %d; want an error and format 1", err, formatOf(t, db))
	}
	_ = db.View(func(tx *bolt.Tx) error {
		if tx.Bucket([]byte("2")) != nil {
			t.Error("the first migration of a failed run was kept")
		}
		return nil
	})
	ran = nil
	list := []migration{step(2, false), step(3, false)}
	for range 2 {
		if err := db.Update(func(tx *bolt.Tx) error { _, err := migrate(tx, list, false); return err }); err != nil {
			t.Fatal(err)
		}
	}
	if formatOf(t, db) != 3 || len(ran) != 2 || ran[0] != 2 || ran[1] != 3 {
		t.Fatalf("format %d, migrations run %v; want format 3 after [2 3], each once", formatOf(t, db), ran)
	}
	// This binary's list is shorter: the migrated file is now refused.
	if err := db.Update(func(tx *bolt.Tx) error { _, err := migrate(tx, nil, false); return err }); !errors.Is(err, ErrNewerFormat) {
		t.Fatalf("format 3 under a binary of format 1: %v, want ErrNewerFormat", err)
	}
}

// A new file is stamped with the current format.
func TestNewStateFileStamped(t *testing.T) {
	db, err := OpenDB(filepath.Join(t.TempDir(), "new.db"), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer CloseDB(db)
	_ = db.View(func(tx *bolt.Tx) error {
		if tx.Bucket(bucketFormat) == nil {
			t.Error("new file has no format version recorded")
		}
		return nil
	})
	if v := formatOf(t, db); v != FormatVersion {
		t.Fatalf("new file has format %d, want %d", v, FormatVersion)
	}
}
