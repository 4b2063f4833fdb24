package gateway_test

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fleetgate/fleetgate/gateway"
	"github.com/fleetgate/fleetgate/gateway/clocktest"
	"pgregory.net/rapid"
)

var t0 = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

// recorder is an in-memory Uplink: a bounded FIFO queue of what the table
// enqueued, which the test reads. When it is full, Enqueue waits for room
// until ctx is done, as the real uplink does under backpressure.
type recorder struct {
	ch chan gateway.Evidence
	// during, if set, runs inside Enqueue before the evidence is queued.
	during func(gateway.Evidence)
}

func newRecorder(capacity int) *recorder {
	return &recorder{ch: make(chan gateway.Evidence, capacity)}
}

func (r *recorder) Enqueue(ctx context.Context, ev gateway.Evidence) error {
	if r.during != nil {
		r.during(ev)
	}
	select {
	case r.ch <- ev:
		return nil
	default:
	}
	select {
	case r.ch <- ev:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// take empties the queue and returns what it held, oldest first.
func (r *recorder) take() []gateway.Evidence {
	var out []gateway.Evidence
	for {
		select {
		case ev := <-r.ch:
			out = append(out, ev)
		default:
			return out
		}
	}
}

func mustDevice(t testing.TB, s string) gateway.DeviceID {
	t.Helper()
	d, err := gateway.ParseDeviceID(s)
	if err != nil {
		t.Fatal(err)
	}
	return d
}

func mustSession(t testing.TB, s string) gateway.SessionID {
	t.Helper()
	id, err := gateway.ParseSessionID(s)
	if err != nil {
		t.Fatal(err)
	}
	return id
}

// fixture is a table on a manual clock with lease 90s and renew_every 20s.
type fixture struct {
	t     *testing.T
	clock *clocktest.Clock
	up    *recorder
	tbl   *gateway.Table
}

func newFixture(t *testing.T, o gateway.TableOptions, queue int) *fixture {
	t.Helper()
	f := &fixture{t: t, clock: clocktest.New(t0), up: newRecorder(queue)}
	if o.Lease == 0 {
		o.Lease = 90 * time.Second
	}
	if o.RenewEvery == 0 {
		o.RenewEvery = 20 * time.Second
	}
	o.Clock = f.clock
	f.tbl = gateway.NewTable(f.up, o)
	return f
}

// observe moves the clock to t0+at and observes evidence of kind k then.
func (f *fixture) observe(dev, sess string, k gateway.Kind, at time.Duration) error {
	f.t.Helper()
	f.clock.Set(t0.Add(at))
	return f.tbl.Observe(context.Background(), gateway.Evidence{
		Device: mustDevice(f.t, dev), Session: mustSession(f.t, sess),
		Kind: k, ObservedAt: f.clock.Now(), Protocol: "coap",
	})
}

func (f *fixture) mustObserve(dev, sess string, k gateway.Kind, at time.Duration) {
	f.t.Helper()
	if err := f.observe(dev, sess, k, at); err != nil {
		f.t.Fatalf("observe %s %s %v at %v: %v", dev, sess, k, at, err)
	}
}

// expect checks that exactly the writes want (kind, offset from t0) were
// enqueued since the last call.
func (f *fixture) expect(want ...write) {
	f.t.Helper()
	var got []write
	for _, ev := range f.up.take() {
		got = append(got, write{string(ev.Device) + " " + string(ev.Session), ev.Kind, ev.ObservedAt.Sub(t0)})
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		f.t.Fatalf("writes:\n got %v\nwant %v", got, want)
	}
}

type write struct {
	who  string
	kind gateway.Kind
	at   time.Duration
}

func w(who string, k gateway.Kind, at time.Duration) write { return write{who, k, at} }

func TestTableConnectRenewLeave(t *testing.T) {
	f := newFixture(t, gateway.TableOptions{}, 16)
	const s = time.Second

	// A POST /hb of an unknown session is its connect.
	f.mustObserve("dev-1", "coap/default", gateway.Renew, 0)
	f.expect(w("dev-1 coap/default", gateway.Connect, 0))

	// Heartbeats that would move the deadline by less than 20s stay local.
	for _, at := range []time.Duration{5 * s, 10 * s, 15 * s, 19*s + 999*time.Millisecond} {
		f.mustObserve("dev-1", "coap/default", gateway.Renew, at)
	}
	f.expect()
	f.mustObserve("dev-1", "coap/default", gateway.Renew, 20*s)
	f.expect(w("dev-1 coap/default", gateway.Renew, 20*s))
	f.mustObserve("dev-1", "coap/default", gateway.Renew, 30*s)
	f.expect()

	got := f.tbl.Sessions("dev-1")
	want := []gateway.SessionView{{
		Device: "dev-1", Session: "coap/default", Protocol: "coap",
		FirstSeen: t0, LastSeen: t0.Add(30 * s), LastSent: t0.Add(20 * s), Deadline: t0.Add(30*s + 90*s),
	}}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("Sessions:\n got %+v\nwant %+v", got, want)
	}
	if n := f.tbl.Len(); n != 1 {
		t.Fatalf("Len = %d, want 1", n)
	}

	f.mustObserve("dev-1", "coap/default", gateway.Leave, 31*s)
	f.expect(w("dev-1 coap/default", gateway.Leave, 31*s))
	if n, got := f.tbl.Len(), f.tbl.Sessions("dev-1"); n != 0 || len(got) != 0 {
		t.Fatalf("after leave: Len = %d, Sessions = %v", n, got)
	}

	// After a leave the next heartbeat is a connect again.
	f.mustObserve("dev-1", "coap/default", gateway.Renew, 32*s)
	f.expect(w("dev-1 coap/default", gateway.Connect, 32*s))
}

func TestTableLeaveOfUnknownSessionIsSent(t *testing.T) {
	f := newFixture(t, gateway.TableOptions{}, 16)
	f.mustObserve("dev-1", "mqtt/1/7", gateway.Leave, time.Second)
	f.mustObserve("dev-1", "mqtt/1/7", gateway.Leave, 2*time.Second)
	f.expect(w("dev-1 mqtt/1/7", gateway.Leave, time.Second), w("dev-1 mqtt/1/7", gateway.Leave, 2*time.Second))
	if n := f.tbl.Len(); n != 0 {
		t.Fatalf("Len = %d, want 0", n)
	}
}

func TestTableConnectOfKnownSessionIsSentAndResetsThrottle(t *testing.T) {
	f := newFixture(t, gateway.TableOptions{}, 16)
	const s = time.Second
	f.mustObserve("dev-1", "gw/1/1", gateway.Connect, 0)
	f.mustObserve("dev-1", "gw/1/1", gateway.Connect, 1*s)
	f.expect(w("dev-1 gw/1/1", gateway.Connect, 0), w("dev-1 gw/1/1", gateway.Connect, 1*s))
	// The throttle counts from the newest connect.
	f.mustObserve("dev-1", "gw/1/1", gateway.Renew, 20*s)
	f.expect()
	f.mustObserve("dev-1", "gw/1/1", gateway.Renew, 21*s)
	f.expect(w("dev-1 gw/1/1", gateway.Renew, 21*s))
}

func TestTableSessionsOfOneDevice(t *testing.T) {
	f := newFixture(t, gateway.TableOptions{Shards: 1}, 16) // all in one shard
	f.mustObserve("dev-1", "coap/b", gateway.Renew, 0)
	f.mustObserve("dev-1", "coap/a", gateway.Renew, 0)
	f.mustObserve("dev-10", "coap/a", gateway.Renew, 0)
	f.mustObserve("dev-2", "coap/a", gateway.Renew, 0)
	got := f.tbl.Sessions("dev-1")
	if len(got) != 2 || got[0].Session != "coap/a" || got[1].Session != "coap/b" || got[0].Device != "dev-1" {
		t.Fatalf("Sessions(dev-1) = %+v, want coap/a and coap/b of dev-1", got)
	}
	// Evidence of one session never renews another of the same device.
	f.up.take()
	f.mustObserve("dev-1", "coap/a", gateway.Renew, 25*time.Second)
	f.expect(w("dev-1 coap/a", gateway.Renew, 25*time.Second))
	if got := f.tbl.Sessions("dev-1"); !got[1].LastSeen.Equal(t0) {
		t.Fatalf("coap/b LastSeen = %v, want %v", got[1].LastSeen, t0)
	}
}

func TestTableProtocolNames(t *testing.T) {
	f := newFixture(t, gateway.TableOptions{}, 512)
	// A table keeps 255 protocol names; later ones show as "".
	for i := range 300 {
		ev := gateway.Evidence{Device: mustDevice(t, fmt.Sprintf("dev-%d", i)), Session: "s", Kind: gateway.Renew, Protocol: fmt.Sprintf("proto-%d", i)}
		if err := f.tbl.Observe(context.Background(), ev); err != nil {
			t.Fatal(err)
		}
	}
	if err := f.tbl.Observe(context.Background(), gateway.Evidence{Device: "dev-0", Session: "t", Kind: gateway.Renew, Protocol: "proto-0"}); err != nil {
		t.Fatal(err)
	}
	for i := range 300 {
		want := fmt.Sprintf("proto-%d", i)
		if i >= 255 {
			want = ""
		}
		if got := f.tbl.Sessions(mustDevice(t, fmt.Sprintf("dev-%d", i))); got[0].Protocol != want {
			t.Fatalf("dev-%d: Protocol = %q, want %q", i, got[0].Protocol, want)
		}
	}
	if got := f.tbl.Sessions("dev-0"); len(got) != 2 || got[1].Protocol != "proto-0" {
		t.Fatalf("dev-0: %+v", got)
	}
}

func TestTableMaxSessions(t *testing.T) {
	f := newFixture(t, gateway.TableOptions{MaxSessions: 2}, 16)
	const s = time.Second
	f.mustObserve("dev-1", "coap/default", gateway.Renew, 0)
	f.mustObserve("dev-2", "coap/default", gateway.Renew, 0)
	f.up.take()

	err := f.observe("dev-3", "coap/default", gateway.Renew, s)
	if !errors.Is(err, gateway.ErrOverloaded) {
		t.Fatalf("third session: err = %v, want ErrOverloaded", err)
	}
	f.expect()
	if n := f.tbl.Len(); n != 2 {
		t.Fatalf("Len = %d, want 2", n)
	}
	// Known sessions still renew at the cap.
	f.mustObserve("dev-1", "coap/default", gateway.Renew, 20*s)
	f.expect(w("dev-1 coap/default", gateway.Renew, 20*s))
	// A leave makes room.
	f.mustObserve("dev-2", "coap/default", gateway.Leave, 21*s)
	f.mustObserve("dev-3", "coap/default", gateway.Renew, 22*s)
	f.expect(w("dev-2 coap/default", gateway.Leave, 21*s), w("dev-3 coap/default", gateway.Connect, 22*s))
}

// Sweep keeps a session it drops for KeepLapsed after its deadline, for
// a restore (Restorable lists it after the live ones), if a write of it
// was accepted.
func TestTableKeepsLapsedForRestore(t *testing.T) {
	f := newFixture(t, gateway.TableOptions{KeepLapsed: 100 * time.Second}, 1)
	const s = time.Second
	f.mustObserve("dev-sent", "coap/default", gateway.Renew, 0)
	// the queue is full: dev-refused's connect is refused
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := f.tbl.Observe(ctx, gateway.Evidence{Device: "dev-refused", Session: "coap/default", Kind: gateway.Renew, ObservedAt: t0, Protocol: "coap"}); err == nil {
		t.Fatal("observe with a full queue and a done context: no error")
	}
	f.up.take()
	f.mustObserve("dev-live", "coap/default", gateway.Renew, 60*s)
	restorable := func() []string {
		var got []string
		f.tbl.Restorable(func(v gateway.SessionView) bool {
			got = append(got, fmt.Sprintf("%s %v", v.Device, v.Deadline.Sub(t0)))
			return true
		})
		return got
	}
	if n := f.tbl.Sweep(t0.Add(95 * s)); n != 2 {
		t.Fatalf("Sweep dropped %d, want 2", n)
	}
	if got, want := fmt.Sprint(restorable()), "[dev-live 2m30s dev-sent 1m30s]"; got != want {
		t.Fatalf("restorable after the sweep: %s, want %s", got, want)
	}
	f.tbl.Sweep(t0.Add(190 * s)) // dev-sent's deadline + 100 s: forgotten
	if got, want := fmt.Sprint(restorable()), "[dev-live 2m30s]"; got != want {
		t.Fatalf("restorable past KeepLapsed: %s, want %s", got, want)
	}
}

func TestTableSweep(t *testing.T) {
	f := newFixture(t, gateway.TableOptions{}, 16)
	const s = time.Second
	f.mustObserve("dev-1", "coap/default", gateway.Renew, 0)
	f.mustObserve("dev-2", "coap/default", gateway.Renew, 0)
	f.mustObserve("dev-2", "coap/default", gateway.Renew, 60*s)
	f.up.take()

	if n := f.tbl.Sweep(t0.Add(90*s - time.Nanosecond)); n != 0 {
		t.Fatalf("Sweep before the lease ran out dropped %d", n)
	}
	if n := f.tbl.Sweep(t0.Add(90 * s)); n != 1 {
		t.Fatalf("Sweep at now − lastSeen = lease dropped %d, want 1", n)
	}
	f.expect() // the central lease decides: nothing is sent
	if got := f.tbl.Sessions("dev-1"); len(got) != 0 {
		t.Fatalf("dev-1 still held: %v", got)
	}
	if n := f.tbl.Len(); n != 1 {
		t.Fatalf("Len = %d, want 1", n)
	}
	if n := f.tbl.Sweep(t0.Add(149 * s)); n != 0 {
		t.Fatalf("second Sweep dropped %d", n)
	}
	// A swept session that comes back connects again.
	f.mustObserve("dev-1", "coap/default", gateway.Renew, 100*s)
	f.expect(w("dev-1 coap/default", gateway.Connect, 100*s))
}

// Devices counts each device once, by its newest session: online within
// suspect_after of it, suspect until the lease runs out, then nowhere.
func TestTableDevicesByState(t *testing.T) {
	f := newFixture(t, gateway.TableOptions{Shards: 2}, 64)
	const s = time.Second
	const suspectAfter = 45 * s
	f.mustObserve("dev-1", "coap/default", gateway.Renew, 0)
	f.mustObserve("dev-2", "coap/a", gateway.Renew, 0)
	f.mustObserve("dev-3", "coap/b", gateway.Renew, 0)
	f.mustObserve("dev-3", "coap/a", gateway.Renew, 10*s)
	f.mustObserve("dev-2", "coap/b", gateway.Renew, 30*s) // the newest session decides
	f.mustObserve("dev-4", "mqtt/1", gateway.Renew, 44*s)
	for _, c := range []struct {
		at   time.Duration
		want gateway.DeviceCounts
	}{
		{45*s - time.Nanosecond, gateway.DeviceCounts{Online: 4}},
		{50 * s, gateway.DeviceCounts{Online: 3, Suspect: 1}}, // dev-1: 45s since its evidence
		{55 * s, gateway.DeviceCounts{Online: 2, Suspect: 2}}, // dev-3: 45s since its newest
		{75 * s, gateway.DeviceCounts{Online: 1, Suspect: 3}}, // dev-2: 45s since its newest
		{89 * s, gateway.DeviceCounts{Suspect: 4}},            // dev-4
		{90 * s, gateway.DeviceCounts{Suspect: 3}},            // dev-1's lease ran out
		{100*s - time.Nanosecond, gateway.DeviceCounts{Suspect: 3}},
		{100 * s, gateway.DeviceCounts{Suspect: 2}}, // dev-3's newest ran out
		{120 * s, gateway.DeviceCounts{Suspect: 1}},
		{140 * s, gateway.DeviceCounts{}},
	} {
		if got := f.tbl.Devices(t0.Add(c.at), suspectAfter); got != c.want {
			t.Errorf("Devices at +%v = %+v, want %+v", c.at, got, c.want)
		}
	}
}

// A device with a lease of its own (the devices file's, an adapter's,
// a learned one) is judged by its deadline, as the store's Counts and
// the API judge it: suspect in the last lease − suspect_after of its
// own lease, counted until that lease runs out.
func TestTableDevicesOwnLease(t *testing.T) {
	f := newFixture(t, gateway.TableOptions{Shards: 2, MaxLease: 3 * time.Hour}, 64)
	const s = time.Second
	f.mustObserve("dev-1", "coap/default", gateway.Renew, 0)
	f.clock.Set(t0)
	if err := f.tbl.Observe(context.Background(), gateway.Evidence{Device: "dev-2", Session: "lora/default", Kind: gateway.Renew,
		ObservedAt: t0, Protocol: "lorawan", Lease: 2 * time.Hour}); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		at   time.Duration
		want gateway.DeviceCounts
	}{
		{44 * s, gateway.DeviceCounts{Online: 2}},
		{45 * s, gateway.DeviceCounts{Online: 1, Suspect: 1}},
		{90 * s, gateway.DeviceCounts{Online: 1}}, // dev-1's 90 s lease ran out, not dev-2's
		{7155*s - time.Nanosecond, gateway.DeviceCounts{Online: 1}},
		{7155 * s, gateway.DeviceCounts{Suspect: 1}}, // 45 s before its deadline
		{7200*s - time.Nanosecond, gateway.DeviceCounts{Suspect: 1}},
		{7200 * s, gateway.DeviceCounts{}},
	} {
		if got := f.tbl.Devices(t0.Add(c.at), 45*s); got != c.want {
			t.Errorf("Devices at +%v = %+v, want %+v", c.at, got, c.want)
		}
	}
}

