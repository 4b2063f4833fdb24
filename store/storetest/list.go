package storetest

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/fleetgate/fleetgate/gateway"
)

// checkWindow is the suspect window the suite's full-scan checks count
// with (between the property runs' two leases).
const checkWindow = 5 * time.Second

// listAll reads every page of q, at most maxPages.
func listAll(ctx context.Context, s gateway.Store, q gateway.ListQuery) ([]gateway.DeviceInfo, error) {
	var out []gateway.DeviceInfo
	for range maxPages {
		p, err := s.List(ctx, q)
		if err != nil {
			return nil, fmt.Errorf("List(%+v): %w", q, err)
		}
		if q.Limit > 0 && len(p.Devices) > q.Limit {
			return nil, fmt.Errorf("List(%+v) returned %d devices", q, len(p.Devices))
		}
		out = append(out, p.Devices...)
		if p.Next == "" {
			return out, nil
		}
		q.Cursor = p.Next
	}
	return nil, fmt.Errorf("List(%+v) did not end after %d pages", q, maxPages)
}

// checkOrder checks that devs are in order o, each once.
func checkOrder(o gateway.ListOrder, devs []gateway.DeviceInfo) error {
	for i := 1; i < len(devs); i++ {
		if o.Compare(o.KeyOf(devs[i-1]), o.KeyOf(devs[i])) >= 0 {
			return fmt.Errorf("by %s, %s (since %d) comes before %s (since %d)", o,
				devs[i-1].Device, devs[i-1].Since.UnixMilli(), devs[i].Device, devs[i].Since.UnixMilli())
		}
	}
	return nil
}

// Inspector is what a store under test may offer beyond gateway.Store
// (through its Opener's wrapper of it): a check of the structures it
// keeps beside its records (indexes, counters) against those records,
// which the suite runs wherever it compares the store with a full scan
// (checkScans), after the reads that may have built them.
type Inspector interface {
	Inspect(ctx context.Context) error
}

// checkScans compares what the store keeps to answer its reads cheaply
// with a full scan of its devices: Counts (with checkWindow), each List
// order and state filter (every device once, in order, the same as by
// ID), and each gateway's sessions; then the store's own Inspect, if it
// has one.
func checkScans(ctx context.Context, s gateway.Store) error {
	now, err := s.Now(ctx)
	if err != nil {
		return err
	}
	all, err := listAll(ctx, s, gateway.ListQuery{Limit: 1000})
	if err != nil {
		return err
	}
	if err := checkOrder(gateway.OrderID, all); err != nil {
		return err
	}
	var want gateway.Counts
	sessions := map[string]int64{}
	for _, d := range all {
		if d.State == gateway.Online {
			want.Online++
			if d.Deadline.After(now) && !d.Deadline.After(now.Add(checkWindow)) {
				want.Suspect++
			}
		} else {
			want.Offline++
		}
		for _, x := range d.Sessions {
			sessions[x.Gateway]++
		}
	}
	got, err := s.Counts(ctx, checkWindow)
	if err != nil {
		return fmt.Errorf("Counts: %w", err)
	}
	if got != want {
		return fmt.Errorf("Counts = %+v, a scan of the devices counts %+v", got, want)
	}
	for _, o := range []gateway.ListOrder{gateway.OrderID, gateway.OrderChanged} {
		for _, st := range []gateway.State{"", gateway.Online, gateway.Offline} {
			got, err := listAll(ctx, s, gateway.ListQuery{Order: o, State: st, Limit: 3})
			if err != nil {
				return err
			}
			if err := checkOrder(o, got); err != nil {
				return fmt.Errorf("List(%s, state %q): %w", o, st, err)
			}
			var want []gateway.DeviceInfo
			for _, d := range all {
				if st == "" || d.State == st {
					want = append(want, d)
				}
			}
			slices.SortFunc(got, func(a, b gateway.DeviceInfo) int { return strings.Compare(string(a.Device), string(b.Device)) })
			if d := diffDeviceLists(got, want, now); d != "" {
				return fmt.Errorf("List(%s, state %q) and a scan by ID differ: %s", o, st, d)
			}
		}
	}
	gws, err := s.Gateways(ctx)
	if err != nil {
		return fmt.Errorf("Gateways: %w", err)
	}
	for _, g := range gws {
		if g.Sessions != sessions[g.ID] {
			return fmt.Errorf("Gateways: %s holds %d sessions, the devices hold %d of it", g.ID, g.Sessions, sessions[g.ID])
		}
		delete(sessions, g.ID)
	}
	if len(sessions) > 0 {
		return fmt.Errorf("Gateways lacks the gateways of sessions %v", sessions)
	}
	if in, ok := s.(Inspector); ok {
		return in.Inspect(ctx)
	}
	return nil
}

