package uplink

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/fleetgate/fleetgate/gateway"
	"github.com/fleetgate/fleetgate/internal/redistest"
)

// TestOutageBuffersAndReplays hangs a real Redis with SIGSTOP: writes go
// to the outbox coalesced per session, the status says down with the
// outbox's depth and age; after SIGCONT the outbox is replayed and
// emptied, evidence that lapsed meanwhile is dropped (its device is not
// online afterwards), and replaying the same entries again writes no
// event.
func TestOutageBuffersAndReplays(t *testing.T) {
	srv := redistest.Start(t)
	e := newEnv(t, Options{Lease: 90 * time.Second, MaxBatch: 50, Timeout: 300 * time.Millisecond,
		ProbeMin: 100 * time.Millisecond, ProbeMax: 100 * time.Millisecond}, OutboxOptions{}, redisStore(t, srv))
	u, ctx := e.u, context.Background()
	e.run()

	mustEnqueue(t, u, evidence("before", gateway.Connect, e.clock.Now()))
	if err := u.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	if info, err := e.store.Device(ctx, "before"); err != nil || info.State != gateway.Online {
		t.Fatalf("before the outage: %+v, %v", info, err)
	}

	callsUp := len(e.store.Calls())
	srv.Signal(syscall.SIGSTOP)
	stopped := true
	t.Cleanup(func() {
		if stopped {
			srv.Signal(syscall.SIGCONT)
		}
	})
	// The first flush into the hung server times out. Its request may
	// still run when the server resumes (it sits in the socket), so it
	// carries only evidence that is replayed anyway.
	mustEnqueue(t, u, evidence("stay", gateway.Connect, e.clock.Now()))
	if err := u.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	if st := u.Status(); st.Up || st.OutboxSessions != 1 || st.LastError == "" {
		t.Fatalf("after a failed flush: %+v; want down with 1 outbox session and the error", st)
	}
	callsDown := len(e.store.Calls())

	// While down, writes go straight to the outbox, coalesced: a shard
	// whose batch failed once gets no store call until it answers a
	// probe (health is per shard: another shard's first write fails once
	// too).
	mustEnqueue(t, u, evidence("lapse", gateway.Connect, e.clock.Now()))
	for range 5 {
		e.clock.Advance(16 * time.Second)
		mustEnqueue(t, u, evidence("stay", gateway.Renew, e.clock.Now()), evidence("before", gateway.Renew, e.clock.Now()))
		if err := u.Flush(ctx); err != nil {
			t.Fatal(err)
		}
	}
	st := u.Status()
	if st.Up || st.OutboxSessions != 3 || st.OutboxOldest != 80*time.Second || st.Pending != 0 {
		t.Fatalf("during the outage: %+v; want down, 3 sessions, oldest 80s, nothing pending", st)
	}
	body, err := json.Marshal(st)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{`"up":false`, `"outbox_sessions":3`, `"outbox_oldest_age_ns":80000000000`} {
		if !strings.Contains(string(body), want) {
			t.Fatalf("status JSON %s lacks %s", body, want)
		}
	}
	if got := metricValue(t, e.reg, "fleetgate_uplink_up", "", ""); got != 0 {
		t.Fatalf("fleetgate_uplink_up = %v during the outage", got)
	}
	if got := metricValue(t, e.reg, "fleetgate_outbox_sessions", "", ""); got != 3 {
		t.Fatalf("fleetgate_outbox_sessions = %v, want 3", got)
	}
	if got := metricValue(t, e.reg, "fleetgate_outbox_oldest_age_seconds", "", ""); got != 80 {
		t.Fatalf("fleetgate_outbox_oldest_age_seconds = %v, want 80", got)
	}
	failed := map[int]bool{}
	for _, c := range e.store.Calls()[callsUp:] {
		if failed[c.shard] {
			t.Fatalf("shard %d called again while down: %+v", c.shard, c)
		}
		failed[c.shard] = c.err != nil
	}

	// "lapse" was last seen 91s ago when the store answers again.
	e.clock.Advance(11 * time.Second)
	srv.Signal(syscall.SIGCONT)
	stopped = false
	step := func() { e.clock.Advance(100 * time.Millisecond) }
	waitFor(t, "uplink up and outbox replayed", 20*time.Second, step, func() bool {
		st := u.Status()
		return st.Up && st.OutboxSessions == 0
	})
	if st := u.Status(); st.Dropped.Lapsed != 1 || st.OutboxOldest != 0 {
		t.Fatalf("after replay: %+v; want 1 lapsed write dropped", st)
	}
	if got := metricValue(t, e.reg, "fleetgate_outbox_dropped_total", "reason", "lapsed"); got != 1 {
		t.Fatalf("fleetgate_outbox_dropped_total{reason=lapsed} = %v, want 1", got)
	}
	if _, err := e.store.Device(ctx, "lapse"); !errors.Is(err, gateway.ErrNotFound) {
		t.Fatalf("lapsed evidence reached the store: %v", err)
	}
	for _, d := range []gateway.DeviceID{"stay", "before"} {
		info, err := e.store.Device(ctx, d)
		if err != nil || info.State != gateway.Online {
			t.Fatalf("%s after replay: %+v, %v; want online", d, info, err)
		}
	}
	replays := 0
	for _, c := range e.store.Calls()[callsDown:] {
		if c.replay && c.err == nil {
			replays++
		}
	}
	if replays == 0 {
		t.Fatal("no replay batch reached the store")
	}
	events := allEvents(t, e.store)
	if err := onlineOnce(events, "before", "stay"); err != nil {
		t.Fatal(err)
	}

	// A crash between Apply and the outbox delete replays entries again:
	// no new event.
	if err := u.buffer([]item{
		{key{"stay", "coap/default"}, slot{kind: gateway.Renew, at: e.clock.Now().Add(-time.Second)}},
		{key{"before", "coap/default"}, slot{kind: gateway.Renew, at: e.clock.Now().Add(-time.Second)}},
	}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "second replay", 20*time.Second, step, func() bool { return u.Status().OutboxSessions == 0 })
	if again := allEvents(t, e.store); len(again) != len(events) {
		t.Fatalf("replaying again wrote events: %d, then %d", len(events), len(again))
	}
}