// A device counts once however its sessions come and go.
func TestTableDevicesSessionsComeAndGo(t *testing.T) {
	f := newFixture(t, gateway.TableOptions{Shards: 1}, 64)
	want := func(at time.Duration, online, suspect int) {
		t.Helper()
		if got := f.tbl.Devices(t0.Add(at), 45*time.Second); got != (gateway.DeviceCounts{Online: online, Suspect: suspect}) {
			t.Fatalf("Devices at +%v = %+v, want %d online, %d suspect", at, got, online, suspect)
		}
	}
	f.mustObserve("dev-1", "coap/a", gateway.Renew, 0)
	f.mustObserve("dev-1", "coap/b", gateway.Renew, 0)
	f.mustObserve("dev-2", "coap/a", gateway.Renew, 0)
	want(0, 2, 0)
	f.mustObserve("dev-1", "coap/b", gateway.Leave, time.Second)
	want(time.Second, 2, 0)
	f.mustObserve("dev-1", "coap/c", gateway.Renew, 2*time.Second)
	f.mustObserve("dev-1", "coap/d", gateway.Renew, 2*time.Second)
	want(2*time.Second, 2, 0)
	f.mustObserve("dev-1", "coap/a", gateway.Leave, 3*time.Second)
	f.mustObserve("dev-1", "coap/c", gateway.Leave, 3*time.Second)
	want(46*time.Second, 1, 1) // dev-1 by coap/d (+2s), dev-2 suspect
	if n := f.tbl.Sweep(t0.Add(90 * time.Second)); n != 1 {
		t.Fatalf("Sweep dropped %d, want dev-2's session", n)
	}
	want(90*time.Second, 0, 1)
}

