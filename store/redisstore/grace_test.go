package redisstore

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/fleetgate/fleetgate/gateway"
	"github.com/fleetgate/fleetgate/gateway/clocktest"
	"github.com/fleetgate/fleetgate/internal/redistest"
)

const (
	testGrace   = 20 * time.Second
	testSilence = 3 * time.Second
	testLease   = 10 * time.Second
)

// newGraceEnv is newEnv with a gateway grace and silence.
func newGraceEnv(t *testing.T, c redis.UniversalClient) *env {
	t.Helper()
	clock := clocktest.New(time.UnixMilli(startMs))
	s, err := Open(t.Context(), c, Options{Prefix: uniquePrefix(), Shards: 1, Now: clock.Now,
		GatewayGrace: testGrace, GatewaySilence: testSilence, GatewayLost: testLease})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return &env{t: t, ctx: t.Context(), c: c, clock: clock, store: s}
}

func leased(gw string, behind bool, ws ...gateway.Write) gateway.Batch {
	return gateway.Batch{Gateway: gw, Epoch: 1, Lease: testLease, Behind: behind, Writes: ws}
}

// A device whose lease runs out while the gateway that wrote it is not
// heard is held for the grace, not reaped: late but valid evidence the
// gateway replays when it comes back keeps it online with no event; a
// gateway that stays lost gets its devices reported offline at the end
// of the grace with reason gateway_lost and the true lease end; a device
// that stopped behind a gateway that is heard again is reported expired.
func TestGatewayGrace(t *testing.T) {
	forBackends(t, func(t *testing.T, c redis.UniversalClient) {
		const dev = gateway.DeviceID("dev-g")
		connect := func(e *env) time.Time {
			t0 := e.clock.Now()
			if evs := e.apply(0, leased("gw-a", false, write(dev, "coap/default", gateway.Connect, 0))); len(evs) != 1 {
				t.Fatalf("connect: %s", describe(evs))
			}
			return t0
		}

		t.Run("late evidence after the gateway returns", func(t *testing.T) {
			e := newGraceEnv(t, c)
			t0 := connect(e)
			e.clock.Advance(testLease + time.Second) // gw-a silent for 11 s
			r := e.reap(0, 10)
			if len(r.Offline) != 0 || r.Held != 1 {
				t.Fatalf("reap while gw-a is silent: %+v, want the device held", r)
			}
			if d := e.device(dev); d.State != gateway.Online {
				t.Fatalf("held device %+v, want online", d)
			}
			// gw-a is back and replays evidence observed 5 s after the
			// connect, still behind; then it has caught up
			age := e.clock.Now().Sub(t0.Add(5 * time.Second))
			replay := leased("gw-a", true, write(dev, "coap/default", gateway.Renew, age))
			replay.Replay = true
			if evs := e.apply(0, replay); len(evs) != 0 {
				t.Fatalf("late but valid replay wrote %s", describe(evs))
			}
			d := e.device(dev)
			if want := t0.Add(5*time.Second + testLease); d.State != gateway.Online || !d.Deadline.Equal(want) {
				t.Fatalf("device after the replay: %+v, want online until %v", d, want)
			}
			e.clock.Set(t0.Add(5*time.Second + testLease))
			e.apply(0, leased("gw-a", false)) // caught up, keeping alive
			r = e.reap(0, 10)
			if len(r.Offline) != 1 || r.Offline[0].Reason != gateway.ReasonExpired {
				t.Fatalf("reap at the replayed deadline, gw-a heard: %+v", r)
			}
			if evs := e.events(0); len(evs) != 2 {
				t.Fatalf("log %s, want online then one offline", describe(evs))
			}
		})

		t.Run("gateway stays lost", func(t *testing.T) {
			e := newGraceEnv(t, c)
			t0 := connect(e)
			e.clock.Advance(testLease + time.Second)
			if r := e.reap(0, 10); r.Held != 1 {
				t.Fatalf("reap: %+v, want held", r)
			}
			e.clock.Set(t0.Add(testLease + testGrace - time.Millisecond))
			if r := e.reap(0, 10); len(r.Offline) != 0 {
				t.Fatalf("reap before the grace ended: %+v", r)
			}
			e.clock.Set(t0.Add(testLease + testGrace))
			r := e.reap(0, 10)
			if len(r.Offline) != 1 {
				t.Fatalf("reap at the end of the grace: %+v", r)
			}
			ev := r.Offline[0]
			if ev.Reason != gateway.ReasonGatewayLost || !ev.Deadline.Equal(t0.Add(testLease)) || ev.Gateway != "gw-a" {
				t.Fatalf("event %+v, want gateway_lost with the true lease end %v", ev, t0.Add(testLease))
			}
			if log := e.events(0); len(log) != 2 || log[1].Reason != gateway.ReasonGatewayLost || !log[1].Deadline.Equal(t0.Add(testLease)) {
				t.Fatalf("log %s", describe(log))
			}
		})

		t.Run("device stopped, gateway heard again", func(t *testing.T) {
			e := newGraceEnv(t, c)
			t0 := connect(e)
			e.clock.Advance(testLease + time.Second)
			if r := e.reap(0, 10); r.Held != 1 {
				t.Fatalf("reap: %+v, want held", r)
			}
			e.clock.Set(t0.Add(testLease + testGrace))
			e.apply(0, leased("gw-a", false)) // gw-a heard, caught up
			r := e.reap(0, 10)
			if len(r.Offline) != 1 || r.Offline[0].Reason != gateway.ReasonExpired || !r.Offline[0].Deadline.Equal(t0.Add(testLease)) {
				t.Fatalf("reap: %+v, want expired at the true lease end", r)
			}
		})

		t.Run("evidence observed after the true deadline, within the grace", func(t *testing.T) {
			e := newGraceEnv(t, c)
			connect(e)
			e.clock.Advance(testLease + time.Second)
			if r := e.reap(0, 10); r.Held != 1 {
				t.Fatalf("reap: %+v, want held", r)
			}
			// the outbox keeps a session's newest evidence only: evidence
			// observed inside the grace keeps the device, and its own
			// deadline is the device's from now on
			now := e.clock.Now()
			if evs := e.apply(0, leased("gw-a", false, write(dev, "coap/default", gateway.Renew, 0))); len(evs) != 0 {
				t.Fatalf("evidence within the grace: %s", describe(evs))
			}
			if d := e.device(dev); !d.Deadline.Equal(now.Add(testLease)) {
				t.Fatalf("device %+v, want deadline %v", d, now.Add(testLease))
			}
			if r := e.reap(0, 10); len(r.Offline) != 0 || r.Held != 0 {
				t.Fatalf("reap after the hold was undone: %+v", r)
			}
		})

		t.Run("leave of a held device", func(t *testing.T) {
			e := newGraceEnv(t, c)
			connect(e)
			e.clock.Advance(testLease + time.Second)
			if r := e.reap(0, 10); r.Held != 1 {
				t.Fatalf("reap: %+v, want held", r)
			}
			// a leave observed 2 s before the true deadline, replayed
			evs := e.apply(0, leased("gw-a", true, write(dev, "coap/default", gateway.Leave, 3*time.Second)))
			if len(evs) != 1 || evs[0].Reason != gateway.ReasonLeave {
				t.Fatalf("replayed leave of a held device: %s", describe(evs))
			}
		})

		t.Run("replay within the grace of the deadline, before any hold", func(t *testing.T) {
			e := newGraceEnv(t, c)
			connect(e)
			e.clock.Advance(testLease + 2*time.Second)
			// observed 1 s after the deadline: the outbox kept only this
			// newest evidence of the session
			replay := leased("gw-a", true, write(dev, "coap/default", gateway.Renew, time.Second))
			replay.Replay = true
			if evs := e.apply(0, replay); len(evs) != 0 {
				t.Fatalf("replay within the grace: %s", describe(evs))
			}
			// the same evidence sent live is a gap in presence
			e2 := newGraceEnv(t, c)
			connect(e2)
			e2.clock.Advance(testLease + 2*time.Second)
			if evs := e2.apply(0, leased("gw-a", false, write(dev, "coap/default", gateway.Renew, time.Second))); len(evs) != 2 {
				t.Fatalf("live evidence after the deadline: %s, want offline then online", describe(evs))
			}
		})

		t.Run("live gateway: no hold", func(t *testing.T) {
			e := newGraceEnv(t, c)
			connect(e)
			e.clock.Advance(testLease)
			e.apply(0, leased("gw-a", false)) // heard just now
			r := e.reap(0, 10)
			if len(r.Offline) != 1 || r.Held != 0 || r.Offline[0].Reason != gateway.ReasonExpired {
				t.Fatalf("reap with gw-a heard: %+v, want expired at once", r)
			}
		})

		t.Run("behind gateway: hold", func(t *testing.T) {
			e := newGraceEnv(t, c)
			connect(e)
			e.clock.Advance(testLease)
			e.apply(0, leased("gw-a", true)) // heard, still replaying
			if r := e.reap(0, 10); len(r.Offline) != 0 || r.Held != 1 {
				t.Fatalf("reap with gw-a behind: %+v, want held", r)
			}
		})
	})
}

