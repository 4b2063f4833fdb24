package embedded

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/fleetgate/fleetgate/gateway"
	"github.com/fleetgate/fleetgate/gateway/clocktest"
)

func TestConnectRenewLeave(t *testing.T) {
	f := newFixture(t, Options{Shards: 1})
	const d, s = gateway.DeviceID("dev-1"), gateway.SessionID("gw-a/1/1")

	evs := f.apply(0, batch("gw-a", 1, connect(d, s, 2*time.Second)))
	if len(evs) != 1 {
		t.Fatalf("connect: %d events, want 1", len(evs))
	}
	f.wantEvent(evs[0], d, gateway.Online, 1, gateway.ReasonConnect)
	if evs[0].Gateway != "gw-a" || evs[0].Session != s || !evs[0].At.Equal(t0) || evs[0].Shard != 0 {
		t.Fatalf("connect event %+v", evs[0])
	}
	info := f.device(d)
	wantDeadline := t0.Add(lease - 2*time.Second)
	if info.State != gateway.Online || !info.Deadline.Equal(wantDeadline) || info.Ver != uint64(t0.UnixMilli()) || !info.Since.Equal(t0) {
		t.Fatalf("after connect: %+v", info)
	}
	if len(info.Sessions) != 1 || info.Sessions[0].ID != s || info.Sessions[0].Gateway != "gw-a" || info.Sessions[0].Epoch != 1 {
		t.Fatalf("sessions %+v", info.Sessions)
	}

	f.clk.Advance(30 * time.Second)
	if evs := f.apply(0, batch("gw-a", 1, renew(d, s, 0))); len(evs) != 0 {
		t.Fatalf("renew of a live session wrote %+v", evs)
	}
	if got := f.device(d).Deadline; !got.Equal(t0.Add(30*time.Second + lease)) {
		t.Fatalf("renew: deadline %v", got)
	}
	// An older renewal never moves the deadline back.
	if f.apply(0, batch("gw-a", 1, renew(d, s, 20*time.Second))); !f.device(d).Deadline.Equal(t0.Add(30*time.Second + lease)) {
		t.Fatalf("older renew moved the deadline to %v", f.device(d).Deadline)
	}

	f.clk.Advance(time.Second)
	evs = f.apply(0, batch("gw-a", 1, leave(d, s, 0)))
	if len(evs) != 1 {
		t.Fatalf("leave: %d events", len(evs))
	}
	f.wantEvent(evs[0], d, gateway.Offline, 2, gateway.ReasonLeave)
	if !evs[0].Deadline.IsZero() {
		t.Fatalf("leave event carries a deadline: %+v", evs[0])
	}
	info = f.device(d)
	if info.State != gateway.Offline || !info.Deadline.IsZero() || len(info.Sessions) != 0 || info.Ver != uint64(t0.UnixMilli())+1 || !info.Since.Equal(t0.Add(31*time.Second)) {
		t.Fatalf("after leave: %+v", info)
	}
	// A duplicate leave finds no session.
	if evs := f.apply(0, batch("gw-a", 1, leave(d, s, 0))); len(evs) != 0 {
		t.Fatalf("second leave wrote %+v", evs)
	}
	// The record outlives the sessions: ver keeps counting.
	evs = f.apply(0, batch("gw-b", 4, renew(d, "coap/default", 0)))
	f.wantEvent(evs[0], d, gateway.Online, 3, gateway.ReasonRenew)
	if info := f.device(d); info.Gateway != "gw-b" || info.Session != "coap/default" {
		t.Fatalf("last writer %q %q", info.Gateway, info.Session)
	}
	checkConsistent(t, f.db, 1, true)
}

func TestTwoSessions(t *testing.T) {
	f := newFixture(t, Options{Shards: 1})
	const d = gateway.DeviceID("dev-2")
	f.apply(0, batch("gw-a", 1, connect(d, "a", 0)))
	f.clk.Advance(10 * time.Second)
	if evs := f.apply(0, batch("gw-a", 1, connect(d, "b", 0))); len(evs) != 0 {
		t.Fatalf("second session wrote %+v", evs)
	}
	if got := f.device(d).Deadline; !got.Equal(t0.Add(10*time.Second + lease)) {
		t.Fatalf("deadline %v, want the max over sessions", got)
	}
	// Leaving one session never removes another.
	if evs := f.apply(0, batch("gw-a", 1, leave(d, "b", 0))); len(evs) != 0 {
		t.Fatalf("leaving one of two sessions wrote %+v", evs)
	}
	info := f.device(d)
	if info.State != gateway.Online || len(info.Sessions) != 1 || info.Sessions[0].ID != "a" || !info.Deadline.Equal(t0.Add(lease)) {
		t.Fatalf("after leaving b: %+v", info)
	}
	checkConsistent(t, f.db, 1, true)
}

