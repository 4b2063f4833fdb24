package embedded

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/fleetgate/fleetgate/gateway"
)

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
	for ; pages < 40; pages++ { // 2 × limit + 64 records a call: b-1100 on the 17th
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
