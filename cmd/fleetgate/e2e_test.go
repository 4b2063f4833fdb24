package main

import (
	"strings"
	"testing"
	"time"

	"github.com/fleetgate/fleetgate/gateway"
	"github.com/fleetgate/fleetgate/internal/redistest"
)

// scenario lets real time pass while devices act: the processes under
// test run on the real clock, so the scenario's own durations are real.
func scenario(d time.Duration) { time.Sleep(d) }

// A device that heartbeats gets one online event; once it stops, its
// offline event comes inside the bounds check-config derives.
func TestE2EOnlineThenOfflineWithinBound(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	rc := srv.Client(t)
	tm := fastTiming
	gw := newGateway(t, "gw-a", srv.Addr, tm)
	gw.start()

	d := device{t: t, id: "dev-bound"}
	stop := d.keepSending(func() string { return gw.coapAddr }, tm.heartbeat/2, time.Minute)
	scenario(tm.lease + 2*time.Second) // keeps sending longer than one lease
	last := stop()

	waitFor(t, tm.lease+tm.runnerInterval+10*time.Second, "offline event", func() bool {
		return len(eventsOf(events(t, rc, 4), d.id)) >= 2
	})
	evs := eventsOf(events(t, rc, 4), d.id)
	checkAlternates(t, d.id, evs)
	if len(evs) != 2 || evs[0].reason != "connect" || evs[1].reason != "expired" {
		t.Fatalf("events %+v, want online(connect) then offline(expired)", evs)
	}
	lag := evs[1].at.Sub(last)
	earliest := tm.lease - tm.renewEvery - 300*time.Millisecond
	worst := tm.lease + gateway.CoverageWait(tm.flush) + tm.runnerInterval + 1500*time.Millisecond
	if lag < earliest || lag > worst {
		t.Fatalf("offline %v after the last heartbeat, want within [%v, %v]", lag, earliest, worst)
	}
	if evs[1].deadline.IsZero() || evs[1].at.Before(evs[1].deadline) {
		t.Fatalf("offline event deadline %v at %v: want a deadline before the event", evs[1].deadline, evs[1].at)
	}
}

// A device moving between two gateways inside its lease, and a gateway
// restarted (cleanly and with kill -9) inside the lease, produce no event.
func TestE2EMoveAndRestartEmitNothing(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	rc := srv.Client(t)
	tm := fastTiming
	a := newGateway(t, "gw-a", srv.Addr, tm)
	b := newGateway(t, "gw-b", srv.Addr, tm)
	a.start()
	b.start()

	d := device{t: t, id: "dev-mover"}
	target := a.coapAddr
	var mu = make(chan string, 1)
	mu <- target
	addr := func() string { v := <-mu; mu <- v; return v }
	move := func(to string) { <-mu; mu <- to }

	stop := d.keepSending(addr, tm.heartbeat/2, 2*time.Minute)
	scenario(2 * time.Second)
	move(b.coapAddr) // roam to gateway b
	scenario(2 * time.Second)
	move(a.coapAddr) // and back to a, which now restarts cleanly
	a.stop()
	a.start()
	scenario(2 * time.Second)
	a.kill() // and is killed outright, then comes back
	a.start()
	scenario(2 * time.Second)
	stop()

	evs := eventsOf(events(t, rc, 4), d.id)
	if len(evs) != 1 || evs[0].state != "online" {
		t.Fatalf("while the device kept sending: events %+v, want exactly one online", evs)
	}
	waitFor(t, tm.lease+10*time.Second, "offline after the device stopped", func() bool {
		return len(eventsOf(events(t, rc, 4), d.id)) >= 2
	})
	checkAlternates(t, d.id, eventsOf(events(t, rc, 4), d.id))
}

