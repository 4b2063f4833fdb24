package uplink

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/fleetgate/fleetgate/gateway"
)

// TestOutboxAgesOnBootClock buffers one connect (lease 30 s), then moves
// the clocks as a clock step, a reboot or a boot clock behind the entry
// would, and replays: the age comes from the boot clock alone, and an
// entry whose age is unknown is dropped and counted, never replayed.
func TestOutboxAgesOnBootClock(t *testing.T) {
	other := gateway.BootID{0: 0xb0, 15: 2}
	tests := []struct {
		name string
		// move moves the test clock after the entry is buffered; since is
		// the boot clock reading at that moment.
		move    func(e *env, since time.Duration)
		age     time.Duration // the replayed age; 0: dropped
		unknown uint64
	}{
		{"boot clock moved 2s, wall clock stepped an hour", func(e *env, since time.Duration) {
			e.clock.Advance(time.Hour)
			e.clock.Reboot(testBoot, since+2*time.Second)
		}, 2 * time.Second, 0},
		{"rebooted", func(e *env, _ time.Duration) {
			e.clock.Advance(2 * time.Second)
			// Up for longer than the entry's boot time: only the boot ID
			// tells the entry is of another boot.
			e.clock.Reboot(other, 2*time.Hour)
		}, 0, 1},
		{"entry ahead of the boot clock", func(e *env, since time.Duration) {
			e.clock.Advance(2 * time.Second)
			e.clock.Reboot(testBoot, since-time.Minute)
		}, 0, 1},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			u, e := newEmbeddedUplink(t, Options{Lease: 30 * time.Second})
			observed := e.clock.Now()
			if err := u.buffer([]item{{key{"dev-1", "coap/default"}, slot{kind: gateway.Connect, at: observed, kindLease: 30 * time.Second}}}); err != nil {
				t.Fatal(err)
			}
			_, since, _ := e.clock.Boot()
			tc.move(e, since)
			e.run()
			waitFor(t, "the outbox replayed", 10*time.Second, nil, func() bool { return e.ob.Len() == 0 })
			info, err := e.store.Device(context.Background(), "dev-1")
			if tc.age == 0 {
				if !errors.Is(err, gateway.ErrNotFound) {
					t.Fatalf("device after the replay: %+v, %v; want not found (entry dropped)", info, err)
				}
			} else if want := e.clock.Now().Add(30*time.Second - tc.age); err != nil || !info.Deadline.Equal(want) {
				t.Fatalf("device after the replay: %+v, %v; want deadline %v (age %v)", info, err, want, tc.age)
			}
			if got := u.Status().Dropped.UnknownAge; got != tc.unknown {
				t.Errorf("status dropped.unknown_age = %d, want %d", got, tc.unknown)
			}
			if got := metricValue(t, e.reg, "fleetgate_outbox_dropped_total", "reason", reasonUnknownAge); got != float64(tc.unknown) {
				t.Errorf("fleetgate_outbox_dropped_total{reason=unknown_age} = %v, want %d", got, tc.unknown)
			}
		})
	}
}

// TestOutboxEntryOfAnotherBootReplaced: new evidence of a session whose
// entry is of another boot replaces the entry (counted as unknown age)
// instead of merging with it.
func TestOutboxEntryOfAnotherBootReplaced(t *testing.T) {
	u, e := newEmbeddedUplink(t, Options{Lease: 30 * time.Second})
	k := key{"dev-1", "coap/default"}
	if err := u.buffer([]item{{k, slot{leave: e.clock.Now(), leaveLease: 30 * time.Second}}}); err != nil {
		t.Fatal(err)
	}
	e.clock.Advance(time.Second)
	e.clock.Reboot(gateway.BootID{0: 0xb0, 15: 3}, time.Second)
	if err := u.buffer([]item{{k, slot{kind: gateway.Renew, at: e.clock.Now(), kindLease: 30 * time.Second}}}); err != nil {
		t.Fatal(err)
	}
	if got := u.Status().Dropped.UnknownAge; got != 1 {
		t.Fatalf("dropped.unknown_age = %d, want 1 (the leave of the other boot)", got)
	}
	perShard, unknown, bad, err := e.ob.oldestRecords(everyShard(testShards), 10, 10, nil)
	if err != nil || len(unknown) != 0 || len(bad) != 0 {
		t.Fatal(err, unknown, bad)
	}
	var recs []record
	for _, rs := range perShard {
		recs = append(recs, rs...)
	}
	if len(recs) != 1 || recs[0].kind != gateway.Renew || !recs[0].leave.IsZero() || recs[0].kindLease != 30*time.Second {
		t.Fatalf("outbox holds %+v, want the renewal alone", recs)
	}
}