func TestTableLocalLeaseRunOutWithoutSweep(t *testing.T) {
	f := newFixture(t, gateway.TableOptions{}, 16)
	f.mustObserve("dev-1", "coap/default", gateway.Renew, 0)
	f.mustObserve("dev-1", "coap/default", gateway.Renew, 90*time.Second)
	f.expect(w("dev-1 coap/default", gateway.Connect, 0), w("dev-1 coap/default", gateway.Connect, 90*time.Second))
	if got := f.tbl.Sessions("dev-1"); len(got) != 1 || !got[0].FirstSeen.Equal(t0.Add(90*time.Second)) {
		t.Fatalf("Sessions = %+v, want one first seen at +90s", got)
	}
	if n := f.tbl.Len(); n != 1 {
		t.Fatalf("Len = %d, want 1", n)
	}
}

func TestTableSetTiming(t *testing.T) {
	f := newFixture(t, gateway.TableOptions{}, 16)
	const s = time.Second
	f.mustObserve("dev-1", "coap/default", gateway.Renew, 0) // lease 90s: deadline 90s
	f.tbl.SetTiming(30*s, 5*s)
	// Under lease 30s a renewal moves the deadline only from 60s on.
	f.mustObserve("dev-1", "coap/default", gateway.Renew, 4*s)
	f.mustObserve("dev-1", "coap/default", gateway.Renew, 64*s)
	f.mustObserve("dev-1", "coap/default", gateway.Renew, 65*s)
	f.expect(w("dev-1 coap/default", gateway.Connect, 0), w("dev-1 coap/default", gateway.Renew, 65*s))
	if n := f.tbl.Sweep(t0.Add(94 * s)); n != 0 {
		t.Fatalf("Sweep at 94s dropped %d, want 0 (evidence at 65s holds it to 95s)", n)
	}
	if n := f.tbl.Sweep(t0.Add(95 * s)); n != 1 {
		t.Fatalf("Sweep at 95s dropped %d, want 1", n)
	}
	// Zero values go back to the defaults (90s, 20s).
	f.tbl.SetTiming(0, 0)
	f.mustObserve("dev-1", "coap/default", gateway.Renew, 100*s)
	f.mustObserve("dev-1", "coap/default", gateway.Renew, 119*s)
	f.mustObserve("dev-1", "coap/default", gateway.Renew, 120*s)
	f.expect(w("dev-1 coap/default", gateway.Connect, 100*s), w("dev-1 coap/default", gateway.Renew, 120*s))
	if n := f.tbl.Sweep(t0.Add(209 * s)); n != 0 {
		t.Fatalf("Sweep with lease 90s dropped %d, want 0", n)
	}
}

