// Package statefile opens the gateway's bbolt state file, which holds the
// uplink's outbox, the gateway epoch and the embedded store: one file, one
// lock, one format version. Open checks a file after an unclean stop and
// moves a damaged one aside, loudly, rather than crash-looping on it; it
// migrates an older format in place and refuses a newer one untouched
// (format.go). The owners of the buckets bring their own migrations.
package statefile

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"time"

	bolt "go.etcd.io/bbolt"
	berrors "go.etcd.io/bbolt/errors"
)

// LockTimeout is how long Open waits for the state file's lock, held
// by another running gateway with the same state_dir.
const LockTimeout = 2 * time.Second

// The state bucket holds the clean-close marker: "open" from Open until
// Close, so the next Open knows whether the last stop was clean.
var (
	bucketState = []byte("uplink.state")
	keyOpen     = []byte("open")
)

// errCorrupt marks a state file that failed its consistency check.
var errCorrupt = errors.New("state file corrupt")

// Open opens (or creates) the gateway's bbolt state file at path, running
// the migrations it lacks in place and refusing a file newer than the
// last of them with ErrNewerFormat without writing to it (format.go). It
// waits at most LockTimeout for the file lock. After an unclean stop (the
// file was not closed with CloseDB) it checks the whole file; a file that
// cannot be opened as a bbolt database or fails the check is renamed to
// path+".corrupt-<unix seconds>", logged at ERROR, and replaced by a fresh
// empty file, so that a damaged file costs its contents but never a crash
// loop.
func Open(path string, logger *slog.Logger, migrations []Migration) (*bolt.DB, error) {
	if err := checkList(migrations); err != nil {
		return nil, err
	}
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	db, err := openChecked(path, logger, migrations)
	if !errors.Is(err, errCorrupt) {
		return db, err
	}
	aside := fmt.Sprintf("%s.corrupt-%d", path, time.Now().Unix())
	if rerr := os.Rename(path, aside); rerr != nil {
		return nil, fmt.Errorf("statefile: move corrupt state file aside: %w (after: %w)", rerr, err)
	}
	logger.Error("STATE FILE CORRUPT: moved it aside and starting with an empty one; its outbox and gateway epoch are lost",
		"path", path, "moved_to", aside, "err", err)
	return openChecked(path, logger, migrations)
}

// Close marks the state file cleanly closed and closes it, so that the
// next Open skips the full check.
func Close(db *bolt.DB) error {
	err := db.Update(func(tx *bolt.Tx) error {
		b, err := tx.CreateBucketIfNotExists(bucketState)
		if err != nil {
			return err
		}
		return b.Put(keyOpen, []byte{0})
	})
	if cerr := db.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("statefile: close state file: %w", err)
	}
	return nil
}

// openChecked opens path, checks it unless it was closed cleanly, and
// marks it open. Failures that mean the file's content is damaged wrap
// errCorrupt; others (permissions, the lock held elsewhere) do not.
func openChecked(path string, logger *slog.Logger, migrations []Migration) (db *bolt.DB, err error) {
	defer func() {
		// bbolt panics on some damaged pages while loading the file. The
		// half-open handle is left alone (closing it could wait forever on
		// the panicked transaction); the file is renamed and reopened anew.
		if r := recover(); r != nil {
			db, err = nil, fmt.Errorf("%w: open %s: panic: %v", errCorrupt, path, r)
		}
	}()
	// A file of a newer format is refused before anything writes to it.
	version := Version(migrations)
	if err := newerFormat(path, version); err != nil {
		return nil, err
	}
	fi, statErr := os.Stat(path)
	fresh := statErr != nil || fi.Size() == 0
	db, err = bolt.Open(path, 0o600, &bolt.Options{Timeout: LockTimeout})
	switch {
	case errors.Is(err, berrors.ErrInvalid), errors.Is(err, berrors.ErrChecksum), errors.Is(err, berrors.ErrVersionMismatch):
		return nil, fmt.Errorf("%w: open %s: %w", errCorrupt, path, err)
	case err != nil:
		return nil, fmt.Errorf("statefile: open state file %s: %w", path, err)
	}
	clean := fresh
	if err := db.View(func(tx *bolt.Tx) error {
		if b := tx.Bucket(bucketState); b != nil {
			v := b.Get(keyOpen)
			clean = len(v) == 1 && v[0] == 0
		}
		return nil
	}); err != nil {
		db.Close()
		return nil, fmt.Errorf("%w: read %s: %w", errCorrupt, path, err)
	}
	if !clean {
		start := time.Now()
		if err := check(db); err != nil {
			db.Close()
			return nil, fmt.Errorf("%w: check %s: %w", errCorrupt, path, err)
		}
		logger.Info("state file checked after an unclean stop", "path", path, "took", time.Since(start))
	}
	// The format migrations and the open marker commit together.
	var from uint64
	if err := db.Update(func(tx *bolt.Tx) error {
		var merr error
		if from, merr = migrate(tx, migrations, fresh); merr != nil {
			return merr
		}
		b, err := tx.CreateBucketIfNotExists(bucketState)
		if err != nil {
			return err
		}
		return b.Put(keyOpen, []byte{1})
	}); err != nil {
		db.Close()
		return nil, fmt.Errorf("statefile: mark state file open: %w", err)
	}
	if from != version {
		logger.Info("state file migrated", "path", path, "from_format", from, "to_format", version)
	}
	return db, nil
}

// check runs bbolt's consistency check over the whole file and returns
// the first few problems it found.
func check(db *bolt.DB) error {
	var errs []error
	err := db.View(func(tx *bolt.Tx) error {
		for err := range tx.Check() {
			if len(errs) < 5 {
				errs = append(errs, err)
			}
		}
		return nil
	})
	return errors.Join(append(errs, err)...)
}