// gatewayEvents reads the gateways stream of e's store as "gw state" lines.
func gatewayEvents(e *env) []string {
	e.t.Helper()
	msgs, err := e.c.XRange(e.ctx, e.store.keys[0].data[6], "-", "+").Result()
	if err != nil {
		e.t.Fatal(err)
	}
	var out []string
	for _, m := range msgs {
		out = append(out, fmt.Sprint(m.Values["gateway"], " ", m.Values["state"]))
	}
	return out
}

// A gateway not heard for the lease gets one `lost` event, one `back`
// event when it writes again, and nothing in between however often the
// runner reaps; a store outage the runner saw itself counts from its end.
func TestGatewayLostAndBack(t *testing.T) {
	forBackends(t, func(t *testing.T, c redis.UniversalClient) {
		e := newGraceEnv(t, c)
		e.apply(0, leased("gw-a", false, write("dev-1", "s", gateway.Connect, 0)))
		e.apply(0, leased("gw-b", false, write("dev-2", "s", gateway.Connect, 0)))
		for range 3 {
			e.clock.Advance(testLease / 2)
			e.apply(0, leased("gw-b", false)) // gw-b keeps writing
			e.reap(0, 10)
		}
		if got := gatewayEvents(e); !slices.Equal(got, []string{"gw-a lost"}) {
			t.Fatalf("after gw-a's silence of 1.5 leases: %q, want one lost", got)
		}
		e.apply(0, leased("gw-a", false))
		e.reap(0, 10)
		e.reap(0, 10)
		if got := gatewayEvents(e); !slices.Equal(got, []string{"gw-a lost", "gw-a back"}) {
			t.Fatalf("after gw-a wrote again: %q, want lost then back", got)
		}
	})
	t.Run("runner outage", func(t *testing.T) {
		e := newGraceEnv(t, sharedServer().Client(t))
		e.apply(0, leased("gw-a", false, write("dev-1", "s", gateway.Connect, 0)))
		e.reap(0, 10)
		// the runner cannot reach the store for longer than the lease
		e.store.reaps[0].failed = true
		e.clock.Advance(2 * testLease)
		e.reap(0, 10) // the outage ends here
		if got := gatewayEvents(e); len(got) != 0 {
			t.Fatalf("right after the runner's own outage: %q, want none", got)
		}
		e.clock.Advance(testLease + time.Millisecond)
		e.reap(0, 10)
		if got := gatewayEvents(e); !slices.Equal(got, []string{"gw-a lost"}) {
			t.Fatalf("a lease after the outage ended: %q, want gw-a lost", got)
		}
	})
}

// A device whose grace runs out during a store outage the runner saw
// gets a grace after it: its gateway, behind, replays once the store
// answers, and the first reap after the outage must not end it first.
func TestHeldGraceCountsFromRunnerOutage(t *testing.T) {
	e := newGraceEnv(t, sharedServer().Client(t))
	e.apply(0, leased("gw-a", false, write("dev-1", "s", gateway.Connect, 0)))
	e.reap(0, 10)
	e.clock.Advance(testLease / 2)
	e.apply(0, leased("gw-a", true)) // gw-a's outbox holds writes
	// the runner cannot reach the store past the device's deadline and grace
	e.store.reaps[0].failed = true
	e.clock.Advance(testLease + testGrace)
	for range 2 {
		if r := e.reap(0, 10); len(r.Offline) != 0 {
			t.Fatalf("reap right after the outage: %s, want the device held", describe(r.Offline))
		}
	}
	e.clock.Advance(testGrace + time.Millisecond)
	r := e.reap(0, 10)
	if len(r.Offline) != 1 || r.Offline[0].Reason != gateway.ReasonGatewayLost {
		t.Fatalf("reap a grace after the outage: %s, want dev-1 gateway_lost", describe(r.Offline))
	}
}

// A restart that loads an older snapshot (Redis with RDB persistence, or
// a promoted replica that kept the RDB of its last full sync) brings back
// records whose sessions ran out long ago: they say nothing of the device
// since, and live evidence of another session bridges such a session (no
// offline and online).
func TestStaleSnapshotBridgedByAnotherSession(t *testing.T) {
	srv := redistest.Start(t)
	e := newGraceEnv(t, srv.Client(t))
	if evs := e.apply(0, leased("gw-a", false, write("renamed", "mqtt/x", gateway.Connect, 0))); len(evs) != 1 {
		t.Fatalf("connect: %s", describe(evs))
	}
	if err := srv.Client(t).Save(t.Context()).Err(); err != nil {
		t.Fatal(err)
	}
	// what happened after the snapshot is lost with the restart
	e.clock.Advance(3 * testLease)
	srv.Restart()
	if evs := e.apply(0, leased("gw-a", false)); len(evs) != 0 {
		t.Fatalf("gw-a's keep-alive after the restart: %s", describe(evs))
	}
	if evs := e.apply(0, leased("gw-c", false, write("renamed", "mqtt/y", gateway.Connect, 0))); len(evs) != 0 {
		t.Fatalf("a new session of renamed after the restart: %s, want no event", describe(evs))
	}
	if info := e.device("renamed"); info.State != gateway.Online {
		t.Fatalf("renamed: %+v, want online", info)
	}
}

