package redisstore

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/fleetgate/fleetgate/gateway"
	"github.com/fleetgate/fleetgate/gateway/clocktest"
	"github.com/fleetgate/fleetgate/internal/redistest"
)

// believedCount is how many devices gw@epoch believes steady on shard.
func believedCount(s *Store, shard int, gw string, epoch uint64) int {
	b := s.beliefs.get(beliefKey{shard, gw, epoch})
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.steady)
}

// believedSession is the session gw@epoch believes d's record steady with.
func believedSession(s *Store, shard int, gw string, epoch uint64, d gateway.DeviceID) gateway.SessionID {
	b := s.beliefs.get(beliefKey{shard, gw, epoch})
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.steady[d].session
}

// TestBelievedRenewalsReadNoRecords: once the store has told a gateway that
// its devices are steady, their renewals move the deadlines without
// reading a single record (no HMGET runs inside the script).
func TestBelievedRenewalsReadNoRecords(t *testing.T) {
	srv := sharedServer()
	e := newEnv(t, srv.Client(t), 1)
	devs := devicesIn(t, 1, 0, 100, "bel")
	var connects, renews []gateway.Write
	for _, d := range devs {
		connects = append(connects, write(d, "coap/default", gateway.Connect, 0))
		renews = append(renews, write(d, "coap/default", gateway.Renew, 0))
	}
	if evs := e.apply(0, batch("gw-a", 1, connects...)); len(evs) != len(devs) {
		t.Fatalf("connects wrote %d events, want %d", len(evs), len(devs))
	}
	if n := believedCount(e.store, 0, "gw-a", 1); n != len(devs) {
		t.Fatalf("gw-a believes %d devices steady, want %d", n, len(devs))
	}
	e.clock.Advance(20 * time.Second)
	before := commandCalls(t, e.ctx, []string{srv.Addr}, "hmget")
	if evs := e.apply(0, batch("gw-a", 1, renews...)); len(evs) != 0 {
		t.Fatalf("renewals wrote %s", describe(evs))
	}
	// one HMGET of the epochs hash, none of the records
	if n := commandCalls(t, e.ctx, []string{srv.Addr}, "hmget") - before; n != 1 {
		t.Fatalf("believed renewals ran %d HMGET, want 1 (the epochs)", n)
	}
	for _, d := range []gateway.DeviceID{devs[0], devs[99]} {
		if got := e.device(d); !got.Deadline.Equal(ms(110*time.Second)) || len(got.Sessions) != 1 {
			t.Fatalf("%s after a believed renewal: %+v", d, got)
		}
	}

	// After beliefTTL a belief is not used: the renewal reads the record
	// and the store confirms the belief again.
	for range 11 {
		e.clock.Advance(time.Minute)
		e.apply(0, batch("gw-a", 1, renews...))
	}
	before = commandCalls(t, e.ctx, []string{srv.Addr}, "hmget")
	e.clock.Advance(time.Minute)
	e.apply(0, batch("gw-a", 1, renews...))
	if n := commandCalls(t, e.ctx, []string{srv.Addr}, "hmget") - before; n != 1 {
		t.Fatalf("renewals right after the stores confirmed the beliefs ran %d HMGET, want 1", n)
	}
}