func TestTableFailedEnqueueIsRetried(t *testing.T) {
	f := newFixture(t, gateway.TableOptions{}, 1)
	const s = time.Second
	cancelled, cancel := context.WithCancel(context.Background())
	cancel()
	observe := func(dev string, at time.Duration) error {
		f.clock.Set(t0.Add(at))
		return f.tbl.Observe(cancelled, gateway.Evidence{
			Device: mustDevice(t, dev), Session: "coap/default", Kind: gateway.Renew, ObservedAt: f.clock.Now(),
		})
	}

	if err := observe("dev-1", 0); err != nil {
		t.Fatal(err)
	}
	// The queue is full: the connect of dev-2 cannot be enqueued.
	if err := observe("dev-2", s); !errors.Is(err, context.Canceled) {
		t.Fatalf("connect into a full queue: err = %v, want context.Canceled", err)
	}
	f.expect(w("dev-1 coap/default", gateway.Connect, 0))
	// The session is held (its evidence was seen) but nothing counts as sent.
	if got := f.tbl.Sessions("dev-2"); len(got) != 1 || !got[0].LastSent.IsZero() {
		t.Fatalf("dev-2 after a failed connect: %+v", got)
	}
	if err := observe("dev-2", 2*s); err != nil {
		t.Fatal(err)
	}
	f.expect(w("dev-2 coap/default", gateway.Connect, 2*s))

	// A renewal that fails is retried by the next heartbeat.
	if err := observe("dev-2", 3*s); err != nil { // throttled: nothing queued
		t.Fatal(err)
	}
	if err := observe("dev-1", 20*s); err != nil { // fills the queue
		t.Fatal(err)
	}
	if err := observe("dev-2", 22*s); !errors.Is(err, context.Canceled) {
		t.Fatalf("renew into a full queue: err = %v, want context.Canceled", err)
	}
	if got := f.tbl.Sessions("dev-2"); !got[0].LastSent.Equal(t0.Add(2*s)) || !got[0].LastSeen.Equal(t0.Add(22*s)) {
		t.Fatalf("dev-2 after a failed renew: %+v, want LastSent +2s, LastSeen +22s", got)
	}
	f.expect(w("dev-1 coap/default", gateway.Renew, 20*s))
	if err := observe("dev-2", 23*s); err != nil {
		t.Fatal(err)
	}
	f.expect(w("dev-2 coap/default", gateway.Renew, 23*s))

	// A failed leave is reported; the session is gone locally either way
	// (the central lease ends it).
	if err := observe("dev-1", 24*s); err != nil {
		t.Fatal(err)
	}
	f.up.ch <- gateway.Evidence{} // fill the queue
	err := f.tbl.Observe(cancelled, gateway.Evidence{Device: "dev-2", Session: "coap/default", Kind: gateway.Leave, ObservedAt: t0.Add(25 * s)})
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("leave into a full queue: err = %v", err)
	}
	if n := f.tbl.Len(); n != 1 {
		t.Fatalf("Len = %d, want 1", n)
	}
}