// After a loss the gateways restore what they hold once they have
// called; one may restore, with its passed deadline, the session of a
// device that moved away from it (its offline may never have been
// written), before the gateway the device moved to restores the live one.
// Nothing is reaped during the grace after the incarnation begins: the
// device restored by both is online with no offline.
func TestNothingReapedInTheGraceAfterALoss(t *testing.T) {
	srv := redistest.Start(t)
	e := newGraceEnv(t, srv.Client(t))
	if evs := e.apply(0, leased("gw-b", false, write("mover", "coap/main", gateway.Connect, 0))); len(evs) != 1 {
		t.Fatalf("connect: %s", describe(evs))
	}
	// it moved to gw-a (same session); its session at gw-b ran out there
	e.clock.Advance(testLease + time.Second)
	if err := srv.Client(t).FlushAll(t.Context()).Err(); err != nil {
		t.Fatal(err)
	}
	lapsed := restored(leased("gw-b", false, write("mover", "coap/main", gateway.Renew, testLease+time.Second)))
	if evs := e.apply(0, lapsed); len(evs) != 0 {
		t.Fatalf("gw-b's restore of the session that ran out: %s, want none", describe(evs))
	}
	if r := e.reap(0, 10); len(r.Offline) != 0 {
		t.Fatalf("reap before gw-a's restore: %s, want none", describe(r.Offline))
	}
	e.clock.Advance(testGrace / 2)
	live := restored(leased("gw-a", false, write("mover", "coap/main", gateway.Renew, 0)))
	e.apply(0, live)
	// past the grace after the loss, gw-a's renewals go on
	e.clock.Advance(testLease - time.Second)
	e.apply(0, leased("gw-a", false, write("mover", "coap/main", gateway.Renew, 0)))
	e.clock.Advance(2 * time.Second)
	e.apply(0, leased("gw-b", false))
	if r := e.reap(0, 10); len(r.Offline) != 0 {
		t.Fatalf("reap after gw-a's restore: %s, want none", describe(r.Offline))
	}
	if info := e.device("mover"); info.State != gateway.Online {
		t.Fatalf("mover: %+v, want online", info)
	}
}

// A goodbye written in the grace after a loss is held, not written as an
// offline: the gateway the device moved to may not have called since the
// loss (the store lost the liveness records that would say it lags).
func TestLeaveHeldInTheGraceAfterALoss(t *testing.T) {
	srv := redistest.Start(t)
	e := newGraceEnv(t, srv.Client(t))
	e.apply(0, leased("gw-a", false, write("mover", "mqtt/a", gateway.Connect, 0)))
	e.apply(0, leased("gw-b", false))
	if err := srv.Client(t).FlushAll(t.Context()).Err(); err != nil {
		t.Fatal(err)
	}
	e.clock.Advance(time.Second)
	restore := restored(leased("gw-a", false, write("mover", "mqtt/a", gateway.Renew, 0)))
	e.apply(0, restore)
	// it moved to gw-b (whose connect is on its way) and said goodbye here
	if evs := e.apply(0, leased("gw-a", false, write("mover", "mqtt/a", gateway.Leave, 0))); len(evs) != 0 {
		t.Fatalf("goodbye in the grace after the loss: %s, want it held", describe(evs))
	}
	e.clock.Advance(time.Second)
	if evs := e.apply(0, leased("gw-b", false, write("mover", "mqtt/b", gateway.Connect, 1500*time.Millisecond))); len(evs) != 0 {
		t.Fatalf("gw-b's connect, observed before the goodbye: %s, want none", describe(evs))
	}
	e.clock.Advance(testGrace)
	e.apply(0, leased("gw-a", false))
	e.apply(0, leased("gw-b", false, write("mover", "mqtt/b", gateway.Renew, 0)))
	if r := e.reap(0, 10); len(r.Offline) != 0 {
		t.Fatalf("reap after the grace: %s, want none", describe(r.Offline))
	}
	if info := e.device("mover"); info.State != gateway.Online {
		t.Fatalf("mover: %+v, want online", info)
	}
}

// A restart that loads an older snapshot brings back sessions whose
// deadlines passed long ago, under liveness records from before the
// restart. What a gateway wrote before the new incarnation is not in it
// until its restore is: the reap neither counts a record from before the
// incarnation as a gateway's silence nor a call that last wrote to
// another incarnation as its coverage, so the device the gateway keeps
// alive is not reported offline, and one that stopped is, once the
// gateway's restore has gone through and it reports coverage again.
func TestReplacedStateWaitsForTheRestore(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.Client(t)
	clock := clocktest.New(time.UnixMilli(startMs))
	prefix := uniquePrefix()
	open := func() *Store {
		s, err := Open(t.Context(), c, Options{Prefix: prefix, Shards: 1, Now: clock.Now,
			GatewayGrace: testGrace, GatewaySilence: testSilence, GatewayLost: testLease})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		return s
	}
	// gw-a's own store (its beliefs know the incarnation it wrote to) and
	// the runner's
	gwa := &env{t: t, ctx: t.Context(), c: c, clock: clock, store: open()}
	runner := &env{t: t, ctx: t.Context(), c: c, clock: clock, store: open()}
	if evs := gwa.apply(0, covered(leased("gw-a", false,
		write("keeper", "coap/default", gateway.Connect, 0),
		write("quitter", "coap/default", gateway.Connect, 0)))); len(evs) != 2 {
		t.Fatalf("connects: %s", describe(evs))
	}
	if err := c.Save(t.Context()).Err(); err != nil {
		t.Fatal(err)
	}
	// keeper goes on (its renewals are lost with the restart), quitter stops
	for range 6 {
		clock.Advance(testLease / 2)
		gwa.apply(0, covered(leased("gw-a", false, write("keeper", "coap/default", gateway.Renew, 0))))
	}
	srv.Restart()
	clock.Advance(time.Second)
	for i := range 2 {
		if r := runner.reap(0, 10); len(r.Offline) != 0 {
			t.Fatalf("reap %d after the restart, before gw-a called: %s, want none", i, describe(r.Offline))
		}
	}
	// gw-a's first call finds the new incarnation; its coverage there
	// counts for nothing until its restore
	res, err := gwa.store.Apply(t.Context(), 0, covered(leased("gw-a", false, write("keeper", "coap/default", gateway.Renew, 0))))
	if err != nil || !res.Reset {
		t.Fatalf("gw-a's first call after the restart: %+v, %v; want a reset", res, err)
	}
	clock.Advance(2 * time.Second)
	for i := range 2 {
		if r := runner.reap(0, 10); len(r.Offline) != 0 {
			t.Fatalf("reap %d before gw-a's restore: %s, want none", i, describe(r.Offline))
		}
	}
	restore := restored(leased("gw-a", false, write("keeper", "coap/default", gateway.Renew, 0)))
	if evs := gwa.apply(0, restore); len(evs) != 0 {
		t.Fatalf("gw-a's restore: %s, want none", describe(evs))
	}
	gwa.apply(0, covered(leased("gw-a", false)))
	clock.Advance(2 * time.Second)
	r := runner.reap(0, 10)
	if len(r.Offline) != 1 || r.Offline[0].Device != "quitter" || r.Offline[0].Reason != gateway.ReasonExpired {
		t.Fatalf("reap after gw-a's restore: %s, want quitter expired", describe(r.Offline))
	}
	if info := runner.device("keeper"); info.State != gateway.Online {
		t.Fatalf("keeper: %+v, want online", info)
	}
}

