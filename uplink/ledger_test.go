package uplink

import (
	"bytes"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/fleetgate/fleetgate/gateway"
	"github.com/fleetgate/fleetgate/internal/redistest"
)

// heldDeadline never reports a device offline sooner than it could have
// been: a session live when recorded may have been renewed until the
// next record was due or the successor started, whichever came first.
func TestHeldDeadline(t *testing.T) {
	at := func(s float64) time.Time { return t0.Add(time.Duration(s * float64(time.Second))) }
	rec := func(seen, dl, recorded float64, staleBy time.Duration) ledgerRecord {
		return ledgerRecord{LastSeen: at(seen), Deadline: at(dl), RecordedAt: at(recorded), StaleBy: staleBy}
	}
	for _, c := range []struct {
		name   string
		r      ledgerRecord
		opened float64
		want   float64
	}{
		{"ran out before the record: as recorded", rec(0, 30, 40, 7*time.Second), 45, 30},
		{"live, successor started before the next record", rec(0, 30, 1, 7*time.Second), 5, 35},
		{"live, next record was due before the successor started", rec(0, 30, 1, 7*time.Second), 20, 38},
		{"live, a longer lease of its own", rec(10, 70, 12, 7*time.Second), 13, 73},
		{"recorded deadline already later than the estimate", rec(0, 30, 1, 0), 1, 31},
	} {
		if got := heldDeadline(c.r, at(c.opened)); !got.Equal(at(c.want)) {
			t.Errorf("%s: %v, want %v", c.name, got.Sub(t0), at(c.want).Sub(t0))
		}
	}
}

// Records read back as written, a later record of a session replacing
// an earlier one; a torn or damaged tail ends the reading there, and a
// file without the header is refused.
func TestLedgerFileRoundTrip(t *testing.T) {
	r1 := ledgerRecord{LastSeen: t0, Deadline: t0.Add(30 * time.Second), RecordedAt: t0.Add(time.Second), StaleBy: 7 * time.Second}
	r2 := r1
	r2.LastSeen, r2.Deadline = t0.Add(5*time.Second), t0.Add(35*time.Second)
	k1, k2 := key{"dev-1", "coap/default"}, key{"dev-2", "mqtt/x"}
	file := []byte(ledgerMagic + string(rune(ledgerFormat)))
	file = appendRecord(file, k1, r1)
	file = appendRecord(file, k2, r1)
	file = appendRecord(file, k1, r2)
	file = appendIncarnation(file, 3, "inc-3")
	read := func(b []byte) (map[key]ledgerRecord, bool, error) {
		c, torn, err := readLedger(bytes.NewReader(b))
		return c.sessions, torn, err
	}
	c, torn, err := readLedger(bytes.NewReader(file))
	got := c.sessions
	if err != nil || torn || len(got) != 2 || !got[k1].LastSeen.Equal(r2.LastSeen) || !got[k2].Deadline.Equal(r1.Deadline) || got[k2].StaleBy != r1.StaleBy ||
		len(c.incarnations) != 1 || c.incarnations[3] != "inc-3" || !slices.Equal(c.order, []key{k1, k2}) {
		t.Fatalf("read: %+v torn=%v %v", c, torn, err)
	}
	file = file[:len(file)-len(appendIncarnation(nil, 3, "inc-3"))]
	// a torn append: the last record cut short, or a byte of it flipped
	for _, bad := range [][]byte{file[:len(file)-3], append(slices.Clone(file[:len(file)-1]), file[len(file)-1]^1)} {
		got, torn, err := read(bad)
		if err != nil || !torn || len(got) != 2 || !got[k1].LastSeen.Equal(r1.LastSeen) {
			t.Errorf("torn tail: %+v torn=%v %v, want the first two records", got, torn, err)
		}
	}
	if _, _, err := read([]byte("not a ledger")); err == nil {
		t.Errorf("a file without the header was read")
	}
}