// TestBeliefsInvalidated: whatever changes a record steady for gw-a (a
// second session or a takeover from another gateway, a reap, a lapse
// without a reap, the loss of the shard's state) voids gw-a's belief, so
// its next renewal has the full semantics.
func TestBeliefsInvalidated(t *testing.T) {
	forBackends(t, func(t *testing.T, c redis.UniversalClient) {
		e := newEnv(t, c, 1)
		steady := func(d gateway.DeviceID) {
			t.Helper()
			e.apply(0, batch("gw-a", 1, write(d, "s0", gateway.Connect, 0)))
			if believedSession(e.store, 0, "gw-a", 1, d) != "s0" {
				t.Fatalf("gw-a does not believe %s steady after its connect", d)
			}
		}
		renew := func(d gateway.DeviceID) []gateway.Event {
			t.Helper()
			return e.apply(0, batch("gw-a", 1, write(d, "s0", gateway.Renew, 0)))
		}
		devs := devicesIn(t, 1, 0, 7, "inv")
		// every device's lease runs out and the runner reaps them
		lapseAndReap := func() {
			t.Helper()
			e.clock.Advance(91 * time.Second)
			for range 10 {
				if !e.reap(0, 100).More {
					return
				}
			}
			t.Fatal("the reaps did not drain the shard")
		}

		t.Run("second session", func(t *testing.T) {
			d := devs[0]
			steady(d)
			e.apply(0, gateway.Batch{Gateway: "gw-b", Epoch: 1, Lease: 30 * time.Second,
				Writes: []gateway.Write{write(d, "s1", gateway.Connect, 0)}})
			e.clock.Advance(time.Second)
			renew(d)
			got := e.device(d)
			if len(got.Sessions) != 2 || !got.Deadline.Equal(e.clock.Now().Add(90*time.Second)) {
				t.Fatalf("after gw-a's renewal: %+v", got)
			}
			for _, s := range got.Sessions {
				if s.ID == "s1" && !s.Deadline.Equal(e.clock.Now().Add(29*time.Second)) {
					t.Fatalf("gw-a's renewal moved gw-b's session: %+v", got.Sessions)
				}
			}
		})
		t.Run("takeover", func(t *testing.T) {
			d := devs[1]
			steady(d)
			e.apply(0, batch("gw-b", 1, write(d, "s0", gateway.Renew, 0)))
			renew(d)
			if got := e.device(d); got.Gateway != "gw-a" || got.Sessions[0].Gateway != "gw-a" {
				t.Fatalf("gw-a renewed s0 after gw-b took it over, but: %+v", got)
			}
		})
		t.Run("reaped", func(t *testing.T) {
			d := devs[2]
			steady(d)
			lapseAndReap()
			evs := renew(d)
			if len(evs) != 1 || evs[0].State != gateway.Online || evs[0].Device != d {
				t.Fatalf("renewal after the reap wrote %s, want %s online", describe(evs), d)
			}
		})
		t.Run("reaped, then online elsewhere", func(t *testing.T) {
			d := devs[6]
			steady(d)
			lapseAndReap()
			e.apply(0, batch("gw-b", 1, write(d, "s1", gateway.Connect, 0)))
			renew(d)
			if got := e.device(d); len(got.Sessions) != 2 || got.Gateway != "gw-a" {
				t.Fatalf("gw-a renewed s0 after the reap and gw-b's connect, but: %+v", got)
			}
		})
		t.Run("forgotten, then online elsewhere", func(t *testing.T) {
			d := gateway.DeviceID(string(devs[6]) + "-f")
			steady(d)
			if _, err := e.store.Forget(e.ctx, d, "gw-admin"); err != nil {
				t.Fatal(err)
			}
			e.apply(0, batch("gw-b", 1, write(d, "s1", gateway.Connect, 0)))
			renew(d)
			if got := e.device(d); len(got.Sessions) != 2 || got.Gateway != "gw-a" {
				t.Fatalf("gw-a renewed s0 after the forget and gw-b's connect, but: %+v", got)
			}
		})
		t.Run("lapsed", func(t *testing.T) {
			d := devs[3]
			steady(d)
			e.clock.Advance(91 * time.Second)
			evs := renew(d)
			if len(evs) != 2 || evs[0].State != gateway.Offline || evs[0].Reason != gateway.ReasonExpired ||
				evs[1].State != gateway.Online {
				t.Fatalf("renewal after the lapse wrote %s, want offline (expired) then online", describe(evs))
			}
		})
		t.Run("state lost", func(t *testing.T) {
			d := devs[4]
			steady(d)
			if err := c.Del(e.ctx, e.store.keys[0].data...).Err(); err != nil {
				t.Fatal(err)
			}
			// a renewal of a gateway that wrote to the lost state restores
			// the record without an event (ApplyResult.Reset)
			if evs := renew(d); len(evs) != 0 {
				t.Fatalf("renewal after the shard's keys were lost wrote %s, want a silent restore", describe(evs))
			}
			if got := e.device(d); got.State != gateway.Online || got.Ver != uint64(got.Since.UnixMilli()) {
				t.Fatalf("device after the restore: %+v, want online at a ver of the store time", got)
			}
		})
		t.Run("fenced", func(t *testing.T) {
			d := devs[5]
			steady(d)
			e.apply(0, batch("gw-a", 2, write(d, "s9", gateway.Connect, 0)))
			_, err := e.store.Apply(e.ctx, 0, batch("gw-a", 1, write(d, "s0", gateway.Renew, 0)))
			if !errors.Is(err, gateway.ErrFenced) {
				t.Fatalf("renewal of a fenced epoch: %v", err)
			}
			if n := believedCount(e.store, 0, "gw-a", 1); n != 0 {
				t.Fatalf("a fenced process still believes %d devices steady", n)
			}
		})
	})
}

