package embedded

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/fleetgate/fleetgate/gateway"
	"github.com/fleetgate/fleetgate/gateway/clocktest"
)

var t0 = time.Date(2026, 11, 29, 10, 0, 0, 0, time.UTC)

const lease = 90 * time.Second

// fixture is a store on a real bbolt file in the test's directory, on a
// manual clock.
type fixture struct {
	t    testing.TB
	path string
	db   *bolt.DB
	clk  *clocktest.Clock
	s    *Store
	opts Options
}

func newFixture(t testing.TB, o Options) *fixture {
	t.Helper()
	f := &fixture{t: t, path: filepath.Join(t.TempDir(), "gw.db"), clk: clocktest.New(t0), opts: o}
	if f.opts.Now == nil {
		f.opts.Now = f.clk.Now
	}
	f.open()
	t.Cleanup(func() {
		if f.db != nil {
			f.db.Close()
		}
	})
	return f
}

func openDB(t testing.TB, path string) *bolt.DB {
	t.Helper()
	db, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: 5 * time.Second})
	if err != nil {
		t.Fatalf("bolt open: %v", err)
	}
	return db
}

func (f *fixture) open() {
	f.t.Helper()
	f.db = openDB(f.t, f.path)
	s, err := Open(f.db, f.opts)
	if err != nil {
		f.t.Fatalf("Open: %v", err)
	}
	f.s = s
}

// reopen closes the store and the file and opens both again.
func (f *fixture) reopen() {
	f.t.Helper()
	if err := f.s.Close(); err != nil {
		f.t.Fatalf("Close: %v", err)
	}
	if err := f.db.Close(); err != nil {
		f.t.Fatalf("bolt close: %v", err)
	}
	f.open()
}

// deviceIn returns the i-th device name (prefix-i-j) that hashes to shard.
func deviceIn(prefix string, shard, shards, i int) gateway.DeviceID {
	for j, found := 0, 0; j < 1_000_000; j++ {
		d := gateway.DeviceID(fmt.Sprintf("%s-%d", prefix, j))
		if gateway.ShardOf(d, shards) != shard {
			continue
		}
		if found == i {
			return d
		}
		found++
	}
	panic("no device in shard")
}

func batch(gw string, epoch uint64, ws ...gateway.Write) gateway.Batch {
	return gateway.Batch{Gateway: gw, Epoch: epoch, Lease: lease, Writes: ws}
}

func connect(d gateway.DeviceID, s gateway.SessionID, age time.Duration) gateway.Write {
	return gateway.Write{Device: d, Session: s, Kind: gateway.Connect, Age: age}
}

func renew(d gateway.DeviceID, s gateway.SessionID, age time.Duration) gateway.Write {
	return gateway.Write{Device: d, Session: s, Kind: gateway.Renew, Age: age}
}

func leave(d gateway.DeviceID, s gateway.SessionID, age time.Duration) gateway.Write {
	return gateway.Write{Device: d, Session: s, Kind: gateway.Leave, Age: age}
}

func (f *fixture) apply(shard int, b gateway.Batch) []gateway.Event {
	f.t.Helper()
	res, err := f.s.Apply(context.Background(), shard, b)
	if err != nil {
		f.t.Fatalf("Apply: %v", err)
	}
	return res.Events
}

func (f *fixture) device(d gateway.DeviceID) gateway.DeviceInfo {
	f.t.Helper()
	info, err := f.s.Device(context.Background(), d)
	if err != nil {
		f.t.Fatalf("Device(%s): %v", d, err)
	}
	return info
}

// allEvents reads a shard's whole log in pages of 7 (to exercise paging).
func (f *fixture) allEvents(shard int) []gateway.Event {
	f.t.Helper()
	return readLog(f.t, f.s, shard)
}