func TestLapsedEvidenceIgnored(t *testing.T) {
	f := newFixture(t, Options{Shards: 1})
	const d = gateway.DeviceID("dev-3")
	if evs := f.apply(0, batch("gw-a", 1, connect(d, "a", lease), renew(d, "b", lease+time.Hour))); len(evs) != 0 {
		t.Fatalf("lapsed evidence wrote %+v", evs)
	}
	if _, err := f.s.Device(context.Background(), d); !errors.Is(err, gateway.ErrNotFound) {
		t.Fatalf("Device after lapsed evidence: %v, want ErrNotFound", err)
	}
	f.apply(0, batch("gw-a", 1, connect(d, "a", 0)))
	if evs := f.apply(0, batch("gw-a", 1, renew(d, "b", lease))); len(evs) != 0 {
		t.Fatalf("lapsed renew wrote %+v", evs)
	}
	if info := f.device(d); len(info.Sessions) != 1 {
		t.Fatalf("lapsed renew created a session: %+v", info.Sessions)
	}
	checkConsistent(t, f.db, 1, true)
}

func TestLeaveIgnoredForNewerEvidence(t *testing.T) {
	f := newFixture(t, Options{Shards: 1})
	const d, s = gateway.DeviceID("dev-4"), gateway.SessionID("coap/x")
	f.apply(0, batch("gw-a", 1, connect(d, s, 0)))
	f.clk.Advance(5 * time.Second)
	// The leave was observed before the connect's evidence (age 10s).
	if evs := f.apply(0, batch("gw-a", 1, leave(d, s, 10*time.Second))); len(evs) != 0 {
		t.Fatalf("stale leave wrote %+v", evs)
	}
	if info := f.device(d); info.State != gateway.Online || len(info.Sessions) != 1 {
		t.Fatalf("stale leave removed the session: %+v", info)
	}
	// A leave as new as the evidence ends it.
	evs := f.apply(0, batch("gw-a", 1, leave(d, s, 5*time.Second)))
	if len(evs) != 1 {
		t.Fatalf("leave: %+v", evs)
	}
	f.wantEvent(evs[0], d, gateway.Offline, 2, gateway.ReasonLeave)
	checkConsistent(t, f.db, 1, true)
}

func TestApplyDropsExpiredFirst(t *testing.T) {
	f := newFixture(t, Options{Shards: 1})
	const d = gateway.DeviceID("dev-5")
	f.apply(0, batch("gw-a", 1, connect(d, "a", 0)))
	f.clk.Advance(lease + 3*time.Second)
	evs := f.apply(0, batch("gw-b", 2, renew(d, "b", time.Second)))
	if len(evs) != 2 {
		t.Fatalf("events %+v, want expired then online", evs)
	}
	f.wantEvent(evs[0], d, gateway.Offline, 2, gateway.ReasonExpired)
	if !evs[0].Deadline.Equal(t0.Add(lease)) || !evs[0].At.Equal(f.clk.Now()) || evs[0].Session != "a" || evs[0].Gateway != "gw-a" {
		t.Fatalf("expired event %+v", evs[0])
	}
	f.wantEvent(evs[1], d, gateway.Online, 3, gateway.ReasonRenew)
	info := f.device(d)
	if len(info.Sessions) != 1 || info.Sessions[0].ID != "b" || info.Ver != f.firstVer(evs[1].Shard, d)+2 {
		t.Fatalf("after: %+v", info)
	}
	// A leave of an expired session also reports the expiry only.
	f.clk.Advance(lease)
	evs = f.apply(0, batch("gw-b", 2, leave(d, "b", 0)))
	if len(evs) != 1 {
		t.Fatalf("leave of an expired session: %+v", evs)
	}
	f.wantEvent(evs[0], d, gateway.Offline, 4, gateway.ReasonExpired)
	checkConsistent(t, f.db, 1, true)
}