func TestTableDoesNotHoldLockDuringEnqueue(t *testing.T) {
	f := newFixture(t, gateway.TableOptions{Shards: 1}, 16)
	f.up.during = func(ev gateway.Evidence) {
		// Would deadlock if Observe held the shard's lock.
		f.tbl.Sessions(ev.Device)
		f.tbl.Range(func(gateway.SessionView) bool { return true })
	}
	done := make(chan error, 1)
	go func() {
		done <- f.observe("dev-1", "coap/default", gateway.Renew, 0)
	}()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Observe is stuck: it holds a shard lock while calling Enqueue")
	}
	f.expect(w("dev-1 coap/default", gateway.Connect, 0))
}

func TestTableRefusesInvalidEvidence(t *testing.T) {
	f := newFixture(t, gateway.TableOptions{}, 16)
	for _, tc := range []struct {
		name string
		ev   gateway.Evidence
		want error
	}{
		{"empty device", gateway.Evidence{Session: "coap/default", Kind: gateway.Renew}, gateway.ErrInvalidDeviceID},
		{"unchecked device", gateway.Evidence{Device: "dev 1", Session: "coap/default", Kind: gateway.Renew}, gateway.ErrInvalidDeviceID},
		{"zero byte in device", gateway.Evidence{Device: "dev\x001", Session: "coap/default", Kind: gateway.Connect}, gateway.ErrInvalidDeviceID},
		{"empty session", gateway.Evidence{Device: "dev-1", Kind: gateway.Renew}, gateway.ErrInvalidSessionID},
		{"empty session leave", gateway.Evidence{Device: "dev-1", Kind: gateway.Leave}, gateway.ErrInvalidSessionID},
		{"session with space", gateway.Evidence{Device: "dev-1", Session: "coap/a b", Kind: gateway.Renew}, gateway.ErrInvalidSessionID},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := f.tbl.Observe(context.Background(), tc.ev); !errors.Is(err, tc.want) {
				t.Fatalf("err = %v, want %v", err, tc.want)
			}
		})
	}
	if err := f.tbl.Observe(context.Background(), gateway.Evidence{Device: "dev-1", Session: "coap/default"}); err == nil {
		t.Fatal("evidence without a kind was accepted")
	}
	f.expect()
	if n := f.tbl.Len(); n != 0 {
		t.Fatalf("Len = %d, want 0", n)
	}
}

func TestTableZeroObservedAtIsNow(t *testing.T) {
	f := newFixture(t, gateway.TableOptions{}, 16)
	f.clock.Advance(7 * time.Second)
	if err := f.tbl.Observe(context.Background(), gateway.Evidence{Device: "dev-1", Session: "coap/default", Kind: gateway.Renew}); err != nil {
		t.Fatal(err)
	}
	f.expect(w("dev-1 coap/default", gateway.Connect, 7*time.Second))
}

func TestTableRange(t *testing.T) {
	f := newFixture(t, gateway.TableOptions{Shards: 3}, 64)
	want := map[string]bool{}
	for d := range 5 {
		for s := range 2 {
			dev, sess := fmt.Sprintf("dev-%d", d), fmt.Sprintf("coap/%d", s)
			f.mustObserve(dev, sess, gateway.Renew, time.Duration(d)*time.Second)
			want[dev+" "+sess] = true
		}
	}
	seen := map[string]bool{}
	f.tbl.Range(func(v gateway.SessionView) bool {
		k := string(v.Device) + " " + string(v.Session)
		if seen[k] {
			t.Errorf("%s visited twice", k)
		}
		seen[k] = true
		if v.Protocol != "coap" || v.LastSent.IsZero() || !v.FirstSeen.Equal(v.LastSeen) {
			t.Errorf("view %+v", v)
		}
		f.tbl.Len() // fn may use the table
		return true
	})
	if fmt.Sprint(seen) != fmt.Sprint(want) {
		t.Fatalf("Range visited %v, want %v", seen, want)
	}
	visits := 0
	f.tbl.Range(func(gateway.SessionView) bool { visits++; return visits < 3 })
	if visits != 3 {
		t.Fatalf("Range went on after fn returned false: %d visits", visits)
	}
}