// horizonEnvs opens three stores on one prefix and one clock, with the
// grace, silence, loss and the horizon (lease + grace) the gateways run
// with: two gateways' and a runner's.
func horizonEnvs(t *testing.T, c redis.UniversalClient) (a, b, runner *env) {
	clock := clocktest.New(time.UnixMilli(startMs))
	prefix := uniquePrefix()
	open := func() *env {
		s, err := Open(t.Context(), c, Options{Prefix: prefix, Shards: 1, Now: clock.Now, GatewayGrace: testGrace,
			GatewaySilence: testSilence, GatewayLost: testLease, GatewayHorizon: testLease + testGrace})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		return &env{t: t, ctx: t.Context(), c: c, clock: clock, store: s}
	}
	return open(), open(), open()
}

// covered is b covering everything this gateway observed (Batch.Covers).
func covered(b gateway.Batch) gateway.Batch {
	b.Covers = true
	return b
}

// A replaced state knows the gateways of its time by records older than
// the horizon: one that has not called in the new incarnation may hold a
// device's live session (here mover's, which moved to gw-c after the
// snapshot), so the reap waits for it until the incarnation is a horizon
// old, and a device held in the old state gets its grace from the
// incarnation's start, not from its old deadline.
func TestReplacedStateWaitsForEveryGatewayItKnew(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.Client(t)
	gwa, gwc, runner := horizonEnvs(t, c)
	clock := runner.clock
	gwa.apply(0, covered(leased("gw-a", false,
		write("mover", "coap/default", gateway.Connect, 0), write("quitter", "coap/default", gateway.Connect, 0))))
	gwc.apply(0, covered(leased("gw-c", false)))
	// gw-a goes silent past quitter's deadline: the reap holds quitter
	clock.Advance(testLease + time.Second)
	gwc.apply(0, covered(leased("gw-c", false)))
	if r := runner.reap(0, 10); len(r.Offline) != 0 || r.Held == 0 {
		t.Fatalf("reap with gw-a silent: %+v, want quitter held", r)
	}
	if err := c.Save(t.Context()).Err(); err != nil {
		t.Fatal(err)
	}
	// after the snapshot: mover moves to gw-c, gw-a comes back; all lost
	// with the restart, a horizon and more later
	gwc.apply(0, covered(leased("gw-c", false, write("mover", "coap/default", gateway.Connect, 0))))
	for range 8 {
		clock.Advance(testLease / 2)
		gwa.apply(0, covered(leased("gw-a", false)))
		gwc.apply(0, covered(leased("gw-c", false, write("mover", "coap/default", gateway.Renew, 0))))
	}
	srv.Restart()
	clock.Advance(time.Second)
	// gw-a calls, restores nothing of mover or quitter, covers again
	gwa.mustReset("gw-a")
	restore := restored(leased("gw-a", false))
	gwa.apply(0, restore)
	gwa.apply(0, covered(leased("gw-a", false)))
	clock.Advance(2 * time.Second)
	for i := range 2 {
		if r := runner.reap(0, 10); len(r.Offline) != 0 {
			t.Fatalf("reap %d before gw-c called: %s, want none", i, describe(r.Offline))
		}
	}
	gwc.mustReset("gw-c")
	restore = restored(leased("gw-c", false, write("mover", "coap/default", gateway.Renew, 0)))
	if evs := gwc.apply(0, restore); len(evs) != 0 {
		t.Fatalf("gw-c's restore: %s, want none", describe(evs))
	}
	gwc.apply(0, covered(leased("gw-c", false)))
	// (every due device is held for the grace from the incarnation's
	// start: a replaced state may not know every gateway that holds one)
	clock.Advance(testGrace)
	gwa.apply(0, covered(leased("gw-a", false)))
	gwc.apply(0, covered(leased("gw-c", false, write("mover", "coap/default", gateway.Renew, 0))))
	var offs []gateway.Event
	for range 3 {
		offs = append(offs, runner.reap(0, 10).Offline...)
	}
	if len(offs) != 1 || offs[0].Device != "quitter" || offs[0].Reason != gateway.ReasonExpired {
		t.Fatalf("reaps after both restored: %s, want quitter expired", describe(offs))
	}
	if info := runner.device("mover"); info.State != gateway.Online {
		t.Fatalf("mover: %+v, want online", info)
	}
}

// A gateway that called the new incarnation of a replaced state but has
// not restored yet (its first call there covers nothing) holds what the
// state lacks, as one that has not called: mover moved to gw-a after the
// snapshot, and gw-a stopped just after its first call. The snapshot's
// record of mover, on gw-b, ran out long ago; the reap waits for gw-a
// until the incarnation is a horizon old, not only the grace, and gw-a's
// restore then keeps mover online with no event.
func TestReplacedStateWaitsForAGatewayNotRestoredYet(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.Client(t)
	gwa, gwb, runner := horizonEnvs(t, c)
	clock := runner.clock
	gwb.apply(0, covered(leased("gw-b", false, write("mover", "coap/default", gateway.Connect, 0))))
	gwa.apply(0, covered(leased("gw-a", false)))
	if err := c.Save(t.Context()).Err(); err != nil {
		t.Fatal(err)
	}
	// after the snapshot: mover moves to gw-a; lost with the restart
	for range 4 {
		clock.Advance(testLease / 2)
		gwa.apply(0, covered(leased("gw-a", false, write("mover", "coap/default", gateway.Renew, 0))))
		gwb.apply(0, covered(leased("gw-b", false)))
	}
	srv.Restart()
	clock.Advance(time.Second)
	// gw-a calls once and stops; gw-b restores (nothing of mover) and
	// covers on
	gwa.mustReset("gw-a")
	gwb.mustReset("gw-b")
	gwb.apply(0, restored(leased("gw-b", false)))
	var offs []gateway.Event
	for range (testLease+testGrace)/time.Second - 2 {
		clock.Advance(time.Second)
		gwb.apply(0, covered(leased("gw-b", false)))
		offs = append(offs, runner.reap(0, 10).Offline...)
	}
	if len(offs) != 0 {
		t.Fatalf("reaps while gw-a has not restored, within a horizon of the incarnation's start: %s, want none", describe(offs))
	}
	restore := restored(leased("gw-a", false, write("mover", "coap/default", gateway.Renew, 0)))
	if evs := gwa.apply(0, restore); len(evs) != 0 {
		t.Fatalf("gw-a's restore: %s, want none", describe(evs))
	}
	gwa.apply(0, covered(leased("gw-a", false)))
	if r := runner.reap(0, 10); len(r.Offline) != 0 {
		t.Fatalf("reap after gw-a restored: %s, want none", describe(r.Offline))
	}
	if info := runner.device("mover"); info.State != gateway.Online {
		t.Fatalf("mover: %+v, want online", info)
	}
}

