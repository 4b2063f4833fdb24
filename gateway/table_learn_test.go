package gateway_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/fleetgate/fleetgate/gateway"
)

// learnOptions are a table's options with learned leases on: lease 90 s,
// renew_every 20 s, max_lease 2 h.
func learnOptions() gateway.TableOptions {
	return gateway.TableOptions{Shards: 4, Lease: 90 * time.Second, RenewEvery: 20 * time.Second, LearnLease: true, MaxLease: 2 * time.Hour}
}

// TestTableLearnedLease: with learned leases on, a device that sends every
// 10 minutes starts at max_lease, keeps a local and a central lease that
// reach past its next message all along (its session is never swept, no
// write lapses), and settles at 3 × 10 min + renew_every; the writes
// carry the learned lease.
func TestTableLearnedLease(t *testing.T) {
	f := newFixture(t, learnOptions(), 1024)
	const period = 10 * time.Minute
	learned := gateway.LearnFactor*period + 20*time.Second
	var sentUntil time.Time // the central deadline: the latest write's observed_at + lease
	for i := range 40 {
		at := time.Duration(i) * period
		if n := f.tbl.Sweep(t0.Add(at)); n != 0 {
			t.Fatalf("message %d at %v: Sweep dropped %d sessions", i, at, n)
		}
		if i > 0 && !sentUntil.After(t0.Add(at)) {
			t.Fatalf("message %d at %v: the central deadline %v has passed", i, at, sentUntil.Sub(t0))
		}
		f.mustObserve("dev-1", "coap/default", gateway.Renew, at)
		for _, ev := range f.up.take() {
			if i == 0 && ev.Lease != 2*time.Hour {
				t.Fatalf("first write's lease %v, want max_lease 2h", ev.Lease)
			}
			sentUntil = maxTime(sentUntil, ev.ObservedAt.Add(ev.Lease))
		}
	}
	views := f.tbl.Sessions("dev-1")
	if len(views) != 1 {
		t.Fatalf("sessions %+v", views)
	}
	last := t0.Add(39 * period)
	if got := views[0].Deadline.Sub(last); got != learned {
		// the local deadline is the latest evidence's: its lease is the learned one
		t.Fatalf("local deadline %v after the last message, want the learned lease %v", got, learned)
	}
	// a device that asks for its own lease keeps it
	f.clock.Set(last.Add(time.Minute))
	if err := f.tbl.Observe(context.Background(), gateway.Evidence{Device: "dev-1", Session: "coap/default", Kind: gateway.Renew,
		ObservedAt: f.clock.Now(), Lease: 5 * time.Hour, Protocol: "coap"}); err != nil {
		t.Fatal(err)
	}
	if evs := f.up.take(); len(evs) != 1 || evs[0].Lease != 5*time.Hour {
		t.Fatalf("evidence with its own lease: writes %+v, want one with 5h", evs)
	}
}

// TestTableLearnedLeaseOffByDefault: without LearnLease, or with a
// max_lease not above the lease, evidence without a lease gets the lease.
func TestTableLearnedLeaseOffByDefault(t *testing.T) {
	for name, o := range map[string]gateway.TableOptions{
		"off":                {Lease: 90 * time.Second, MaxLease: 2 * time.Hour},
		"max_lease is lease": {Lease: 90 * time.Second, LearnLease: true, MaxLease: 90 * time.Second},
	} {
		t.Run(name, func(t *testing.T) {
			f := newFixture(t, o, 16)
			f.mustObserve("dev-1", "coap/default", gateway.Renew, 0)
			if evs := f.up.take(); len(evs) != 1 || evs[0].Lease != 90*time.Second {
				t.Fatalf("writes %+v, want one with the lease 90s", evs)
			}
		})
	}
}

