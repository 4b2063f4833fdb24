package embedded

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/fleetgate/fleetgate/gateway"
)

// gatewayLog is the gateway events of shard 0's log as "gw state" lines,
// checking that each has its contact and that each gateway's vers rise.
func (f *fixture) gatewayLog() []string {
	f.t.Helper()
	var out []string
	last := map[string]uint64{}
	for _, e := range f.allEvents(0) {
		if !e.IsGateway() {
			continue
		}
		if e.Ver <= last[e.Gateway] || e.Contact.IsZero() || e.Contact.After(e.At) || e.Shard != 0 {
			f.t.Fatalf("gateway event %+v after ver %d", e, last[e.Gateway])
		}
		last[e.Gateway] = e.Ver
		out = append(out, e.Gateway+" "+string(e.State))
	}
	return out
}

func (f *fixture) reapAll() {
	f.t.Helper()
	for n := range f.opts.Shards {
		if _, err := f.s.Reap(context.Background(), n, 100); err != nil {
			f.t.Fatalf("Reap(%d): %v", n, err)
		}
	}
}

// lostGateways is the IDs that Gateways reports lost.
func (f *fixture) lostGateways() []string {
	f.t.Helper()
	gws, err := f.s.Gateways(context.Background())
	if err != nil {
		f.t.Fatal(err)
	}
	var out []string
	for _, g := range gws {
		if g.Lost {
			out = append(out, g.ID)
		}
	}
	return out
}

// A gateway not heard for GatewayLost gets one lost event in shard 0's
// log (however often the reap runs), one back event when it calls again;
// the time the store was closed counts from its opening, and Gateways
// reports the gateways with their contact.
func TestGatewayEvents(t *testing.T) {
	const lost = 10 * time.Second
	f := newFixture(t, Options{Shards: 2, GatewayLost: lost})
	d := deviceIn("gwev", 1, 2, 0)
	f.apply(1, batch("gw-a", 1, connect(d, "s1", 0)))
	f.apply(0, batch("gw-a", 1))
	f.apply(0, batch("gw-b", 3))
	for range 3 {
		f.clk.Advance(lost / 2)
		f.apply(0, batch("gw-b", 3))
		f.reapAll()
	}
	if got := f.gatewayLog(); !slices.Equal(got, []string{"gw-a lost"}) {
		t.Fatalf("after gw-a's silence of 1.5 × GatewayLost: %q, want one lost", got)
	}
	if lost := f.lostGateways(); !slices.Equal(lost, []string{"gw-a"}) {
		t.Fatalf("Gateways reports %q lost, want gw-a, as its lost event says", lost)
	}
	f.apply(0, batch("gw-a", 2))
	f.reapAll()
	f.reapAll()
	if got := f.gatewayLog(); !slices.Equal(got, []string{"gw-a lost", "gw-a back"}) {
		t.Fatalf("after gw-a called again: %q, want lost, back", got)
	}
	gws, err := f.s.Gateways(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if len(gws) != 2 || gws[0].ID != "gw-a" || gws[0].Epoch != 2 || !gws[0].Contact.Equal(f.clk.Now()) ||
		gws[1].ID != "gw-b" || gws[1].Epoch != 3 || gws[0].Lost || gws[1].Lost {
		t.Fatalf("Gateways = %+v", gws)
	}

	// closed for longer than GatewayLost: counted from the opening
	f.clk.Advance(3 * lost)
	f.reopen()
	f.reapAll()
	if got := f.gatewayLog(); len(got) != 2 {
		t.Fatalf("right after a reopen: %q, want nothing new", got)
	}
	f.clk.Advance(lost + time.Millisecond)
	f.reapAll()
	if got := f.gatewayLog(); !slices.Equal(got, []string{"gw-a lost", "gw-a back", "gw-a lost", "gw-b lost"}) {
		t.Fatalf("GatewayLost after the reopen: %q", got)
	}
	if lost := f.lostGateways(); !slices.Equal(lost, []string{"gw-a", "gw-b"}) {
		t.Fatalf("Gateways reports %q lost after the reopen, want both", lost)
	}
}

func TestLostOrBack(t *testing.T) {
	at := func(v int64) *int64 { return &v }
	for _, tc := range []struct {
		name       string
		contact    int64
		lostAt     *int64
		now, since int64
		want       gateway.State
	}{
		{"heard", 100, nil, 105, 0, ""},
		{"silent exactly the limit", 100, nil, 110, 0, ""},
		{"silent past the limit", 100, nil, 111, 0, gateway.Lost},
		{"opened since", 100, nil, 111, 105, ""},
		{"lost, not heard since", 100, at(100), 200, 0, ""},
		{"lost, heard since", 150, at(100), 200, 0, gateway.Back},
	} {
		got, ok := lostOrBack(tc.contact, tc.lostAt, tc.now, tc.since, 10)
		if got != tc.want || ok != (tc.want != "") {
			t.Errorf("%s: lostOrBack = %q, %v; want %q", tc.name, got, ok, tc.want)
		}
	}
}

// An event of the file, a device's or a gateway's, never crashes its
// decoder, and a gateway event that decodes encodes back to the same
// event.
func FuzzDecodeEvent(f *testing.F) {
	key := eventID{ms: 5, seq: 1}.key()
	dev := gateway.Event{Device: "d", State: gateway.Offline, Ver: 2, At: t0, Reason: gateway.ReasonExpired, Gateway: "gw", Session: "s", Deadline: t0.Add(-time.Second)}
	gw := gateway.Event{State: gateway.Lost, Ver: uint64(t0.UnixMilli()), At: t0, Gateway: "gw-a", Contact: t0.Add(-4 * time.Second)}
	f.Add(encodeEvent(&dev))
	f.Add(encodeEvent(&gw))
	f.Add([]byte{gatewayEventFormat, 0, 1, 0, 0, 0})
	f.Fuzz(func(t *testing.T, b []byte) {
		e, err := decodeEvent(0, key, b)
		if err != nil || !e.IsGateway() {
			return
		}
		again, err := decodeEvent(0, key, encodeEvent(&e))
		if err != nil || fmt.Sprint(again) != fmt.Sprint(e) {
			t.Fatalf("%+v encodes to %+v, %v", e, again, err)
		}
	})
}

func TestGatewayEventRoundTrip(t *testing.T) {
	key := eventID{ms: 5, seq: 1}.key()
	e := gateway.Event{State: gateway.Back, Ver: 9, At: t0, Gateway: "gw-a", Contact: t0.Add(-time.Second)}
	b := encodeEvent(&e)
	got, err := decodeEvent(0, key, b)
	if err != nil || !got.IsGateway() || got.State != gateway.Back || got.Ver != 9 || !got.At.Equal(t0) || got.Gateway != "gw-a" || !got.Contact.Equal(e.Contact) || got.ID != "5-1" {
		t.Fatalf("round trip: %+v, %v", got, err)
	}
	for i := range len(b) {
		if _, err := decodeEvent(0, key, b[:i]); !errors.Is(err, errCorrupt) {
			t.Fatalf("gateway event cut at %d decoded: %v", i, err)
		}
	}
}