// A restore's leave in a replaced state: mover moved from gw-a to gw-b,
// and the restart lost both writes. gw-a restores first, with mover's
// leave; gw-b's restore, with mover's live session, comes after. The
// leave must not end mover at once (the other gateway may hold the
// device, as for a leave in a state that was not replaced): mover stays
// online without an event and keeps its session on gw-b. A leaver whose
// device no other gateway holds ends, with reason leave, once the
// incarnation's grace has passed.
func TestReplacedStateLeaveWaitsForTheOtherRestores(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.Client(t)
	gwa, gwb, runner := horizonEnvs(t, c)
	clock := runner.clock
	gwa.apply(0, covered(leased("gw-a", false)))
	gwb.apply(0, covered(leased("gw-b", false)))
	if err := c.Save(t.Context()).Err(); err != nil {
		t.Fatal(err)
	}
	// after the snapshot: mover and leaver connect to gw-a; mover moves
	// to gw-b; both leave gw-a
	gwa.apply(0, covered(leased("gw-a", false,
		write("mover", "mqtt#1", gateway.Connect, 0), write("leaver", "mqtt#1", gateway.Connect, 0))))
	clock.Advance(time.Second)
	gwb.apply(0, covered(leased("gw-b", false, write("mover", "mqtt#2", gateway.Connect, 0))))
	if evs := gwa.apply(0, covered(leased("gw-a", false,
		write("mover", "mqtt#1", gateway.Leave, 0), write("leaver", "mqtt#1", gateway.Leave, 0)))); len(evs) != 1 || evs[0].Device != "leaver" {
		t.Fatalf("the leaves before the restart: %s, want leaver's offline", describe(evs))
	}
	srv.Restart()
	clock.Advance(time.Second)
	gwa.mustReset("gw-a")
	restore := restored(covered(leased("gw-a", false, write("mover", "mqtt#1", gateway.Leave, 0), write("leaver", "mqtt#1", gateway.Leave, 0))))
	if evs := gwa.apply(0, restore); len(evs) != 0 {
		t.Fatalf("gw-a's restore of two leaves: %s, want none while gw-b may hold them", describe(evs))
	}
	if r := runner.reap(0, 10); len(r.Offline) != 0 {
		t.Fatalf("reap before gw-b's restore: %s, want none", describe(r.Offline))
	}
	clock.Advance(time.Second)
	gwb.mustReset("gw-b")
	restore = restored(covered(leased("gw-b", false, write("mover", "mqtt#2", gateway.Renew, 0))))
	if evs := gwb.apply(0, restore); len(evs) != 0 {
		t.Fatalf("gw-b's restore: %s, want none (mover was online)", describe(evs))
	}
	offline := runner.reapsOverTwoGraces(func() {
		gwa.apply(0, covered(leased("gw-a", false)))
		gwb.apply(0, covered(leased("gw-b", false, write("mover", "mqtt#2", gateway.Renew, 0))))
	})
	if len(offline) != 1 || offline[0].Device != "leaver" || offline[0].Reason != gateway.ReasonLeave {
		t.Fatalf("reaps over twice the grace: %s, want leaver's offline (leave) alone", describe(offline))
	}
	if info := runner.device("mover"); info.State != gateway.Online {
		t.Fatalf("mover: %+v, want online", info)
	}
}

// A restart without persistence, then a replica attaching to the empty
// master: Redis gives a master a new replication ID when it creates the
// backlog for its first replica, so the state that began with the loss
// is a second incarnation a moment later, with no new loss. mover had
// moved from gw-a to gw-b; gw-a restores its session that ran out before
// gw-b, whose calls are slow, has restored the live one. The hold of the
// grace after the loss must still cover the second incarnation: before,
// the loss was recorded for the first one only, and the reap ended mover
// (expired) while gw-b's restore was on its way.
func TestLossHoldOutlastsTheReplicaAttaching(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.Client(t)
	gwa, gwb, runner := horizonEnvs(t, c)
	clock := runner.clock
	gwa.apply(0, covered(leased("gw-a", false, write("mover", "coap/a", gateway.Connect, 0))))
	gwb.apply(0, covered(leased("gw-b", false)))
	clock.Advance(time.Second)
	gwb.apply(0, covered(leased("gw-b", false, write("mover", "coap/b", gateway.Connect, 0))))
	gwa.apply(0, covered(leased("gw-a", false)))
	srv.Restart()
	clock.Advance(time.Second)
	gwa.mustReset("gw-a")
	before := replID(t, c)
	// (the replica's full sync starts at once, not after Redis's 5 s wait
	// for more replicas)
	if err := c.ConfigSet(t.Context(), "repl-diskless-sync-delay", "0").Err(); err != nil {
		t.Fatal(err)
	}
	redistest.StartReplica(t, srv.Addr)
	if after := replID(t, c); after == before {
		t.Fatalf("the master's replication ID stayed %s when its first replica attached; the test needs it to change", before)
	}
	// gw-a's restore: mover's session on it ran out half a second ago
	restore := restored(covered(leased("gw-a", false, write("mover", "coap/a", gateway.Renew, testLease+500*time.Millisecond))))
	if evs := gwa.apply(0, restore); len(evs) != 0 {
		t.Fatalf("gw-a's restore: %s, want none", describe(evs))
	}
	if info := runner.device("mover"); info.State != gateway.Online {
		t.Fatalf("mover after gw-a's restore: %+v, want online (recreated)", info)
	}
	// gw-a's next flush covers what it observed, the restore included
	clock.Advance(100 * time.Millisecond)
	gwa.apply(0, covered(leased("gw-a", false)))
	clock.Advance(100 * time.Millisecond)
	if r := runner.reap(0, 10); len(r.Offline) != 0 {
		t.Fatalf("reap before gw-b's restore: %s, want none (the grace after the loss)", describe(r.Offline))
	}
	clock.Advance(time.Second)
	gwb.mustReset("gw-b")
	restore = restored(covered(leased("gw-b", false, write("mover", "coap/b", gateway.Renew, 0))))
	if evs := gwb.apply(0, restore); len(evs) != 0 {
		t.Fatalf("gw-b's restore: %s, want none (mover was online)", describe(evs))
	}
	offline := runner.reapsOverTwoGraces(func() {
		gwa.apply(0, covered(leased("gw-a", false)))
		gwb.apply(0, covered(leased("gw-b", false, write("mover", "coap/b", gateway.Renew, 0))))
	})
	if len(offline) != 0 {
		t.Fatalf("reaps over twice the grace: %s, want none", describe(offline))
	}
	if info := runner.device("mover"); info.State != gateway.Online {
		t.Fatalf("mover: %+v, want online", info)
	}
}