// Redis is cut while devices keep sending; the gateway is killed -9 during
// the outage and restarted after it. Evidence sent during the outage still
// counts (it was in the outbox), and a device that kept sending is never
// reported offline.
func TestE2EOutageKillRestartKeepsEvidence(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	rc := srv.Client(t)
	px := redistest.NewProxy(t, srv.Addr)
	tm := e2eTiming{lease: 10 * time.Second, heartbeat: time.Second, renewEvery: time.Second, flush: 100 * time.Millisecond, runnerInterval: 100 * time.Millisecond}
	gw := newGateway(t, "gw-a", px.Addr(), tm)
	gw.start()
	addr := func() string { return gw.coapAddr }

	steady := device{t: t, id: "dev-steady"}
	brief := device{t: t, id: "dev-brief"}
	stopSteady := steady.keepSending(addr, tm.heartbeat/2, 2*time.Minute)
	stopBrief := brief.keepSending(addr, tm.heartbeat/2, 2*time.Minute)
	waitFor(t, 10*time.Second, "both devices online", func() bool {
		all := events(t, rc, 4)
		return len(eventsOf(all, steady.id)) == 1 && len(eventsOf(all, brief.id)) == 1
	})

	outage := time.Now()
	px.SetCut(true)
	scenario(2500 * time.Millisecond)
	lastBrief := stopBrief() // its last 2.5 s of evidence exist only in the outbox
	scenario(1500 * time.Millisecond)
	gw.kill()
	scenario(time.Second)
	px.SetCut(false)
	gw.start()
	scenario(2 * time.Second)

	all := events(t, rc, 4)
	if evs := eventsOf(all, steady.id); len(evs) != 1 {
		t.Fatalf("steady device: events %+v, want only its first online", evs)
	}
	waitFor(t, tm.lease+10*time.Second, "brief device offline", func() bool {
		return len(eventsOf(events(t, rc, 4), brief.id)) >= 2
	})
	evs := eventsOf(events(t, rc, 4), brief.id)
	checkAlternates(t, brief.id, evs)
	// Its deadline comes from evidence sent during the outage: later than
	// any deadline written before the link was cut.
	if min := lastBrief.Add(tm.lease - tm.renewEvery - 300*time.Millisecond); evs[1].deadline.Before(min) {
		t.Fatalf("brief device expired at deadline %v, want ≥ %v (last heartbeat %v, outage began %v): outage evidence was lost",
			evs[1].deadline, min, lastBrief, outage)
	}
	stopSteady()
	if evs := eventsOf(events(t, rc, 4), steady.id); len(evs) != 1 {
		t.Fatalf("steady device: events %+v, want only its first online", evs)
	}
}

// An outage longer than the lease, with the gateway killed -9 during it:
// evidence that lapsed in the outbox is dropped at replay, never written,
// so a device that stopped during the outage is not resurrected.
func TestE2EOutageLapsedEvidenceNotResurrected(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	rc := srv.Client(t)
	px := redistest.NewProxy(t, srv.Addr)
	tm := fastTiming
	gw := newGateway(t, "gw-a", px.Addr(), tm)
	gw.start()
	addr := func() string { return gw.coapAddr }

	gone := device{t: t, id: "dev-gone"}
	stop := gone.keepSending(addr, tm.heartbeat/2, time.Minute)
	waitFor(t, 10*time.Second, "device online", func() bool { return len(eventsOf(events(t, rc, 4), gone.id)) == 1 })
	px.SetCut(true)
	scenario(700 * time.Millisecond)
	stop() // its last evidence is in the outbox only
	scenario(1500 * time.Millisecond)
	gw.kill()
	scenario(tm.lease + time.Second) // the outbox evidence lapses meanwhile
	px.SetCut(false)
	gw.start()

	waitFor(t, tm.lease+10*time.Second, "offline event", func() bool { return len(eventsOf(events(t, rc, 4), gone.id)) >= 2 })
	scenario(2 * time.Second) // replay has run by now: it must add nothing
	evs := eventsOf(events(t, rc, 4), gone.id)
	checkAlternates(t, gone.id, evs)
	if len(evs) != 2 {
		t.Fatalf("events %+v, want online then offline only: lapsed evidence was resurrected", evs)
	}
}

// A gateway started while Redis is unreachable serves its devices at once
// (into the outbox); once Redis answers, the evidence is replayed and the
// device comes online with reason replay.
func TestE2EStartDuringOutage(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	rc := srv.Client(t)
	px := redistest.NewProxy(t, srv.Addr)
	px.SetCut(true)
	tm := e2eTiming{lease: 10 * time.Second, heartbeat: time.Second, renewEvery: time.Second, flush: 100 * time.Millisecond, runnerInterval: 100 * time.Millisecond}
	gw := newGateway(t, "gw-late", px.Addr(), tm)
	gw.start() // ready although Redis is cut
	d := device{t: t, id: "dev-late"}
	d.heartbeat(gw.coapAddr)
	waitFor(t, 10*time.Second, "outbox holds the device", func() bool {
		code, out, _ := runCLI(t, "status", "--addr", gw.admin, "--json")
		return code == 0 && strings.Contains(out, `"outbox_sessions": 1`)
	})
	px.SetCut(false)
	waitFor(t, 30*time.Second, "online after Redis answered", func() bool { return len(eventsOf(events(t, rc, 4), d.id)) == 1 })
	if evs := eventsOf(events(t, rc, 4), d.id); evs[0].state != "online" || evs[0].reason != "replay" {
		t.Fatalf("events %+v, want one online with reason replay", evs)
	}
	gw.stop()
}
