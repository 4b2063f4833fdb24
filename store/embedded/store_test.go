package embedded

import (
	"context"
	"errors"
	"fmt"
	"strings"
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

func TestReap(t *testing.T) {
	const shards = 2
	f := newFixture(t, Options{Shards: shards})
	ctx := context.Background()
	var devs []gateway.DeviceID
	for i := range 5 {
		d := deviceIn("r", 1, shards, i)
		devs = append(devs, d)
		// Deadlines t0+lease+0s, +1s, ... +4s.
		f.apply(1, batch("gw-a", 1, connect(d, "a", 0)))
		f.clk.Advance(time.Second)
	}
	res, err := f.s.Reap(ctx, 1, 10)
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Offline) != 0 || res.More || !res.Next.Equal(t0.Add(lease)) {
		t.Fatalf("nothing due: %+v", res)
	}
	f.clk.Set(t0.Add(lease + 2*time.Second)) // the first three are due
	res, err = f.s.Reap(ctx, 1, 2)
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Offline) != 2 || !res.More || !res.Next.Equal(t0.Add(lease+2*time.Second)) {
		t.Fatalf("first reap: %+v", res)
	}
	for i, e := range res.Offline {
		f.wantEvent(e, devs[i], gateway.Offline, 2, gateway.ReasonExpired)
		if !e.Deadline.Equal(t0.Add(lease+time.Duration(i)*time.Second)) || !e.At.Equal(f.clk.Now()) {
			t.Fatalf("expired event %+v", e)
		}
	}
	res, err = f.s.Reap(ctx, 1, 2)
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Offline) != 1 || res.More || !res.Next.Equal(t0.Add(lease+3*time.Second)) {
		t.Fatalf("second reap: %+v", res)
	}
	if info := f.device(devs[2]); info.State != gateway.Offline || info.Ver != f.firstVer(1, devs[2])+1 || len(info.Sessions) != 0 {
		t.Fatalf("reaped device: %+v", info)
	}
	// A device that was reaped is not reported expired again by Apply.
	if evs := f.apply(1, batch("gw-a", 1, leave(devs[0], "a", 0))); len(evs) != 0 {
		t.Fatalf("leave after reap: %+v", evs)
	}
	f.clk.Advance(time.Hour)
	res, err = f.s.Reap(ctx, 1, 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Offline) != 0 || !res.More {
		t.Fatalf("limit 0: %+v", res)
	}
	if res, err = f.s.Reap(ctx, 1, 100); err != nil || len(res.Offline) != 2 || res.More || !res.Next.IsZero() {
		t.Fatalf("last reap: %+v, %v", res, err)
	}
	if res, err = f.s.Reap(ctx, 0, 100); err != nil || len(res.Offline) != 0 || !res.Next.IsZero() {
		t.Fatalf("empty shard: %+v, %v", res, err)
	}
	checkConsistent(t, f.db, shards, true)
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

func TestEventsPositions(t *testing.T) {
	f := newFixture(t, Options{Shards: 1})
	ctx := context.Background()
	for i := range 3 {
		f.apply(0, batch("gw", 1, connect(gateway.DeviceID(fmt.Sprintf("e-%d", i)), "a", 0)))
		f.clk.Advance(time.Millisecond)
	}
	all, err := f.s.Events(ctx, 0, "0", 0)
	if err != nil || len(all) != 3 {
		t.Fatalf("Events from 0: %d, %v", len(all), err)
	}
	for _, tc := range []struct {
		after string
		want  int
	}{
		{"", 3},
		{all[0].ID, 2},
		{all[2].ID, 0},
		{strings.TrimSuffix(all[1].ID, "-0"), 1}, // "<ms>" is "<ms>-0"
		{fmt.Sprint(t0.UnixMilli() - 1), 3},
	} {
		got, err := f.s.Events(ctx, 0, tc.after, 10)
		if err != nil || len(got) != tc.want {
			t.Errorf("after %q: %d events, %v; want %d", tc.after, len(got), err, tc.want)
		}
		if err == nil && len(got) > 0 && got[len(got)-1].ID != all[2].ID {
			t.Errorf("after %q: ends at %s", tc.after, got[len(got)-1].ID)
		}
	}
	if got, err := f.s.Events(ctx, 0, "", 2); err != nil || len(got) != 2 {
		t.Fatalf("limit 2: %d, %v", len(got), err)
	}
	for _, bad := range []string{"x", "1-", "-1", "1-2-3", "18446744073709551615-18446744073709551615"} {
		if _, err := f.s.Events(ctx, 0, bad, 1); err == nil {
			t.Errorf("after %q accepted", bad)
		}
	}
}