// A restart into a snapshot older than a gateway's first call (a
// promoted replica that loads the dump.rdb of its last full sync): the
// state does not know gw-a at all. mover had moved from gw-b to gw-a;
// gw-b restores first, with mover's goodbye. The goodbye must wait, as
// after a loss (gw-a may hold the device), and gw-a's restore then keeps
// mover online with no event. Before, a replaced state waited only for
// the gateways it knew, and gw-b's goodbye wrote mover's offline at once.
func TestSnapshotThatDoesNotKnowAGatewayWaitsForIt(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.Client(t)
	gwa, gwb, runner := horizonEnvs(t, c)
	clock := runner.clock
	gwb.apply(0, covered(leased("gw-b", false)))
	if err := c.Save(t.Context()).Err(); err != nil {
		t.Fatal(err)
	}
	gwb.apply(0, covered(leased("gw-b", false, write("mover", "mqtt/b", gateway.Connect, 0))))
	gwa.apply(0, covered(leased("gw-a", false)))
	clock.Advance(time.Second)
	gwb.apply(0, covered(leased("gw-b", false, write("mover", "mqtt/b", gateway.Leave, 0))))
	gwa.apply(0, covered(leased("gw-a", false, write("mover", "mqtt/a", gateway.Connect, 0))))
	srv.Restart()
	clock.Advance(500 * time.Millisecond)
	gwb.mustReset("gw-b")
	restore := restored(leased("gw-b", false, write("mover", "mqtt/b", gateway.Leave, 500*time.Millisecond)))
	if evs := gwb.apply(0, restore); len(evs) != 0 {
		t.Fatalf("gw-b's restore of mover's goodbye: %s, want none while gw-a may hold mover", describe(evs))
	}
	if r := runner.reap(0, 10); len(r.Offline) != 0 {
		t.Fatalf("reap before gw-a called: %s, want none", describe(r.Offline))
	}
	clock.Advance(time.Second)
	gwa.mustReset("gw-a")
	restore = restored(leased("gw-a", false, write("mover", "mqtt/a", gateway.Renew, 0)))
	if evs := gwa.apply(0, restore); len(evs) != 0 {
		t.Fatalf("gw-a's restore: %s, want none (mover stayed online)", describe(evs))
	}
	offline := runner.reapsOverTwoGraces(func() {
		gwa.apply(0, covered(leased("gw-a", false, write("mover", "mqtt/a", gateway.Renew, 0))))
		gwb.apply(0, covered(leased("gw-b", false)))
	})
	if len(offline) != 0 {
		t.Fatalf("reaps over twice the grace: %s, want none", describe(offline))
	}
	if info := runner.device("mover"); info.State != gateway.Online {
		t.Fatalf("mover: %+v, want online", info)
	}
}

// A gateway that stops as the store restarts into a snapshot is waited
// for as one heard at the incarnation's start: its devices are held up
// to its horizon (lease + grace) from then, not only the grace, so a stop
// shorter than that loses none; one that does not come back has them
// reported gateway_lost at the horizon's end.
func TestGatewayStoppedAtARestartIsWaitedForItsHorizon(t *testing.T) {
	for _, back := range []bool{true, false} {
		t.Run(map[bool]string{true: "back before its horizon", false: "never back"}[back], func(t *testing.T) {
			srv := redistest.Start(t)
			c := srv.Client(t)
			gwa, gwb, runner := horizonEnvs(t, c)
			clock := runner.clock
			gwa.apply(0, covered(leased("gw-a", false, write("dev", "coap/default", gateway.Connect, 0))))
			gwb.apply(0, covered(leased("gw-b", false)))
			if err := c.Save(t.Context()).Err(); err != nil {
				t.Fatal(err)
			}
			clock.Advance(time.Second)
			gwa.apply(0, covered(leased("gw-a", false, write("dev", "coap/default", gateway.Renew, 0))))
			srv.Restart()
			start := clock.Now()
			// gw-b calls and restores; gw-a is stopped
			gwb.mustReset("gw-b")
			restore := restored(leased("gw-b", false))
			gwb.apply(0, restore)
			var offline []gateway.Event
			for clock.Now().Before(start.Add(testGrace + testLease - time.Second)) {
				clock.Advance(time.Second)
				gwb.apply(0, covered(leased("gw-b", false)))
				offline = append(offline, runner.reap(0, 10).Offline...)
			}
			if len(offline) != 0 {
				t.Fatalf("reaps while gw-a is stopped, inside its horizon: %s, want none", describe(offline))
			}
			if back {
				gwa.mustReset("gw-a")
				restore = restored(leased("gw-a", false, write("dev", "coap/default", gateway.Renew, 0)))
				if evs := gwa.apply(0, restore); len(evs) != 0 {
					t.Fatalf("gw-a's restore: %s, want none", describe(evs))
				}
			}
			for range 2 * testSilence / time.Second {
				clock.Advance(time.Second)
				gwb.apply(0, covered(leased("gw-b", false)))
				if back {
					gwa.apply(0, covered(leased("gw-a", false, write("dev", "coap/default", gateway.Renew, 0))))
				}
				offline = append(offline, runner.reap(0, 10).Offline...)
			}
			switch {
			case back && len(offline) != 0:
				t.Fatalf("after gw-a's return: %s, want none", describe(offline))
			case !back && (len(offline) != 1 || offline[0].Reason != gateway.ReasonGatewayLost):
				t.Fatalf("gw-a never back: %s, want dev's offline (gateway_lost)", describe(offline))
			}
		})
	}
}

// A loss that the runner sees first: gw-b's new process (no incarnation
// to compare: its first call reports nothing) restores mover's session
// that ran out (from its ledger), and the reap runs before gw-a, whose
// calls still fail, has called: mover had moved to gw-a. The runner's
// reaps saw the shard's previous incarnation, so this one is no new
// store's first, and the reap holds mover for the grace; gw-a's restore
// then keeps it online with no event.
func TestLossSeenFirstByTheRunnerHoldsDevices(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.Client(t)
	gwa, gwb, runner := horizonEnvs(t, c)
	clock := runner.clock
	gwb.apply(0, covered(leased("gw-b", false, write("mover", "coap/default", gateway.Connect, 0))))
	gwa.apply(0, covered(leased("gw-a", false)))
	runner.reap(0, 10)
	if err := c.FlushAll(t.Context()).Err(); err != nil {
		t.Fatal(err)
	}
	clock.Advance(testLease + time.Second)
	// gw-b's new process: the runner's Store has no beliefs of gw-b
	if evs := runner.apply(0, restored(leased("gw-b", false, write("mover", "coap/default", gateway.Renew, testLease+time.Second)))); len(evs) != 0 {
		t.Fatalf("gw-b's new process restores mover: %s, want none", describe(evs))
	}
	runner.apply(0, covered(leased("gw-b", false)))
	clock.Advance(100 * time.Millisecond)
	if r := runner.reap(0, 10); len(r.Offline) != 0 {
		t.Fatalf("reap before gw-a called: %s, want none (the grace after the loss)", describe(r.Offline))
	}
	clock.Advance(time.Second)
	gwa.mustReset("gw-a")
	if evs := gwa.apply(0, restored(leased("gw-a", false, write("mover", "coap/default", gateway.Renew, 0)))); len(evs) != 0 {
		t.Fatalf("gw-a's restore: %s, want none", describe(evs))
	}
	offline := runner.reapsOverTwoGraces(func() {
		gwa.apply(0, covered(leased("gw-a", false, write("mover", "coap/default", gateway.Renew, 0))))
		runner.apply(0, covered(leased("gw-b", false)))
	})
	if len(offline) != 0 {
		t.Fatalf("reaps over twice the grace: %s, want none", describe(offline))
	}
}