// TestLeaseTravelsWithEvidence: the lease in force when evidence is
// queued is the one it is written with, whatever a reload sets later; an
// outbox entry keeps it, and judges its lapse by it.
func TestLeaseTravelsWithEvidence(t *testing.T) {
	t.Run("queue", func(t *testing.T) {
		u, e := newEmbeddedUplink(t, Options{Lease: 10 * time.Second})
		mustEnqueue(t, u, evidence("dev-1", gateway.Connect, e.clock.Now()))
		u.SetTiming(60*time.Second, 0, 0)
		if err := u.Flush(context.Background()); err != nil {
			t.Fatal(err)
		}
		info, err := e.store.Device(context.Background(), "dev-1")
		if want := e.clock.Now().Add(10 * time.Second); err != nil || !info.Deadline.Equal(want) {
			t.Fatalf("device: %+v, %v; want the deadline of the 10s lease it was queued under, %v", info, err, want)
		}
	})
	t.Run("outbox", func(t *testing.T) {
		u, e := newEmbeddedUplink(t, Options{Lease: 10 * time.Second})
		observed := e.clock.Now()
		if err := u.buffer([]item{
			{key{"long", "coap/default"}, slot{kind: gateway.Connect, at: observed, kindLease: 60 * time.Second}},
			{key{"short", "coap/default"}, slot{kind: gateway.Connect, at: observed, kindLease: 5 * time.Second}},
		}); err != nil {
			t.Fatal(err)
		}
		u.SetTiming(30*time.Second, 0, 0)
		e.clock.Advance(20 * time.Second)
		e.run()
		waitFor(t, "the outbox replayed", 10*time.Second, nil, func() bool { return e.ob.Len() == 0 })
		info, err := e.store.Device(context.Background(), "long")
		if want := observed.Add(60 * time.Second); err != nil || !info.Deadline.Equal(want) {
			t.Fatalf("long: %+v, %v; want deadline %v (its own 60s lease)", info, err, want)
		}
		if info, err := e.store.Device(context.Background(), "short"); !errors.Is(err, gateway.ErrNotFound) {
			t.Fatalf("short: %+v, %v; want not found (lapsed under its own 5s lease)", info, err)
		}
		if got := u.Status().Dropped.Lapsed; got != 1 {
			t.Errorf("dropped.lapsed = %d, want 1", got)
		}
	})
}

func TestSystemBoot(t *testing.T) {
	b, err := NewSystemBoot("")
	if err != nil {
		t.Fatal(err)
	}
	id1, s1, err := b.Boot()
	if err != nil || id1 == (gateway.BootID{}) || s1 <= 0 {
		t.Fatalf("Boot() = %x, %v, %v", id1, s1, err)
	}
	id2, s2, err := b.Boot()
	if err != nil || id2 != id1 || s2 < s1 {
		t.Fatalf("second Boot() = %x, %v, %v after %x, %v", id2, s2, err, id1, s1)
	}
	o, err := NewSystemBoot("00000000-0000-4000-8000-000000000002\n")
	if err != nil {
		t.Fatal(err)
	}
	if id, _, _ := o.Boot(); id != (gateway.BootID{6: 0x40, 8: 0x80, 15: 2}) {
		t.Fatalf("overridden boot ID %x", id)
	}
	if _, err := NewSystemBoot("reboot"); err == nil {
		t.Fatal("a malformed override accepted")
	}
}

// TestRecordReadable: when an entry's age is known, and what it is.
func TestRecordReadable(t *testing.T) {
	now := t0.Add(time.Hour)
	since := 2 * time.Hour // the boot began at t0 - 1h
	other := gateway.BootID{0: 0xb0, 15: 9}
	for _, tc := range []struct {
		name string
		boot gateway.BootID
		at   time.Time     // as stored: since boot, or wall clock with a zero boot
		age  time.Duration // -1: unknown
	}{
		{"this boot", testBoot, onBoot(since - 10*time.Second), 10 * time.Second},
		{"this boot, observed now", testBoot, onBoot(since), 0},
		{"this boot, ahead of the boot clock", testBoot, onBoot(since + time.Millisecond), -1},
		{"another boot", other, onBoot(time.Minute), -1},
		{"format 1, inside this boot", gateway.BootID{}, now.Add(-10 * time.Second), 10 * time.Second},
		{"format 1, in the future", gateway.BootID{}, now.Add(time.Second), -1},
		{"format 1, before this boot", gateway.BootID{}, now.Add(-since - time.Second), -1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := record{item: item{slot: slot{kind: gateway.Renew, at: tc.at}}, boot: tc.boot}
			ok := r.readable(now, testBoot, since)
			if ok != (tc.age >= 0) {
				t.Fatalf("readable = %v, want %v", ok, tc.age >= 0)
			}
			if ok && !r.at.Equal(now.Add(-tc.age)) {
				t.Fatalf("observed at %v, want %v (age %v)", r.at, now.Add(-tc.age), tc.age)
			}
		})
	}
}
