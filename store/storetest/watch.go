package storetest

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"pgregory.net/rapid"

	"github.com/fleetgate/fleetgate/gateway"
	"github.com/fleetgate/fleetgate/gateway/clocktest"
)

// WatchOpener is an Opener that also sets the cap of each shard's event
// log (the stores' EventsMaxLen), for the trimming cases.
type WatchOpener func(t *testing.T, shards int, maxLen int64, now func() time.Time) gateway.Store

// RunWatch checks the gateway.EventLog contract: snapshots at a
// position, reads after a position (waiting, resync on trimming and on a
// foreign incarnation), the publisher lease and position, and, as a
// rapid property, that a snapshot merged with the events after its
// cursor equals the store's state under a concurrent fleet of writes.
func RunWatch(t *testing.T, open WatchOpener) {
	plain := func(t *testing.T, shards int, now func() time.Time) gateway.Store {
		return open(t, shards, 100_000, now)
	}
	suite{
		{"SnapshotAtPosition", testSnapshotAtPosition},
		{"SnapshotPaging", testSnapshotPaging},
		{"ReadAfterPosition", testReadAfterPosition},
		{"ReadWaits", testReadWaits},
		{"WaitEvents", testWaitEvents},
		{"ForeignIncarnation", testForeignIncarnation},
		{"PublisherLease", testPublisherLease},
	}.run(t, plain)
	t.Run("TrimmedPosition", func(t *testing.T) { testTrimmedPosition(t, open) })
	t.Run("SnapshotPlusDeltas", func(t *testing.T) { checkSnapshotPlusDeltas(t, plain) })
}

// cursorOf reads the current position of every shard.
func (e *env) cursorOf() gateway.Cursor {
	e.t.Helper()
	c := make(gateway.Cursor, e.shards)
	for s := range e.shards {
		p, err := e.store.SnapshotShard(e.ctx, s, "", 0)
		if err != nil {
			e.t.Fatalf("SnapshotShard(%d, limit 0): %v", s, err)
		}
		if len(p.Devices) != 0 || p.Next != "" {
			e.t.Fatalf("SnapshotShard(%d, limit 0) = %d devices, next %q; want a position only", s, len(p.Devices), p.Next)
		}
		if p.At.Incarnation == "" || p.At.ID == "" {
			e.t.Fatalf("SnapshotShard(%d) position %+v: want an incarnation and an ID", s, p.At)
		}
		c[s] = p.At
	}
	return c
}

func (e *env) read(shard int, after gateway.Position, limit int, block time.Duration) []gateway.Event {
	e.t.Helper()
	evs, err := e.store.ReadEvents(e.ctx, shard, after, limit, block)
	if err != nil {
		e.t.Fatalf("ReadEvents(%d, %v): %v", shard, after, err)
	}
	return evs
}

func testSnapshotAtPosition(t *testing.T, open Opener) {
	e := newEnv(t, open, 1)
	d := devicesIn(t, 1, 0, 3, "snap")
	empty := e.cursorOf()
	if empty[0].ID != "0" {
		t.Errorf("position of an empty log = %q, want \"0\"", empty[0].ID)
	}
	if evs := e.read(0, empty[0], 10, 0); len(evs) != 0 {
		t.Errorf("ReadEvents of an empty log = %v", evs)
	}
	res := e.apply(batch("gw", 1, wr(d[0], "s", gateway.Connect, 0), wr(d[1], "s", gateway.Connect, 0)))
	p, err := e.store.SnapshotShard(e.ctx, 0, "", 10)
	if err != nil {
		t.Fatal(err)
	}
	if p.At.ID != res.Events[1].ID || p.At.Incarnation != empty[0].Incarnation {
		t.Errorf("snapshot position %+v, want the last event %s in incarnation %s", p.At, res.Events[1].ID, empty[0].Incarnation)
	}
	if len(p.Devices) != 2 || p.Next != "" {
		t.Fatalf("snapshot = %d devices next %q, want 2 and the end", len(p.Devices), p.Next)
	}
	for _, di := range p.Devices {
		if di.State != gateway.Online || di.Ver != firstVer(di.Since) {
			t.Errorf("snapshot device %s = %s ver %d, want online ver %d", di.Device, di.State, di.Ver, firstVer(di.Since))
		}
	}
	// the events between the empty cursor and the snapshot are those two
	evs := e.read(0, empty[0], 10, 0)
	if len(evs) != 2 || evs[0].ID != res.Events[0].ID || evs[1].ID != res.Events[1].ID {
		t.Errorf("ReadEvents after the empty cursor = %v, want the two online events", evs)
	}
	if evs := e.read(0, p.At, 10, 0); len(evs) != 0 {
		t.Errorf("ReadEvents after the snapshot position = %v, want none", evs)
	}
}