func TestReplay(t *testing.T) {
	f := newFixture(t, Options{Shards: 1})
	const d = gateway.DeviceID("dev-6")
	b := batch("gw-a", 1, connect(d, "a", time.Second), renew(d, "a", 0), connect(d, "b", 0))
	b.Replay = true
	evs := f.apply(0, b)
	if len(evs) != 1 {
		t.Fatalf("events %+v", evs)
	}
	f.wantEvent(evs[0], d, gateway.Online, 1, gateway.ReasonReplay)
	f.clk.Advance(time.Second)
	// Replaying any batch twice yields no new event.
	for range 2 {
		if evs := f.apply(0, b); len(evs) != 0 {
			t.Fatalf("replayed batch wrote %+v", evs)
		}
	}
	lb := batch("gw-a", 1, leave(d, "a", 0), leave(d, "b", 0))
	if evs := f.apply(0, lb); len(evs) != 1 {
		t.Fatalf("leave batch: %+v", evs)
	}
	if evs := f.apply(0, lb); len(evs) != 0 {
		t.Fatalf("replayed leave batch wrote %+v", evs)
	}
	checkConsistent(t, f.db, 1, true)
}

func TestFencing(t *testing.T) {
	const shards = 4
	f := newFixture(t, Options{Shards: shards})
	d0, d1 := deviceIn("f", 0, shards, 0), deviceIn("f", 1, shards, 0)
	f.apply(0, batch("gw-a", 5, connect(d0, "a", 0)))

	ctx := context.Background()
	// The stale batch is refused whole, on its shard and on any other.
	if _, err := f.s.Apply(ctx, 0, batch("gw-a", 4, connect(d0, "old", 0), leave(d0, "a", 0))); !errors.Is(err, gateway.ErrFenced) {
		t.Fatalf("stale epoch: %v, want ErrFenced", err)
	}
	if _, err := f.s.Apply(ctx, 1, batch("gw-a", 4, renew(d1, "old", 0))); !errors.Is(err, gateway.ErrFenced) {
		t.Fatalf("stale epoch on another shard: %v, want ErrFenced", err)
	}
	info := f.device(d0)
	if info.State != gateway.Online || len(info.Sessions) != 1 || info.Sessions[0].ID != "a" {
		t.Fatalf("fenced batch changed the device: %+v", info)
	}
	if _, err := f.s.Device(ctx, d1); !errors.Is(err, gateway.ErrNotFound) {
		t.Fatalf("fenced batch created a device: %v", err)
	}
	// The same epoch and a newer one pass; then the older is fenced.
	f.apply(0, batch("gw-a", 5, renew(d0, "a", 0)))
	f.apply(1, batch("gw-a", 6, renew(d1, "a", 0)))
	if _, err := f.s.Apply(ctx, 0, batch("gw-a", 5, renew(d0, "a", 0))); !errors.Is(err, gateway.ErrFenced) {
		t.Fatalf("epoch 5 after 6: %v", err)
	}
	// Another gateway has its own epoch.
	f.apply(0, batch("gw-b", 1, renew(d0, "b", 0)))
	checkConsistent(t, f.db, shards, true)
}

