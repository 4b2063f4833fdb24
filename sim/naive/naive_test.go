package naive_test

import (
	"context"
	"testing"
	"time"

	"github.com/fleetgate/fleetgate/internal/redistest"
	"github.com/fleetgate/fleetgate/sim"
	"github.com/fleetgate/fleetgate/sim/naive"
)

// The same fleet and checker as for fleetgate: a small CoAP fleet with
// frozen and leaving devices is judged right.
func TestNaivePeerUnderTheChecker(t *testing.T) {
	srv := redistest.Start(t)
	ctx := context.Background()
	p, err := naive.Start(ctx, srv.Client(t), 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	rep, err := sim.Run(ctx, sim.Options{CoAP: []string{p.Addr()}, Source: p, Devices: 40, Duration: 4 * time.Second,
		Heartbeat: 300 * time.Millisecond, Scenarios: []sim.Churn{sim.Freeze, sim.Leave}, Prefix: "n-",
		Lease: 2 * time.Second, RenewEvery: 0, RunnerInterval: 100 * time.Millisecond, Slack: time.Second, Tolerance: 300 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if rep.Failed() || rep.Stopped == 0 || rep.Detection.N != rep.Stopped || rep.StoreCallsPerHeartbeat < 0.9 {
		t.Fatalf("report %+v", rep)
	}
}

// Expirations while the subscriber is cut are lost for good.
func TestNaiveCutLosesExpirations(t *testing.T) {
	srv := redistest.Start(t)
	rc := srv.Client(t)
	ctx := context.Background()
	p, err := naive.Start(ctx, rc, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	offline := func(dev string) bool {
		evs, _ := p.Events(ctx, time.Time{})
		for _, e := range evs {
			if e.Device == dev && e.State == "offline" {
				return true
			}
		}
		return false
	}
	waitFor := func(what string, cond func() bool) {
		t.Helper()
		for end := time.Now().Add(10 * time.Second); !cond(); time.Sleep(20 * time.Millisecond) {
			if time.Now().After(end) {
				t.Fatalf("timed out waiting for %s", what)
			}
		}
	}
	done := make(chan struct{})
	start := time.Now()
	go func() { defer close(done); p.Cut(ctx, 1500*time.Millisecond) }()
	if err := rc.Set(ctx, "naive:lost", "1", 200*time.Millisecond).Err(); err != nil {
		t.Fatal(err)
	}
	waitFor("the key to expire", func() bool { return rc.Exists(ctx, "naive:lost").Val() == 0 })
	<-done
	if time.Since(start) < 1500*time.Millisecond {
		t.Fatal("Cut returned early")
	}
	if err := rc.Set(ctx, "naive:heard", "1", 200*time.Millisecond).Err(); err != nil {
		t.Fatal(err)
	}
	waitFor("the offline after the subscriber is back", func() bool { return offline("heard") })
	if offline("lost") {
		t.Fatal("an expiration during the cut was heard")
	}
}