// FuzzLedgerFile: any bytes in the ledger's file (a damaged disk) are read
// without a panic, each record read being one that was whole.
func FuzzLedgerFile(f *testing.F) {
	rec := ledgerRecord{LastSeen: t0, Deadline: t0.Add(30 * time.Second), RecordedAt: t0, StaleBy: time.Second}
	f.Add(appendRecord([]byte(ledgerMagic+string(rune(ledgerFormat))), key{"d", "s"}, rec))
	f.Add([]byte(ledgerMagic + string(rune(ledgerFormat)) + "\x00\x01"))
	f.Add([]byte{})
	f.Add(appendIncarnation([]byte(ledgerMagic+string(rune(ledgerFormat))), 7, "abc"))
	f.Fuzz(func(t *testing.T, b []byte) {
		c, _, _ := readLedger(bytes.NewReader(b))
		for k, r := range c.sessions {
			if k.device == "" || r.Deadline.Before(r.LastSeen) || r.StaleBy < 0 {
				t.Fatalf("record read that was not whole: %v %+v", k, r)
			}
		}
		if len(c.order) != len(c.sessions) {
			t.Fatalf("%d sessions in order, %d read", len(c.order), len(c.sessions))
		}
	})
}

// A gateway crashes (its table gone with it) shortly after a device
// stopped, and the store then loses its state: the gateway's next process
// restores that device's session from the ledger its predecessor wrote,
// with the latest deadline it can have had, so the store knows the device
// again and its offline still comes. Without the ledger nobody knows it.
func TestRestoreAfterCrashFromTheLedger(t *testing.T) {
	srv, e, path, ledger := crashEnv(t)
	ctx := t.Context()
	// the accepted connect, written by the ledger loop's next turn
	if n, _, err := ledger.writeAdds(); n != 1 || err != nil {
		t.Fatalf("ledger adds written: %d %v, want 1", n, err)
	}
	// the process is killed 5 s later (no final rewrite); its successor
	// starts a second later with an empty table
	e.clock.Advance(6 * time.Second)
	next, damaged, err := OpenLedger(path, e.clock.Now(), restoreKeepLapsed)
	if err != nil || damaged || next.Inherited() != 1 {
		t.Fatalf("successor's ledger: %d inherited, damaged %v, %v; want 1", next.Inherited(), damaged, err)
	}
	succ := successor(t, e, next)
	if err := succ.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	if err := srv.Client(t).FlushAll(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	e.clock.Advance(2 * time.Second)
	if err := succ.Flush(ctx); err != nil { // the keep-alive meets the loss
		t.Fatal(err)
	}
	info, err := e.store.Device(ctx, "stopped")
	if err != nil || info.State != gateway.Online {
		t.Fatalf("after the loss: %+v %v, want online again", info, err)
	}
	// recorded at the flush (t0, lease 30 s), the ledger written then with
	// a period of 7.5 s, the successor at t0+6 s: renewed until t0+6 s at
	// the latest
	if want := t0.Add(36 * time.Second); !info.Deadline.Equal(want) {
		t.Errorf("restored deadline %v, want %v (the latest it can have had)", info.Deadline.Sub(t0), want.Sub(t0))
	}
}

// A rewrite holds the table's sessions that a restore would re-send (of
// which a write was accepted or handed to the uplink) and the held
// sessions still kept, as they were recorded; it drops the held ones past
// their keep time.
func TestLedgerRewrite(t *testing.T) {
	_, e, table := restoreEnv(t, nil)
	ctx := t.Context()
	// a predecessor's ledger: one session kept long, one about to go
	old := []heldSession{
		{view: gateway.SessionView{Device: "kept", Session: "s"}, keep: t0.Add(time.Hour),
			rec: ledgerRecord{LastSeen: t0.Add(-time.Minute), Deadline: t0.Add(-30 * time.Second), RecordedAt: t0.Add(-20 * time.Second), StaleBy: time.Second}},
		{view: gateway.SessionView{Device: "gone", Session: "s"}, keep: t0.Add(time.Second),
			rec: ledgerRecord{LastSeen: t0.Add(-time.Minute), Deadline: t0.Add(-30 * time.Second), RecordedAt: t0.Add(-20 * time.Second), StaleBy: time.Second}},
	}
	path := filepath.Join(t.TempDir(), LedgerFile)
	ledger, _, err := OpenLedger(path, t0, restoreKeepLapsed)
	if err != nil {
		t.Fatal(err)
	}
	ledger.add(nil, old)
	e.u.ledger = ledger
	if err := table.Observe(ctx, gateway.Evidence{Device: "live", Session: "s", Kind: gateway.Renew, ObservedAt: e.clock.Now()}); err != nil {
		t.Fatal(err)
	}
	if err := e.u.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	// observed and queued: handed to the uplink, so restored too
	if err := table.Observe(ctx, gateway.Evidence{Device: "queued", Session: "s", Kind: gateway.Renew, ObservedAt: e.clock.Now()}); err != nil {
		t.Fatal(err)
	}
	e.clock.Advance(2 * time.Second)
	if err := e.u.rewriteLedger(e.clock.Now()); err != nil {
		t.Fatal(err)
	}
	got, _, err := OpenLedger(path, e.clock.Now(), restoreKeepLapsed)
	if err != nil {
		t.Fatal(err)
	}
	held := map[gateway.DeviceID]gateway.SessionView{}
	for _, v := range got.heldAt(e.clock.Now()) {
		held[v.Device] = v
	}
	if len(held) != 3 || held["live"].Deadline.IsZero() || held["queued"].Deadline.IsZero() || !held["kept"].LastSeen.Equal(t0.Add(-time.Minute)) {
		t.Fatalf("ledger after the rewrite: %+v, want live, queued and kept (as recorded)", held)
	}
}

// The store loses its state after a gateway process restored on it for
// the last time and before that process calls again (it is killed): the
// store can report the loss to no one (Reset goes to a process that saw
// the old state). The next process finds the shard's incarnation changed
// from the one its predecessor's ledger names, and restores what its
// predecessor held there.
func TestRestoreAfterALossNoProcessSaw(t *testing.T) {
	srv, e, path, _ := crashEnv(t)
	ctx := t.Context()
	if err := e.u.rewriteLedger(e.clock.Now()); err != nil {
		t.Fatal(err)
	}
	// the loss, then the kill; the next process starts 2 s later
	if err := srv.Client(t).FlushAll(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	e.clock.Advance(2 * time.Second)
	next, _, err := OpenLedger(path, e.clock.Now(), restoreKeepLapsed)
	if err != nil {
		t.Fatal(err)
	}
	if n := len(next.Incarnations()); n != testShards {
		t.Fatalf("the ledger names %d shards' incarnations, want %d", n, testShards)
	}
	succ := successor(t, e, next)
	if err := succ.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	if info, err := e.store.Device(ctx, "stopped"); err != nil || info.State != gateway.Online {
		t.Fatalf("after the loss: %+v %v, want online again (restored by the next process)", info, err)
	}
	// and a third process, on the same state, restores nothing
	if inc := succ.restoredIncarnations(); len(inc) != testShards {
		t.Fatalf("restored on %d shards, want %d", len(inc), testShards)
	}
}

// Of the connects an outbox replay wrote, those observed before this
// process started (a predecessor's) are held; this process's own are its
// table's, which forgets those that leave (held, a goodbye would not end
// them, and a restore after a loss would bring them back).
func TestLedgerHoldsOnlyAPredecessorsReplays(t *testing.T) {
	_, e, _ := restoreEnv(t, nil)
	ledger, _, err := OpenLedger(filepath.Join(t.TempDir(), LedgerFile), e.clock.Now(), restoreKeepLapsed)
	if err != nil {
		t.Fatal(err)
	}
	e.u.ledger = ledger
	before, after := e.u.started.Add(-time.Second), e.u.started.Add(time.Second)
	tws := []timedWrite{
		{before, gateway.Write{Device: "theirs", Session: "s", Kind: gateway.Connect}},
		{after, gateway.Write{Device: "ours", Session: "s", Kind: gateway.Connect}},
		{before, gateway.Write{Device: "renewed", Session: "s", Kind: gateway.Renew}},
	}
	e.u.ledgerConnects(e.u.timing(), true, tws, after)
	held := ledger.heldAt(after)
	if len(held) != 1 || held[0].Device != "theirs" {
		t.Errorf("held %+v, want the predecessor's connect only", held)
	}
	if n, _, err := ledger.writeAdds(); n != 2 || err != nil {
		t.Errorf("appended %d connects (%v), want 2", n, err)
	}
}

// crashEnv is restoreEnv whose uplink keeps a ledger at path, with one
// device, "stopped", observed and flushed (its connect accepted).
func crashEnv(t *testing.T) (*redistest.Server, *env, string, *Ledger) {
	srv, e, table := restoreEnv(t, nil)
	path := filepath.Join(t.TempDir(), LedgerFile)
	ledger, _, err := OpenLedger(path, e.clock.Now(), restoreKeepLapsed)
	if err != nil {
		t.Fatal(err)
	}
	e.u.ledger = ledger
	if err := table.Observe(t.Context(), gateway.Evidence{Device: "stopped", Session: "coap/default", Kind: gateway.Renew, ObservedAt: e.clock.Now()}); err != nil {
		t.Fatal(err)
	}
	if err := e.u.Flush(t.Context()); err != nil {
		t.Fatal(err)
	}
	return srv, e, path, ledger
}

// successor is the gateway's next process on e's store and outbox: an
// empty table, a new epoch, the ledger next.
func successor(t *testing.T, e *env, next *Ledger) *Uplink {
	empty := gateway.NewTable(nil, gateway.TableOptions{Lease: 30 * time.Second, Clock: e.clock})
	return New(e.store, e.ob, Options{Gateway: "gw-test", Epoch: 2, Lease: 30 * time.Second, FlushInterval: time.Second,
		KeepAlive: time.Second, Sessions: empty.Restorable, Ledger: next, Clock: e.clock, Logger: testLogger(t)})
}

// A device that comes back to the gateway's next process under a new
// session is left to that session's evidence: its held session from the
// predecessor is not restored (lapsed, it would recreate a record the
// reap could end before the new connect, still queued, lands).
func TestRestoreLeavesABackDeviceToItsOwnEvidence(t *testing.T) {
	srv, e, path, ledger := crashEnv(t)
	ctx := t.Context()
	if _, _, err := ledger.writeAdds(); err != nil {
		t.Fatal(err)
	}
	e.clock.Advance(40 * time.Second) // the held session has run out
	next, _, err := OpenLedger(path, e.clock.Now(), restoreKeepLapsed)
	if err != nil || next.Inherited() != 1 {
		t.Fatalf("successor's ledger: %d inherited, %v", next.Inherited(), err)
	}
	var table *gateway.Table
	succ := New(e.store, e.ob, Options{Gateway: "gw-test", Epoch: 2, Lease: 30 * time.Second, FlushInterval: time.Second,
		KeepAlive: time.Second, Sessions: func(fn func(gateway.SessionView) bool) { table.Restorable(fn) }, Ledger: next,
		Clock: e.clock, Logger: testLogger(t)})
	table = gateway.NewTable(succ, gateway.TableOptions{Lease: 30 * time.Second, Clock: e.clock})
	if err := srv.Client(t).FlushAll(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	// back under a new session: its connect queued, not sent yet
	if err := table.Observe(ctx, gateway.Evidence{Device: "stopped", Session: "coap/new", Kind: gateway.Connect, ObservedAt: e.clock.Now()}); err != nil {
		t.Fatal(err)
	}
	succ.sendMu.Lock()
	succ.restoreShards(ctx, succ.timing(), []int{gateway.ShardOf("stopped", testShards)})
	succ.sendMu.Unlock()
	if info, err := e.store.Device(ctx, "stopped"); err == nil {
		t.Fatalf("after the restore: %+v; want no record until the new connect lands", info)
	}
	if err := succ.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	if info, err := e.store.Device(ctx, "stopped"); err != nil || info.State != gateway.Online || len(info.Sessions) != 1 || info.Sessions[0].ID != "coap/new" {
		t.Fatalf("after the connect: %+v %v; want online on its new session only", info, err)
	}
}
