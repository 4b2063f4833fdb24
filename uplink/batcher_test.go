package uplink

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"pgregory.net/rapid"

	"github.com/fleetgate/fleetgate/gateway"
)

var t0 = time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)

func at(sec int) time.Time { return t0.Add(time.Duration(sec) * time.Second) }

type ev struct {
	k   gateway.Kind
	sec int
}

type wr struct {
	k   gateway.Kind
	sec int
}

func slotWrites(s slot) []wr {
	var out []wr
	for _, tw := range appendWrites(nil, []item{{key{"d", "s"}, s}}) {
		out = append(out, wr{tw.w.Kind, int(tw.at.Sub(t0) / time.Second)})
	}
	return out
}

func TestSlotCoalescing(t *testing.T) {
	C, R, L := gateway.Connect, gateway.Renew, gateway.Leave
	cases := []struct {
		name string
		in   []ev
		want []wr
	}{
		{"newest renew wins", []ev{{R, 1}, {R, 2}, {R, 3}}, []wr{{R, 3}}},
		{"connect stays connect", []ev{{C, 1}, {R, 5}}, []wr{{C, 5}}},
		{"late connect upgrades", []ev{{R, 5}, {C, 1}}, []wr{{C, 5}}},
		{"visit kept", []ev{{C, 1}, {L, 2}}, []wr{{C, 1}, {L, 2}}},
		{"visit with renewals", []ev{{C, 1}, {R, 2}, {L, 3}}, []wr{{C, 2}, {L, 3}}},
		{"leave kept before later connect", []ev{{R, 1}, {L, 2}, {C, 3}, {R, 4}}, []wr{{L, 2}, {C, 4}}},
		{"visit then a new visit", []ev{{C, 1}, {L, 2}, {R, 3}}, []wr{{L, 2}, {C, 3}}},
		{"renew after leave", []ev{{L, 2}, {R, 3}}, []wr{{L, 2}, {R, 3}}},
		{"late evidence before the leave is a visit", []ev{{L, 5}, {R, 3}}, []wr{{R, 3}, {L, 5}}},
		{"leave then a visit becomes the visit", []ev{{L, 2}, {C, 3}, {L, 4}}, []wr{{C, 3}, {L, 4}}},
		{"second leave extends the visit", []ev{{C, 1}, {L, 2}, {L, 4}}, []wr{{C, 1}, {L, 4}}},
		{"older leave ignored", []ev{{C, 1}, {L, 4}, {L, 2}}, []wr{{C, 1}, {L, 4}}},
		{"old leave after newer connect", []ev{{C, 5}, {L, 3}}, []wr{{L, 3}, {C, 5}}},
		{"evidence older than leave, kind after it", []ev{{L, 3}, {C, 5}, {R, 1}}, []wr{{L, 3}, {C, 5}}},
		{"tie: connect then leave is a visit", []ev{{C, 3}, {L, 3}}, []wr{{C, 3}, {L, 3}}},
		{"tie: leave then connect", []ev{{L, 3}, {C, 3}}, []wr{{L, 3}, {C, 3}}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var s slot
			for _, e := range c.in {
				s.add(e.k, at(e.sec), 0)
			}
			got := slotWrites(s)
			if len(got) != len(c.want) || s.n() != len(c.want) {
				t.Fatalf("writes %v (n=%d), want %v", got, s.n(), c.want)
			}
			for i := range got {
				if got[i] != c.want[i] {
					t.Fatalf("writes %v, want %v", got, c.want)
				}
			}
			// Merging the slot into an empty one, or splitting the input
			// in two slots and merging them, gives the same writes.
			var m slot
			m.merge(s)
			if g := slotWrites(m); len(g) != len(got) || (len(g) > 0 && g[len(g)-1] != got[len(got)-1]) {
				t.Fatalf("merged %v, want %v", g, got)
			}
			var a, b slot
			for i, e := range c.in {
				if i < len(c.in)/2 {
					a.add(e.k, at(e.sec), 0)
				} else {
					b.add(e.k, at(e.sec), 0)
				}
			}
			a.merge(b)
			if g := slotWrites(a); len(g) != len(got) || g[len(g)-1] != got[len(got)-1] {
				t.Fatalf("split and merged %v, want %v", g, got)
			}
		})
	}
}