// TestTableConcurrent runs workers that each own some sessions, workers
// that share one session, and a sweeper/reader, under -race; then it
// checks the writes of every session.
func TestTableConcurrent(t *testing.T) {
	const (
		workers   = 6
		perWorker = 20
		rounds    = 150
		step      = 10 * time.Millisecond
		renew     = time.Second
	)
	clock := clocktest.New(t0)
	up := newRecorder(workers * rounds * 4)
	tbl := gateway.NewTable(up, gateway.TableOptions{Shards: 4, Lease: time.Hour, RenewEvery: renew, MaxSessionsPerDevice: 1 << 20, Clock: clock})
	ctx := context.Background()

	var wg sync.WaitGroup
	errs := make(chan error, workers+1)
	for wk := range workers {
		wg.Go(func() {
			for r := range rounds {
				clock.Advance(step)
				sess := gateway.SessionID(fmt.Sprintf("coap/%d", r%perWorker))
				if err := tbl.Observe(ctx, gateway.Evidence{Device: gateway.DeviceID(fmt.Sprintf("dev-%d", wk)), Session: sess, Kind: gateway.Renew, Protocol: "coap"}); err != nil {
					errs <- err
					return
				}
				if err := tbl.Observe(ctx, gateway.Evidence{Device: "shared", Session: "coap/default", Kind: gateway.Renew}); err != nil {
					errs <- err
					return
				}
			}
			if err := tbl.Observe(ctx, gateway.Evidence{Device: gateway.DeviceID(fmt.Sprintf("dev-%d", wk)), Session: "coap/0", Kind: gateway.Leave}); err != nil {
				errs <- err
			}
		})
	}
	stop := make(chan struct{})
	var readers sync.WaitGroup
	readers.Go(func() {
		deadline := time.Now().Add(30 * time.Second)
		for {
			select {
			case <-stop:
				return
			default:
			}
			tbl.Sweep(clock.Now()) // lease 1h: drops nothing
			tbl.Range(func(gateway.SessionView) bool { return true })
			tbl.Sessions("shared")
			tbl.SetTiming(time.Hour, renew)
			if time.Now().After(deadline) {
				errs <- errors.New("workers did not finish within 30s")
				return
			}
		}
	})
	wg.Wait()
	close(stop)
	readers.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}

	if n, want := tbl.Len(), workers*(perWorker-1)+1; n != want {
		t.Fatalf("Len = %d, want %d", n, want)
	}
	byKey := map[string][]gateway.Evidence{}
	for _, ev := range up.take() {
		k := string(ev.Device) + " " + string(ev.Session)
		byKey[k] = append(byKey[k], ev)
	}
	if len(byKey) != workers*perWorker+1 {
		t.Fatalf("writes for %d sessions, want %d", len(byKey), workers*perWorker+1)
	}
	for k, evs := range byKey {
		if evs[0].Kind != gateway.Connect {
			t.Errorf("%s: first write %v, want connect", k, evs[0].Kind)
		}
		// Renew writes are reserved in time order under the shard lock,
		// whatever order the goroutines then enqueued them in.
		var last time.Time
		for i, ev := range sortedByTime(evs) {
			switch {
			case i == 0 && ev.Kind != gateway.Connect:
				t.Errorf("%s: earliest write %v", k, ev.Kind)
			case i > 0 && ev.Kind == gateway.Connect:
				t.Errorf("%s: second connect at %v", k, ev.ObservedAt)
			case i > 0 && ev.Kind == gateway.Renew && ev.ObservedAt.Sub(last) < renew:
				t.Errorf("%s: renew %v after the previous write, less than %v", k, ev.ObservedAt.Sub(last), renew)
			}
			last = ev.ObservedAt
		}
	}
	if n := len(byKey["shared coap/default"]); n < 2 {
		t.Fatalf("shared session written %d times over %v", n, time.Duration(workers*rounds)*step)
	}
}

