package embedded

import (
	"context"
	"log/slog"
	"path/filepath"
	"slices"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/fleetgate/fleetgate/gateway"
	"github.com/fleetgate/fleetgate/gateway/clocktest"
	"github.com/fleetgate/fleetgate/internal/statefile"
)

// dropIndexes removes every shard's change index and session counts, as
// in a file a release before them (state file format 5) wrote.
func dropIndexes(t *testing.T, db *bolt.DB, shards int) {
	t.Helper()
	err := db.Update(func(tx *bolt.Tx) error {
		for n := range shards {
			root := tx.Bucket(shardBucket(n))
			if err := root.DeleteBucket(bucketChg); err != nil {
				return err
			}
			var keys [][]byte
			c := root.Cursor()
			for k, _ := c.Seek([]byte(keySessions)); k != nil && string(k[:min(len(k), len(keySessions))]) == keySessions; k, _ = c.Next() {
				keys = append(keys, append([]byte(nil), k...))
			}
			for _, k := range keys {
				if err := root.Delete(k); err != nil {
					return err
				}
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// byChange is the devices of List by last change, every page of 2.
func byChange(t *testing.T, s *Store) []gateway.DeviceID {
	t.Helper()
	var out []gateway.DeviceID
	q := gateway.ListQuery{Order: gateway.OrderChanged, Limit: 2}
	for range 100 {
		p, err := s.List(context.Background(), q)
		if err != nil {
			t.Fatalf("List: %v", err)
		}
		for _, d := range p.Devices {
			out = append(out, d.Device)
		}
		if p.Next == "" {
			return out
		}
		q.Cursor = p.Next
	}
	t.Fatal("List did not end")
	return nil
}

// TestIndexesOfAnOlderFile: a state file of format 5 (written by a
// release before the change index and the session counts) is migrated
// to format 6 when statefile.Open opens it: its records are indexed by
// last change and their sessions counted per gateway, and both move from
// then on; a file without them that the migration did not see (a bolt
// file opened without internal/statefile) is indexed by Open.
func TestIndexesOfAnOlderFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "fleetgate.db")
	// the formats before 6: the outbox's 2 (not this package's), then
	// this package's up to 5
	format5 := append([]statefile.Migration{{To: 2, What: "the outbox's", Run: func(*bolt.Tx) error { return nil }}}, Migrations[:3]...)
	all := append(format5[:1:1], Migrations...)
	if statefile.Version(format5) != 5 || statefile.Version(all) != 6 {
		t.Fatalf("formats %d and %d, want 5 and 6", statefile.Version(format5), statefile.Version(all))
	}
	db, err := statefile.Open(path, slog.New(slog.DiscardHandler), format5)
	if err != nil {
		t.Fatal(err)
	}
	f := &fixture{t: t, path: path, db: db, clk: clocktest.New(t0), opts: Options{Shards: 2}}
	f.opts.Now = f.clk.Now
	t.Cleanup(func() { f.db.Close() })
	f.s, err = Open(db, f.opts)
	if err != nil {
		t.Fatal(err)
	}
	a, b, c := deviceIn("old", 0, 2, 0), deviceIn("old", 1, 2, 0), deviceIn("old", 1, 2, 1)
	f.apply(0, batch("gw-a", 1, connect(a, "s1", 0), connect(a, "s2", 0)))
	f.clk.Advance(time.Second)
	f.apply(1, batch("gw-b", 1, connect(b, "s1", 0)))
	f.clk.Advance(time.Second)
	f.apply(1, batch("gw-b", 1, connect(c, "s1", 0)))
	f.clk.Advance(time.Second)
	f.apply(1, batch("gw-b", 1, leave(b, "s1", 0)))
	want := []gateway.DeviceID{b, c, a}
	if got := byChange(t, f.s); !slices.Equal(got, want) {
		t.Fatalf("by change %v, want %v", got, want)
	}
	dropIndexes(t, db, 2)
	if _, err := f.s.List(context.Background(), gateway.ListQuery{Order: gateway.OrderChanged}); err == nil {
		t.Fatal("List of shards without a change index: no error")
	}
	if err := statefile.Close(db); err != nil {
		t.Fatal(err)
	}

	db, err = statefile.Open(path, slog.New(slog.DiscardHandler), all)
	if err != nil {
		t.Fatalf("open with the migration to format 6: %v", err)
	}
	var format uint64
	if err := db.View(func(tx *bolt.Tx) (err error) { format, err = statefile.Format(tx); return err }); err != nil || format != 6 {
		t.Fatalf("format %d (%v) after the migration, want 6", format, err)
	}
	checkConsistent(t, db, 2, true)
	f.db = db
	f.s, err = Open(db, f.opts)
	if err != nil {
		t.Fatal(err)
	}
	if got := byChange(t, f.s); !slices.Equal(got, want) {
		t.Errorf("migrated: by change %v, want %v", got, want)
	}
	wantSessions(t, f.s, map[string]int64{"gw-a": 2, "gw-b": 1})
	f.clk.Advance(time.Second)
	f.apply(0, batch("gw-a", 1, leave(a, "s2", 0), leave(a, "s1", 0)))
	want = []gateway.DeviceID{a, b, c}
	if got := byChange(t, f.s); !slices.Equal(got, want) {
		t.Errorf("after a leave: by change %v, want %v", got, want)
	}
	wantSessions(t, f.s, map[string]int64{"gw-a": 0, "gw-b": 1})

	dropIndexes(t, db, 2)
	f.reopen()
	checkConsistent(t, f.db, 2, true)
	if got := byChange(t, f.s); !slices.Equal(got, want) {
		t.Errorf("reopened: by change %v, want %v", got, want)
	}
	wantSessions(t, f.s, map[string]int64{"gw-a": 0, "gw-b": 1})
}

// wantSessions checks each gateway's sessions in Gateways.
func wantSessions(t *testing.T, s *Store, want map[string]int64) {
	t.Helper()
	gws, err := s.Gateways(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]int64{}
	for _, g := range gws {
		got[g.ID] = g.Sessions
	}
	for id, n := range want {
		if got[id] != n {
			t.Errorf("gateway %s holds %d sessions, want %d (all: %v)", id, got[id], n, got)
		}
	}
}
