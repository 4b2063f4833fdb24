package storetest

import (
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"pgregory.net/rapid"

	"github.com/fleetgate/fleetgate/gateway"
	"github.com/fleetgate/fleetgate/gateway/clocktest"
)

// gwForget is the gateway named in the removed events of the cases.
const gwForget = "gw-admin"

func removed(d gateway.DeviceID, ver uint64, at time.Time, s gateway.SessionID) wantEvent {
	return wantEvent{Device: d, State: gateway.Removed, Ver: ver, Reason: gateway.ReasonForget, At: at, Gateway: gwForget, Session: s}
}

// forget forgets d and fails the test on an error.
func (e *env) forget(d gateway.DeviceID) gateway.Event {
	e.t.Helper()
	ev, err := e.store.Forget(e.ctx, d, gwForget)
	if err != nil {
		e.t.Fatalf("Forget(%s): %v", d, err)
	}
	return ev
}

// checkGone checks that the store holds nothing of d: Device is
// ErrNotFound and List does not name it.
func (e *env) checkGone(d gateway.DeviceID) {
	e.t.Helper()
	if info, err := e.store.Device(e.ctx, d); !errors.Is(err, gateway.ErrNotFound) {
		e.t.Errorf("Device(%s) after Forget = %+v, %v; want ErrNotFound", d, info, err)
	}
	for _, st := range []gateway.State{"", gateway.Online, gateway.Offline} {
		page, err := e.store.List(e.ctx, gateway.ListQuery{State: st, Limit: 1000})
		if err != nil {
			e.t.Fatalf("List(%q): %v", st, err)
		}
		for _, info := range page.Devices {
			if info.Device == d {
				e.t.Errorf("List(%q) after Forget names %s: %+v", st, d, info)
			}
		}
	}
}

// testForget: Forget of a device online with two sessions and a leave
// tombstone writes one removed event (ver + 1, reason forget, the
// forgetting gateway, the last session), returns it, and leaves nothing
// of the device: Device and List do not find it, its deadlines are gone
// (a reap past them writes nothing), and so is its tombstone (evidence
// older than the leave brings the device back, as new). A second Forget
// is ErrNotFound and writes nothing.
func testForget(t *testing.T, open Opener) {
	e, d, shard, t0 := newConnected(t, open, 2)
	e.clock.Advance(time.Second)
	e.apply(batch(gwB, 1, wr(d, "s2", gateway.Connect, 0)))
	e.clock.Advance(time.Second)
	e.apply(batch(gwA, 1, wr(d, "s1", gateway.Leave, 0)))
	e.clock.Advance(time.Second)
	at := e.now()
	before := len(e.log(shard))

	ev := e.forget(d)
	e.checkEvents("Forget", []gateway.Event{ev}, shard, removed(d, 2, at, "s1"))
	e.checkLogged(shard, []gateway.Event{ev})
	e.checkGone(d)
	if err := checkScans(e.ctx, e.store); err != nil {
		t.Errorf("after forgetting an online device: %v", err)
	}

	if _, err := e.store.Forget(e.ctx, d, gwForget); !errors.Is(err, gateway.ErrNotFound) {
		t.Errorf("second Forget(%s) = %v, want ErrNotFound", d, err)
	}
	if _, err := e.store.Forget(e.ctx, "never-seen", gwForget); !errors.Is(err, gateway.ErrNotFound) {
		t.Errorf("Forget(never-seen) = %v, want ErrNotFound", err)
	}
	e.checkLogLen("after the second Forget", shard, before+1)

	e.clock.Advance(2 * lease)
	if res := e.reap(shard, 100); len(res.Offline) != 0 || !res.Next.IsZero() {
		t.Errorf("reap past the forgotten deadlines: %s, next %v; want no event, no deadline", describeEvents(res.Offline), res.Next)
	}
	e.checkLogLen("after the reap", shard, before+1)

	// The leave of s1 at t0+2s was a tombstone: a renewal of s1 observed
	// before it would have been ignored; forgotten, it creates the device.
	now := e.now()
	age := now.Sub(t0.Add(time.Second))
	res := e.apply(withLease(batch(gwA, 1, wr(d, "s1", gateway.Renew, age)), 3*lease))
	if len(res.Events) != 1 || res.Events[0].State != gateway.Online || res.Events[0].Ver <= ev.Ver {
		t.Fatalf("renewal of the forgotten device's left session: %s; want one online event above ver %d", describeEvents(res.Events), ev.Ver)
	}
	got := e.device(d)
	if got.State != gateway.Online || got.Ver != res.Events[0].Ver || len(got.Sessions) != 1 {
		t.Errorf("device back after Forget: %+v; want online at ver %d with one session", got, res.Events[0].Ver)
	}
}