// TestTableConcurrentRefusals has workers renew one shared session and
// their own through a queue of two that one worker empties every tenth
// round, with contexts that are done, so that many writes are refused
// while others are in flight. Accepted renewals must still be renew_every
// apart, and no refused write may count as sent.
func TestTableConcurrentRefusals(t *testing.T) {
	const (
		workers = 4
		rounds  = 300
		renew   = 5 * time.Millisecond
	)
	clock := clocktest.New(t0)
	up := newRecorder(2)
	tbl := gateway.NewTable(up, gateway.TableOptions{Lease: time.Hour, RenewEvery: renew, MaxSessionsPerDevice: 1 << 20, Clock: clock})
	done, cancel := context.WithCancel(context.Background())
	cancel()

	var (
		mu       sync.Mutex
		accepted []gateway.Evidence
		refused  atomic.Int64
		wg       sync.WaitGroup
	)
	errs := make(chan error, workers)
	for wk := range workers {
		wg.Go(func() {
			own := gateway.DeviceID(fmt.Sprintf("dev-%d", wk))
			for r := range rounds {
				clock.Advance(time.Millisecond)
				for _, d := range []gateway.DeviceID{own, "shared"} {
					err := tbl.Observe(done, gateway.Evidence{Device: d, Session: "coap/default", Kind: gateway.Renew})
					switch {
					case errors.Is(err, context.Canceled):
						refused.Add(1)
					case err != nil:
						errs <- err
						return
					}
				}
				if wk == 0 && r%10 == 0 {
					mu.Lock()
					accepted = append(accepted, up.take()...)
					mu.Unlock()
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	accepted = append(accepted, up.take()...)
	if refused.Load() == 0 {
		t.Fatal("no write was refused")
	}
	if len(accepted) == 0 {
		t.Fatal("no write was accepted")
	}
	byDevice := map[gateway.DeviceID][]gateway.Evidence{}
	for _, ev := range accepted {
		byDevice[ev.Device] = append(byDevice[ev.Device], ev)
	}
	for d, evs := range byDevice {
		evs = sortedByTime(evs)
		for i := 1; i < len(evs); i++ {
			if evs[i].Kind == gateway.Renew && evs[i].ObservedAt.Sub(evs[i-1].ObservedAt) < renew {
				t.Errorf("%s: accepted renewals %v apart, renew_every %v", d, evs[i].ObservedAt.Sub(evs[i-1].ObservedAt), renew)
			}
		}
	}
	// The table never takes a refused write for sent: LastSent is zero
	// or the time of an accepted write.
	for wk := range workers + 1 {
		d := gateway.DeviceID(fmt.Sprintf("dev-%d", wk))
		if wk == workers {
			d = "shared"
		}
		v := tbl.Sessions(d)
		if len(v) != 1 {
			t.Fatalf("%s: %d sessions", d, len(v))
		}
		if v[0].LastSent.IsZero() {
			continue
		}
		if !slices.ContainsFunc(byDevice[d], func(ev gateway.Evidence) bool { return ev.ObservedAt.Equal(v[0].LastSent) }) {
			t.Errorf("%s: LastSent %v is no accepted write's time", d, v[0].LastSent)
		}
	}
}

func sortedByTime(evs []gateway.Evidence) []gateway.Evidence {
	out := slices.Clone(evs)
	slices.SortStableFunc(out, func(a, b gateway.Evidence) int { return a.ObservedAt.Compare(b.ObservedAt) })
	return out
}

// TestTableThrottleProperty drives a table on a manual clock with random
// schedules: "steady" sessions that send a renewal at least every
// heartbeat_interval (jitter only makes them early), "erratic" sessions
// with short and long gaps, connects and leaves, and sweeps at a fixed
// period. Half the runs have an uplink queue of 1–3 writes drained only
// every few steps, so that writes fail (each Observe gets a done context:
// a full queue refuses at once, as for a front end whose request deadline
// ran out).
//
// Counting central writes (the formula): a session's writes are
// cut into lifetimes. A lifetime starts with a Connect write at c and ends
// at the first Leave write after it, else at the next Connect write, else
// at the end of the run; its writes are that connect, its renew writes and
// that leave. Every lifetime has writes ≤ (end − c)/renew_every + 2, and a
// steady session (one lifetime) has writes ≤ run/renew_every + 2. Leave
// writes outside a lifetime (a leave of a session already gone) are not
// counted there: each accepted Leave is written exactly once.
//
// Also checked: a renew write comes at least renew_every after the
// previous write of its session; a renewal whose write failed is retried
// (the session's next accepted non-leave evidence is written); and, without
// failures, a steady session is written at its first heartbeat, then at
// most renew_every + heartbeat_interval apart, and its last heartbeat is
// less than renew_every after its last write, so its central deadline
// (last write + lease, lease > renew_every + heartbeat_interval) never
// lapses.
func TestTableThrottleProperty(t *testing.T) {
	rapid.Check(t, func(rt *rapid.T) {
		sc := drawSchedule(rt)
		for s, ws := range simulate(rt, sc) {
			checkWrites(rt, sc, s, ws)
		}
	})
}

// schedule is one generated run of the throttle property.
type schedule struct {
	run, heartbeat, renewEvery, lease time.Duration
	steady, erratic                   int // sessions [0, steady) are steady
	outages                           bool
	queue, flushEvery                 int // uplink queue size; drained every flushEvery steps
	steps                             []simStep
	heartbeats                        [][]time.Duration // of each steady session
}

type simStep struct {
	at   time.Duration
	sess int // −1: Sweep
	kind gateway.Kind
}

// simSession names session s; two sessions share each device.
func simSession(s int) (gateway.DeviceID, gateway.SessionID) {
	return gateway.DeviceID(fmt.Sprintf("dev-%d", s/2)), gateway.SessionID(fmt.Sprintf("coap/%d", s))
}

func drawSchedule(rt *rapid.T) schedule {
	ms := func(n int64) time.Duration { return time.Duration(n) * time.Millisecond }
	run := rapid.Int64Range(1_000, 1_200_000).Draw(rt, "run_ms")
	hb := rapid.Int64Range(max(100, run/300), 30_000).Draw(rt, "heartbeat_ms")
	renew := rapid.Int64Range(1_000, 30_000).Draw(rt, "renew_every_ms")
	lease := renew + hb + rapid.Int64Range(1, 60_000).Draw(rt, "lease_slack_ms")
	sweepEvery := max(1_000, run/100) + rapid.Int64Range(0, lease).Draw(rt, "sweep_every_extra_ms")
	sc := schedule{
		run: ms(run), heartbeat: ms(hb), renewEvery: ms(renew), lease: ms(lease),
		steady:  rapid.IntRange(1, 3).Draw(rt, "steady"),
		erratic: rapid.IntRange(0, 3).Draw(rt, "erratic"),
		outages: rapid.Bool().Draw(rt, "outages"),
		queue:   4, flushEvery: 1,
	}
	if sc.outages {
		sc.queue = rapid.IntRange(1, 3).Draw(rt, "queue")
		sc.flushEvery = rapid.IntRange(1, 5).Draw(rt, "flush_every")
	}

	sc.heartbeats = make([][]time.Duration, sc.steady)
	for s := range sc.steady {
		for at := rapid.Int64Range(0, min(hb, run)).Draw(rt, "start_ms"); at <= run; at += hb - rapid.Int64Range(0, hb/2).Draw(rt, "jitter_ms") {
			sc.steps = append(sc.steps, simStep{ms(at), s, gateway.Renew})
			sc.heartbeats[s] = append(sc.heartbeats[s], ms(at))
		}
	}
	kinds := []gateway.Kind{gateway.Renew, gateway.Renew, gateway.Renew, gateway.Renew, gateway.Renew, gateway.Renew, gateway.Connect, gateway.Leave}
	for s := sc.steady; s < sc.steady+sc.erratic; s++ {
		at := rapid.Int64Range(0, lease).Draw(rt, "start_ms")
		for n := 0; at <= run && n < 300; n++ {
			sc.steps = append(sc.steps, simStep{ms(at), s, rapid.SampledFrom(kinds).Draw(rt, "kind")})
			if rapid.Bool().Draw(rt, "long_gap") {
				at += rapid.Int64Range(hb, 2*lease).Draw(rt, "gap_ms")
			} else {
				at += rapid.Int64Range(1, hb).Draw(rt, "gap_ms")
			}
		}
	}
	for at := sweepEvery; at <= run; at += sweepEvery {
		sc.steps = append(sc.steps, simStep{ms(at), -1, 0})
	}
	slices.SortStableFunc(sc.steps, func(a, b simStep) int { return int(a.at - b.at) })
	return sc
}

// simulate runs sc on a table and returns each session's writes, in the
// order they were enqueued. It checks each Observe on the way: at most one
// write per evidence, every accepted leave written, failures only when the
// queue can be full, and a renewal whose write failed retried by the
// session's next accepted evidence.
func simulate(rt *rapid.T, sc schedule) [][]gateway.Evidence {
	clock := clocktest.New(t0)
	up := newRecorder(sc.queue)
	tbl := gateway.NewTable(up, gateway.TableOptions{Shards: 2, Lease: sc.lease, RenewEvery: sc.renewEvery, Clock: clock})
	done, cancel := context.WithCancel(context.Background())
	cancel()

	n := sc.steady + sc.erratic
	index := map[string]int{}
	for s := range n {
		d, id := simSession(s)
		index[string(d)+" "+string(id)] = s
	}
	writes := make([][]gateway.Evidence, n)
	flush := func() {
		for _, ev := range up.take() {
			s := index[string(ev.Device)+" "+string(ev.Session)]
			writes[s] = append(writes[s], ev)
		}
	}
	owed := make([]bool, n)
	for i, st := range sc.steps {
		clock.Set(t0.Add(st.at))
		if st.sess < 0 {
			tbl.Sweep(clock.Now())
		} else {
			d, id := simSession(st.sess)
			before := len(up.ch)
			err := tbl.Observe(done, gateway.Evidence{Device: d, Session: id, Kind: st.kind, ObservedAt: clock.Now()})
			added := len(up.ch) - before
			switch {
			case err != nil && !sc.outages:
				rt.Fatalf("%s %s at %v: %v with a queue that is never full", d, id, st.at, err)
			case err != nil:
				owed[st.sess] = st.kind == gateway.Renew
			case added > 1:
				rt.Fatalf("%s %s at %v: one evidence made %d writes", d, id, st.at, added)
			case st.kind == gateway.Leave && added != 1:
				rt.Fatalf("%s %s at %v: accepted leave was not written", d, id, st.at)
			case owed[st.sess] && added != 1:
				rt.Fatalf("%s %s at %v: the renewal that failed before is not retried", d, id, st.at)
			default:
				owed[st.sess] = false
			}
		}
		if (i+1)%sc.flushEvery == 0 {
			flush()
		}
	}
	flush()
	return writes
}

// checkWrites checks the writes ws of session s against the throttle.
func checkWrites(rt *rapid.T, sc schedule, s int, ws []gateway.Evidence) {
	R := sc.renewEvery
	at := func(j int) time.Duration { return ws[j].ObservedAt.Sub(t0) }
	for j, ev := range ws {
		if ev.Kind != gateway.Renew {
			continue
		}
		if j == 0 || ws[j-1].Kind == gateway.Leave {
			rt.Fatalf("session %d: renew write at %v follows no connect or renew", s, at(j))
		}
		if gap := at(j) - at(j-1); gap < R {
			rt.Fatalf("session %d: renew write %v after the previous write, renew_every %v", s, gap, R)
		}
	}

	// Lifetimes: the writes ws[j:k] from a connect up to the next connect,
	// or through the first leave.
	for j, ev := range ws {
		if ev.Kind != gateway.Connect {
			continue
		}
		k := j + 1
		for k < len(ws) && ws[k].Kind != gateway.Connect {
			k++
			if ws[k-1].Kind == gateway.Leave {
				break
			}
		}
		end := sc.run
		switch {
		case ws[k-1].Kind == gateway.Leave:
			end = at(k - 1)
		case k < len(ws):
			end = at(k)
		}
		if n := k - j; time.Duration(n-2)*R > end-at(j) {
			rt.Fatalf("session %d: %d writes in the lifetime %v..%v, renew_every %v", s, n, at(j), end, R)
		}
	}

	if s >= sc.steady {
		return
	}
	if time.Duration(len(ws)-2)*R > sc.run {
		rt.Fatalf("steady session %d: %d writes in %v, renew_every %v", s, len(ws), sc.run, R)
	}
	if sc.outages {
		return
	}
	hbs, H := sc.heartbeats[s], sc.heartbeat
	if len(ws) == 0 || ws[0].Kind != gateway.Connect || at(0) != hbs[0] {
		rt.Fatalf("steady session %d: first write %v, first heartbeat at %v", s, ws, hbs[0])
	}
	for j := 1; j < len(ws); j++ {
		if ws[j].Kind != gateway.Renew || at(j)-at(j-1) > R+H {
			rt.Fatalf("steady session %d: %v write at %v, %v after the previous one (renew_every %v, heartbeat %v)", s, ws[j].Kind, at(j), at(j)-at(j-1), R, H)
		}
	}
	if last := hbs[len(hbs)-1]; last-at(len(ws)-1) >= R {
		rt.Fatalf("steady session %d: last heartbeat %v, last write %v", s, last, at(len(ws)-1))
	}
}

// RunSweep sweeps on the table's clock: moving the clock past a lease
// drops the session, without the test waiting for a real ticker.
func TestTableRunSweep(t *testing.T) {
	f := newFixture(t, gateway.TableOptions{}, 16)
	f.mustObserve("dev-1", "coap/default", gateway.Renew, 0)
	f.up.take()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- f.tbl.RunSweep(ctx, 5*time.Second) }()
	for deadline := time.Now().Add(10 * time.Second); f.tbl.Len() != 0; {
		if time.Now().After(deadline) {
			t.Fatalf("session not swept after the clock passed its lease: Len = %d", f.tbl.Len())
		}
		if f.clock.Timers() > 0 {
			f.clock.Advance(5 * time.Second)
		}
		runtime.Gosched()
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("RunSweep: %v", err)
	}
	if f.clock.Now().Sub(t0) < 90*time.Second {
		t.Fatalf("swept at %v, before the lease ran out", f.clock.Now().Sub(t0))
	}
}