// TestInvalidationsOfGoneGatewaysAreForgotten: the invalidations kept for a
// gateway that never applies again leave the shard an hour later.
func TestInvalidationsOfGoneGatewaysAreForgotten(t *testing.T) {
	e := newEnv(t, sharedServer().Client(t), 1)
	d := devicesIn(t, 1, 0, 1, "gone")[0]
	e.apply(0, batch("gw-x", 1, write(d, "s0", gateway.Connect, 0)))
	e.apply(0, batch("gw-y", 1, write(d, "s0", gateway.Renew, 0)))
	inv := e.store.keys[0].data[4]
	if n, err := e.c.ZCard(e.ctx, inv).Result(); err != nil || n != 1 {
		t.Fatalf("after gw-y took over gw-x's steady device: %d invalidations (%v), want 1", n, err)
	}
	e.clock.Advance(59 * time.Minute)
	for range 4 {
		e.reap(0, 10)
	}
	if n, _ := e.c.ZCard(e.ctx, inv).Result(); n != 1 {
		t.Fatalf("after 59 min: %d invalidations, want 1", n)
	}
	e.clock.Advance(2 * time.Minute)
	for range 2 { // two gateway refs, one cleaned per reap call
		e.reap(0, 10)
	}
	if n, _ := e.c.ZCard(e.ctx, inv).Result(); n != 0 {
		t.Fatalf("after 61 min: %d invalidations, want 0", n)
	}
	// With none left, a reap with nothing due writes nothing.
	addr := []string{sharedServer().Addr}
	before := commandCalls(t, e.ctx, addr, "hset")
	e.reap(0, 10)
	if n := commandCalls(t, e.ctx, addr, "hset") - before; n != 0 {
		t.Fatalf("an idle reap ran %d HSET", n)
	}
}

// TestBeliefsConcurrentCallers: Apply and ApplyShards calls of one gateway
// process on overlapping shards, in opposite shard orders and with a
// repeated shard in one call, neither deadlock nor lose a renewal.
func TestBeliefsConcurrentCallers(t *testing.T) {
	const shards, rounds = 4, 100
	e := newEnv(t, sharedServer().Client(t), shards)
	devs := devicesPerShard(shards, "conc")
	renewal := func(sh int) gateway.ShardBatch {
		return gateway.ShardBatch{Shard: sh, Batch: batch("gw-a", 1, write(devs[sh], "s0", gateway.Renew, 0))}
	}
	for sh := range shards {
		e.apply(sh, batch("gw-a", 1, write(devs[sh], "s0", gateway.Connect, 0)))
	}
	orders := [][]int{{0, 1, 2, 3}, {3, 2, 1, 0}, {1, 1, 0}, {2}}
	errs := make(chan error, len(orders))
	for _, order := range orders {
		go func() {
			for range rounds {
				var bs []gateway.ShardBatch
				for _, sh := range order {
					bs = append(bs, renewal(sh))
				}
				for _, r := range e.store.ApplyShards(e.ctx, bs) {
					if r.Err != nil || len(r.Result.Events) != 0 {
						errs <- fmt.Errorf("shards %v: %v, events %s", order, r.Err, describe(r.Result.Events))
						return
					}
				}
			}
			errs <- nil
		}()
	}
	deadline := time.After(60 * time.Second)
	for range orders {
		select {
		case err := <-errs:
			if err != nil {
				t.Fatal(err)
			}
		case <-deadline:
			t.Fatal("concurrent apply calls did not finish in 60 s (deadlock?)")
		}
	}
	for _, d := range devs {
		if got := e.device(d); got.State != gateway.Online || len(got.Sessions) != 1 {
			t.Fatalf("%s after the concurrent renewals: %+v", d, got)
		}
	}
}

