package storetest

import (
	"testing"
	"time"

	"github.com/fleetgate/fleetgate/gateway"
)

// leased is a write with a lease of its own (gateway.Write.Lease).
func leased(d gateway.DeviceID, s gateway.SessionID, k gateway.Kind, age, l time.Duration) gateway.Write {
	w := wr(d, s, k, age)
	w.Lease = l
	return w
}

// testPerWriteLease: a write's own lease, not the batch's, makes its
// deadline, decides whether it lapsed, whether it is late but valid, and
// whether a leave finds newer evidence; a write without one takes the
// batch's.
func testPerWriteLease(t *testing.T, open Opener) {
	t.Run("deadline", func(t *testing.T) {
		e := newEnv(t, open, 1)
		long, short, plain := gateway.DeviceID("dev-long"), gateway.DeviceID("dev-short"), gateway.DeviceID("dev-plain")
		t0 := e.now()
		e.apply(batch(gwA, 1,
			leased(long, "s1", gateway.Connect, time.Second, 3*lease),
			leased(short, "s1", gateway.Connect, 0, lease/3),
			wr(plain, "s1", gateway.Connect, 0)))
		e.checkDevice(long, onlineInfo(long, 1, t0, sess("s1", t0.Add(3*lease-time.Second))))
		e.checkDevice(short, onlineInfo(short, 1, t0, sess("s1", t0.Add(lease/3))))
		e.checkDevice(plain, onlineInfo(plain, 1, t0, sess("s1", t0.Add(lease))))

		// A shorter lease never pulls a deadline in.
		e.clock.Advance(time.Second)
		res := e.apply(batch(gwA, 1, leased(long, "s1", gateway.Renew, 0, lease/3)))
		e.checkEvents("renew under a shorter lease", res.Events, 0)
		e.checkDevice(long, onlineInfo(long, 1, t0, sess("s1", t0.Add(3*lease-time.Second))))
	})

	t.Run("lapsed by its own lease", func(t *testing.T) {
		e := newEnv(t, open, 1)
		d := gateway.DeviceID("dev-1")
		res := e.apply(batch(gwA, 1, leased(d, "s1", gateway.Renew, lease/2, lease/3)))
		e.checkEvents("write older than its own lease", res.Events, 0)
		e.checkAbsent(d)
		now := e.now()
		res = e.apply(batch(gwA, 1, leased(d, "s1", gateway.Renew, 2*lease, 3*lease)))
		e.checkEvents("write older than the batch lease, younger than its own", res.Events, 0,
			online(d, 1, gateway.ReasonRenew, now, gwA, "s1"))
		e.checkDevice(d, onlineInfo(d, 1, now, sess("s1", now.Add(lease))))
	})

	t.Run("late but valid under its own lease", func(t *testing.T) {
		e := newEnv(t, open, 1)
		d := gateway.DeviceID("dev-1")
		t0 := e.now()
		e.apply(batch(gwA, 1, leased(d, "s1", gateway.Connect, 0, 5*time.Second)))
		e.clock.Advance(6 * time.Second)
		// Observed at t0+3s, inside the session's lease; its own lease
		// (40s) carries it to t0+43s. Judged with the batch's lease it
		// would look observed after the deadline.
		res := e.apply(batch(gwA, 1, leased(d, "s1", gateway.Renew, 3*time.Second, 40*time.Second)))
		e.checkEvents("late but valid renewal", res.Events, 0)
		e.checkDevice(d, onlineInfo(d, 1, t0, sess("s1", t0.Add(43*time.Second))))
	})

	t.Run("leave", func(t *testing.T) {
		for _, tc := range []struct {
			name    string
			lease   time.Duration // the leave's
			removed bool
		}{
			{"under the session's lease", 3 * lease, true},
			{"under a shorter lease than the session's evidence", lease, false},
		} {
			t.Run(tc.name, func(t *testing.T) {
				e := newEnv(t, open, 1)
				d := gateway.DeviceID("dev-1")
				t0 := e.now()
				e.apply(batch(gwA, 1, leased(d, "s1", gateway.Connect, 0, 3*lease)))
				e.clock.Advance(time.Second)
				res := e.apply(batch(gwA, 1, leased(d, "s1", gateway.Leave, 0, tc.lease)))
				if tc.removed {
					e.checkEvents("leave", res.Events, 0, leaveEvent(d, 2, e.now(), gwA, "s1"))
					e.checkDevice(d, offlineInfo(d, 2, e.now()))
					return
				}
				e.checkEvents("leave that finds newer evidence", res.Events, 0)
				e.checkDevice(d, onlineInfo(d, 1, t0, sess("s1", t0.Add(3*lease))))
			})
		}
	})

	t.Run("steady renewals", func(t *testing.T) {
		// The Redis store takes steady renewals by a cheaper path; a
		// renewal with a lease of its own must still get that lease.
		e := newEnv(t, open, 1)
		d := gateway.DeviceID("dev-1")
		t0 := e.now()
		e.apply(batch(gwA, 1, wr(d, "s1", gateway.Connect, 0)))
		for range 3 {
			e.clock.Advance(time.Second)
			e.apply(batch(gwA, 1, wr(d, "s1", gateway.Renew, 0)))
		}
		e.clock.Advance(time.Second)
		res := e.apply(batch(gwA, 1, leased(d, "s1", gateway.Renew, 0, 4*lease)))
		e.checkEvents("steady renewal with its own lease", res.Events, 0)
		e.checkDevice(d, onlineInfo(d, 1, t0, sess("s1", e.now().Add(4*lease))))
	})

	t.Run("negative lease refused", func(t *testing.T) {
		e := newEnv(t, open, 1)
		d := gateway.DeviceID("dev-1")
		if err := e.applyErr(batch(gwA, 1, leased(d, "s1", gateway.Connect, 0, -time.Second))); err == nil {
			t.Errorf("Apply of a write with a negative lease succeeded")
		}
		e.checkAbsent(d)
	})
}
