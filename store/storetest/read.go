package storetest

import (
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/fleetgate/fleetgate/gateway"
)

// testShardsAndNow: Shards is the count the store was opened with, and
// Now is its clock.
func testShardsAndNow(t *testing.T, open Opener) {
	for _, shards := range []int{1, 5} {
		e := newEnv(t, open, shards)
		if got := e.store.Shards(); got != shards {
			t.Errorf("Shards() = %d, want %d", got, shards)
		}
		for _, step := range []time.Duration{0, 1500 * time.Millisecond, time.Hour} {
			e.clock.Advance(step)
			got, err := e.store.Now(e.ctx)
			if err != nil {
				t.Fatalf("Now: %v", err)
			}
			if !got.Equal(e.now()) {
				t.Errorf("Now() = %v, want the clock's %v", got, e.now())
			}
		}
	}
}

// testDeviceNotFound: Device of a device the store never saw is
// ErrNotFound, in an empty store as in a used shard.
func testDeviceNotFound(t *testing.T, open Opener) {
	e := newEnv(t, open, 2)
	// The message says it once, for the operator who reads it.
	if _, err := e.store.Device(e.ctx, "never-seen"); !errors.Is(err, gateway.ErrNotFound) || err.Error() != "device never-seen: not found" {
		t.Errorf("Device of an empty store = %v, want ErrNotFound saying \"device never-seen: not found\"", err)
	}
	seen := devicesIn(t, 2, 0, 2, "dev")
	e.apply(batch(gwA, 1, wr(seen[0], "s1", gateway.Connect, 0)))
	if _, err := e.store.Device(e.ctx, seen[1]); !errors.Is(err, gateway.ErrNotFound) {
		t.Errorf("Device of an unseen device in a used shard = %v, want ErrNotFound", err)
	}
}

// testEventsPaging: Events reads a shard's log in order, with strictly
// increasing IDs, from the start ("" or "0") or after any event, in
// pages of at most limit.
func testEventsPaging(t *testing.T, open Opener) {
	e := newEnv(t, open, 2)
	devs := devicesIn(t, 2, 0, 4, "ev")
	for _, d := range devs {
		e.apply(batch(gwA, 1, wr(d, "s1", gateway.Connect, 0)))
		e.clock.Advance(time.Millisecond)
	}
	e.apply(batch(gwA, 1, wr(devs[0], "s1", gateway.Leave, 0), wr(devs[2], "s1", gateway.Leave, 0)))
	e.clock.Advance(time.Millisecond)
	e.apply(batch(gwA, 1, wr(devs[0], "s1", gateway.Connect, 0)))
	e.apply(batch(gwA, 1, wr(devicesIn(t, 2, 1, 1, "ev1")[0], "s1", gateway.Connect, 0)))

	full, err := e.store.Events(e.ctx, 0, "", 100)
	if err != nil {
		t.Fatalf("Events: %v", err)
	}
	if len(full) != 7 {
		t.Fatalf("shard 0 has %d events, want 7: %s", len(full), describeEvents(full))
	}
	for i, ev := range full {
		prev := ""
		if i > 0 {
			prev = full[i-1].ID
		}
		if err := checkAfter(prev, ev.ID); err != nil {
			t.Errorf("event %d: %v", i, err)
		}
	}
	e.checkLogLen("the other shard", 1, 1)

	var paged []gateway.Event
	after := "0"
	for range 10 {
		page, err := e.store.Events(e.ctx, 0, after, 3)
		if err != nil {
			t.Fatalf("Events(after %q, 3): %v", after, err)
		}
		if len(page) > 3 {
			t.Fatalf("Events(limit 3) returned %d events", len(page))
		}
		if len(page) == 0 {
			break
		}
		paged = append(paged, page...)
		after = page[len(page)-1].ID
	}
	if !slices.EqualFunc(paged, full, sameEvent) {
		t.Errorf("paging by 3 read %s\nwant %s", describeEvents(paged), describeEvents(full))
	}
	mid, err := e.store.Events(e.ctx, 0, full[2].ID, 2)
	if err != nil {
		t.Fatalf("Events(after %s, 2): %v", full[2].ID, err)
	}
	if !slices.EqualFunc(mid, full[3:5], sameEvent) {
		t.Errorf("Events(after event 2, 2) = %s, want events 3 and 4", describeEvents(mid))
	}
}

// testListPaging: List pages through every device once, at most limit
// per page (0: the default page), filtered by state, each as Device
// reads it.
func testListPaging(t *testing.T, open Opener) {
	e := newEnv(t, open, 4)
	const n = 23
	want := map[gateway.DeviceID]gateway.State{}
	var ws []gateway.Write
	for i := range n {
		d := gateway.DeviceID(fmt.Sprintf("list-%02d", i))
		want[d] = gateway.Online
		ws = append(ws, wr(d, "s1", gateway.Connect, 0))
	}
	connect := func(ws []gateway.Write) {
		byShard := map[int][]gateway.Write{}
		for _, w := range ws {
			s := gateway.ShardOf(w.Device, 4)
			byShard[s] = append(byShard[s], w)
		}
		for _, ws := range byShard {
			e.apply(batch(gwA, 1, ws...))
		}
	}
	connect(ws)
	e.clock.Advance(time.Second)
	var leaves []gateway.Write
	for i := 0; i < n; i += 3 {
		d := gateway.DeviceID(fmt.Sprintf("list-%02d", i))
		want[d] = gateway.Offline
		leaves = append(leaves, wr(d, "s1", gateway.Leave, 0))
	}
	connect(leaves)

	for _, filter := range []gateway.State{"", gateway.Online, gateway.Offline} {
		for _, limit := range []int{4, 1, 0} {
			t.Run(fmt.Sprintf("state %q limit %d", filter, limit), func(t *testing.T) {
				seen := map[gateway.DeviceID]bool{}
				cursor := ""
				for page := 0; ; page++ {
					if page == maxPages {
						t.Fatalf("List did not end after %d pages", maxPages)
					}
					p, err := e.store.List(e.ctx, gateway.ListQuery{State: filter, Cursor: cursor, Limit: limit})
					if err != nil {
						t.Fatalf("List(cursor %q): %v", cursor, err)
					}
					if limit > 0 && len(p.Devices) > limit {
						t.Errorf("List page of %d devices, limit %d", len(p.Devices), limit)
					}
					for _, info := range p.Devices {
						if seen[info.Device] {
							t.Errorf("List returned %s twice", info.Device)
						}
						seen[info.Device] = true
						if filter != "" && info.State != filter {
							t.Errorf("List(state %s) returned %s in state %s", filter, info.Device, info.State)
						}
						direct, err := e.store.Device(e.ctx, info.Device)
						if err != nil {
							t.Fatalf("Device(%s): %v", info.Device, err)
						}
						if d := diffDevice(info, direct, e.now()); d != "" {
							t.Errorf("List's %s differs from Device's: %s", info.Device, d)
						}
					}
					if p.Next == "" {
						break
					}
					cursor = p.Next
				}
				for d, st := range want {
					if (filter == "" || st == filter) && !seen[d] {
						t.Errorf("List(state %q) missed %s (%s)", filter, d, st)
					}
				}
				for d := range seen {
					if _, ok := want[d]; !ok {
						t.Errorf("List returned unknown device %s", d)
					}
				}
			})
		}
	}
}