// onlineOnce checks that events hold exactly one event, online, for each
// device, and none for any other.
func onlineOnce(events []gateway.Event, devices ...gateway.DeviceID) error {
	n := map[gateway.DeviceID]int{}
	for _, ev := range events {
		if ev.State != gateway.Online {
			return fmt.Errorf("unexpected event %+v", ev)
		}
		n[ev.Device]++
	}
	for _, d := range devices {
		if n[d] != 1 {
			return fmt.Errorf("%d online events for %s, want 1: %+v", n[d], d, events)
		}
		delete(n, d)
	}
	if len(n) != 0 {
		return fmt.Errorf("events for other devices: %v", n)
	}
	return nil
}

// TestOutboxOverflowWhileRedisDown kills Redis: the outbox keeps the
// newest MaxSessions sessions and counts what it dropped; after a restart
// of the (now empty) server the rest is replayed.
func TestOutboxOverflowWhileRedisDown(t *testing.T) {
	srv := redistest.Start(t)
	e := newEnv(t, Options{Timeout: 500 * time.Millisecond, ProbeMin: 100 * time.Millisecond, ProbeMax: 100 * time.Millisecond},
		OutboxOptions{MaxSessions: 20}, redisStore(t, srv))
	u, ctx := e.u, context.Background()
	e.run()
	srv.Kill()
	for i := range 30 {
		mustEnqueue(t, u, evidence(gateway.DeviceID(fmt.Sprintf("ov-%02d", i)), gateway.Connect, e.clock.Now()))
		e.clock.Advance(time.Second)
		if i%10 == 9 {
			if err := u.Flush(ctx); err != nil {
				t.Fatal(err)
			}
		}
	}
	st := u.Status()
	if st.Up || st.OutboxSessions != 20 || st.Dropped.Overflow != 10 || st.OutboxOldest != 20*time.Second {
		t.Fatalf("status %+v: want down, 20 sessions, 10 dropped, oldest 20s", st)
	}
	if got := metricValue(t, e.reg, "fleetgate_outbox_dropped_total", "reason", "overflow"); got != 10 {
		t.Fatalf("fleetgate_outbox_dropped_total{reason=overflow} = %v, want 10", got)
	}
	srv.Restart()
	waitFor(t, "replay after restart", 20*time.Second, func() { e.clock.Advance(100 * time.Millisecond) }, func() bool {
		st := u.Status()
		return st.Up && st.OutboxSessions == 0
	})
	for i := range 30 {
		d := gateway.DeviceID(fmt.Sprintf("ov-%02d", i))
		_, err := e.store.Device(ctx, d)
		if dropped := i < 10; dropped != errors.Is(err, gateway.ErrNotFound) {
			t.Fatalf("%s (dropped=%v): %v", d, dropped, err)
		}
	}
}

