package storetest

import (
	"slices"
	"testing"
	"time"

	"github.com/fleetgate/fleetgate/gateway"
)

// testShardLock: AcquireShard takes or extends the runner lease of one
// shard for one owner until it runs out; ReleaseShard gives it up and is
// a no-op for anyone else; RunnerLeases tells the shards held.
func testShardLock(t *testing.T, open Opener) {
	e := newEnv(t, open, 2)
	acquire := func(shard int, owner string, ttl time.Duration, want bool) {
		t.Helper()
		got, err := e.store.AcquireShard(e.ctx, shard, owner, ttl)
		if err != nil {
			t.Fatalf("AcquireShard(%d, %s): %v", shard, owner, err)
		}
		if got != want {
			t.Errorf("at +%v AcquireShard(%d, %s, %v) = %v, want %v",
				e.now().Sub(time.UnixMilli(startMs)), shard, owner, ttl, got, want)
		}
	}
	release := func(shard int, owner string) {
		t.Helper()
		if err := e.store.ReleaseShard(e.ctx, shard, owner); err != nil {
			t.Fatalf("ReleaseShard(%d, %s): %v", shard, owner, err)
		}
	}
	leases := func(want ...bool) {
		t.Helper()
		got, err := e.store.RunnerLeases(e.ctx)
		if err != nil {
			t.Fatalf("RunnerLeases: %v", err)
		}
		if !slices.Equal(got, want) {
			t.Errorf("at +%v RunnerLeases = %v, want %v", e.now().Sub(time.UnixMilli(startMs)), got, want)
		}
	}
	const ttl = 10 * time.Second
	leases(false, false)
	release(0, "a") // not held: no-op
	acquire(0, "a", ttl, true)
	acquire(0, "b", ttl, false)
	acquire(1, "b", ttl, true) // shards are independent
	leases(true, true)
	e.clock.Advance(6 * time.Second)
	acquire(0, "a", ttl, true) // extended to +16s
	e.clock.Advance(6 * time.Second)
	acquire(0, "b", ttl, false) // +12s: a's extended lease holds
	leases(true, false)         // b's lease of shard 1 ran out at +10s
	release(0, "b")             // not the owner: no-op
	acquire(0, "b", ttl, false)
	e.clock.Advance(4*time.Second + time.Millisecond)
	acquire(0, "b", ttl, true) // +16.001s: a's lease ran out
	acquire(0, "a", ttl, false)
	release(0, "a") // no longer the owner: no-op
	acquire(0, "a", ttl, false)
	release(0, "b")
	leases(false, false)
	acquire(0, "a", ttl, true)
	acquire(1, "a", ttl, true) // b's lease of shard 1 (taken at +0) ran out
}

