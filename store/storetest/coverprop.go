package storetest

import (
	"slices"
	"testing"
	"time"

	"pgregory.net/rapid"

	"github.com/fleetgate/fleetgate/gateway"
	"github.com/fleetgate/fleetgate/gateway/clocktest"
)

// The coverage property's shape: two gateways, each with its own devices
// (a device's sessions are its gateway's), evidence that waits in the
// gateway until a call delivers it, and calls that are lost, partial, or
// applied while their caller believes they failed.
const (
	coverLease        = 4 * time.Second
	coverDevicesPerGW = 2
	coverMinSteps     = 10
	coverMaxSteps     = 60
)

var coverAdvances = []time.Duration{time.Millisecond, 100 * time.Millisecond, 500 * time.Millisecond,
	time.Second, 3 * time.Second, 5 * time.Second}

// pendingEvidence is evidence a gateway observed and holds to send:
// written is set when a call applied it although its caller believes it
// failed (the gateway sends it again).
type pendingEvidence struct {
	device  gateway.DeviceID
	at      time.Time
	written bool
}

// coverGateway is one gateway of the property: its devices and the
// evidence it holds.
type coverGateway struct {
	name    string
	devices []gateway.DeviceID
	pending []pendingEvidence
}

// checkCoverageProperty: no interleaving of late calls, lost calls,
// partial calls and reaps lets a store report a device offline (reason
// expired) while a gateway holds unwritten evidence of it that would have
// moved its deadline (observed after deadline − lease, at or before the
// deadline), nor with reason gateway_lost before the deadline + the grace
// (invariant 11). And once every gateway has delivered
// everything and the clock passes every deadline + grace, every device
// goes offline (the rule only delays).
func checkCoverageProperty(t *testing.T, open GraceOpener) {
	ids := devicesIn(t, 1, 0, 2*coverDevicesPerGW, "cprop")
	rapid.Check(t, func(rt *rapid.T) {
		clock := clocktest.New(time.UnixMilli(startMs).UTC())
		store := open(t, 1, clock.Now, coverGrace)
		gws := []*coverGateway{
			{name: gwA, devices: ids[:coverDevicesPerGW]},
			{name: gwB, devices: ids[coverDevicesPerGW:]},
		}
		offline := map[gateway.DeviceID]bool{}
		check := func(evs []gateway.Event) {
			if err := checkScans(rt.Context(), store); err != nil {
				rt.Fatal(err)
			}
			for _, e := range evs {
				switch e.State {
				case gateway.Offline:
					offline[e.Device] = true
				case gateway.Online:
					offline[e.Device] = false
					continue
				}
				if e.Reason == gateway.ReasonGatewayLost {
					if e.At.Before(e.Deadline.Add(coverGrace)) {
						rt.Fatalf("%s offline (gateway_lost) at %v, before its deadline %v + the grace", e.Device, e.At, e.Deadline)
					}
					continue
				}
				if e.Reason != gateway.ReasonExpired {
					continue
				}
				for _, g := range gws {
					for _, p := range g.pending {
						if p.device == e.Device && !p.written && !p.at.After(e.Deadline) && p.at.Add(coverLease).After(e.Deadline) {
							rt.Fatalf("%s offline (expired, deadline %v) while %s holds its evidence of %v", e.Device, e.Deadline, g.name, p.at)
						}
					}
				}
			}
		}
		// call writes the first n pending of g in one batch that reports
		// the coverage a gateway would: before the oldest evidence left,
		// and before now (evidence of this very millisecond may come
		// after the call).
		call := func(g *coverGateway, n int) []gateway.Event {
			now := clock.Now()
			cover := now
			if n < len(g.pending) {
				cover = slices.MinFunc(g.pending[n:], func(a, b pendingEvidence) int { return a.at.Compare(b.at) }).at
			}
			cover = cover.Add(-time.Millisecond)
			b := gateway.Batch{Gateway: g.name, Epoch: 1, Lease: coverLease, Covers: true, CoverAge: now.Sub(cover)}
			for _, p := range g.pending[:n] {
				b.Writes = append(b.Writes, gateway.Write{Device: p.device, Session: gateway.SessionID(g.name + "/x"), Kind: gateway.Renew, Age: now.Sub(p.at)})
			}
			res, err := store.Apply(rt.Context(), 0, b)
			if err != nil {
				rt.Fatalf("Apply: %v", err)
			}
			return res.Events
		}
		step := func() {
			g := rapid.SampledFrom(gws).Draw(rt, "gateway")
			switch rapid.SampledFrom([]string{"observe", "observe", "deliver", "partial", "lost", "unacked", "advance", "advance", "reap", "reap"}).Draw(rt, "action") {
			case "observe":
				d := rapid.SampledFrom(g.devices).Draw(rt, "device")
				g.pending = append(g.pending, pendingEvidence{device: d, at: clock.Now()})
			case "deliver":
				evs := call(g, len(g.pending))
				g.pending = nil
				check(evs)
			case "partial":
				n := rapid.IntRange(0, len(g.pending)).Draw(rt, "taken")
				evs := call(g, n)
				g.pending = g.pending[n:]
				check(evs)
			case "lost":
				// the call timed out and was refused as stale: nothing
			case "unacked":
				// applied, but its caller saw a timeout and keeps it all
				n := rapid.IntRange(0, len(g.pending)).Draw(rt, "taken")
				evs := call(g, n)
				for i := range n {
					g.pending[i].written = true
				}
				check(evs)
			case "advance":
				clock.Advance(rapid.SampledFrom(coverAdvances).Draw(rt, "advance"))
			case "reap":
				r, err := store.Reap(rt.Context(), 0, 100)
				if err != nil {
					rt.Fatalf("Reap: %v", err)
				}
				check(r.Offline)
			}
		}
		steps := rapid.IntRange(coverMinSteps, coverMaxSteps).Draw(rt, "steps")
		for range steps {
			step()
		}
		// Everything delivered, then every deadline and grace passes:
		// every device that was ever online goes offline.
		for _, g := range gws {
			evs := call(g, len(g.pending))
			g.pending = nil
			check(evs)
		}
		end := clock.Now().Add(coverLease + coverGrace + 2*CoverRecheck)
		for clock.Now().Before(end) {
			clock.Advance(CoverRecheck / 2)
			for _, g := range gws {
				check(call(g, 0))
			}
			r, err := store.Reap(rt.Context(), 0, 100)
			if err != nil {
				rt.Fatalf("Reap: %v", err)
			}
			check(r.Offline)
		}
		for d, off := range offline {
			if !off {
				rt.Fatalf("%s still online after every deadline and the grace passed", d)
			}
		}
		for _, d := range ids {
			if info, err := store.Device(rt.Context(), d); err == nil && info.State != gateway.Offline {
				rt.Fatalf("%s is %s after every deadline and the grace passed", d, info.State)
			}
		}
	})
}