func testSnapshotPaging(t *testing.T, open Opener) {
	e := newEnv(t, open, 2)
	want := map[gateway.DeviceID]bool{}
	for s := range 2 {
		ds := devicesIn(t, 2, s, 23, "page")
		var ws []gateway.Write
		for _, d := range ds {
			ws = append(ws, wr(d, "s", gateway.Connect, 0))
			want[d] = true
		}
		e.apply(batch("gw", 1, ws...))
	}
	got := map[gateway.DeviceID]int{}
	for s := range 2 {
		page := ""
		for i := 0; ; i++ {
			if i == maxPages {
				t.Fatalf("shard %d: no end after %d pages", s, maxPages)
			}
			p, err := e.store.SnapshotShard(e.ctx, s, page, 5)
			if err != nil {
				t.Fatalf("SnapshotShard(%d, %q): %v", s, page, err)
			}
			if len(p.Devices) > 5 {
				t.Fatalf("page of %d devices over the limit 5", len(p.Devices))
			}
			for _, d := range p.Devices {
				got[d.Device]++
				if gateway.ShardOf(d.Device, 2) != s {
					t.Errorf("device %s in shard %d's snapshot", d.Device, s)
				}
			}
			if p.Next == "" {
				break
			}
			page = p.Next
		}
	}
	for d := range want {
		if got[d] != 1 {
			t.Errorf("device %s returned %d times, want once", d, got[d])
		}
	}
	if len(got) != len(want) {
		t.Errorf("snapshot has %d devices, want %d", len(got), len(want))
	}
	if _, err := e.store.SnapshotShard(e.ctx, 2, "", 1); !errors.Is(err, gateway.ErrBadShard) {
		t.Errorf("SnapshotShard(2 of 2) = %v, want ErrBadShard", err)
	}
}

func testReadAfterPosition(t *testing.T, open Opener) {
	e := newEnv(t, open, 1)
	d := devicesIn(t, 1, 0, 1, "read")[0]
	start := e.cursorOf()[0]
	var all []gateway.Event
	for range 5 {
		all = append(all, e.apply(batch("gw", 1, wr(d, "s", gateway.Connect, 0))).Events...)
		all = append(all, e.apply(batch("gw", 1, wr(d, "s", gateway.Leave, 0))).Events...)
	}
	if len(all) != 10 {
		t.Fatalf("wrote %d events, want 10", len(all))
	}
	pos, var_ := start, []gateway.Event{}
	for range 10 {
		evs := e.read(0, pos, 3, 0)
		if len(evs) == 0 {
			break
		}
		if len(evs) > 3 {
			t.Fatalf("read %d events over the limit 3", len(evs))
		}
		var_ = append(var_, evs...)
		pos = gateway.Position{Incarnation: pos.Incarnation, ID: evs[len(evs)-1].ID}
	}
	if len(var_) != 10 {
		t.Fatalf("read %d events after the start, want 10", len(var_))
	}
	for i, ev := range var_ {
		if ev.ID != all[i].ID || ev.Ver != all[0].Ver+uint64(i) || ev.Device != d || ev.Shard != 0 {
			t.Errorf("event %d = %+v, want %+v", i, ev, all[i])
		}
	}
	// a position with no incarnation is read by ID alone
	if evs := e.read(0, gateway.Position{ID: all[7].ID}, 10, 0); len(evs) != 2 || evs[0].ID != all[8].ID {
		t.Errorf("read after %s without incarnation = %v, want the last two events", all[7].ID, evs)
	}
	if _, err := e.store.ReadEvents(e.ctx, 0, gateway.Position{Incarnation: start.Incarnation, ID: "x-1"}, 1, 0); err == nil {
		t.Errorf("ReadEvents after a malformed ID: no error")
	}
}