func TestWritesOrderedByObservation(t *testing.T) {
	items := []item{
		{key{"d", "a"}, slot{kind: gateway.Renew, at: at(5)}},
		{key{"d", "b"}, slot{leave: at(1), kind: gateway.Connect, at: at(7)}},
		{key{"e", "c"}, slot{leave: at(3)}},
	}
	tws := appendWrites(nil, items)
	ws := withAges(tws, at(10))
	want := []struct {
		s   gateway.SessionID
		k   gateway.Kind
		age time.Duration
	}{{"b", gateway.Leave, 9 * time.Second}, {"c", gateway.Leave, 7 * time.Second}, {"a", gateway.Renew, 5 * time.Second}, {"b", gateway.Connect, 3 * time.Second}}
	if len(ws) != len(want) {
		t.Fatalf("got %d writes, want %d", len(ws), len(want))
	}
	for i, w := range want {
		if ws[i].Session != w.s || ws[i].Kind != w.k || ws[i].Age != w.age {
			t.Fatalf("write %d = %+v, want %+v", i, ws[i], w)
		}
	}
	if got := withAges(tws, at(0)); got[0].Age != 0 {
		t.Fatalf("age of future evidence %v, want 0", got[0].Age)
	}
}

func TestQueueBoundAndTake(t *testing.T) {
	q := newQueue()
	add := func(d gateway.DeviceID, k gateway.Kind, sec int) bool {
		ok, _ := q.tryAdd(gateway.Evidence{Device: d, Session: "s", Kind: k, ObservedAt: at(sec)}, 3)
		return ok
	}
	for i, d := range []gateway.DeviceID{"a", "b", "c"} {
		if !add(d, gateway.Renew, i) {
			t.Fatalf("add %s refused below the limit", d)
		}
	}
	if add("d", gateway.Renew, 4) {
		t.Fatal("new session accepted over the limit")
	}
	if !add("a", gateway.Renew, 5) {
		t.Fatal("coalescing into a pending session refused at the limit")
	}
	if add("a", gateway.Leave, 6) && q.pending() > 3 {
		t.Fatal("pending grew over the limit")
	}
	_, space := q.tryAdd(gateway.Evidence{Device: "d", Session: "s", Kind: gateway.Renew, ObservedAt: at(7)}, 3)
	items, n := q.take(2, time.Time{}, 0)
	if n != 2 || len(items) != 2 || items[0].device != "a" || items[1].device != "b" {
		t.Fatalf("take(2) = %v (%d writes), want a, b", items, n)
	}
	select {
	case <-space:
	default:
		t.Fatal("take did not signal space")
	}
	if q.pending() != 1 {
		t.Fatalf("pending %d after take, want 1", q.pending())
	}
	q.requeue(items)
	if q.pending() != 3 {
		t.Fatalf("pending %d after requeue, want 3", q.pending())
	}
}

// peek shows every pending session with a copy of its slot, in arrival
// order, and takes nothing.
func TestQueuePeek(t *testing.T) {
	q := newQueue()
	for _, ev := range []gateway.Evidence{
		{Device: "b", Session: "s", Kind: gateway.Connect, ObservedAt: at(0)},
		{Device: "a", Session: "s", Kind: gateway.Renew, ObservedAt: at(1)},
		{Device: "b", Session: "s", Kind: gateway.Leave, ObservedAt: at(2)},
	} {
		if ok, _ := q.tryAdd(ev, 10); !ok {
			t.Fatalf("add %v refused below the limit", ev)
		}
	}
	items := q.peek()
	if len(items) != 2 || items[0].device != "b" || items[1].device != "a" || !items[0].leave.Equal(at(2)) {
		t.Fatalf("peek = %+v, want b (with its leave at 2 s), a", items)
	}
	items[0].leave = time.Time{}
	if q.pending() != 3 {
		t.Fatalf("pending %d after peek, want 3", q.pending())
	}
	if again := q.peek(); !again[0].leave.Equal(at(2)) {
		t.Fatalf("changing what peek returned changed the queue: %+v", again[0])
	}
}

func TestEnqueueRefusesUnknownKind(t *testing.T) {
	u, _ := newEmbeddedUplink(t, Options{})
	err := u.Enqueue(context.Background(), gateway.Evidence{Device: "d", Session: "s", Kind: 9, ObservedAt: t0})
	if err == nil || errors.Is(err, gateway.ErrOverloaded) {
		t.Fatalf("Enqueue(kind 9) = %v, want a plain error", err)
	}
}

func TestBackoffBounds(t *testing.T) {
	u, _ := newEmbeddedUplink(t, Options{ProbeMin: 100 * time.Millisecond, ProbeMax: 10 * time.Second})
	for n, want := range []time.Duration{100 * time.Millisecond, 200 * time.Millisecond, 400 * time.Millisecond} {
		for range 20 {
			if d := u.backoff(n); d < want/2 || d > want {
				t.Fatalf("backoff(%d) = %v, want in [%v, %v]", n, d, want/2, want)
			}
		}
	}
	for _, n := range []int{7, 8, 64, 1 << 20} {
		if d := u.backoff(n); d < 5*time.Second || d > 10*time.Second {
			t.Fatalf("backoff(%d) = %v, want in [5s, 10s]", n, d)
		}
	}
}

