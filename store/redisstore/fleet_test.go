package redisstore

import (
	"fmt"
	"slices"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/fleetgate/fleetgate/gateway"
)

func (e *env) wantCounts(what string, online, offline int64) {
	e.t.Helper()
	got, err := e.store.Counts(e.ctx, 0)
	if err != nil {
		e.t.Fatalf("%s: Counts: %v", what, err)
	}
	if want := (gateway.Counts{Online: online, Offline: offline}); got != want {
		e.t.Fatalf("%s: Counts = %+v, want %+v", what, got, want)
	}
}

// TestCountsOfAnOlderStore: shards written without the online count (a
// store of an older release, or one whose count an operator deleted to
// have it recounted) are counted by the first Counts, in one pass, which
// keeps the count from then on; the count field is never listed as a
// device.
func TestCountsOfAnOlderStore(t *testing.T) {
	forBackends(t, func(t *testing.T, c redis.UniversalClient) {
		e := newEnv(t, c, 2)
		a, b := devicesIn(t, 2, 0, 2, "old"), devicesIn(t, 2, 1, 1, "old")
		e.apply(0, batch("gw-a", 1, write(a[0], "s1", gateway.Connect, 0), write(a[1], "s1", gateway.Connect, 0)))
		e.apply(1, batch("gw-a", 1, write(b[0], "s1", gateway.Connect, 0)))
		e.apply(0, batch("gw-a", 1, write(a[1], "s1", gateway.Leave, 0)))
		for s := range 2 {
			if n, err := c.HExists(e.ctx, e.store.keys[s].data[1], "~on").Result(); err != nil || n {
				t.Fatalf("shard %d: count field before the first Counts: %v, %v", s, n, err)
			}
		}
		e.wantCounts("first Counts", 2, 1)
		for s := range 2 {
			if n, err := c.HExists(e.ctx, e.store.keys[s].data[1], "~on").Result(); err != nil || !n {
				t.Fatalf("shard %d: no count field after the first Counts: %v, %v", s, n, err)
			}
		}
		e.apply(0, batch("gw-a", 1, write(a[0], "s1", gateway.Leave, 0)))
		e.wantCounts("after a leave", 1, 2)

		page, err := e.store.List(e.ctx, gateway.ListQuery{Limit: 100})
		if err != nil {
			t.Fatal(err)
		}
		if len(page.Devices) != 3 || page.Next != "" {
			t.Fatalf("List: %d devices (next %q), want the 3 devices", len(page.Devices), page.Next)
		}
		if _, err := e.store.Device(e.ctx, "~on"); err == nil {
			t.Fatal("Device(~on) found the count field")
		}

		// deleting the field has it recounted
		if err := c.HDel(e.ctx, e.store.keys[0].data[1], "~on").Err(); err != nil {
			t.Fatal(err)
		}
		e.wantCounts("recounted", 1, 2)
	})
}

// gatewayStates is Gateways as "id epoch lost|heard behind?" lines.
func gatewayStates(e *env) []string {
	e.t.Helper()
	gws, err := e.store.Gateways(e.ctx)
	if err != nil {
		e.t.Fatalf("Gateways: %v", err)
	}
	var out []string
	for _, g := range gws {
		s := fmt.Sprintf("%s %d heard", g.ID, g.Epoch)
		if g.Lost {
			s = fmt.Sprintf("%s %d lost", g.ID, g.Epoch)
		}
		if g.Behind {
			s += " behind"
		}
		out = append(out, s)
	}
	return out
}

// Gateways tells a gateway the reap reported lost until it calls again,
// and one whose last call said its outbox still held writes.
func TestGatewaysLostAndBehind(t *testing.T) {
	forBackends(t, func(t *testing.T, c redis.UniversalClient) {
		e := newGraceEnv(t, c)
		e.apply(0, leased("gw-a", false, write("dev-1", "s", gateway.Connect, 0)))
		e.apply(0, leased("gw-b", false, write("dev-2", "s", gateway.Connect, 0)))
		for range 3 {
			e.clock.Advance(testLease / 2)
			e.apply(0, leased("gw-b", true))
			e.reap(0, 10)
		}
		if got := gatewayStates(e); !slices.Equal(got, []string{"gw-a 1 lost", "gw-b 1 heard behind"}) {
			t.Fatalf("after gw-a's silence: %q", got)
		}
		e.apply(0, leased("gw-a", false))
		e.apply(0, leased("gw-b", false))
		e.reap(0, 10)
		if got := gatewayStates(e); !slices.Equal(got, []string{"gw-a 1 heard", "gw-b 1 heard"}) {
			t.Fatalf("after gw-a wrote again: %q", got)
		}
		checkGatewayEvents(t, e.allEvents(0), "gw-a lost", "gw-a back")
	})
}

// checkGatewayEvents checks that the gateway events of log are want
// ("gw state"), each with its contact, each gateway's vers rising.
func checkGatewayEvents(t *testing.T, log []gateway.Event, want ...string) {
	t.Helper()
	var got []string
	last := map[string]uint64{}
	for _, ev := range log {
		if !ev.IsGateway() {
			continue
		}
		got = append(got, ev.Gateway+" "+string(ev.State))
		if ev.Ver <= last[ev.Gateway] || ev.Contact.IsZero() || ev.Contact.After(ev.At) {
			t.Fatalf("gateway event %+v after ver %d", ev, last[ev.Gateway])
		}
		last[ev.Gateway] = ev.Ver
	}
	if !slices.Equal(got, want) {
		t.Fatalf("gateway events %q, want %q", got, want)
	}
}