// TestBeliefsShardTwiceInOneCall: when one call carries two batches of a
// shard, the second may change what the first's reply said (here it
// adds a session); the process must not go on believing the device steady.
func TestBeliefsShardTwiceInOneCall(t *testing.T) {
	e := newEnv(t, sharedServer().Client(t), 1)
	d := devicesIn(t, 1, 0, 1, "twice")[0]
	e.apply(0, batch("gw-a", 1, write(d, "s0", gateway.Connect, 0)))
	e.clock.Advance(time.Second)
	for _, r := range e.store.ApplyShards(e.ctx, []gateway.ShardBatch{
		{Shard: 0, Batch: batch("gw-a", 1, write(d, "s0", gateway.Renew, 0))},
		{Shard: 0, Batch: gateway.Batch{Gateway: "gw-a", Epoch: 1, Lease: 30 * time.Second,
			Writes: []gateway.Write{write(d, "s1", gateway.Connect, 0)}}},
	}) {
		if r.Err != nil {
			t.Fatal(r.Err)
		}
	}
	s1 := e.clock.Now().Add(30 * time.Second)
	e.clock.Advance(time.Second)
	e.apply(0, batch("gw-a", 1, write(d, "s0", gateway.Renew, 0)))
	got := e.device(d)
	if len(got.Sessions) != 2 {
		t.Fatalf("after the renewal: %+v", got)
	}
	for _, s := range got.Sessions {
		if s.ID == "s1" && !s.Deadline.Equal(s1) {
			t.Fatalf("the renewal of s0 moved s1 to %v, want %v: %+v", s.Deadline, s1, got.Sessions)
		}
	}
}

// TestBeliefsVoidAfterFailover: a replica that takes over may lack the
// last writes, here gw-a's takeover of a session. gw-a learned from that
// write that the device is steady for it; on the new master it is not,
// and gw-a's next renewal must take the general path (the replication ID
// is part of the incarnation).
func TestBeliefsVoidAfterFailover(t *testing.T) {
	ctx := t.Context()
	primary, replica := redistest.Start(t), redistest.Start(t)
	pc, rc := primary.Client(t), replica.Client(t)
	host, port, err := net.SplitHostPort(primary.Addr)
	if err != nil {
		t.Fatal(err)
	}
	if err := rc.Do(ctx, "REPLICAOF", host, port).Err(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, "the replica to link to the primary", func() bool {
		info, err := rc.Info(ctx, "replication").Result()
		return err == nil && strings.Contains(info, "master_link_status:up")
	})

	// The store's client reaches whichever server target names.
	var target atomic.Value
	target.Store(primary.Addr)
	c := redis.NewClient(&redis.Options{Dialer: func(ctx context.Context, network, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, network, target.Load().(string))
	}})
	t.Cleanup(func() { c.Close() })
	clock := clocktest.New(time.UnixMilli(startMs))
	s, err := Open(ctx, c, Options{Prefix: uniquePrefix(), Shards: 1, Now: clock.Now})
	if err != nil {
		t.Fatal(err)
	}
	e := &env{t: t, ctx: ctx, c: c, clock: clock, store: s}
	d := gateway.DeviceID("failover-1")
	e.apply(0, batch("gw-b", 1, write(d, "s0", gateway.Connect, 0)))
	if n, err := pc.Do(ctx, "WAIT", 1, 5000).Int(); err != nil || n != 1 {
		t.Fatalf("WAIT for the replica: %d, %v", n, err)
	}
	// The replica becomes a master of its own with what it has; the old
	// primary takes one more write, which the new master never sees.
	if err := rc.Do(ctx, "REPLICAOF", "NO", "ONE").Err(); err != nil {
		t.Fatal(err)
	}
	e.clock.Advance(time.Second)
	e.apply(0, batch("gw-a", 1, write(d, "s0", gateway.Renew, 0)))
	if believedSession(s, 0, "gw-a", 1, d) != "s0" {
		t.Fatal("gw-a does not believe the device steady after taking its session over")
	}

	// Failover: the clients now reach the former replica.
	target.Store(replica.Addr)
	primary.Kill()
	if err := c.Ping(ctx).Err(); err != nil {
		if err := c.Ping(ctx).Err(); err != nil {
			t.Fatalf("ping after the failover: %v", err)
		}
	}
	if believedSession(s, 0, "gw-a", 1, d) != "s0" {
		t.Fatal("the belief is gone before the renewal: the test would prove nothing")
	}
	e.clock.Advance(time.Second)
	e.apply(0, batch("gw-a", 1, write(d, "s0", gateway.Renew, 0)))
	if got := e.device(d); got.Gateway != "gw-a" || len(got.Sessions) != 1 || got.Sessions[0].Gateway != "gw-a" {
		t.Fatalf("after gw-a's renewal on the new master: %+v", got)
	}
}