func readLog(t testing.TB, s *Store, shard int) []gateway.Event {
	t.Helper()
	var all []gateway.Event
	after := ""
	for range 1_000_000 {
		page, err := s.Events(context.Background(), shard, after, 7)
		if err != nil {
			t.Fatalf("Events: %v", err)
		}
		all = append(all, page...)
		if len(page) < 7 {
			return all
		}
		after = page[len(page)-1].ID
	}
	t.Fatal("event log does not end")
	return nil
}

// firstVer is the ver of device d's first event in shard's log.
func (f *fixture) firstVer(shard int, d gateway.DeviceID) uint64 {
	f.t.Helper()
	for _, e := range f.allEvents(shard) {
		if e.Device == d {
			return e.Ver
		}
	}
	f.t.Fatalf("no event of %s in shard %d", d, shard)
	return 0
}

// wantEvent checks the fields of e that a test decides; n is the ordinal
// of the device's transition (1 for its first): its ver is the ver of
// the device's first event in the log (the store time it was written at)
// plus n - 1.
func (f *fixture) wantEvent(e gateway.Event, d gateway.DeviceID, st gateway.State, n uint64, r gateway.Reason) {
	f.t.Helper()
	ver := n
	for _, first := range f.allEvents(e.Shard) {
		if first.Device == d {
			if first.Ver != uint64(first.At.UnixMilli()) {
				f.t.Fatalf("first event %+v: ver is not the store time", first)
			}
			ver = first.Ver + n - 1
			break
		}
	}
	if e.Device != d || e.State != st || e.Ver != ver || e.Reason != r {
		f.t.Fatalf("event %+v, want device %s state %s ver %d reason %s", e, d, st, ver, r)
	}
}