// testForgetVerNeverRepeats: a device forgotten and seen again in the
// same millisecond, several times over, gets vers that only grow: the
// store time has not passed its last ver, the shard's ver floor has.
// Another device of the shard, new after the forget, starts above the
// floor too; one seen before keeps counting from its own ver.
func testForgetVerNeverRepeats(t *testing.T, open Opener) {
	e := newEnv(t, open, 1)
	d, other := gateway.DeviceID("dev-1"), gateway.DeviceID("dev-2")
	e.apply(batch(gwA, 1, wr(other, "s1", gateway.Connect, 0)))
	var vers []uint64
	for i := range 4 {
		res := e.apply(batch(gwA, 1, wr(d, gateway.SessionID(fmt.Sprintf("s%d", i)), gateway.Connect, 0)))
		if len(res.Events) != 1 {
			t.Fatalf("round %d: connect wrote %s, want one online event", i, describeEvents(res.Events))
		}
		vers = append(vers, res.Events[0].Ver, e.forget(d).Ver)
	}
	for i := 1; i < len(vers); i++ {
		if vers[i] <= vers[i-1] {
			t.Fatalf("vers of a device forgotten and back within one millisecond: %v; want strictly growing", vers)
		}
	}
	res := e.apply(batch(gwA, 1, wr("dev-3", "s1", gateway.Connect, 0)))
	if len(res.Events) != 1 || res.Events[0].Ver <= vers[len(vers)-1] {
		t.Errorf("a new device after the forgets: %s; want ver above the floor %d", describeEvents(res.Events), vers[len(vers)-1])
	}
	res = e.apply(batch(gwA, 1, wr(other, "s1", gateway.Leave, 0)))
	if len(res.Events) != 1 || res.Events[0].Ver != firstVer(e.now())+1 {
		t.Errorf("a device seen before the forgets: %s; want ver %d", describeEvents(res.Events), firstVer(e.now())+1)
	}
}

// testForgetOffline: a device forgotten offline (its sessions reaped)
// gets its removed event; a device forgotten online writes no offline
// event besides it.
func testForgetOffline(t *testing.T, open Opener) {
	e, d, shard, _ := newConnected(t, open, 2)
	e.clock.Advance(lease + time.Second)
	if res := e.reap(shard, 10); len(res.Offline) != 1 {
		t.Fatalf("reap: %s, want the offline", describeEvents(res.Offline))
	}
	at := e.now()
	e.checkEvents("Forget offline", []gateway.Event{e.forget(d)}, shard, removed(d, 3, at, "s1"))
	e.checkGone(d)
	if err := checkScans(e.ctx, e.store); err != nil {
		t.Errorf("after forgetting an offline device: %v", err)
	}
}

// testForgetConcurrentRenewal: renewals of a device and Forgets of it at
// once, on a clock that does not move (the hardest case for vers), leave
// a log in which the device's vers strictly grow, every removed event
// follows an event of the device and is followed by an online one, and
// the store agrees with the log's last event.
func testForgetConcurrentRenewal(t *testing.T, open Opener) {
	e := newEnv(t, open, 2)
	d := gateway.DeviceID("dev-1")
	shard := gateway.ShardOf(d, 2)
	const rounds = 30
	var wg sync.WaitGroup
	errs := make(chan error, 2*rounds)
	wg.Go(func() {
		for i := range rounds {
			kind := gateway.Renew
			if i%5 == 4 {
				kind = gateway.Leave
			}
			if _, err := e.store.Apply(e.ctx, shard, batch(gwA, 1, wr(d, "s1", kind, 0))); err != nil {
				errs <- fmt.Errorf("Apply: %w", err)
			}
		}
	})
	wg.Go(func() {
		for range rounds {
			if _, err := e.store.Forget(e.ctx, d, gwForget); err != nil && !errors.Is(err, gateway.ErrNotFound) {
				errs <- fmt.Errorf("Forget: %w", err)
			}
		}
	})
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	last := checkForgetLog(t, e.log(shard))[d]
	info, err := e.store.Device(e.ctx, d)
	switch {
	case last.State == gateway.Removed && !errors.Is(err, gateway.ErrNotFound):
		t.Errorf("log ends with %s, Device = %+v, %v; want ErrNotFound", describeEvent(last), info, err)
	case last.State != gateway.Removed && (err != nil || info.Ver != last.Ver || info.State != last.State):
		t.Errorf("log ends with %s, Device = %+v, %v; want that state and ver", describeEvent(last), info, err)
	}
}