func testReadWaits(t *testing.T, open Opener) {
	e := newEnv(t, open, 2)
	d := devicesIn(t, 2, 1, 1, "wait")[0]
	cur := e.cursorOf()
	// nothing comes: the wait ends empty after block
	begin := time.Now()
	if evs := e.read(1, cur[1], 10, 50*time.Millisecond); len(evs) != 0 {
		t.Fatalf("read = %v, want none", evs)
	}
	if el := time.Since(begin); el < 40*time.Millisecond {
		t.Errorf("read returned after %v, want it to wait about 50ms", el)
	}
	// a write during the wait ends it with the event
	got := make(chan []gateway.Event, 1)
	go func() {
		evs, err := e.store.ReadEvents(e.ctx, 1, cur[1], 10, 10*time.Second)
		if err != nil {
			t.Errorf("ReadEvents: %v", err)
		}
		got <- evs
	}()
	res := e.apply(batch("gw", 1, wr(d, "s", gateway.Connect, 0)))
	select {
	case evs := <-got:
		if len(evs) != 1 || evs[0].ID != res.Events[0].ID {
			t.Errorf("waiting read = %v, want the online event %s", evs, res.Events[0].ID)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("waiting read not woken by a write within 5s")
	}
	// a cancelled context ends the wait
	ctx, cancel := context.WithCancel(e.ctx)
	done := make(chan error, 1)
	go func() {
		_, err := e.store.ReadEvents(ctx, 0, cur[0], 10, 10*time.Second)
		done <- err
	}()
	cancel()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("cancelled read still waiting after 5s")
	}
}

// wait calls WaitEvents and fails the test on an error.
func (e *env) wait(ctx context.Context, after gateway.Cursor, block time.Duration) []int {
	e.t.Helper()
	got, err := e.store.WaitEvents(ctx, after, block)
	if err != nil {
		e.t.Fatalf("WaitEvents(%v, %v): %v", after, block, err)
	}
	return got
}