// TestRunFinalFlush stops Run with writes pending: they reach the store,
// or, with the store hung, the outbox within the timeout.
func TestRunFinalFlush(t *testing.T) {
	runUntilCancel := func(t *testing.T, e *env) time.Duration {
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- e.u.Run(ctx) }()
		mustEnqueue(t, e.u, evidence("last", gateway.Connect, e.clock.Now()))
		start := time.Now()
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Fatalf("Run: %v", err)
			}
		case <-time.After(20 * time.Second):
			t.Fatal("Run did not return")
		}
		return time.Since(start)
	}
	t.Run("to the store", func(t *testing.T) {
		_, e := newEmbeddedUplink(t, Options{})
		runUntilCancel(t, e)
		if info, err := e.store.Device(context.Background(), "last"); err != nil || info.State != gateway.Online {
			t.Fatalf("after the final flush: %+v, %v", info, err)
		}
	})
	t.Run("to the outbox when the store hangs", func(t *testing.T) {
		srv := redistest.Start(t)
		e := newEnv(t, Options{Timeout: 300 * time.Millisecond}, OutboxOptions{}, redisStore(t, srv))
		srv.Signal(syscall.SIGSTOP)
		defer srv.Signal(syscall.SIGCONT)
		if took := runUntilCancel(t, e); took > 5*time.Second {
			t.Fatalf("final flush took %v with a 300ms timeout", took)
		}
		if st := e.u.Status(); st.OutboxSessions != 1 || st.Pending != 0 {
			t.Fatalf("after the final flush: %+v; want the write in the outbox", st)
		}
	})
}

// Evidence whose lease ran out in the outbox by less than the gateway
// grace is still replayed: the store moves the passed deadline of its
// session to it (the device's offline then names its true deadline);
// beyond the grace it is dropped as lapsed.
func TestReplayKeepsLapsedEvidenceForTheGrace(t *testing.T) {
	srv := redistest.Start(t)
	e := newEnv(t, Options{Lease: 10 * time.Second, Timeout: 300 * time.Millisecond, GatewayGrace: 20 * time.Second,
		ProbeMin: 100 * time.Millisecond, ProbeMax: 100 * time.Millisecond}, OutboxOptions{}, redisStoreOnClock(t, srv))
	u, ctx := e.u, context.Background()
	e.run()
	t0 := e.clock.Now()
	mustEnqueue(t, u, evidence("within", gateway.Connect, t0), evidence("beyond", gateway.Connect, t0))
	if err := u.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	srv.Signal(syscall.SIGSTOP)
	stopped := true
	t.Cleanup(func() {
		if stopped {
			srv.Signal(syscall.SIGCONT)
		}
	})
	// The first flush into the hung server fails on every shard; its
	// request may still run when the server resumes, so it carries only
	// devices of no concern. Then the shards are down: writes go to the
	// outbox with no store call.
	for i, seen := 0, map[int]bool{}; len(seen) < testShards && i < 1000; i++ {
		d := gateway.DeviceID(fmt.Sprintf("other-%d", i))
		if s := gateway.ShardOf(d, testShards); !seen[s] {
			seen[s] = true
			mustEnqueue(t, u, evidence(d, gateway.Connect, e.clock.Now()))
		}
	}
	if err := u.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	e.clock.Advance(4 * time.Second)
	mustEnqueue(t, u, evidence("beyond", gateway.Renew, e.clock.Now()))
	e.clock.Advance(2 * time.Second)
	mustEnqueue(t, u, evidence("within", gateway.Renew, e.clock.Now()))
	if err := u.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	// within's renewal lapsed 18.9 s ago, beyond's 20.9 s ago
	e.clock.Set(t0.Add(34900 * time.Millisecond))
	srv.Signal(syscall.SIGCONT)
	stopped = false
	waitFor(t, "outbox replayed", 20*time.Second, func() { e.clock.Advance(10 * time.Millisecond) }, func() bool {
		st := u.Status()
		return st.Up && st.OutboxSessions == 0
	})
	if st := u.Status(); st.Dropped.Lapsed != testShards+1 {
		t.Fatalf("after replay: %+v; want beyond's write and the others' dropped as lapsed", st)
	}
	// The test clock steps while the replay runs: between the uplink
	// reading a write's age and the store reading its time it may have
	// stepped, which dates the replayed renewal that much later (never
	// earlier). beyond's deadline is its connect's, untouched.
	const slack = 100 * time.Millisecond
	for d, want := range map[gateway.DeviceID]time.Time{"within": t0.Add(16 * time.Second), "beyond": t0.Add(10 * time.Second)} {
		info, err := e.store.Device(ctx, d)
		if err != nil || info.Deadline.Before(want) || info.Deadline.After(want.Add(slack)) {
			t.Errorf("%s after the replay: %+v, %v; want deadline %v (up to %v later)", d, info, err, want, slack)
		}
	}
}