// TestCoalescingKeepsStoreOutcome checks, against a model of the store's
// per-session semantics (gateway/store.go), that sending a session's
// coalesced writes leaves the session exactly as sending every piece of
// its evidence one by one would, whatever the session held before.
func TestCoalescingKeepsStoreOutcome(t *testing.T) {
	const lease = 10
	// apply is the store's rule for one write at time now; d is the
	// session's deadline, 0 when it holds none.
	apply := func(d, now int, k gateway.Kind, observed int) int {
		if d <= now {
			d = 0
		}
		switch k {
		case gateway.Leave:
			if d != 0 && d <= observed+lease {
				d = 0
			}
		default:
			if nd := observed + lease; nd > now {
				d = max(d, nd)
			}
		}
		return d
	}
	rapid.Check(t, func(rt *rapid.T) {
		now := rapid.IntRange(0, 40).Draw(rt, "now")
		initial := 0
		if rapid.Bool().Draw(rt, "live before") {
			initial = rapid.IntRange(now+1, now+2*lease).Draw(rt, "initial deadline")
		}
		n := rapid.IntRange(1, 8).Draw(rt, "evidence")
		kinds := rapid.SliceOfN(rapid.SampledFrom([]gateway.Kind{gateway.Connect, gateway.Renew, gateway.Leave}), n, n).Draw(rt, "kinds")
		times := rapid.SliceOfN(rapid.IntRange(0, 40), n, n).Draw(rt, "times")
		slices.Sort(times) // one gateway observes a session's evidence in order

		// onlines counts the writes that open the session (an online
		// event when it is the device's only one).
		full, coalesced := initial, initial
		fullOn, coalescedOn := 0, 0
		var s slot
		for i, k := range kinds {
			next := apply(full, now, k, times[i])
			if full == 0 && next != 0 {
				fullOn++
			}
			full = next
			s.add(k, at(times[i]), 0)
		}
		writes := slotWrites(s)
		if len(writes) > 2 {
			rt.Fatalf("%d coalesced writes", len(writes))
		}
		for _, w := range writes {
			next := apply(coalesced, now, w.k, w.sec)
			if coalesced == 0 && next != 0 {
				coalescedOn++
			}
			coalesced = next
		}
		if full != coalesced {
			rt.Fatalf("deadline %d after every write, %d after the coalesced writes %v", full, coalesced, writes)
		}
		// A visit is never erased: if the session was opened by some
		// evidence, the coalesced writes open it too, unless it was live
		// before (visits may merge, with each other and with the presence
		// the session already had).
		if (initial == 0 && (fullOn > 0) != (coalescedOn > 0)) || coalescedOn > fullOn {
			rt.Fatalf("session opened %d times by every write, %d times by the coalesced writes %v", fullOn, coalescedOn, writes)
		}
		// The outbox keeps the same writes.
		r, err := decodeRecord([]byte("d\x00s"), encodeRecord(s, testBoot, 1))
		if s.n() > 0 {
			if err != nil {
				rt.Fatalf("decode: %v", err)
			}
			if got := slotWrites(r.slot); !slices.Equal(got, writes) {
				rt.Fatalf("outbox round trip %v, want %v", got, writes)
			}
		}
	})
}

// A slot that merged two connects or renews says so (they stand for
// several observations, gateway.Write.Coalesced); one observation, or a
// visit and a leave, does not; merge keeps the mark.
func TestSlotMerged(t *testing.T) {
	C, R, L := gateway.Connect, gateway.Renew, gateway.Leave
	for _, c := range []struct {
		in   []ev
		want bool
	}{
		{[]ev{{R, 1}}, false},
		{[]ev{{C, 1}, {L, 2}}, false},
		{[]ev{{L, 2}, {R, 3}}, false},
		{[]ev{{R, 1}, {R, 2}}, true},
		{[]ev{{C, 1}, {R, 2}, {L, 3}}, true},
	} {
		var s slot
		for _, e := range c.in {
			s.add(e.k, at(e.sec), 0)
		}
		if s.merged != c.want {
			t.Errorf("%v: merged %v, want %v", c.in, s.merged, c.want)
		}
		var m slot
		m.merge(s)
		if m.merged != c.want {
			t.Errorf("%v merged into an empty slot: merged %v, want %v", c.in, m.merged, c.want)
		}
	}
}