// diffDeviceLists says how two lists of devices in the same order
// differ, "" when they do not.
func diffDeviceLists(got, want []gateway.DeviceInfo, now time.Time) string {
	if len(got) != len(want) {
		ids := func(ds []gateway.DeviceInfo) []gateway.DeviceID {
			out := make([]gateway.DeviceID, len(ds))
			for i, d := range ds {
				out[i] = d.Device
			}
			return out
		}
		return fmt.Sprintf("%d devices %v, want %d %v", len(got), ids(got), len(want), ids(want))
	}
	for i := range got {
		if d := diffDevice(got[i], want[i], now); d != "" || got[i].Device != want[i].Device {
			return fmt.Sprintf("%s: %s", want[i].Device, d)
		}
	}
	return ""
}

// testListOrders: List by ID (with and without a prefix) and by last
// change (newest first, ties by ID descending), each with and without a
// state filter, paged by every limit from 1 up, gives the devices a
// reference sort of Device's answers gives; a bad order, state, prefix
// or cursor is ErrBadQuery.
func testListOrders(t *testing.T, open Opener) {
	e := newEnv(t, open, 3)
	var devs []gateway.DeviceID
	for s := range 3 {
		devs = append(devs, devicesIn(t, 3, s, 3, "ord-a")...)
		devs = append(devs, devicesIn(t, 3, s, 2, "ord-b")...)
	}
	devs = append(devs, "ord", "ord-", "orda")
	// connects in two milliseconds (ties), then leaves and connects
	// again, each later
	for i, d := range devs {
		if i == len(devs)/2 {
			e.clock.Advance(time.Millisecond)
		}
		e.apply(batch(gwA, 1, wr(d, "s1", gateway.Connect, 0)))
	}
	for i := 0; i < len(devs); i += 3 {
		e.clock.Advance(7 * time.Millisecond)
		e.apply(batch(gwA, 1, wr(devs[i], "s1", gateway.Leave, 0)))
	}
	e.clock.Advance(time.Second)
	e.apply(batch(gwA, 1, wr(devs[3], "s1", gateway.Connect, 0)))

	infos := map[gateway.DeviceID]gateway.DeviceInfo{}
	for _, d := range devs {
		infos[d] = e.device(d)
	}
	reference := func(o gateway.ListOrder, st gateway.State, prefix string) []gateway.DeviceInfo {
		var out []gateway.DeviceInfo
		for _, d := range slices.Sorted(maps.Keys(infos)) {
			if info := infos[d]; (st == "" || info.State == st) && strings.HasPrefix(string(d), prefix) {
				out = append(out, info)
			}
		}
		slices.SortFunc(out, func(a, b gateway.DeviceInfo) int { return o.Compare(o.KeyOf(a), o.KeyOf(b)) })
		return out
	}
	queries := []gateway.ListQuery{{}, {Order: gateway.OrderChanged}}
	for _, p := range []string{"ord-a", "ord-b", "ord", "orda", "ord-", "zz"} {
		queries = append(queries, gateway.ListQuery{Order: gateway.OrderID, Prefix: p})
	}
	for _, q := range queries {
		for _, st := range []gateway.State{"", gateway.Online, gateway.Offline} {
			for _, limit := range []int{1, 2, 3, 5, 100} {
				q.State, q.Limit = st, limit
				got, err := listAll(e.ctx, e.store, q)
				if err != nil {
					t.Fatal(err)
				}
				want := reference(cmp.Or(q.Order, gateway.OrderID), st, q.Prefix)
				if d := diffDeviceLists(got, want, e.now()); d != "" {
					t.Errorf("List(order %q, prefix %q, state %q, limit %d): %s", q.Order, q.Prefix, st, limit, d)
				}
			}
		}
	}

	for _, q := range []gateway.ListQuery{
		{Order: "size"},
		{State: gateway.Suspect},
		{Order: gateway.OrderChanged, Prefix: "ord"},
		{Prefix: "ord a"},
		{Cursor: "changed:1:ord"},
		{Order: gateway.OrderChanged, Cursor: "id:ord"},
		{Cursor: "id:"},
		{Order: gateway.OrderChanged, Cursor: "changed:x:ord"},
	} {
		if _, err := e.store.List(e.ctx, q); !errors.Is(err, gateway.ErrBadQuery) {
			t.Errorf("List(%+v) = %v, want ErrBadQuery", q, err)
		}
	}
}

