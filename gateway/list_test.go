package gateway_test

import (
	"errors"
	"fmt"
	"slices"
	"testing"

	"pgregory.net/rapid"

	"github.com/fleetgate/fleetgate/gateway"
)

func TestListCursor(t *testing.T) {
	for _, c := range []struct {
		o gateway.ListOrder
		k gateway.ListKey
		s string
	}{
		{gateway.OrderID, gateway.ListKey{Device: "pump-1"}, "id:pump-1"},
		{gateway.OrderID, gateway.ListKey{Device: "a:b"}, "id:a:b"},
		{gateway.OrderChanged, gateway.ListKey{Since: 1893456000000, Device: "a:b"}, "changed:1893456000000:a:b"},
		{gateway.OrderChanged, gateway.ListKey{Since: 0, Device: "x"}, "changed:0:x"},
	} {
		if got := c.o.Cursor(c.k); got != c.s {
			t.Errorf("%s Cursor(%+v) = %q, want %q", c.o, c.k, got, c.s)
		}
		if got, err := gateway.ParseListCursor(c.o, c.s); err != nil || got != c.k {
			t.Errorf("ParseListCursor(%s, %q) = %+v, %v; want %+v", c.o, c.s, got, err, c.k)
		}
	}
	for _, c := range []struct {
		o gateway.ListOrder
		s string
	}{
		{gateway.OrderID, ""}, {gateway.OrderID, "id:"}, {gateway.OrderID, "changed:1:x"}, {gateway.OrderID, "id:a b"},
		{gateway.OrderChanged, "id:x"}, {gateway.OrderChanged, "changed:1"}, {gateway.OrderChanged, "changed::x"},
		{gateway.OrderChanged, "changed:-1:x"}, {gateway.OrderChanged, "changed:01:x"}, {gateway.OrderChanged, "changed:+1:x"},
		{gateway.OrderChanged, "changed:99999999999999999999:x"}, {gateway.OrderChanged, "changed:1:"},
	} {
		if k, err := gateway.ParseListCursor(c.o, c.s); !errors.Is(err, gateway.ErrBadQuery) {
			t.Errorf("ParseListCursor(%s, %q) = %+v, %v; want ErrBadQuery", c.o, c.s, k, err)
		}
	}
}

// A cursor from outside never crashes ParseListCursor, and what it
// accepts it writes back the same.
func FuzzParseListCursor(f *testing.F) {
	f.Add("changed", "changed:1893456000000:pump-1")
	f.Add("id", "id:pump-1")
	f.Add("changed", "changed:0:a:b")
	f.Add("id", "id:")
	f.Add("changed", "changed:007:x")
	f.Fuzz(func(t *testing.T, o, s string) {
		order := gateway.ListOrder(o)
		k, err := gateway.ParseListCursor(order, s)
		if err != nil {
			if !errors.Is(err, gateway.ErrBadQuery) {
				t.Errorf("ParseListCursor(%q, %q): %v, not ErrBadQuery", o, s, err)
			}
			return
		}
		if got := order.Cursor(k); got != s {
			t.Errorf("ParseListCursor(%q, %q) = %+v, written back %q", o, s, k, got)
		}
	})
}

func TestListQueryCheck(t *testing.T) {
	o, limit, after, err := gateway.ListQuery{}.Check(1000)
	if o != gateway.OrderID || limit != 100 || after != nil || err != nil {
		t.Errorf("Check of the zero query = %s, %d, %v, %v", o, limit, after, err)
	}
	if _, limit, _, _ := (gateway.ListQuery{Limit: 5000}).Check(1000); limit != 1000 {
		t.Errorf("limit 5000 bounded to %d, want 1000", limit)
	}
	_, _, after, err = gateway.ListQuery{Order: gateway.OrderChanged, Cursor: "changed:5:d"}.Check(1000)
	if err != nil || *after != (gateway.ListKey{Since: 5, Device: "d"}) {
		t.Errorf("Check of a cursor: %v, %v", after, err)
	}
	for _, q := range []gateway.ListQuery{
		{Order: "size"}, {State: gateway.Suspect}, {Order: gateway.OrderChanged, Prefix: "a"}, {Prefix: "a/b"}, {Cursor: "changed:1:a"},
	} {
		if _, _, _, err := q.Check(1000); !errors.Is(err, gateway.ErrBadQuery) {
			t.Errorf("Check(%+v) = %v, want ErrBadQuery", q, err)
		}
	}
}

