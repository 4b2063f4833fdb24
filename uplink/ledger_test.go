package uplink

import (
	"testing"
	"time"

	"github.com/fleetgate/fleetgate/gateway"
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

func TestLedgerRecordRoundTrip(t *testing.T) {
	r := ledgerRecord{LastSeen: t0, Deadline: t0.Add(30 * time.Second), RecordedAt: t0.Add(time.Second), StaleBy: 7 * time.Second}
	got, err := decodeLedgerRecord(r.encode())
	if err != nil || !got.LastSeen.Equal(r.LastSeen) || !got.Deadline.Equal(r.Deadline) || !got.RecordedAt.Equal(r.RecordedAt) || got.StaleBy != r.StaleBy {
		t.Fatalf("round trip: %+v %v, want %+v", got, err, r)
	}
	for _, b := range [][]byte{nil, {ledgerFormat}, append([]byte{2}, r.encode()[1:]...),
		(ledgerRecord{LastSeen: t0, Deadline: t0.Add(-time.Second)}).encode()} {
		if _, err := decodeLedgerRecord(b); err == nil {
			t.Errorf("decode %x: no error", b)
		}
	}
}

// FuzzLedgerRecord: any bytes in the ledger's bucket (a damaged state
// file) decode to an error or to a record that encodes to the same bytes.
func FuzzLedgerRecord(f *testing.F) {
	f.Add((ledgerRecord{LastSeen: t0, Deadline: t0.Add(30 * time.Second), RecordedAt: t0, StaleBy: time.Second}).encode())
	f.Add([]byte{ledgerFormat, 0xff})
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, b []byte) {
		r, err := decodeLedgerRecord(b)
		if err != nil {
			return
		}
		if string(r.encode()) != string(b) {
			t.Fatalf("%x decoded to %+v, which encodes to %x", b, r, r.encode())
		}
	})
}

// A gateway crashes (its table gone with it) shortly after a device
// stopped, and the store then loses its state: the gateway's next process
// restores that device's session from the ledger its predecessor wrote,
// with the latest deadline it can have had, so the store knows the device
// again and its offline still comes. Without the ledger nobody knows it.
func TestRestoreAfterCrashFromTheLedger(t *testing.T) {
	srv, e, table := restoreEnv(t, nil)
	ctx := t.Context()
	ledger, _, err := OpenLedger(e.db, e.clock.Now(), restoreKeepLapsed)
	if err != nil {
		t.Fatal(err)
	}
	e.u.ledger = ledger
	if err := table.Observe(ctx, gateway.Evidence{Device: "stopped", Session: "coap/default", Kind: gateway.Renew, ObservedAt: e.clock.Now()}); err != nil {
		t.Fatal(err)
	}
	if err := e.u.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	// the accepted connect, written by the ledger loop's next turn
	if n, _, err := ledger.writeAdds(); n != 1 || err != nil {
		t.Fatalf("ledger adds written: %d %v, want 1", n, err)
	}
	// the process is killed 5 s later (no final rewrite); its successor
	// starts a second later with an empty table
	e.clock.Advance(6 * time.Second)
	next, n, err := OpenLedger(e.db, e.clock.Now(), restoreKeepLapsed)
	if err != nil || n != 0 || next.Inherited() != 1 {
		t.Fatalf("successor's ledger: %d inherited, %d unreadable, %v; want 1, 0", next.Inherited(), n, err)
	}
	empty := gateway.NewTable(nil, gateway.TableOptions{Lease: 30 * time.Second, Clock: e.clock})
	succ := New(e.store, e.ob, Options{Gateway: "gw-test", Epoch: 2, Lease: 30 * time.Second, FlushInterval: time.Second,
		KeepAlive: time.Second, Sessions: empty.Restorable, Ledger: next, Clock: e.clock, Logger: testLogger(t)})
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
	ledger, _, err := OpenLedger(e.db, t0, restoreKeepLapsed)
	if err != nil {
		t.Fatal(err)
	}
	ledger.add(old, true)
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
	got, _, err := OpenLedger(e.db, e.clock.Now(), restoreKeepLapsed)
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