// reapsOverTwoGraces advances the clock by a quarter grace eight times,
// each time making the gateways' calls and a reap, and returns the
// offline events of those reaps.
func (e *env) reapsOverTwoGraces(calls func()) []gateway.Event {
	e.t.Helper()
	var offline []gateway.Event
	for range 8 {
		e.clock.Advance(testGrace / 4)
		calls()
		offline = append(offline, e.reap(0, 10).Offline...)
	}
	return offline
}

// mustReset applies gw's first call after a restart, an empty batch
// covering everything, and fails unless it reports a reset.
func (e *env) mustReset(gw string) {
	e.t.Helper()
	if res, err := e.store.Apply(e.ctx, 0, covered(leased(gw, false))); err != nil || !res.Reset {
		e.t.Fatalf("%s's first call after the restart: %+v, %v; want a reset", gw, res, err)
	}
}

// restored is b as a restore batch (gateway.Batch.Restore).
func restored(b gateway.Batch) gateway.Batch {
	b.Restore = true
	return b
}

// replID is the master_replid the server of c reports.
func replID(t *testing.T, c *redis.Client) string {
	t.Helper()
	info, err := c.Info(t.Context(), "replication").Result()
	if err != nil {
		t.Fatal(err)
	}
	for line := range strings.Lines(info) {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "master_replid:"); ok {
			return v
		}
	}
	t.Fatalf("no master_replid in %q", info)
	return ""
}

// The hold of the grace after a loss counts from the loss, not from the
// deadline that falls in it: a device that says goodbye in that grace,
// with no gateway lagging once it is over, is reported offline at its
// end, not a grace after the goodbye.
func TestLeaveInTheGraceAfterALossEndsWithThatGrace(t *testing.T) {
	srv := redistest.Start(t)
	e := newGraceEnv(t, srv.Client(t))
	e.apply(0, covered(leased("gw-a", false, write("quitter", "mqtt/a", gateway.Connect, 0))))
	e.apply(0, covered(leased("gw-b", false)))
	if err := srv.Client(t).FlushAll(t.Context()).Err(); err != nil {
		t.Fatal(err)
	}
	e.clock.Advance(time.Second)
	restore := restored(covered(leased("gw-a", false, write("quitter", "mqtt/a", gateway.Renew, 0))))
	e.apply(0, restore)
	e.apply(0, covered(leased("gw-b", false)))
	e.clock.Advance(testGrace / 2)
	if evs := e.apply(0, covered(leased("gw-a", false, write("quitter", "mqtt/a", gateway.Leave, 0)))); len(evs) != 0 {
		t.Fatalf("goodbye in the grace after the loss: %s, want it held", describe(evs))
	}
	if r := e.reap(0, 10); len(r.Offline) != 0 {
		t.Fatalf("reap in the grace: %s, want none", describe(r.Offline))
	}
	// the grace since the loss is over; both gateways have covered the
	// goodbye since
	e.clock.Advance(testGrace/2 + time.Second)
	e.apply(0, covered(leased("gw-a", false)))
	e.apply(0, covered(leased("gw-b", false)))
	r := e.reap(0, 10)
	if len(r.Offline) != 1 || r.Offline[0].Reason != gateway.ReasonLeave {
		t.Fatalf("reap after the grace since the loss: %s, want quitter's offline (leave)", describe(r.Offline))
	}
}

// A device that moved to gw-a just before a loss: gw-b had written its
// goodbye, gw-a's connect was still queued when gw-a restored what it
// held (a queued connect is left out of a restore, to bring the device
// online itself), and it reached the store after its lease ran out.
// Evidence observed before the incarnation began that ran out on its way,
// for a record the store does not have, recreates the record online with
// no event, its session ending at once, and the reap writes its offline:
// the lost state had it online. Before, it was dropped and the device
// never got its offline.
func TestLapsedConnectAfterALossRecreatesTheRecord(t *testing.T) {
	srv := redistest.Start(t)
	e := newGraceEnv(t, srv.Client(t))
	e.apply(0, covered(leased("gw-b", false, write("mover", "mqtt/b", gateway.Connect, 0))))
	e.apply(0, covered(leased("gw-a", false)))
	e.clock.Advance(time.Second)
	e.apply(0, covered(leased("gw-b", false, write("mover", "mqtt/b", gateway.Leave, 0))))
	e.apply(0, covered(leased("gw-a", false)))
	if err := srv.Client(t).FlushAll(t.Context()).Err(); err != nil {
		t.Fatal(err)
	}
	e.clock.Advance(500 * time.Millisecond)
	for _, gw := range []string{"gw-a", "gw-b"} {
		r := restored(covered(leased(gw, false)))
		e.apply(0, r)
	}
	// gw-a's connect, observed 1.5 s before the loss, written a lease later
	e.clock.Advance(testLease)
	if evs := e.apply(0, covered(leased("gw-a", false, write("mover", "mqtt/a", gateway.Connect, testLease+2*time.Second)))); len(evs) != 0 {
		t.Fatalf("gw-a's lapsed connect: %s, want none", describe(evs))
	}
	if info := e.device("mover"); info.State != gateway.Online {
		t.Fatalf("mover after gw-a's lapsed connect: %+v, want online (the record recreated)", info)
	}
	var offline []gateway.Event
	for i := 0; i < 40 && len(offline) == 0; i++ {
		e.clock.Advance(time.Second)
		e.apply(0, covered(leased("gw-a", false)))
		e.apply(0, covered(leased("gw-b", false)))
		offline = e.reap(0, 10).Offline
	}
	if len(offline) != 1 || offline[0].Device != "mover" || offline[0].Reason != gateway.ReasonExpired {
		t.Fatalf("reaps after the lapsed connect: %s, want mover's offline (expired)", describe(offline))
	}
}