func TestMergeListRuns(t *testing.T) {
	k := func(d string) gateway.ListKey { return gateway.ListKey{Device: gateway.DeviceID(d)} }
	keys := func(ds ...string) []gateway.ListKey {
		var out []gateway.ListKey
		for _, d := range ds {
			out = append(out, k(d))
		}
		return out
	}
	for _, c := range []struct {
		name  string
		runs  []gateway.ListRun
		limit int
		want  []gateway.ListKey
		next  *gateway.ListKey
	}{
		{"all read", []gateway.ListRun{{Keys: keys("b", "d")}, {Keys: keys("a", "c")}}, 10, keys("a", "b", "c", "d"), nil},
		{"over the limit", []gateway.ListRun{{Keys: keys("b", "d")}, {Keys: keys("a", "c")}}, 3, keys("a", "b", "c"), new(k("c"))},
		{"a full run bounds the page", []gateway.ListRun{{Keys: keys("a", "b"), More: true, Bound: k("b")}, {Keys: keys("c")}}, 2, keys("a", "b"), new(k("b"))},
		{"a run that spent its budget", []gateway.ListRun{{Keys: keys("c"), More: true, Bound: k("m")}, {Keys: keys("a", "n", "x")}}, 10, keys("a", "c"), new(k("m"))},
		{"nothing read yet", []gateway.ListRun{{More: true, Bound: k("m")}, {Keys: keys("n")}}, 10, nil, new(k("m"))},
		{"empty", nil, 10, nil, nil},
	} {
		got, next := gateway.MergeListRuns(gateway.OrderID, c.runs, c.limit)
		if !slices.Equal(got, c.want) || fmt.Sprint(next) != fmt.Sprint(c.next) {
			t.Errorf("%s: %v, next %v; want %v, next %v", c.name, got, next, c.want, c.next)
		}
	}
	// by last change: newest first, ties by ID descending
	got, _ := gateway.MergeListRuns(gateway.OrderChanged, []gateway.ListRun{
		{Keys: []gateway.ListKey{{Since: 9, Device: "a"}, {Since: 5, Device: "z"}}},
		{Keys: []gateway.ListKey{{Since: 9, Device: "b"}, {Since: 7, Device: "a"}}},
	}, 10)
	if want := []gateway.ListKey{{Since: 9, Device: "b"}, {Since: 9, Device: "a"}, {Since: 7, Device: "a"}, {Since: 5, Device: "z"}}; !slices.Equal(got, want) {
		t.Errorf("by change: %v, want %v", got, want)
	}
}

// Paging through sources that each read at most limit keys, and stop
// early when a random budget runs out, with MergeListRuns gives every
// key once, in order, whatever the limit.
func TestMergeListRunsPagesEverything(t *testing.T) {
	rapid.Check(t, func(rt *rapid.T) {
		order := rapid.SampledFrom([]gateway.ListOrder{gateway.OrderID, gateway.OrderChanged}).Draw(rt, "order")
		n := rapid.IntRange(1, 5).Draw(rt, "sources")
		sources := make([][]gateway.ListKey, n)
		var all []gateway.ListKey
		dropped := map[gateway.ListKey]bool{}
		for i, id := range rapid.SliceOfDistinct(rapid.StringMatching(`[a-f]{1,3}`), rapid.ID[string]).Draw(rt, "ids") {
			key := gateway.ListKey{Since: int64(rapid.IntRange(0, 3).Draw(rt, "since")), Device: gateway.DeviceID(id)}
			if order == gateway.OrderID {
				key.Since = 0
			}
			s := i % n
			sources[s] = append(sources[s], key)
			// a filter drops some keys, as a state filter does
			if rapid.IntRange(0, 3).Draw(rt, "filtered") > 0 {
				all = append(all, key)
			} else {
				dropped[key] = true
			}
		}
		for _, src := range sources {
			slices.SortFunc(src, order.Compare)
		}
		slices.SortFunc(all, order.Compare)
		limit := rapid.IntRange(1, 4).Draw(rt, "limit")
		var got []gateway.ListKey
		var after *gateway.ListKey
		for page := 0; ; page++ {
			if page > 4*len(all)+4 {
				rt.Fatalf("no end after %d pages", page)
			}
			var runs []gateway.ListRun
			for _, src := range sources {
				var run gateway.ListRun
				budget := rapid.IntRange(1, limit+2).Draw(rt, "budget")
				for _, key := range src {
					if after != nil && order.Compare(key, *after) <= 0 {
						continue
					}
					if len(run.Keys) == limit || budget == 0 {
						run.More = true
						break
					}
					budget--
					run.Bound = key
					if !dropped[key] {
						run.Keys = append(run.Keys, key)
					}
				}
				runs = append(runs, run)
			}
			keys, next := gateway.MergeListRuns(order, runs, limit)
			if len(keys) > limit {
				rt.Fatalf("a page of %d keys, limit %d", len(keys), limit)
			}
			got = append(got, keys...)
			if next == nil {
				break
			}
			after = next
		}
		if !slices.Equal(got, all) {
			rt.Fatalf("paged %v, want %v", got, all)
		}
	})
}

func TestSessionProtocol(t *testing.T) {
	for id, want := range map[gateway.SessionID]string{
		"gw-1/1796078834/7": "mqtt", "gw-1/mqtt": "mqtt", "coap/default": "coap", "coap/s2": "coap",
		"lorawan/default": "lorawan", "modbus/unit-3": "modbus", "gw-1/x/7": "", "a/b/c/d": "", "nosl": "", "/x": "", "x/": "",
	} {
		if got := gateway.SessionProtocol(id); got != want {
			t.Errorf("SessionProtocol(%q) = %q, want %q", id, got, want)
		}
	}
}