// testListSparseFilter: by ID, a state filter that few devices pass
// reads a bounded number of records a call (2 × limit + 64 a shard), so
// pages may come back short or empty with a next page; paging through
// them still gives each such device once, in order.
func testListSparseFilter(t *testing.T, open Opener) {
	e := newEnv(t, open, 2)
	var want []gateway.DeviceID
	for s := range 2 {
		devs := devicesIn(t, 2, s, 200, "sparse")
		var ws []gateway.Write
		for _, d := range devs {
			ws = append(ws, wr(d, "s1", gateway.Connect, 0))
		}
		e.apply(batch(gwA, 1, ws...))
		// offline: the 100th and the 200th of the shard by ID, each
		// further than a call's budget of records from the one before
		slices.Sort(devs)
		for _, i := range []int{99, 199} {
			e.apply(batch(gwA, 1, wr(devs[i], "s1", gateway.Leave, 0)))
			want = append(want, devs[i])
		}
	}
	slices.Sort(want)
	q := gateway.ListQuery{State: gateway.Offline, Limit: 1}
	var got []gateway.DeviceID
	pages, short := 0, 0
	for ; pages < maxPages; pages++ {
		p, err := e.store.List(e.ctx, q)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range p.Devices {
			got = append(got, d.Device)
		}
		if len(p.Devices) == 0 && p.Next != "" {
			short++
		}
		if p.Next == "" {
			break
		}
		q.Cursor = p.Next
	}
	if !slices.Equal(got, want) {
		t.Errorf("offline devices by ID, a page of 1: %v, want %v", got, want)
	}
	if short == 0 {
		t.Errorf("%d pages, none empty: the filter read every record of a shard in one call", pages)
	}
}

// testListByChangeMoves: a device that changes state moves to the
// front of OrderChanged and out of its old state's list; a renewal moves
// nothing; a forgotten device leaves every order; a cursor taken before
// a change still resumes where it was.
func testListByChangeMoves(t *testing.T, open Opener) {
	e := newEnv(t, open, 2)
	devs := append(devicesIn(t, 2, 0, 3, "mv"), devicesIn(t, 2, 1, 3, "mv")...)
	for _, d := range devs {
		e.clock.Advance(time.Millisecond)
		e.apply(batch(gwA, 1, wr(d, "s1", gateway.Connect, 0)))
	}
	ids := func(q gateway.ListQuery) []gateway.DeviceID {
		t.Helper()
		got, err := listAll(e.ctx, e.store, q)
		if err != nil {
			t.Fatal(err)
		}
		var out []gateway.DeviceID
		for _, d := range got {
			out = append(out, d.Device)
		}
		return out
	}
	newest := func(ds ...gateway.DeviceID) []gateway.DeviceID { return slices.Collect(backward(ds)) }
	byChange := gateway.ListQuery{Order: gateway.OrderChanged}
	if got, want := ids(byChange), newest(devs...); !slices.Equal(got, want) {
		t.Fatalf("by change %v, want %v", got, want)
	}
	first, err := e.store.List(e.ctx, gateway.ListQuery{Order: gateway.OrderChanged, Limit: 2})
	if err != nil {
		t.Fatal(err)
	}
	e.clock.Advance(time.Second)
	for _, d := range devs {
		e.apply(batch(gwA, 1, wr(d, "s1", gateway.Renew, 0)))
	}
	if got, want := ids(byChange), newest(devs...); !slices.Equal(got, want) {
		t.Errorf("renewals moved devices: by change %v, want %v", got, want)
	}
	e.apply(batch(gwA, 1, wr(devs[1], "s1", gateway.Leave, 0)))
	if got, want := ids(byChange), append([]gateway.DeviceID{devs[1]}, newest(slices.Delete(slices.Clone(devs), 1, 2)...)...); !slices.Equal(got, want) {
		t.Errorf("after a leave: by change %v, want %v", got, want)
	}
	if got := ids(gateway.ListQuery{Order: gateway.OrderChanged, State: gateway.Offline}); !slices.Equal(got, []gateway.DeviceID{devs[1]}) {
		t.Errorf("offline by change %v, want [%s]", got, devs[1])
	}
	rest, err := listAll(e.ctx, e.store, gateway.ListQuery{Order: gateway.OrderChanged, Cursor: first.Next})
	if err != nil {
		t.Fatal(err)
	}
	var restIDs []gateway.DeviceID
	for _, d := range rest {
		restIDs = append(restIDs, d.Device)
	}
	if want := newest(devs[:len(devs)-2]...); !slices.Equal(restIDs, slices.DeleteFunc(want, func(d gateway.DeviceID) bool { return d == devs[1] })) {
		t.Errorf("the cursor of the first page, after the leave: %v, want %v without %s", restIDs, want, devs[1])
	}
	if _, err := e.store.Forget(e.ctx, devs[2], gwA); err != nil {
		t.Fatal(err)
	}
	for _, q := range []gateway.ListQuery{byChange, {}, {Prefix: string(devs[2])}} {
		if slices.Contains(ids(q), devs[2]) {
			t.Errorf("List(%+v) still has the forgotten %s", q, devs[2])
		}
	}
	if err := checkScans(e.ctx, e.store); err != nil {
		t.Error(err)
	}
}