// checkConsistent checks the invariants that tie a file together: a
// device is online iff it has a session; its deadline index entry exists
// iff it has a session, at the max of their deadlines; every index entry
// belongs to a record; the change index and the session counts match
// the records (checkIndexes); every device's events alternate online/offline
// starting online with ver +1 each (when the log is complete), and the
// last one matches the record's state and ver.
func checkConsistent(t testing.TB, db *bolt.DB, shards int, completeLog bool) {
	t.Helper()
	err := db.View(func(tx *bolt.Tx) error {
		var errs []error
		for err := range tx.Check() {
			errs = append(errs, err)
		}
		if len(errs) > 0 {
			return fmt.Errorf("bolt check: %w", errors.Join(errs...))
		}
		for n := range shards {
			sh, err := openShard(tx, n)
			if err != nil {
				return err
			}
			if err := checkShard(sh, completeLog); err != nil {
				return fmt.Errorf("shard %d: %w", n, err)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

func checkShard(sh shard, completeLog bool) error {
	records := map[gateway.DeviceID]record{}
	indexed := 0
	err := sh.dev.ForEach(func(k, v []byte) error {
		r, err := decodeRecord(v)
		if err != nil {
			return fmt.Errorf("device %s: %w", k, err)
		}
		d := gateway.DeviceID(k)
		records[d] = r
		if r.online != (len(r.sessions) > 0) {
			return fmt.Errorf("device %s: online %v with %d sessions", d, r.online, len(r.sessions))
		}
		if r.ver == 0 {
			return fmt.Errorf("device %s: record without an event", d)
		}
		if len(r.sessions) > 0 {
			indexed++
			if sh.exp.Get(expKey(r.deadline(), d)) == nil {
				return fmt.Errorf("device %s: deadline %d not indexed", d, r.deadline())
			}
		}
		return nil
	})
	if err != nil {
		return err
	}
	err = sh.exp.ForEach(func(k, _ []byte) error {
		ms, d, ok := parseExpKey(k)
		if r, found := records[d]; !ok || !found || r.deadline() != ms {
			return fmt.Errorf("index entry %x matches no record", k)
		}
		indexed--
		return nil
	})
	if err != nil {
		return err
	}
	if indexed != 0 {
		return fmt.Errorf("%d devices with sessions lack an index entry", indexed)
	}
	if err := checkIndexes(sh, records); err != nil {
		return err
	}
	t, err := decodeTail(sh.root.Get(keyTail))
	if err != nil {
		return err
	}
	type last struct {
		ver   uint64
		state gateway.State
	}
	seen := map[gateway.DeviceID]last{}
	var count uint64
	var prev []byte
	err = sh.ev.ForEach(func(k, v []byte) error {
		count++
		prev = k
		e, err := decodeEvent(sh.n, k, v)
		if err != nil {
			return err
		}
		l, ok := seen[e.Device]
		switch {
		case ok && l.state == gateway.Removed:
			// forgotten, then seen anew: online, above every ver it had
			if e.State != gateway.Online || e.Ver <= l.ver {
				return fmt.Errorf("device %s: %s ver %d after removed ver %d", e.Device, e.State, e.Ver, l.ver)
			}
		case ok && e.Ver != nextVer(l.ver, e.At.UnixMilli(), 0):
			return fmt.Errorf("device %s: ver %d after %d", e.Device, e.Ver, l.ver)
		case ok && e.State == l.state:
			return fmt.Errorf("device %s: %s twice (ver %d)", e.Device, e.State, e.Ver)
		case !ok && completeLog && (e.Ver != uint64(e.At.UnixMilli()) || e.State != gateway.Online):
			return fmt.Errorf("device %s: first event %s ver %d", e.Device, e.State, e.Ver)
		}
		seen[e.Device] = last{e.Ver, e.State}
		return nil
	})
	if err != nil {
		return err
	}
	if count != t.count {
		return fmt.Errorf("tail counts %d events, log holds %d", t.count, count)
	}
	if prev != nil && string(prev) != string(t.last.key()) {
		return fmt.Errorf("tail %s is not the last event %x", t.last, prev)
	}
	for d, r := range records {
		l, ok := seen[d]
		if !ok {
			if completeLog {
				return fmt.Errorf("device %s: record ver %d without events", d, r.ver)
			}
			continue
		}
		if l.ver != r.ver || (l.state == gateway.Online) != r.online {
			return fmt.Errorf("device %s: record ver %d online %v, last event ver %d %s", d, r.ver, r.online, l.ver, l.state)
		}
	}
	for d, l := range seen {
		if _, ok := records[d]; !ok && l.state != gateway.Removed {
			return fmt.Errorf("device %s: events without a record", d)
		}
	}
	return nil
}

// checkIndexes checks a shard's change index and session counts
// (index.go) against its records: one change index entry per record, of
// its state and since, and none else; each gateway's count the number of
// the records' sessions it holds.
func checkIndexes(sh shard, records map[gateway.DeviceID]record) error {
	n := 0
	err := sh.chg.ForEach(func(k, _ []byte) error {
		online, since, d, ok := parseChgKey(k)
		r, found := records[d]
		if !ok || !found || r.online != online || r.since != since {
			return fmt.Errorf("change index entry %x matches no record", k)
		}
		n++
		return nil
	})
	if err != nil {
		return err
	}
	if n != len(records) {
		return fmt.Errorf("%d records, %d change index entries", len(records), n)
	}
	want := map[string]int64{}
	for _, r := range records {
		for _, x := range r.sessions {
			want[x.gw]++
		}
	}
	c := sh.root.Cursor()
	for k, v := c.Seek([]byte(keySessions)); k != nil && bytes.HasPrefix(k, []byte(keySessions)); k, v = c.Next() {
		gw := string(k[len(keySessions):])
		got, err := decodeU64(v)
		if err != nil {
			return fmt.Errorf("sessions of %s: %w", gw, err)
		}
		if int64(got) != want[gw] {
			return fmt.Errorf("gateway %s: %d sessions counted, the records hold %d", gw, got, want[gw])
		}
		delete(want, gw)
	}
	for gw, n := range want {
		if n != 0 {
			return fmt.Errorf("gateway %s: no session count, the records hold %d", gw, n)
		}
	}
	return nil
}