func testWaitEvents(t *testing.T, open Opener) {
	e := newEnv(t, open, 3)
	d1 := devicesIn(t, 3, 1, 1, "await")[0]
	d2 := devicesIn(t, 3, 2, 1, "await")[0]
	cur := e.cursorOf()
	if got := e.wait(e.ctx, cur, 0); len(got) != 0 {
		t.Errorf("WaitEvents(block 0) of idle shards = %v, want none", got)
	}
	// nothing comes: the wait ends empty after block
	begin := time.Now()
	if got := e.wait(e.ctx, cur, 50*time.Millisecond); len(got) != 0 {
		t.Fatalf("WaitEvents = %v, want none", got)
	}
	if el := time.Since(begin); el < 40*time.Millisecond {
		t.Errorf("WaitEvents returned after %v, want it to wait about 50ms", el)
	}
	// a write to one shard during the wait ends it, naming that shard
	got := make(chan []int, 1)
	go func() {
		ready, err := e.store.WaitEvents(e.ctx, cur, 10*time.Second)
		if err != nil {
			t.Errorf("WaitEvents: %v", err)
		}
		got <- ready
	}()
	res := e.apply(batch("gw", 1, wr(d2, "s", gateway.Connect, 0)))
	select {
	case ready := <-got:
		if len(ready) != 1 || ready[0] != 2 {
			t.Errorf("waiting WaitEvents = %v, want shard 2", ready)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("WaitEvents not woken by a write within 5s")
	}
	// events waiting in several shards: all named at once, ascending
	e.apply(batch("gw", 1, wr(d1, "s", gateway.Connect, 0)))
	if ready := e.wait(e.ctx, cur, 10*time.Second); len(ready) != 2 || ready[0] != 1 || ready[1] != 2 {
		t.Errorf("WaitEvents with events in shards 1 and 2 = %v, want [1 2]", ready)
	}
	// a position at the last event of its shard has no news
	past := slices.Clone(cur)
	past[2].ID = res.Events[0].ID
	if ready := e.wait(e.ctx, past, 0); len(ready) != 1 || ready[0] != 1 {
		t.Errorf("WaitEvents past shard 2's event = %v, want [1]", ready)
	}
	// the end of the context ends a wait, before it starts or during it
	idle := e.cursorOf()
	for _, after := range []time.Duration{0, 100 * time.Millisecond} {
		ctx, cancel := context.WithCancel(e.ctx)
		if after == 0 {
			cancel()
		}
		done := make(chan []int)
		go func() {
			ready, _ := e.store.WaitEvents(ctx, idle, 10*time.Second)
			done <- ready
		}()
		time.Sleep(after)
		cancel()
		select {
		case ready := <-done:
			if len(ready) != 0 {
				t.Errorf("WaitEvents ended by its context = %v, want none", ready)
			}
		case <-time.After(3 * time.Second):
			t.Fatalf("WaitEvents still waiting 3s after its context ended (%v into the wait)", after)
		}
	}
	if _, err := e.store.WaitEvents(e.ctx, cur[:2], 0); err == nil {
		t.Errorf("WaitEvents with 2 positions of 3 shards: no error")
	}
	if _, err := e.store.WaitEvents(e.ctx, gateway.Cursor{cur[0], cur[1], {ID: "x-1"}}, 0); err == nil {
		t.Errorf("WaitEvents after a malformed ID: no error")
	}
}

func testForeignIncarnation(t *testing.T, open Opener) {
	e := newEnv(t, open, 1)
	cur := e.cursorOf()
	other := gateway.Position{Incarnation: cur[0].Incarnation + "x", ID: cur[0].ID}
	_, err := e.store.ReadEvents(e.ctx, 0, other, 10, 0)
	var re *gateway.ResyncError
	if !errors.As(err, &re) || re.Reason != gateway.ResyncIncarnation || re.Shard != 0 || !errors.Is(err, gateway.ErrResyncRequired) {
		t.Errorf("ReadEvents in another incarnation = %v, want a ResyncError (incarnation)", err)
	}
	// another store (another file, another prefix) is another incarnation
	e2 := newEnv(t, open, 1)
	if c2 := e2.cursorOf(); c2[0].Incarnation == cur[0].Incarnation {
		t.Errorf("two stores share the incarnation %s", c2[0].Incarnation)
	}
}

func testTrimmedPosition(t *testing.T, open WatchOpener) {
	clock := clocktest.New(time.UnixMilli(startMs).UTC())
	store := open(t, 1, 10, clock.Now)
	e := &env{t: t, ctx: t.Context(), clock: clock, store: store, shards: 1}
	start := e.cursorOf()[0]
	ds := devicesIn(t, 1, 0, 300, "trim")
	var ws []gateway.Write
	for _, d := range ds {
		ws = append(ws, wr(d, "s", gateway.Connect, 0))
	}
	res := e.apply(batch("gw", 1, ws...))
	if len(res.Events) != 300 {
		t.Fatalf("wrote %d events, want 300", len(res.Events))
	}
	for _, after := range []gateway.Position{start, {Incarnation: start.Incarnation, ID: res.Events[0].ID}} {
		_, err := e.store.ReadEvents(e.ctx, 0, after, 10, 0)
		var re *gateway.ResyncError
		if !errors.As(err, &re) || re.Reason != gateway.ResyncTrimmed {
			t.Errorf("ReadEvents after %s, trimmed past: %v, want a ResyncError (trimmed)", after.ID, err)
		}
	}
	// a wait names a shard trimmed past its position, for ReadEvents to
	// tell
	if ready, err := e.store.WaitEvents(e.ctx, gateway.Cursor{start}, 0); err != nil || len(ready) != 1 || ready[0] != 0 {
		t.Errorf("WaitEvents after a trimmed position = %v, %v; want shard 0", ready, err)
	}
	// the log's tail is still served
	tail := gateway.Position{Incarnation: start.Incarnation, ID: res.Events[298].ID}
	if evs := e.read(0, tail, 10, 0); len(evs) != 1 || evs[0].ID != res.Events[299].ID {
		t.Errorf("ReadEvents after the last but one = %v, want the last event", evs)
	}
}

func testPublisherLease(t *testing.T, open Opener) {
	e := newEnv(t, open, 2)
	const ttl = 10 * time.Second
	acquire := func(shard int, owner string, want bool) gateway.Position {
		t.Helper()
		pos, ok, err := e.store.AcquirePublisher(e.ctx, shard, owner, ttl)
		if err != nil {
			t.Fatalf("AcquirePublisher(%d, %s): %v", shard, owner, err)
		}
		if ok != want {
			t.Errorf("AcquirePublisher(%d, %s) = %v, want %v", shard, owner, ok, want)
		}
		return pos
	}
	save := func(shard int, owner string, pos gateway.Position, want error) {
		t.Helper()
		if err := e.store.SavePublisher(e.ctx, shard, owner, pos); !errors.Is(err, want) || (want == nil && err != nil) {
			t.Errorf("SavePublisher(%d, %s) = %v, want %v", shard, owner, err, want)
		}
	}
	if p := acquire(0, "a", true); p != (gateway.Position{}) {
		t.Errorf("first acquire returned position %+v, want none", p)
	}
	acquire(0, "b", false)
	acquire(1, "b", true)
	p1 := gateway.Position{Incarnation: "inc", ID: "5-1"}
	save(0, "a", p1, nil)
	save(0, "b", gateway.Position{Incarnation: "inc", ID: "9-9"}, gateway.ErrNotHolder)
	if err := e.store.ReleasePublisher(e.ctx, 0, "b"); err != nil { // not held: no-op
		t.Fatal(err)
	}
	acquire(0, "b", false)
	if err := e.store.ReleasePublisher(e.ctx, 0, "a"); err != nil {
		t.Fatal(err)
	}
	if p := acquire(0, "b", true); p != p1 {
		t.Errorf("acquire after release returned %+v, want the saved %+v", p, p1)
	}
	save(0, "a", p1, gateway.ErrNotHolder)
	e.clock.Advance(ttl + time.Millisecond)
	// b's lease ran out but no one took it: b may still save
	p2 := gateway.Position{Incarnation: "inc", ID: "6-0"}
	save(0, "b", p2, nil)
	if p := acquire(0, "c", true); p != p2 {
		t.Errorf("acquire of an expired lease returned %+v, want %+v", p, p2)
	}
	save(0, "b", p1, gateway.ErrNotHolder)
	acquire(1, "b", true) // shards are independent
}

// checkSnapshotPlusDeltas: writers apply random batches on a few devices
// (with clock moves and reaps) while a consumer takes a cursor, pages a
// snapshot and reads the events after the cursor. Every event the
// consumer keeps must be the next ver of its device (no gap), and once
// the writers are done and the consumer caught up, its view must equal
// every device's state in the store.
func checkSnapshotPlusDeltas(t *testing.T, open Opener) {
	const shards, perShard = 2, 3
	var devices []gateway.DeviceID
	for s := range shards {
		devices = append(devices, devicesIn(t, shards, s, perShard, "fleet")...)
	}
	rapid.Check(t, func(rt *rapid.T) {
		clock := clocktest.New(time.UnixMilli(startMs).UTC())
		store := open(t, shards, clock.Now)
		ctx := t.Context()
		type step struct {
			device  int
			session gateway.SessionID
			kind    gateway.Kind
			age     time.Duration
			advance time.Duration
			reap    bool
		}
		writers := rapid.IntRange(1, 3).Draw(rt, "writers")
		plans := make([][]step, writers)
		for w := range plans {
			plans[w] = rapid.SliceOfN(rapid.Custom(func(rt *rapid.T) step {
				return step{
					device:  rapid.IntRange(0, len(devices)-1).Draw(rt, "device"),
					session: rapid.SampledFrom(propSessions).Draw(rt, "session"),
					kind:    rapid.SampledFrom(propKinds).Draw(rt, "kind"),
					age:     rapid.SampledFrom([]time.Duration{0, time.Second, 3 * time.Second}).Draw(rt, "age"),
					advance: rapid.SampledFrom([]time.Duration{0, 0, time.Second, 4 * time.Second}).Draw(rt, "advance"),
					reap:    rapid.Bool().Draw(rt, "reap"),
				}
			}), 1, 30).Draw(rt, "plan")
		}
		page := rapid.IntRange(1, 4).Draw(rt, "page")
		var wg sync.WaitGroup
		for w, plan := range plans {
			wg.Go(func() {
				gw := fmt.Sprintf("gw-%d", w)
				for _, st := range plan {
					d := devices[st.device]
					shard := gateway.ShardOf(d, shards)
					b := gateway.Batch{Gateway: gw, Epoch: 1, Lease: 3 * time.Second,
						Writes: []gateway.Write{{Device: d, Session: st.session, Kind: st.kind, Age: st.age}}}
					if _, err := store.Apply(ctx, shard, b); err != nil {
						rt.Errorf("Apply: %v", err)
						return
					}
					clock.Advance(st.advance)
					if st.reap {
						if _, err := store.Reap(ctx, shard, 10); err != nil {
							rt.Errorf("Reap: %v", err)
							return
						}
					}
				}
			})
		}
		// the consumer, concurrently with the writers
		type known struct {
			state gateway.State
			ver   uint64
		}
		view := map[gateway.DeviceID]known{}
		cursor := make(gateway.Cursor, shards)
		for s := range shards {
			p, err := store.SnapshotShard(ctx, s, "", 0)
			if err != nil {
				rt.Fatalf("SnapshotShard: %v", err)
			}
			cursor[s] = p.At
		}
		for s := range shards {
			next := ""
			for i := 0; i < maxPages; i++ {
				p, err := store.SnapshotShard(ctx, s, next, page)
				if err != nil {
					rt.Fatalf("SnapshotShard: %v", err)
				}
				if p.At.Incarnation != cursor[s].Incarnation || gateway.CompareLogIDs(p.At.ID, cursor[s].ID) < 0 {
					rt.Fatalf("page position %+v before the cursor %+v", p.At, cursor[s])
				}
				for _, d := range p.Devices {
					view[d.Device] = known{d.State, d.Ver}
				}
				if next = p.Next; next == "" {
					break
				}
			}
		}
		readAll := func() int {
			n := 0
			for s := range shards {
				for range maxPages {
					evs, err := store.ReadEvents(ctx, s, cursor[s], 7, 0)
					if err != nil {
						rt.Fatalf("ReadEvents: %v", err)
					}
					if len(evs) == 0 {
						break
					}
					for _, ev := range evs {
						k := view[ev.Device]
						if ev.Ver <= k.ver {
							continue // already in the snapshot
						}
						if ev.Ver != nextVer(k.ver, ev.At) {
							rt.Fatalf("device %s: event ver %d after ver %d: a gap", ev.Device, ev.Ver, k.ver)
						}
						view[ev.Device] = known{ev.State, ev.Ver}
						n++
					}
					cursor[s].ID = evs[len(evs)-1].ID
				}
			}
			return n
		}
		readAll()
		wg.Wait()
		readAll()
		for _, d := range devices {
			info, err := store.Device(ctx, d)
			if errors.Is(err, gateway.ErrNotFound) {
				if _, ok := view[d]; ok {
					rt.Errorf("device %s in the view, not in the store", d)
				}
				continue
			}
			if err != nil {
				rt.Fatalf("Device: %v", err)
			}
			if got := view[d]; got.state != info.State || got.ver != info.Ver {
				rt.Errorf("device %s: snapshot + deltas = %s ver %d, store = %s ver %d", d, got.state, got.ver, info.State, info.Ver)
			}
		}
	})
}
