package statefile

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	bolt "go.etcd.io/bbolt"
	berrors "go.etcd.io/bbolt/errors"
)

var testBucket = []byte("test.entries")

// fillStateFile creates a state file at path with n entries and returns
// a copy of it taken while it was open (as after kill -9).
func fillStateFile(t *testing.T, path string, n int) (copyPath string) {
	t.Helper()
	db, err := Open(path, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := db.Update(func(tx *bolt.Tx) error {
		b, err := tx.CreateBucketIfNotExists(testBucket)
		if err != nil {
			return err
		}
		for i := range n {
			if err := b.Put(fmt.Appendf(nil, "key-%06d", i), bytes.Repeat([]byte{byte(i)}, 20+i%50)); err != nil {
				return err
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	copyPath = path + ".copy"
	copyFile(t, path, copyPath)
	if err := Close(db); err != nil {
		t.Fatal(err)
	}
	return copyPath
}

// entries counts the entries fillStateFile wrote.
func entries(t *testing.T, db *bolt.DB) int {
	t.Helper()
	n := 0
	_ = db.View(func(tx *bolt.Tx) error {
		if b := tx.Bucket(testBucket); b != nil {
			n = b.Stats().KeyN
		}
		return nil
	})
	return n
}

func copyFile(t *testing.T, from, to string) {
	t.Helper()
	b, err := os.ReadFile(from)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(to, b, 0o600); err != nil {
		t.Fatal(err)
	}
}

// garble overwrites the file from offset to its end with a fixed pattern.
func garble(t *testing.T, path string, offset int64) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		t.Fatal(err)
	}
	g := make([]byte, fi.Size()-offset)
	for i := range g {
		g[i] = byte(i*7 + 3)
	}
	if _, err := f.WriteAt(g, offset); err != nil {
		t.Fatal(err)
	}
}

func TestOpenMovesCorruptFileAside(t *testing.T) {
	cases := []struct {
		name   string
		offset int64 // garbage from here to the end
		clean  bool  // garble the cleanly closed file, not the copy taken while open
	}{
		{"data pages after unclean stop", 2 * 4096, false},
		{"meta pages", 0, true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "state.db")
			copyPath := fillStateFile(t, path, 300)
			target := copyPath
			if c.clean {
				target = path
			}
			garble(t, target, c.offset)
			var logs bytes.Buffer
			db, err := Open(target, slog.New(slog.NewTextHandler(&logs, nil)), nil)
			if err != nil {
				t.Fatalf("Open on a corrupt file: %v", err)
			}
			defer db.Close()
			if !strings.Contains(logs.String(), "level=ERROR") || !strings.Contains(logs.String(), "STATE FILE CORRUPT") {
				t.Fatalf("no loud log line: %s", logs.String())
			}
			aside, _ := filepath.Glob(target + ".corrupt-*")
			if len(aside) != 1 {
				t.Fatalf("moved-aside files %v, want one", aside)
			}
			if n := entries(t, db); n != 0 {
				t.Fatalf("fresh file holds %d entries", n)
			}
		})
	}
}

func TestOpenChecksOnlyAfterUncleanStop(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state.db")
	copyPath := fillStateFile(t, path, 50)
	for _, c := range []struct {
		path    string
		checked bool
	}{{path, false}, {copyPath, true}} {
		var logs bytes.Buffer
		db, err := Open(c.path, slog.New(slog.NewTextHandler(&logs, nil)), nil)
		if err != nil {
			t.Fatal(err)
		}
		if got := strings.Contains(logs.String(), "checked after an unclean stop"); got != c.checked {
			t.Errorf("%s: checked %v, want %v (log %q)", filepath.Base(c.path), got, c.checked, logs.String())
		}
		if n := entries(t, db); n != 50 {
			t.Fatalf("after reopen: %d entries, want 50", n)
		}
		if err := Close(db); err != nil {
			t.Fatal(err)
		}
	}
}

func TestOpenLockedIsNotCorrupt(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state.db")
	db, err := Open(path, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	_, err = Open(path, slog.New(slog.NewTextHandler(io.Discard, nil)), nil)
	if !errors.Is(err, berrors.ErrTimeout) {
		t.Fatalf("second Open = %v, want the lock timeout", err)
	}
	if aside, _ := filepath.Glob(path + ".corrupt-*"); len(aside) != 0 {
		t.Fatalf("a locked file was moved aside: %v", aside)
	}
}

func formatOf(t *testing.T, db *bolt.DB) uint64 {
	t.Helper()
	var v uint64
	if err := db.View(func(tx *bolt.Tx) (err error) { v, err = Format(tx); return err }); err != nil {
		t.Fatal(err)
	}
	return v
}

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

// step is a test migration to format to that creates a bucket named after
// it, records that it ran, and fails when told to.
func step(ran *[]uint64, to uint64, fail bool) Migration {
	return Migration{To: to, What: "test", Run: func(tx *bolt.Tx) error {
		*ran = append(*ran, to)
		if _, err := tx.CreateBucket([]byte{byte('0' + to)}); err != nil {
			return err
		}
		if fail {
			return errors.New("boom")
		}
		return nil
	}}
}

// A file of a newer format is refused with a clear error and left byte
// for byte as it was, whether it was closed cleanly or not (an unclean
// file must not be "checked", marked or moved aside as corrupt).
func TestNewerFormatRefusedUnchanged(t *testing.T) {
	var ran []uint64
	list := []Migration{step(&ran, 2, false)}
	for _, clean := range []bool{true, false} {
		dir := t.TempDir()
		path := filepath.Join(dir, "fleetgate.db")
		if clean {
			fillStateFile(t, path, 10)
		} else {
			path = fillStateFile(t, path, 10) // the copy taken while open
		}
		setFormat(t, path, Version(list)+1)
		before, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		db, err := Open(path, nil, list)
		if err == nil {
			db.Close()
			t.Fatalf("clean=%v: a file of format %d was opened", clean, Version(list)+1)
		}
		if !errors.Is(err, ErrNewerFormat) || !strings.Contains(err.Error(), fmt.Sprintf("format version %d, this binary reads up to %d", Version(list)+1, Version(list))) {
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
	if len(ran) != 0 {
		t.Fatalf("migrations ran on a refused file: %v", ran)
	}
}

// Migrations run in order, once, and atomically: one that fails leaves
// the file as it was, earlier migrations of the same run included.
func TestMigrationsAtomicAndOrdered(t *testing.T) {
	path := filepath.Join(t.TempDir(), "fleetgate.db")
	db, err := bolt.Open(path, 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	var ran []uint64
	err = db.Update(func(tx *bolt.Tx) error {
		_, err := migrate(tx, []Migration{step(&ran, 2, false), step(&ran, 3, true)}, false)
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
	list := []Migration{step(&ran, 2, false), step(&ran, 3, false)}
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

// A new file is stamped with the current format, without migrating.
func TestNewStateFileStamped(t *testing.T) {
	var ran []uint64
	list := []Migration{step(&ran, 2, false)}
	db, err := Open(filepath.Join(t.TempDir(), "new.db"), nil, list)
	if err != nil {
		t.Fatal(err)
	}
	defer Close(db)
	if v := formatOf(t, db); v != Version(list) || len(ran) != 0 {
		t.Fatalf("new file has format %d after migrations %v, want %d and none run", v, ran, Version(list))
	}
}

// A list that is not numbered 2, 3, ... is refused before the file is
// touched.
func TestOpenRefusesMisnumberedMigrations(t *testing.T) {
	var ran []uint64
	path := filepath.Join(t.TempDir(), "new.db")
	if _, err := Open(path, nil, []Migration{step(&ran, 3, false)}); err == nil || !strings.Contains(err.Error(), "want 2") {
		t.Fatalf("Open with a list starting at 3: %v", err)
	}
	if _, err := os.Stat(path); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the file was created: %v", err)
	}
}
