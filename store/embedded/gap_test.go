package embedded

import (
	"context"
	"testing"
	"time"

	"github.com/fleetgate/fleetgate/gateway"
)

// A gap in the reaps longer than Options.ReapGap (the process or its host
// stopped: the gateway's flushes stopped with the runner) is an outage
// that ends at the next reap: a device whose gateway's coverage has not
// reached its deadline waits for the grace counted from then, not from
// its deadline, and the gateway's evidence written after it keeps the
// device online with no event. Reaps on time leave such a device to go,
// gateway_lost, at the end of its grace as before.
func TestReapGap(t *testing.T) {
	const grace, gapMax = 20 * time.Second, 2 * time.Second
	ctx := context.Background()
	covered := func(ws ...gateway.Write) gateway.Batch {
		b := batch("gw-a", 1, ws...)
		b.Covers = true
		return b
	}
	start := func(t *testing.T) (*fixture, gateway.DeviceID) {
		f := newFixture(t, Options{Shards: 1, GatewayGrace: grace, GatewayRecheck: time.Second, ReapGap: gapMax})
		d := deviceIn("gap", 0, 1, 0)
		if evs := f.apply(0, covered(connect(d, "a", 0))); len(evs) != 1 {
			t.Fatalf("connect: %+v", evs)
		}
		if _, err := f.s.Reap(ctx, 0, 10); err != nil {
			t.Fatal(err)
		}
		return f, d
	}
	reap := func(t *testing.T, f *fixture) gateway.ReapResult {
		t.Helper()
		r, err := f.s.Reap(ctx, 0, 10)
		if err != nil {
			t.Fatal(err)
		}
		return r
	}

	// renewedOnline: the gateway's renewal of d, written after the gap,
	// and the reap after it change nothing: d stays online.
	renewedOnline := func(t *testing.T, f *fixture, d gateway.DeviceID) {
		t.Helper()
		if evs := f.apply(0, covered(renew(d, "a", 0))); len(evs) != 0 {
			t.Fatalf("renewal after the gap wrote %+v", evs)
		}
		if r := reap(t, f); len(r.Offline) != 0 {
			t.Fatalf("reap after the renewal: %+v", r)
		}
		if info := f.device(d); info.State != gateway.Online {
			t.Fatalf("device %+v, want online", info)
		}
	}

	t.Run("frozen past lease and grace", func(t *testing.T) {
		f, d := start(t)
		f.clk.Set(t0.Add(lease + grace + 5*time.Second))
		if r := reap(t, f); len(r.Offline) != 0 || r.Held != 1 || !r.Gap {
			t.Fatalf("first reap after the gap: %+v, want the device waiting and the gap reported", r)
		}
		f.clk.Advance(time.Second)
		if r := reap(t, f); len(r.Offline) != 0 || r.Gap {
			t.Fatalf("reap a second after the gap: %+v, want the device still waiting and no new gap", r)
		}
		renewedOnline(t, f, d)
	})

	t.Run("gateway writes before the first reap after the gap", func(t *testing.T) {
		f, d := start(t)
		f.clk.Set(t0.Add(lease + grace + 5*time.Second))
		renewedOnline(t, f, d)
	})

	t.Run("gateway silent, reaps on time", func(t *testing.T) {
		f, _ := start(t)
		end := t0.Add(lease + grace)
		for f.clk.Now().Add(time.Second).Before(end) {
			f.clk.Advance(time.Second)
			if r := reap(t, f); len(r.Offline) != 0 || r.Gap {
				t.Fatalf("reap at %v, before the grace ended: %+v, want nothing (and no gap)", f.clk.Now().Sub(t0), r)
			}
		}
		f.clk.Set(end)
		r := reap(t, f)
		if len(r.Offline) != 1 || r.Offline[0].Reason != gateway.ReasonGatewayLost {
			t.Fatalf("reap at the end of the grace: %+v, want gateway_lost", r)
		}
	})
}
