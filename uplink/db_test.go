package uplink

import (
	"bytes"
	"errors"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/fleetgate/fleetgate/gateway"
	berrors "go.etcd.io/bbolt/errors"
)

// fillStateFile creates a state file at path with an outbox of n entries
// and returns a copy of it taken while it was open (as after kill -9).
func fillStateFile(t *testing.T, path string, n int) (copyPath string) {
	t.Helper()
	db, err := OpenDB(path, nil)
	if err != nil {
		t.Fatal(err)
	}
	ob, err := OpenOutbox(db, OutboxOptions{})
	if err != nil {
		t.Fatal(err)
	}
	items := make([]item, n)
	for i := range items {
		items[i] = item{key{gateway.DeviceID("dev-" + strings.Repeat("x", i%50)), gateway.SessionID("s/" + string(rune('a'+i%26)))}, slot{kind: gateway.Renew, at: at(i)}}
	}
	if _, _, err := ob.put(items); err != nil {
		t.Fatal(err)
	}
	copyPath = path + ".copy"
	copyFile(t, path, copyPath)
	if err := CloseDB(db); err != nil {
		t.Fatal(err)
	}
	return copyPath
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

func TestOpenDBMovesCorruptFileAside(t *testing.T) {
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
			db, err := OpenDB(target, slog.New(slog.NewTextHandler(&logs, nil)))
			if err != nil {
				t.Fatalf("OpenDB on a corrupt file: %v", err)
			}
			defer db.Close()
			if !strings.Contains(logs.String(), "level=ERROR") || !strings.Contains(logs.String(), "STATE FILE CORRUPT") {
				t.Fatalf("no loud log line: %s", logs.String())
			}
			aside, _ := filepath.Glob(target + ".corrupt-*")
			if len(aside) != 1 {
				t.Fatalf("moved-aside files %v, want one", aside)
			}
			ob, err := OpenOutbox(db, OutboxOptions{})
			if err != nil || ob.Len() != 0 {
				t.Fatalf("fresh file: outbox len %v, err %v", ob, err)
			}
		})
	}
}

func TestOpenDBChecksOnlyAfterUncleanStop(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state.db")
	copyPath := fillStateFile(t, path, 50)
	for _, c := range []struct {
		path    string
		checked bool
	}{{path, false}, {copyPath, true}} {
		var logs bytes.Buffer
		db, err := OpenDB(c.path, slog.New(slog.NewTextHandler(&logs, nil)))
		if err != nil {
			t.Fatal(err)
		}
		if got := strings.Contains(logs.String(), "checked after an unclean stop"); got != c.checked {
			t.Errorf("%s: checked %v, want %v (log %q)", filepath.Base(c.path), got, c.checked, logs.String())
		}
		ob, err := OpenOutbox(db, OutboxOptions{})
		if err != nil || ob.Len() != 50 {
			t.Fatalf("outbox after reopen: %v, %v; want 50 entries", ob, err)
		}
		if err := CloseDB(db); err != nil {
			t.Fatal(err)
		}
	}
}

func TestOpenDBLockedIsNotCorrupt(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state.db")
	db, err := OpenDB(path, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	_, err = OpenDB(path, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if !errors.Is(err, berrors.ErrTimeout) {
		t.Fatalf("second OpenDB = %v, want the lock timeout", err)
	}
	if aside, _ := filepath.Glob(path + ".corrupt-*"); len(aside) != 0 {
		t.Fatalf("a locked file was moved aside: %v", aside)
	}
}