// checkForgetLog checks a log with removed events: per device, vers
// strictly grow; online and offline alternate starting with online,
// +1 each; a removed event is one above the event before it; and after it
// the device starts again with online. It returns each device's last
// event.
func checkForgetLog(t interface {
	Helper()
	Errorf(string, ...any)
}, log []gateway.Event) map[gateway.DeviceID]gateway.Event {
	t.Helper()
	last := map[gateway.DeviceID]gateway.Event{}
	for _, ev := range log {
		prev, seen := last[ev.Device]
		switch {
		case seen && ev.Ver <= prev.Ver:
			t.Errorf("%s's ver goes from %d (%s) to %s", ev.Device, prev.Ver, prev.State, describeEvent(ev))
		case ev.State == gateway.Removed:
			if !seen || prev.State == gateway.Removed || ev.Ver != prev.Ver+1 {
				t.Errorf("%s removed after %s: %s", ev.Device, describeEvent(prev), describeEvent(ev))
			}
		case !seen || prev.State == gateway.Removed:
			if ev.State != gateway.Online {
				t.Errorf("%s starts (again) with %s", ev.Device, describeEvent(ev))
			}
		case ev.State == prev.State || ev.Ver != prev.Ver+1:
			t.Errorf("%s's events go from v%d %s to %s", ev.Device, prev.Ver, prev.State, describeEvent(ev))
		}
		last[ev.Device] = ev
	}
	return last
}

// checkForgetProperty (a part of RunProperties) checks Forget against random interleavings, with
// rapid: connects, renewals and leaves of a few devices through two
// gateways, forgets, and clock moves that are often none at all (a
// forgotten device back within the same millisecond). After every step
// the whole log must pass checkForgetLog, the store must agree with
// each device's last event (gone after a removed event, else its state
// and ver), and its counts with a scan.
func checkForgetProperty(t *testing.T, open Opener) {
	t.Run("ForgetVersNeverRepeat", func(t *testing.T) {
		devs := []gateway.DeviceID{"fp-0", "fp-1", "fp-2"}
		rapid.Check(t, func(rt *rapid.T) {
			clock := clocktest.New(time.UnixMilli(startMs).UTC())
			s := open(t, 1, clock.Now)
			ctx := rt.Context()
			steps := rapid.IntRange(minSteps, maxSteps).Draw(rt, "steps")
			for range steps {
				d := rapid.SampledFrom(devs).Draw(rt, "device")
				switch rapid.IntRange(0, 4).Draw(rt, "op") {
				case 0, 1:
					kind := rapid.SampledFrom(propKinds).Draw(rt, "kind")
					gw := rapid.SampledFrom([]string{gwA, gwB}).Draw(rt, "gw")
					sid := rapid.SampledFrom(propSessions).Draw(rt, "session")
					if _, err := s.Apply(ctx, 0, batch(gw, 1, wr(d, sid, kind, 0))); err != nil {
						rt.Fatalf("Apply: %v", err)
					}
				case 2:
					if _, err := s.Forget(ctx, d, gwForget); err != nil && !errors.Is(err, gateway.ErrNotFound) {
						rt.Fatalf("Forget: %v", err)
					}
				case 3:
					if _, err := s.Reap(ctx, 0, 10); err != nil {
						rt.Fatalf("Reap: %v", err)
					}
				case 4:
					clock.Advance(rapid.SampledFrom([]time.Duration{0, time.Millisecond, lease}).Draw(rt, "advance"))
				}
			}
			if err := checkScans(ctx, s); err != nil {
				rt.Fatal(err)
			}
			log, err := readLog(ctx, s, 0, "")
			if err != nil {
				rt.Fatal(err)
			}
			for d, ev := range checkForgetLog(rt, log) {
				info, err := s.Device(ctx, d)
				switch {
				case ev.State == gateway.Removed && !errors.Is(err, gateway.ErrNotFound):
					rt.Errorf("%s: last event %s, Device = %+v, %v", d, describeEvent(ev), info, err)
				case ev.State != gateway.Removed && (err != nil || info.Ver != ev.Ver || info.State != ev.State):
					rt.Errorf("%s: last event %s, Device = %+v, %v", d, describeEvent(ev), info, err)
				}
			}
		})
	})
}
