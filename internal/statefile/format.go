package statefile

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"

	bolt "go.etcd.io/bbolt"
)

// The state file's format version: one 8-byte big-endian number in the
// bucket "state.format", key "version". A file without it is format 1,
// the format of every release before versions were recorded.
//
// A newer binary migrates an older file in place when Open opens it:
// every migration from the file's version up to Version runs in one
// bbolt write transaction together with the new version number, so a
// crash or a failed migration leaves the file exactly as it was. An older
// binary refuses a file of a newer version (ErrNewerFormat) before it
// writes anything to it: it reads the version in a read-only open first.
var (
	bucketFormat = []byte("state.format")
	keyVersion   = []byte("version")
)

// Migration turns a state file of format To-1 into format To, inside the
// write transaction it is given. It must not commit, and must leave every
// bucket it does not own alone. The owner of a bucket (the outbox, the
// epoch, the embedded store) writes its migrations; the binary passes the
// whole list, oldest first, to Open: list[i].To == i+2.
type Migration struct {
	To   uint64
	What string
	Run  func(tx *bolt.Tx) error
}

// Version is the state file format a binary with these migrations writes
// and the newest it reads: 1 + len(migrations).
func Version(migrations []Migration) uint64 { return uint64(1 + len(migrations)) }

// checkList refuses a migration list that is not numbered 2, 3, ...
func checkList(list []Migration) error {
	for i, m := range list {
		if m.To != uint64(i+2) || m.Run == nil {
			return fmt.Errorf("statefile: migration %d (%s) goes to format %d, want %d", i, m.What, m.To, i+2)
		}
	}
	return nil
}

// ErrNewerFormat is returned by Open for a state file written by a
// newer release than this binary; the file is left untouched.
var ErrNewerFormat = errors.New("state file written by a newer fleetgate release")

// Format returns the format version recorded in tx (1 when none is).
func Format(tx *bolt.Tx) (uint64, error) {
	b := tx.Bucket(bucketFormat)
	if b == nil {
		return 1, nil
	}
	v := b.Get(keyVersion)
	if len(v) != 8 {
		return 0, fmt.Errorf("%w: format version has %d bytes, want 8", errCorrupt, len(v))
	}
	return binary.BigEndian.Uint64(v), nil
}

// newerFormat reports the state file at path if it has a format newer
// than known, reading it through a read-only open (shared lock, no
// write). A file that does not exist, is empty or cannot be read as bbolt
// is not refused here: Open creates it or handles the damage.
func newerFormat(path string, known uint64) error {
	if fi, err := os.Stat(path); err != nil || fi.Size() == 0 {
		return nil
	}
	db, err := bolt.Open(path, 0o600, &bolt.Options{ReadOnly: true, Timeout: LockTimeout})
	if err != nil {
		return nil
	}
	defer db.Close()
	var v uint64
	if err := db.View(func(tx *bolt.Tx) (err error) { v, err = Format(tx); return err }); err != nil {
		return nil
	}
	return checkKnown(path, v, known)
}

func checkKnown(path string, v, known uint64) error {
	if v > known {
		return fmt.Errorf("statefile: %w: %s has format version %d, this binary reads up to %d; run the release that wrote it or a newer one (the file is left as it is)",
			ErrNewerFormat, path, v, known)
	}
	return nil
}

// migrate brings the file in tx to the last version of list, running the
// migrations it lacks in order, and records that version. fresh marks a
// new, empty file: it is stamped with the version without migrating.
// It refuses (changing nothing) a file newer than list knows.
func migrate(tx *bolt.Tx, list []Migration, fresh bool) (from uint64, err error) {
	target := uint64(1 + len(list))
	from = target
	if !fresh {
		if from, err = Format(tx); err != nil {
			return 0, err
		}
	}
	if err := checkKnown(tx.DB().Path(), from, target); err != nil {
		return from, err
	}
	for _, m := range list {
		if m.To <= from {
			continue
		}
		if err := m.Run(tx); err != nil {
			return from, fmt.Errorf("statefile: migrate state file to format %d (%s): %w", m.To, m.What, err)
		}
	}
	b, err := tx.CreateBucketIfNotExists(bucketFormat)
	if err != nil {
		return from, err
	}
	var buf [8]byte
	binary.BigEndian.PutUint64(buf[:], target)
	return from, b.Put(keyVersion, buf[:])
}