// backward yields ds from the last to the first.
func backward(ds []gateway.DeviceID) func(func(gateway.DeviceID) bool) {
	return func(yield func(gateway.DeviceID) bool) {
		for i := len(ds) - 1; i >= 0; i-- {
			if !yield(ds[i]) {
				return
			}
		}
	}
}

// testCountsSuspect: Counts counts as suspect the online devices whose
// deadline is after the store's now and at most the window after it
// (gateway.SuspectWindow), none for a window of 0, and none of the
// devices whose lease ran out that no reap has ended yet (in Online).
func testCountsSuspect(t *testing.T, open Opener) {
	e := newEnv(t, open, 3)
	var devs []gateway.DeviceID
	for s := range 3 {
		devs = append(devs, devicesIn(t, 3, s, 2, "sus")...)
	}
	// deadlines lease−ages from now: 30 s, 25 s, 20 s, 10 s, 5 s and one
	// that ran out
	ages := []time.Duration{0, 5 * time.Second, 10 * time.Second, 20 * time.Second, 25 * time.Second, 29 * time.Second}
	for i, d := range devs {
		e.apply(batch(gwA, 1, wr(d, "s1", gateway.Connect, ages[i])))
	}
	e.clock.Advance(time.Second + time.Millisecond)
	for _, tc := range []struct {
		window time.Duration
		want   int64
	}{{0, 0}, {3999 * time.Millisecond, 1}, {3998 * time.Millisecond, 0}, {9 * time.Second, 2}, {19 * time.Second, 3}, {time.Hour, 5}} {
		got, err := e.store.Counts(e.ctx, tc.window)
		if err != nil {
			t.Fatal(err)
		}
		if got.Suspect != tc.want || got.Online != 6 || got.Offline != 0 {
			t.Errorf("Counts(window %v) = %+v, want 6 online of which %d suspect", tc.window, got, tc.want)
		}
	}
	if err := checkScans(e.ctx, e.store); err != nil {
		t.Error(err)
	}
}

// testGatewaySessions: Gateways counts each gateway's live sessions: a
// connect adds one, a session renewed through another gateway moves
// there, a leave, an expiry (by a write or a reap) and a forget drop
// one; renewals change nothing.
func testGatewaySessions(t *testing.T, open Opener) {
	e := newEnv(t, open, 2)
	held := func(what string, a, b int64) {
		t.Helper()
		gws, err := e.store.Gateways(e.ctx)
		if err != nil {
			t.Fatal(err)
		}
		got := map[string]int64{}
		for _, g := range gws {
			got[g.ID] = g.Sessions
		}
		if got[gwA] != a || got[gwB] != b {
			t.Errorf("%s: sessions %v, want %s %d and %s %d", what, got, gwA, a, gwB, b)
		}
		if err := checkScans(e.ctx, e.store); err != nil {
			t.Errorf("%s: %v", what, err)
		}
	}
	d0, d1 := devicesIn(t, 2, 0, 2, "hold"), devicesIn(t, 2, 1, 2, "hold")
	e.apply(batch(gwA, 1, wr(d0[0], "coap/default", gateway.Connect, 0), wr(d0[1], "s1", gateway.Connect, 0), wr(d0[1], "s2", gateway.Connect, 0)))
	e.apply(batch(gwB, 1, wr(d1[0], "coap/default", gateway.Connect, 0), wr(d1[1], "s1", gateway.Connect, 0)))
	held("connects", 3, 2)
	e.apply(batch(gwA, 1, wr(d0[0], "coap/default", gateway.Renew, 0), wr(d0[1], "s1", gateway.Renew, 0)))
	held("renewals", 3, 2)
	e.clock.Advance(time.Second)
	e.apply(batch(gwB, 1, wr(d0[0], "coap/default", gateway.Renew, 0)))
	held("a CoAP session renewed through the other gateway", 2, 3)
	e.apply(batch(gwA, 1, wr(d0[1], "s2", gateway.Leave, 0)))
	held("a leave of one of two sessions", 1, 3)
	if _, err := e.store.Forget(e.ctx, d1[1], gwA); err != nil {
		t.Fatal(err)
	}
	held("a forget", 1, 2)
	e.clock.Advance(lease)
	e.apply(batch(gwA, 1, wr(d0[1], "s1", gateway.Connect, 0)))
	held("an expiry by a write, and the connect after it", 1, 2)
	for s := range 2 {
		for i := 0; e.reap(s, 10).More; i++ {
			if i > 8 {
				t.Fatalf("Reap(%d) still reports More", s)
			}
		}
	}
	held("reaped", 1, 0)
}