// A restart into an older snapshot in which a device is offline (an
// earlier visit), while the device had come back since and stopped just
// before the restart: its gateway's restore carries the session, either
// as it ran out, or (a killed process's ledger) with the latest deadline
// it can have had, still ahead. Consumers last saw the device online, so
// the record comes back online with no event either way, and the reap
// writes its offline; before, the lapsed restore changed nothing and the
// device never got its offline, and the other wrote an online event
// after the device had stopped.
func TestRestoreOnAnOlderOfflineRecordWritesTheOffline(t *testing.T) {
	for _, tc := range []struct {
		name  string
		lease time.Duration // the restored session's, from its evidence
	}{
		{"ran out", testLease},
		{"latest possible deadline ahead", 2 * testLease},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := redistest.Start(t)
			c := srv.Client(t)
			clock := clocktest.New(time.UnixMilli(startMs))
			prefix := uniquePrefix()
			open := func() *env {
				s, err := Open(t.Context(), c, Options{Prefix: prefix, Shards: 1, Now: clock.Now,
					GatewayGrace: testGrace, GatewaySilence: testSilence, GatewayLost: testLease})
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { s.Close() })
				return &env{t: t, ctx: t.Context(), c: c, clock: clock, store: s}
			}
			gwa, runner := open(), open()
			gwa.apply(0, covered(leased("gw-a", false, write("visitor", "coap/default", gateway.Connect, 0))))
			gwa.apply(0, covered(leased("gw-a", false, write("visitor", "coap/default", gateway.Leave, 0))))
			if err := c.Save(t.Context()).Err(); err != nil {
				t.Fatal(err)
			}
			clock.Advance(time.Second)
			if evs := gwa.apply(0, covered(leased("gw-a", false, write("visitor", "coap/default", gateway.Connect, 0)))); len(evs) != 1 {
				t.Fatalf("the visitor back: %s", describe(evs))
			}
			// it stops; the restart brings back the snapshot, the visitor offline
			clock.Advance(testLease - time.Second)
			srv.Restart()
			clock.Advance(2 * time.Second)
			res, err := gwa.store.Apply(t.Context(), 0, covered(leased("gw-a", false)))
			if err != nil || !res.Reset {
				t.Fatalf("gw-a's first call after the restart: %+v, %v; want a reset", res, err)
			}
			w := write("visitor", "coap/default", gateway.Renew, testLease+time.Second)
			w.Lease = tc.lease
			if evs := gwa.apply(0, restored(leased("gw-a", false, w))); len(evs) != 0 {
				t.Fatalf("gw-a's restore of the session: %s, want none", describe(evs))
			}
			if d := gwa.device("visitor"); d.State != gateway.Online {
				t.Fatalf("the visitor after the restore: %+v, want online", d)
			}
			var offline []gateway.Event
			for i := 0; i < 40 && len(offline) == 0; i++ {
				clock.Advance(time.Second)
				gwa.apply(0, covered(leased("gw-a", false)))
				offline = runner.reap(0, 10).Offline
			}
			if len(offline) != 1 || offline[0].Device != "visitor" || offline[0].Reason != gateway.ReasonExpired {
				t.Fatalf("reaps after the restore: %s, want the visitor's offline (expired)", describe(offline))
			}
		})
	}
}

// A gap in a shard's reaps longer than Options.ReapGap (the store, every
// runner or the host stopped: the gateways may have stopped with them)
// is an outage that ends at the next reap, for every runner of the shard:
// a device whose gateway is not heard is held for the grace counted from
// then, not from its deadline, and no gateway is reported lost over the
// gap. The gateway heard again with the device's evidence keeps it
// online with no event. Reaps on time (no gap) leave a silent gateway's
// devices to go at the end of their grace as before.
func TestReapGap(t *testing.T) {
	const gapMax = 2 * time.Second
	forBackends(t, func(t *testing.T, c redis.UniversalClient) {
		const dev = gateway.DeviceID("dev-gap")
		open := func(t *testing.T, prefix string, clock *clocktest.Clock) *Store {
			s, err := Open(t.Context(), c, Options{Prefix: prefix, Shards: 1, Now: clock.Now,
				GatewayGrace: testGrace, GatewaySilence: testSilence, GatewayLost: testLease, ReapGap: gapMax})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { s.Close() })
			return s
		}
		start := func(t *testing.T) (*env, *Store, time.Time) {
			prefix := uniquePrefix()
			clock := clocktest.New(time.UnixMilli(startMs))
			e := &env{t: t, ctx: t.Context(), c: c, clock: clock, store: open(t, prefix, clock)}
			t0 := clock.Now()
			if evs := e.apply(0, leased("gw-a", false, write(dev, "coap/default", gateway.Connect, 0))); len(evs) != 1 {
				t.Fatalf("connect: %s", describe(evs))
			}
			e.reap(0, 10)
			return e, open(t, prefix, clock), t0
		}

		// renewedOnline: gw-a's renewal of the device, written after the
		// gap, and the reap after it change nothing: it stays online.
		renewedOnline := func(e *env) {
			e.t.Helper()
			if evs := e.apply(0, leased("gw-a", false, write(dev, "coap/default", gateway.Renew, 0))); len(evs) != 0 {
				e.t.Fatalf("renewal after the gap wrote %s", describe(evs))
			}
			if r := e.reap(0, 10); len(r.Offline) != 0 {
				e.t.Fatalf("reap after the renewal: %+v", r)
			}
			if d := e.device(dev); d.State != gateway.Online {
				e.t.Fatalf("device %+v, want online", d)
			}
		}

		t.Run("site frozen past lease and grace", func(t *testing.T) {
			e, other, t0 := start(t)
			e.clock.Set(t0.Add(testLease + testGrace + 5*time.Second))
			r := e.reap(0, 10)
			if len(r.Offline) != 0 || r.Held != 1 || !r.Gap {
				t.Fatalf("first reap after the gap: %+v, want the device held and the gap reported", r)
			}
			// another runner's store takes the shard a moment later: the
			// gap's end holds for it too
			e.clock.Advance(time.Second)
			r, err := other.Reap(t.Context(), 0, 10)
			if err != nil {
				t.Fatal(err)
			}
			if len(r.Offline) != 0 || r.Gap {
				t.Fatalf("another runner's reap after the gap: %+v, want the device still held and the gap ended", r)
			}
			// gw-a runs again and writes the device's evidence
			renewedOnline(e)
			if evs := e.events(0); len(evs) != 1 {
				t.Fatalf("log %s, want the connect only", describe(evs))
			}
			if n, err := c.XLen(t.Context(), e.store.keys[0].data[6]).Result(); err != nil || n != 0 {
				t.Fatalf("gateway events over the gap: %d (%v), want none", n, err)
			}
		})

		t.Run("gateway writes before the first reap after the gap", func(t *testing.T) {
			e, _, t0 := start(t)
			e.clock.Set(t0.Add(testLease + testGrace + 5*time.Second))
			renewedOnline(e)
		})

		t.Run("gateway silent, reaps on time", func(t *testing.T) {
			e, _, t0 := start(t)
			end := t0.Add(testLease + testGrace)
			for e.clock.Now().Add(time.Second).Before(end) {
				e.clock.Advance(time.Second)
				if r := e.reap(0, 10); len(r.Offline) != 0 || r.Gap {
					t.Fatalf("reap at %v, before the grace ended: %+v, want nothing (and no gap)", e.clock.Now().Sub(t0), r)
				}
			}
			e.clock.Set(end)
			r := e.reap(0, 10)
			if len(r.Offline) != 1 || r.Offline[0].Reason != gateway.ReasonGatewayLost {
				t.Fatalf("reap after the grace: %+v, want gateway_lost", r)
			}
		})
	})
}