func TestShardChecks(t *testing.T) {
	const shards = 4
	f := newFixture(t, Options{Shards: shards})
	ctx := context.Background()
	d1 := deviceIn("s", 1, shards, 0)
	for _, n := range []int{-1, shards} {
		if _, err := f.s.Apply(ctx, n, batch("gw", 1)); !errors.Is(err, gateway.ErrBadShard) {
			t.Errorf("Apply shard %d: %v, want ErrBadShard", n, err)
		}
		if _, err := f.s.Reap(ctx, n, 1); !errors.Is(err, gateway.ErrBadShard) {
			t.Errorf("Reap shard %d: %v", n, err)
		}
		if _, err := f.s.Events(ctx, n, "", 1); !errors.Is(err, gateway.ErrBadShard) {
			t.Errorf("Events shard %d: %v", n, err)
		}
		if _, err := f.s.AcquireShard(ctx, n, "r", time.Second); !errors.Is(err, gateway.ErrBadShard) {
			t.Errorf("AcquireShard shard %d: %v", n, err)
		}
		if err := f.s.ReleaseShard(ctx, n, "r"); !errors.Is(err, gateway.ErrBadShard) {
			t.Errorf("ReleaseShard shard %d: %v", n, err)
		}
	}
	// One device of another shard refuses the whole batch.
	_, err := f.s.Apply(ctx, 0, batch("gw", 1, connect(deviceIn("s", 0, shards, 0), "a", 0), connect(d1, "a", 0)))
	if !errors.Is(err, gateway.ErrWrongShard) {
		t.Fatalf("wrong shard: %v", err)
	}
	if _, err := f.s.Device(ctx, deviceIn("s", 0, shards, 0)); !errors.Is(err, gateway.ErrNotFound) {
		t.Fatalf("refused batch wrote: %v", err)
	}
	if f.s.Shards() != shards {
		t.Fatalf("Shards %d", f.s.Shards())
	}
}

func TestReopen(t *testing.T) {
	f := newFixture(t, Options{Shards: 2})
	d := deviceIn("p", 0, 2, 0)
	f.apply(0, batch("gw-a", 3, connect(d, "a", 0)))
	f.apply(0, batch("gw-a", 3, leave(d, "a", 0)))
	f.apply(0, batch("gw-a", 3, connect(d, "a", 0)))
	f.reopen()
	info := f.device(d)
	if info.State != gateway.Online || info.Ver != uint64(t0.UnixMilli())+2 || len(info.Sessions) != 1 || !info.Deadline.Equal(t0.Add(lease)) {
		t.Fatalf("after reopen: %+v", info)
	}
	// Ver continues, the log continues, and the epoch is still fenced.
	f.clk.Advance(time.Second)
	evs := f.apply(0, batch("gw-a", 3, leave(d, "a", 0)))
	f.wantEvent(evs[0], d, gateway.Offline, 4, gateway.ReasonLeave)
	if _, err := f.s.Apply(context.Background(), 0, batch("gw-a", 2, connect(d, "a", 0))); !errors.Is(err, gateway.ErrFenced) {
		t.Fatalf("epoch after reopen: %v", err)
	}
	if got := f.allEvents(0); len(got) != 4 {
		t.Fatalf("log after reopen: %d events", len(got))
	}
	checkConsistent(t, f.db, 2, true)
}

func TestMetaMismatch(t *testing.T) {
	f := newFixture(t, Options{Shards: 4})
	for _, n := range []int{1, 8} {
		if _, err := Open(f.db, Options{Shards: n, Now: f.clk.Now}); !errors.Is(err, gateway.ErrShardMismatch) {
			t.Fatalf("open with %d shards: %v, want ErrShardMismatch", n, err)
		}
	}
	if err := f.db.Update(func(tx *bolt.Tx) error {
		return tx.Bucket(bucketMeta).Put(keySchema, u64(schema+1))
	}); err != nil {
		t.Fatal(err)
	}
	if _, err := Open(f.db, Options{Shards: 4}); !errors.Is(err, gateway.ErrShardMismatch) {
		t.Fatalf("open with another schema: %v, want ErrShardMismatch", err)
	}
	if _, err := Open(f.db, Options{Shards: 0}); err == nil {
		t.Fatal("open with 0 shards succeeded")
	}
}

