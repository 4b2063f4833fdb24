package gateway_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/fleetgate/fleetgate/gateway"
	"github.com/fleetgate/fleetgate/gateway/clocktest"
)

// One device cannot hold more than MaxSessionsPerDevice sessions (issue
// 10: 2,500 instances of one device made a 49 KB record that stalled the
// store). Beyond the cap a new session is refused and counted, its known
// sessions keep renewing, other devices are not affected, and a session
// that leaves or is swept frees its place.
func TestMaxSessionsPerDevice(t *testing.T) {
	clock := clocktest.New(t0)
	rec := newRecorder(1000)
	tab := gateway.NewTable(rec, gateway.TableOptions{
		Lease: 90 * time.Second, RenewEvery: 20 * time.Second, MaxSessionsPerDevice: 3, Clock: clock,
	})
	ctx := context.Background()
	ev := func(dev, sess string, k gateway.Kind) gateway.Evidence {
		return gateway.Evidence{Device: gateway.DeviceID(dev), Session: gateway.SessionID(sess), Kind: k, ObservedAt: clock.Now()}
	}
	for i := range 3 {
		if err := tab.Observe(ctx, ev("alpha", fmt.Sprintf("coap/%d", i), gateway.Renew)); err != nil {
			t.Fatal(err)
		}
	}
	for i := 3; i < 2500; i++ {
		err := tab.Observe(ctx, ev("alpha", fmt.Sprintf("coap/%d", i), gateway.Renew))
		if !errors.Is(err, gateway.ErrSessionLimit) || !errors.Is(err, gateway.ErrOverloaded) {
			t.Fatalf("session %d beyond the cap: %v, want ErrSessionLimit", i, err)
		}
	}
	if got := tab.SessionLimitRefusals(); got != 2497 {
		t.Fatalf("SessionLimitRefusals = %d, want 2497", got)
	}
	if n := len(rec.take()); n != 3 {
		t.Fatalf("%d writes sent, want the 3 connects", n)
	}
	clock.Advance(30 * time.Second)
	if err := tab.Observe(ctx, ev("alpha", "coap/1", gateway.Renew)); err != nil {
		t.Fatalf("a known session must renew at the cap: %v", err)
	}
	if err := tab.Observe(ctx, ev("beta", "coap/0", gateway.Connect)); err != nil {
		t.Fatalf("another device: %v", err)
	}
	if err := tab.Observe(ctx, ev("alpha", "coap/0", gateway.Leave)); err != nil {
		t.Fatal(err)
	}
	if err := tab.Observe(ctx, ev("alpha", "coap/new", gateway.Connect)); err != nil {
		t.Fatalf("after a leave there is room: %v", err)
	}
	if err := tab.Observe(ctx, ev("alpha", "coap/new2", gateway.Connect)); !errors.Is(err, gateway.ErrSessionLimit) {
		t.Fatalf("at the cap again: %v", err)
	}
	// coap/2 was last seen at t0: the sweep at t0+90s drops it alone.
	clock.Advance(60 * time.Second)
	if n := tab.Sweep(clock.Now()); n != 1 {
		t.Fatalf("swept %d, want 1", n)
	}
	if err := tab.Observe(ctx, ev("alpha", "coap/new2", gateway.Connect)); err != nil {
		t.Fatalf("after a sweep there is room: %v", err)
	}
	if got := len(tab.Sessions("alpha")); got != 3 {
		t.Fatalf("alpha has %d sessions, want 3", got)
	}
}

func TestMaxSessionsPerDeviceDefault(t *testing.T) {
	tab := gateway.NewTable(newRecorder(100), gateway.TableOptions{})
	var err error
	n := 0
	for ; n < 100 && err == nil; n++ {
		err = tab.Observe(context.Background(), gateway.Evidence{Device: "d", Session: gateway.SessionID(fmt.Sprint("s", n)), Kind: gateway.Connect})
	}
	if !errors.Is(err, gateway.ErrSessionLimit) || n-1 != gateway.DefaultMaxSessionsPerDevice {
		t.Fatalf("refused after %d sessions (%v), want %d", n-1, err, gateway.DefaultMaxSessionsPerDevice)
	}
}

// Attack: with anonymous devices allowed, strangers made devices without
// bound (each a session here and a record in the store). Now at most
// MaxAnonymousDevices anonymous devices have sessions at once: the first
// session of another one is refused and counted, the anonymous devices
// there keep renewing and opening sessions, devices with credentials are
// not affected, and a device whose last session leaves or is swept frees
// its place.
func TestMaxAnonymousDevices(t *testing.T) {
	clock := clocktest.New(t0)
	tab := gateway.NewTable(newRecorder(1000), gateway.TableOptions{Lease: 90 * time.Second, MaxAnonymousDevices: 3, Clock: clock})
	ctx := context.Background()
	observe := func(dev, sess string, k gateway.Kind, anon bool) error {
		return tab.Observe(ctx, gateway.Evidence{Device: gateway.DeviceID(dev), Session: gateway.SessionID(sess), Kind: k, ObservedAt: clock.Now(), Anonymous: anon})
	}
	for i := range 3 {
		if err := observe(fmt.Sprint("anon-", i), "coap", gateway.Renew, true); err != nil {
			t.Fatal(err)
		}
	}
	for i := 3; i < 1000; i++ {
		err := observe(fmt.Sprint("anon-", i), "coap", gateway.Connect, true)
		if !errors.Is(err, gateway.ErrAnonymousLimit) || !errors.Is(err, gateway.ErrOverloaded) {
			t.Fatalf("anonymous device %d: %v, want ErrAnonymousLimit", i, err)
		}
	}
	if got, n := tab.AnonymousLimitRefusals(), tab.AnonymousDevices(); got != 997 || n != 3 || tab.Len() != 3 {
		t.Fatalf("refusals %d, anonymous devices %d, sessions %d; want 997, 3, 3", got, n, tab.Len())
	}
	if err := observe("anon-0", "coap/2", gateway.Connect, true); err != nil {
		t.Fatalf("a second session of an anonymous device there: %v", err)
	}
	if err := observe("listed", "mqtt", gateway.Connect, false); err != nil {
		t.Fatalf("a device with credentials: %v", err)
	}
	for _, s := range []string{"coap", "coap/2"} {
		if err := observe("anon-0", s, gateway.Leave, true); err != nil {
			t.Fatal(err)
		}
	}
	if err := observe("anon-3", "coap", gateway.Connect, true); err != nil {
		t.Fatalf("after anon-0 left: %v", err)
	}
	clock.Advance(30 * time.Second)
	if err := observe("anon-3", "coap", gateway.Renew, true); err != nil {
		t.Fatal(err)
	}
	clock.Advance(60 * time.Second) // anon-1 and anon-2 lapse
	if n := tab.Sweep(clock.Now()); n != 3 || tab.AnonymousDevices() != 1 {
		t.Fatalf("swept %d, %d anonymous devices left; want 3 and 1", n, tab.AnonymousDevices())
	}
	for i := 4; i < 6; i++ {
		if err := observe(fmt.Sprint("anon-", i), "coap", gateway.Connect, true); err != nil {
			t.Fatalf("after the sweep, anonymous device %d: %v", i, err)
		}
	}
}