// testReap: Reap writes the expiry of at most limit due devices, oldest
// deadline first, reports More and the next deadline, and touches its
// own shard only.
func testReap(t *testing.T, open Opener) {
	e := newEnv(t, open, 2)
	devs := devicesIn(t, 2, 0, 4, "reap")
	other := devicesIn(t, 2, 1, 1, "other")[0]
	t0 := e.now()
	empty := e.reap(0, 10)
	e.checkReapedNothing("Reap of an empty shard", empty, time.Time{})
	if empty.Trimmed != 0 {
		t.Errorf("Reap of an empty shard trimmed %d devices, want 0", empty.Trimmed)
	}
	deadline := make([]time.Time, len(devs))
	for i, d := range devs {
		e.apply(batch(gwA, 1, wr(d, "s1", gateway.Connect, 0)))
		deadline[i] = e.now().Add(lease)
		if i == 2 {
			e.apply(batch(gwA, 1, wr(other, "s1", gateway.Connect, 0)))
		}
		e.clock.Advance(time.Second)
	}
	e.checkReapedNothing("Reap before any deadline", e.reap(0, 10), deadline[0])

	e.clock.Set(t0.Add(2*time.Second + lease)) // devs[2]'s deadline: due
	now := e.now()
	r := e.reap(0, 2)
	e.checkEvents("Reap(limit 2)", r.Offline, 0, expired(devs[0], 2, now, deadline[0]), expired(devs[1], 2, now, deadline[1]))
	if !r.More || !r.Next.Equal(deadline[2]) || r.Trimmed != 0 {
		t.Errorf("Reap(limit 2) of 3 due: More %v Next %v Trimmed %d; want true, %v, 0", r.More, r.Next, r.Trimmed, deadline[2])
	}
	e.checkLogged(0, r.Offline)

	r = e.reap(0, 2)
	e.checkEvents("second Reap(limit 2)", r.Offline, 0, expired(devs[2], 2, now, deadline[2]))
	if r.More || !r.Next.Equal(deadline[3]) {
		t.Errorf("second Reap: More %v Next %v; want false, %v", r.More, r.Next, deadline[3])
	}
	e.checkLogged(0, r.Offline)

	e.checkReapedNothing("third Reap", e.reap(0, 2), deadline[3])
	for i, d := range devs[:3] {
		e.checkDevice(d, offlineInfo(d, 2, now))
		if info := e.device(d); !info.Deadline.IsZero() {
			t.Errorf("device %d deadline %v after reap, want zero", i, info.Deadline)
		}
	}
	e.checkDevice(devs[3], onlineInfo(devs[3], 1, t0.Add(3*time.Second), sess("s1", deadline[3])))
	if info := e.device(other); info.State != gateway.Online {
		t.Errorf("reaping shard 0 changed shard 1's device: %+v", info)
	}

	r = e.reap(1, 1)
	e.checkEvents("Reap of shard 1", r.Offline, 1, expired(other, 2, now, deadline[2]))
	if r.More || !r.Next.IsZero() {
		t.Errorf("Reap of shard 1: More %v Next %v; want false, zero", r.More, r.Next)
	}
}

// testReapKeepsLive: a device with an expired and a live session is not
// reaped offline, whichever session holds the device's deadline.
func testReapKeepsLive(t *testing.T, open Opener) {
	tests := []struct {
		name                  string
		lease1, lease2        time.Duration
		liveID, expiredID     gateway.SessionID
		liveDL, expiredDL, at time.Duration // from t0; s1 at t0, s2 at t0+10s
	}{
		{"older session expired", lease, lease, "s2", "s1", 10*time.Second + lease, lease, lease + time.Second},
		{"newer session expired", 3 * lease, lease, "s1", "s2", 3 * lease, 10*time.Second + lease, 10*time.Second + lease},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, open, 2)
			d := gateway.DeviceID("dev-1")
			shard := gateway.ShardOf(d, 2)
			t0 := e.now()
			e.apply(withLease(batch(gwA, 1, wr(d, "s1", gateway.Connect, 0)), tc.lease1))
			e.clock.Advance(10 * time.Second)
			e.apply(withLease(batch(gwA, 1, wr(d, "s2", gateway.Connect, 0)), tc.lease2))
			e.clock.Set(t0.Add(tc.at))
			// no offline event for a device with a live session; Next is
			// that session's deadline
			r := e.reap(shard, 10)
			e.checkReapedNothing("Reap", r, t0.Add(tc.liveDL))
			if r.Trimmed > 1 {
				t.Errorf("Reap trimmed %d devices, want at most 1", r.Trimmed)
			}
			e.checkDevice(d, onlineInfo(d, 1, t0, sess(tc.liveID, t0.Add(tc.liveDL))))
			for _, s := range e.device(d).Sessions {
				if s.ID == tc.expiredID && !s.Deadline.Equal(t0.Add(tc.expiredDL)) {
					t.Errorf("expired session %s kept with deadline %v, want %v", s.ID, s.Deadline, t0.Add(tc.expiredDL))
				}
			}
			e.checkLogLen("the one online event", shard, 1)
		})
	}
}