// TestTableLearnedLeaseStartsSafe: a restart (a new table) forgets what
// was learned and holds every device for max_lease again until its period
// is learned anew; so does a device whose sessions all lapsed.
func TestTableLearnedLeaseStartsSafe(t *testing.T) {
	f := newFixture(t, learnOptions(), 1024)
	// a device sending every 10 s for 3 h: the start estimate (2 h − 20 s)/3
	// has shrunk to 10 s after 80 min, and the 2 h lease of its first
	// message has run out by 2 h
	for i := range 1081 {
		f.mustObserve("dev-1", "coap/default", gateway.Renew, time.Duration(i)*10*time.Second)
		f.up.take()
	}
	if v := f.tbl.Sessions("dev-1"); len(v) != 1 || v[0].Deadline.Sub(t0) != 3*time.Hour+90*time.Second {
		t.Fatalf("sessions %+v, want the deadline 3h + the lease 90s (the floor)", v)
	}
	restarted := newFixture(t, learnOptions(), 16)
	restarted.mustObserve("dev-1", "coap/default", gateway.Renew, 0)
	if evs := restarted.up.take(); len(evs) != 1 || evs[0].Lease != 2*time.Hour {
		t.Fatalf("after a restart: writes %+v, want one with max_lease 2h", evs)
	}
	// dev-1's sessions lapse: it starts again at max_lease
	if n := f.tbl.Sweep(t0.Add(4 * time.Hour)); n != 1 {
		t.Fatalf("Sweep dropped %d sessions, want 1", n)
	}
	f.mustObserve("dev-1", "coap/default", gateway.Renew, 4*time.Hour)
	if evs := f.up.take(); len(evs) != 1 || evs[0].Lease != 2*time.Hour {
		t.Fatalf("after its sessions lapsed: writes %+v, want one with max_lease 2h", evs)
	}
}

// TestTableLearnedLeaseNewSessionStartsAgain: a device that wakes once an
// hour and opens a new session each time (an MQTT client without a
// persistent session that drops its connection), pinging every 5 s for
// 5 minutes, is never left without a central deadline: its estimate, which
// sees only the gaps inside each session, starts again with each session
// instead of shrinking wake after wake below the hour between them.
func TestTableLearnedLeaseNewSessionStartsAgain(t *testing.T) {
	o := learnOptions()
	o.MaxLease = 4 * time.Hour
	f := newFixture(t, o, 1<<16)
	var deadline time.Time // the latest write's observed_at + lease: the central deadline
	for wake := range 40 {
		start := time.Duration(wake) * time.Hour
		if wake > 0 && !deadline.After(t0.Add(start)) {
			t.Fatalf("wake %d: the central deadline %v has passed", wake, deadline.Sub(t0))
		}
		f.tbl.Sweep(t0.Add(start)) // the sessions whose local lease ran out
		session := fmt.Sprintf("gw/1/%d", wake)
		for i := range 60 {
			f.mustObserve("dev-1", session, gateway.Renew, start+time.Duration(i)*5*time.Second)
		}
		for _, ev := range f.up.take() {
			deadline = maxTime(deadline, ev.ObservedAt.Add(ev.Lease))
		}
	}
}

// TestTableSetLearning: a reload turns learning on or off for evidence
// observed after it.
func TestTableSetLearning(t *testing.T) {
	f := newFixture(t, gateway.TableOptions{Lease: 90 * time.Second}, 16)
	f.mustObserve("dev-1", "coap/default", gateway.Renew, 0)
	f.tbl.SetLearning(true, time.Hour)
	f.mustObserve("dev-2", "coap/default", gateway.Renew, time.Second)
	f.tbl.SetTiming(60*time.Second, 10*time.Second) // keeps learning on
	f.mustObserve("dev-3", "coap/default", gateway.Renew, 2*time.Second)
	f.tbl.SetLearning(false, time.Hour)
	f.mustObserve("dev-4", "coap/default", gateway.Renew, 3*time.Second)
	got := map[gateway.DeviceID]time.Duration{}
	for _, ev := range f.up.take() {
		got[ev.Device] = ev.Lease
	}
	want := map[gateway.DeviceID]time.Duration{"dev-1": 90 * time.Second, "dev-2": time.Hour, "dev-3": time.Hour, "dev-4": 60 * time.Second}
	for d, l := range want {
		if got[d] != l {
			t.Errorf("%s: lease %v, want %v", d, got[d], l)
		}
	}
}

func maxTime(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}