func TestEventsTrimmed(t *testing.T) {
	f := newFixture(t, Options{Shards: 1, EventsMaxLen: 5})
	d := gateway.DeviceID("dev-8")
	var last []gateway.Event
	for i := range 12 {
		w := connect(d, "a", 0)
		if i%2 == 1 {
			w = leave(d, "a", 0)
		}
		last = append(last, f.apply(0, batch("gw", 1, w))...)
		f.clk.Advance(time.Millisecond)
	}
	log := f.allEvents(0)
	if len(log) != 5 {
		t.Fatalf("log holds %d events, cap 5", len(log))
	}
	for i, e := range log {
		if e.ID != last[7+i].ID || e.Ver != last[0].Ver+uint64(7+i) {
			t.Fatalf("log[%d] = %s ver %d, want %s ver %d", i, e.ID, e.Ver, last[7+i].ID, last[0].Ver+uint64(7+i))
		}
	}
	checkConsistent(t, f.db, 1, false)

	// A lower cap on the next open is reached by the next write.
	f.opts.EventsMaxLen = 2
	f.reopen()
	f.apply(0, batch("gw", 1, connect(d, "a", 0)))
	if log := f.allEvents(0); len(log) != 2 || log[1].Ver != log[0].Ver+1 {
		t.Fatalf("after lowering the cap: %+v", log)
	}
	checkConsistent(t, f.db, 1, false)
}

func TestList(t *testing.T) {
	const shards = 3
	f := newFixture(t, Options{Shards: shards})
	ctx := context.Background()
	online := map[gateway.DeviceID]bool{}
	for i := range 20 {
		d := gateway.DeviceID(fmt.Sprintf("l-%02d", i))
		n := gateway.ShardOf(d, shards)
		f.apply(n, batch("gw", 1, connect(d, "a", 0)))
		online[d] = true
		if i%3 == 0 {
			f.apply(n, batch("gw", 1, leave(d, "a", 0)))
			online[d] = false
		}
	}
	for _, st := range []gateway.State{"", gateway.Online, gateway.Offline} {
		seen := map[gateway.DeviceID]bool{}
		q := gateway.ListQuery{State: st, Limit: 3}
		for range 100 {
			page, err := f.s.List(ctx, q)
			if err != nil {
				t.Fatalf("List %q: %v", st, err)
			}
			if len(page.Devices) > 3 {
				t.Fatalf("page of %d", len(page.Devices))
			}
			for _, info := range page.Devices {
				if seen[info.Device] {
					t.Fatalf("%s listed twice", info.Device)
				}
				seen[info.Device] = true
				if info.State != map[bool]gateway.State{true: gateway.Online, false: gateway.Offline}[online[info.Device]] {
					t.Fatalf("%s: %+v", info.Device, info)
				}
			}
			if page.Next == "" {
				break
			}
			q.Cursor = page.Next
		}
		want := 0
		for _, on := range online {
			if st == "" || (st == gateway.Online) == on {
				want++
			}
		}
		if len(seen) != want {
			t.Fatalf("filter %q listed %d devices, want %d", st, len(seen), want)
		}
	}
	for _, q := range []gateway.ListQuery{{Cursor: "x"}, {Cursor: "7/a"}, {Cursor: "1/"}, {State: gateway.Suspect}} {
		if _, err := f.s.List(ctx, q); err == nil {
			t.Errorf("List(%+v) accepted", q)
		}
	}
}

func TestShardLock(t *testing.T) {
	f := newFixture(t, Options{Shards: 2})
	ctx := context.Background()
	acquire := func(shard int, owner string, want bool) {
		t.Helper()
		ok, err := f.s.AcquireShard(ctx, shard, owner, 10*time.Second)
		if err != nil || ok != want {
			t.Fatalf("AcquireShard(%d, %s) = %v, %v; want %v", shard, owner, ok, err, want)
		}
	}
	acquire(0, "r1", true)
	acquire(0, "r2", false)
	acquire(1, "r2", true)
	f.clk.Advance(9 * time.Second)
	acquire(0, "r1", true) // extends to +19s
	f.clk.Advance(9 * time.Second)
	acquire(0, "r2", false)
	f.clk.Advance(time.Second)
	acquire(0, "r2", true) // r1's lease ran out
	if err := f.s.ReleaseShard(ctx, 0, "r1"); err != nil {
		t.Fatal(err)
	}
	acquire(0, "r1", false) // r1 released nothing it did not hold
	if err := f.s.ReleaseShard(ctx, 0, "r2"); err != nil {
		t.Fatal(err)
	}
	acquire(0, "r1", true)
	if _, err := f.s.AcquireShard(ctx, 0, "r1", 0); err == nil {
		t.Fatal("ttl 0 accepted")
	}
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

// TestListBoundedScan: a selective filter over many records returns
// short pages with a cursor rather than scanning the whole file at once.
func TestListBoundedScan(t *testing.T) {
	f := newFixture(t, Options{Shards: 1})
	ctx := context.Background()
	b := batch("gw", 1)
	for i := range 1200 {
		d := gateway.DeviceID(fmt.Sprintf("b-%04d", i))
		b.Writes = append(b.Writes, connect(d, "a", 0))
		if i != 1100 {
			b.Writes = append(b.Writes, leave(d, "a", 0))
		}
	}
	f.apply(0, b)
	q := gateway.ListQuery{State: gateway.Online, Limit: 1}
	var found []gateway.DeviceID
	pages := 0
	for ; pages < 10; pages++ {
		page, err := f.s.List(ctx, q)
		if err != nil {
			t.Fatal(err)
		}
		for _, info := range page.Devices {
			found = append(found, info.Device)
		}
		if page.Next == "" {
			break
		}
		q.Cursor = page.Next
	}
	if pages < 1 || len(found) != 1 || found[0] != "b-1100" {
		t.Fatalf("%d pages found %v, want b-1100 over more than one page", pages+1, found)
	}
}