// TestEventIDsClockStalls: IDs strictly increase while the clock stands
// still and after it goes backwards (a reopen with an earlier clock).
func TestEventIDsClockStalls(t *testing.T) {
	f := newFixture(t, Options{Shards: 1})
	d := gateway.DeviceID("dev-7")
	var ids []string
	for i := range 6 {
		w := connect(d, "a", 0)
		if i%2 == 1 {
			w = leave(d, "a", 0)
		}
		for _, e := range f.apply(0, batch("gw", 1, w)) {
			ids = append(ids, e.ID)
		}
	}
	ms := t0.UnixMilli()
	for i, id := range ids {
		if want := fmt.Sprintf("%d-%d", ms, i); id != want {
			t.Fatalf("id %d = %s, want %s", i, id, want)
		}
	}
	f.clk = clocktest.New(t0.Add(-time.Hour))
	f.opts.Now = f.clk.Now
	f.reopen()
	evs := f.apply(0, batch("gw", 1, connect(d, "a", 0)))
	if want := fmt.Sprintf("%d-6", ms); evs[0].ID != want {
		t.Fatalf("id after the clock went back: %s, want %s", evs[0].ID, want)
	}
	f.clk.Set(t0.Add(time.Millisecond))
	evs = f.apply(0, batch("gw", 1, leave(d, "a", 0)))
	if want := fmt.Sprintf("%d-0", ms+1); evs[0].ID != want {
		t.Fatalf("id after the clock moved on: %s, want %s", evs[0].ID, want)
	}
	log := f.allEvents(0)
	if len(log) != 8 {
		t.Fatalf("log has %d events", len(log))
	}
	for i := 1; i < len(log); i++ {
		a, _ := parseEventID(log[i-1].ID)
		b, _ := parseEventID(log[i].ID)
		if string(a.key()) >= string(b.key()) {
			t.Fatalf("ids %s then %s", log[i-1].ID, log[i].ID)
		}
	}
	checkConsistent(t, f.db, 1, true)
}

func TestNowAndClose(t *testing.T) {
	f := newFixture(t, Options{Shards: 1})
	ctx := context.Background()
	f.clk.Advance(1500 * time.Microsecond)
	now, err := f.s.Now(ctx)
	if err != nil || !now.Equal(t0.Add(time.Millisecond)) {
		t.Fatalf("Now = %v, %v; want millisecond precision", now, err)
	}
	if err := f.s.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := f.s.Apply(ctx, 0, batch("gw", 1, connect("d", "a", 0))); !errors.Is(err, gateway.ErrUnavailable) {
		t.Fatalf("Apply after Close: %v", err)
	}
	if _, err := f.s.Now(ctx); !errors.Is(err, gateway.ErrUnavailable) {
		t.Fatalf("Now after Close: %v", err)
	}
	// The file stays open: it is the gateway's.
	if err := f.db.View(func(*bolt.Tx) error { return nil }); err != nil {
		t.Fatalf("db after Close: %v", err)
	}
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	s, err := Open(f.db, f.opts)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Reap(cctx, 0, 1); !errors.Is(err, context.Canceled) {
		t.Fatalf("Reap with a cancelled context: %v", err)
	}
}

func TestCorruptRecords(t *testing.T) {
	r := record{online: true, ver: 7, since: t0.UnixMilli(), gw: "gw", session: "s",
		sessions: []session{{id: "s", deadline: t0.UnixMilli() + 5, gw: "gw", epoch: 3}, {id: "t", deadline: 1, gw: "g2", epoch: 1}}}
	b := encodeRecord(&r)
	got, err := decodeRecord(b)
	if err != nil || fmt.Sprint(got) != fmt.Sprint(r) {
		t.Fatalf("round trip: %+v, %v", got, err)
	}
	for i := range len(b) {
		if _, err := decodeRecord(b[:i]); !errors.Is(err, errCorrupt) {
			t.Fatalf("record cut at %d of %d decoded: %v", i, len(b), err)
		}
	}
	if _, err := decodeRecord(append(b, 0)); !errors.Is(err, errCorrupt) {
		t.Fatal("trailing byte accepted")
	}
	e := gateway.Event{Device: "d", State: gateway.Offline, Ver: 2, At: t0, Reason: gateway.ReasonExpired, Gateway: "gw", Session: "s", Deadline: t0.Add(-time.Second)}
	eb := encodeEvent(&e)
	key := eventID{ms: 5, seq: 1}.key()
	ge, err := decodeEvent(3, key, eb)
	e.ID, e.Shard = "5-1", 3
	if err != nil || !ge.At.Equal(e.At) || !ge.Deadline.Equal(e.Deadline) || ge.ID != e.ID || ge.Shard != 3 || ge.Reason != e.Reason || ge.Device != e.Device || ge.Ver != 2 {
		t.Fatalf("event round trip: %+v, %v", ge, err)
	}
	for i := range len(eb) {
		if _, err := decodeEvent(0, key, eb[:i]); !errors.Is(err, errCorrupt) {
			t.Fatalf("event cut at %d decoded: %v", i, err)
		}
	}
}
