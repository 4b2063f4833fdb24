package redisstore

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/fleetgate/fleetgate/gateway"
	"github.com/fleetgate/fleetgate/gateway/clocktest"
	"github.com/fleetgate/fleetgate/internal/redistest"
)

// commandCalls sums the "calls" of INFO commandstats for cmd over the
// given servers.
func commandCalls(t testing.TB, ctx context.Context, addrs []string, cmd string) int64 {
	t.Helper()
	var total int64
	for _, a := range addrs {
		c := redis.NewClient(&redis.Options{Addr: a})
		info, err := c.Info(ctx, "commandstats").Result()
		c.Close()
		if err != nil {
			t.Fatalf("info commandstats %s: %v", a, err)
		}
		for _, line := range strings.Split(info, "\n") {
			rest, ok := strings.CutPrefix(line, "cmdstat_"+cmd+":calls=")
			if !ok {
				continue
			}
			n, err := strconv.ParseInt(rest[:strings.IndexByte(rest, ',')], 10, 64)
			if err != nil {
				t.Fatalf("commandstats line %q: %v", line, err)
			}
			total += n
		}
	}
	return total
}

func backendAddrs(name string) []string {
	if name == "cluster" {
		return sharedCluster().Addrs()
	}
	return []string{sharedServer().Addr}
}

// After SCRIPT FLUSH every call still works: EVALSHA fails with NOSCRIPT
// and go-redis falls back to EVAL, which caches the script again.
func TestNoScriptAfterFlush(t *testing.T) {
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) {
			c := b.client(t)
			e := newEnv(t, c, 3)
			addrs := backendAddrs(b.name)
			devs := devicesIn(t, 3, 2, 2, "noscript")
			e.apply(2, batch("gw", 1, write(devs[0], "s", gateway.Connect, 0)))
			if err := c.ScriptFlush(e.ctx).Err(); err != nil {
				t.Fatal(err)
			}
			evals := commandCalls(t, e.ctx, addrs, "eval")
			if evs := e.apply(2, batch("gw", 1, write(devs[1], "s", gateway.Connect, 0))); len(evs) != 1 {
				t.Fatalf("apply after flush: %s", describe(evs))
			}
			if got := commandCalls(t, e.ctx, addrs, "eval") - evals; got != 1 {
				t.Fatalf("apply after SCRIPT FLUSH ran EVAL %d times, want 1", got)
			}
			evals++
			shas := commandCalls(t, e.ctx, addrs, "evalsha")
			e.apply(2, batch("gw", 1, write(devs[1], "s", gateway.Renew, 0)))
			if got := commandCalls(t, e.ctx, addrs, "eval") - evals; got != 0 {
				t.Fatalf("second apply after flush ran EVAL %d times, want 0 (script cached again)", got)
			}
			if got := commandCalls(t, e.ctx, addrs, "evalsha") - shas; got != 1 {
				t.Fatalf("second apply ran EVALSHA %d times, want 1", got)
			}
			if err := c.ScriptFlush(e.ctx).Err(); err != nil {
				t.Fatal(err)
			}
			e.clock.Advance(time.Hour)
			if r := e.reap(2, 10); len(r.Offline) != 2 {
				t.Fatalf("reap after flush: %s", describe(r.Offline))
			}
			if d := e.device(devs[0]); d.State != gateway.Offline {
				t.Fatalf("device after flush: %+v", d)
			}
			if ok, err := e.store.AcquireShard(e.ctx, 2, "o", time.Second); err != nil || !ok {
				t.Fatalf("acquire after flush: %v %v", ok, err)
			}
		})
	}
}

// The store keeps working across a Redis restart (scripts and, with
// persistence off, data are gone) and reports ErrUnavailable while Redis
// is down.
func TestRedisRestart(t *testing.T) {
	srv := redistest.Start(t)
	c := redis.NewClient(&redis.Options{Addr: srv.Addr, MaxRetries: 1, DialTimeout: 200 * time.Millisecond})
	t.Cleanup(func() { c.Close() })
	e := newEnv(t, c, 2)
	dev := devicesIn(t, 2, 0, 1, "restart")[0]
	first := e.apply(0, batch("gw", 1, write(dev, "s", gateway.Connect, 0)))

	srv.Kill()
	ctx, cancel := context.WithTimeout(e.ctx, 2*time.Second)
	_, err := e.store.Apply(ctx, 0, batch("gw", 1, write(dev, "s", gateway.Renew, 0)))
	cancel()
	if !errors.Is(err, gateway.ErrUnavailable) {
		t.Fatalf("apply with Redis down: %v, want ErrUnavailable", err)
	}
	if _, err := e.store.Reap(e.ctx, 0, 10); !errors.Is(err, gateway.ErrUnavailable) {
		t.Fatalf("reap with Redis down: %v, want ErrUnavailable", err)
	}

	srv.Restart()
	e.clock.Advance(time.Second)
	// Pooled connections died with the server; the client redials.
	var res gateway.ApplyResult
	deadline := time.Now().Add(5 * time.Second)
	for {
		var err error
		res, err = e.store.Apply(e.ctx, 0, batch("gw", 1, write(dev, "s", gateway.Renew, 0)))
		if err == nil {
			break
		}
		if !errors.Is(err, gateway.ErrUnavailable) || time.Now().After(deadline) {
			t.Fatalf("apply after restart: %v", err)
		}
	}
	// The record was lost. The renewal of a gateway that wrote to the
	// lost incarnation restores it online without an event (its
	// consumers saw it online) and says so (Reset); its ver is the store
	// time, above every ver the lost one handed out: (device, ver) never
	// repeats.
	if len(res.Events) != 0 || !res.Reset {
		t.Fatalf("after restart (data lost): %s reset %v, want a silent restore", describe(res.Events), res.Reset)
	}
	// The restarted server had no scripts: EVALSHA failed and EVAL ran.
	if n := commandCalls(t, e.ctx, []string{srv.Addr}, "eval"); n != 1 {
		t.Fatalf("EVAL ran %d times after the restart, want 1", n)
	}
	if d := e.device(dev); d.State != gateway.Online || d.Ver != ver(time.Second, 1) || d.Ver <= first[0].Ver {
		t.Fatalf("after restart (data lost): %+v, first %s", d, describe(first))
	}
	e.clock.Advance(time.Hour)
	if r := e.reap(0, 10); len(r.Offline) != 1 || r.Offline[0].Ver != ver(time.Second, 2) {
		t.Fatalf("reap after restart: %s", describe(r.Offline))
	}
	if ok, err := e.store.AcquireShard(e.ctx, 0, "o", time.Second); err != nil || !ok {
		t.Fatalf("acquire after restart: %v %v", ok, err)
	}
}

// A shard's slot moves to another Cluster node while writers and a reaper
// keep working on it. Afterwards every device's log alternates with ver
// +1, no event was lost or duplicated, and the store agrees with the log.
func TestClusterSlotMigration(t *testing.T) {
	cl := sharedCluster()
	c := cl.Client(t)
	const shards, shard = 4, 1
	e := newEnv(t, c, shards)
	ctx := e.ctx
	slot := int(c.ClusterKeySlot(ctx, e.store.keys[shard].data[0]).Val())
	seed := devicesIn(t, shards, shard, 1, "mig-seed")[0]
	seedEvents := e.apply(shard, batch("gw-0", 1, write(seed, "s", gateway.Connect, 0)))
	owner := -1
	for i, n := range cl.Nodes {
		if n.Client(t).Exists(ctx, e.store.keys[shard].data[1]).Val() == 1 {
			owner = i
		}
	}
	if owner < 0 {
		t.Fatal("no node holds the shard")
	}
	dst := (owner + 1) % len(cl.Nodes)
	// The destination has no scripts cached: the first calls there take
	// the NOSCRIPT path.
	if err := cl.Nodes[dst].Client(t).ScriptFlush(ctx).Err(); err != nil {
		t.Fatal(err)
	}

	var (
		mu       sync.Mutex
		returned = map[string]gateway.Event{}
		retries  atomic.Int64
		progress atomic.Int64
	)
	record := func(evs []gateway.Event) {
		mu.Lock()
		defer mu.Unlock()
		for _, ev := range evs {
			if _, dup := returned[ev.ID]; dup {
				t.Errorf("event %s returned twice", ev.ID)
			}
			returned[ev.ID] = ev
		}
	}
	record(seedEvents)
	// retry runs op until it succeeds, retrying ErrUnavailable (TRYAGAIN
	// while the slot's keys are split between the nodes) a bounded number
	// of times, as the uplink's outbox and the runner do.
	retry := func(what string, op func() error) error {
		for attempt := 0; ; attempt++ {
			err := op()
			if err == nil || !errors.Is(err, gateway.ErrUnavailable) || attempt == 200 {
				if err != nil {
					return fmt.Errorf("%s: %w", what, err)
				}
				return nil
			}
			retries.Add(1)
		}
	}

	const writers, rounds = 3, 150
	stopReap := make(chan struct{})
	var wg, reaper sync.WaitGroup
	errs := make(chan error, writers+1)
	all := []gateway.DeviceID{seed}
	for w := 0; w < writers; w++ {
		devs := devicesIn(t, shards, shard, 8, fmt.Sprintf("mig%d", w))
		all = append(all, devs...)
		wg.Add(1)
		go func(w int, devs []gateway.DeviceID) {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(w), 7))
			gw := fmt.Sprintf("gw-%d", w)
			for r := 0; r < rounds; r++ {
				b := gateway.Batch{Gateway: gw, Epoch: 1, Lease: 2 * time.Second}
				for i := 0; i < 1+rng.IntN(6); i++ {
					k := gateway.Kind(1 + rng.IntN(3))
					sess := gateway.SessionID(fmt.Sprintf("s%d", rng.IntN(2)))
					b.Writes = append(b.Writes, write(devs[rng.IntN(len(devs))], sess, k, time.Duration(rng.IntN(1500))*time.Millisecond))
				}
				err := retry("apply", func() error {
					res, err := e.store.Apply(ctx, shard, b)
					if err == nil {
						record(res.Events)
					}
					return err
				})
				if err != nil {
					errs <- err
					return
				}
				e.clock.Advance(time.Duration(rng.IntN(200)) * time.Millisecond)
				progress.Add(1)
			}
		}(w, devs)
	}
	reaper.Add(1)
	go func() {
		defer reaper.Done()
		for {
			select {
			case <-stopReap:
				return
			default:
			}
			err := retry("reap", func() error {
				res, err := e.store.Reap(ctx, shard, 5)
				if err == nil {
					record(res.Offline)
				}
				return err
			})
			if err != nil {
				errs <- err
				return
			}
		}
	}()

	waitFor(t, 20*time.Second, "writers to start", func() bool { return progress.Load() >= writers*20 })
	asking := commandCalls(t, ctx, []string{cl.Nodes[dst].Addr}, "asking")
	before := progress.Load()
	cl.MigrateSlot(t, slot, dst)
	after := progress.Load()
	if after == writers*rounds {
		t.Fatalf("the writers finished before the migration did (%d rounds before it)", before)
	}
	wg.Wait()
	close(stopReap)
	reaper.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if n := cl.Nodes[dst].Client(t).Exists(ctx, e.store.keys[shard].data[2]).Val(); n != 1 {
		t.Fatalf("events stream not on node %d after the migration", dst)
	}
	// Reap everything that is left, after the slot moved.
	e.clock.Advance(time.Minute)
	for i := 0; ; i++ {
		res, err := e.store.Reap(ctx, shard, 100)
		if err != nil {
			t.Fatal(err)
		}
		record(res.Offline)
		if !res.More {
			break
		}
		if i == 100 {
			t.Fatal("reap did not drain the shard")
		}
	}

	log := e.events(shard)
	last := checkAlternation(t, log)
	if len(log) != len(returned) {
		t.Errorf("log holds %d events, the calls returned %d", len(log), len(returned))
	}
	for _, ev := range log {
		r, ok := returned[ev.ID]
		if !ok || r.Device != ev.Device || r.Ver != ev.Ver || r.State != ev.State || r.Reason != ev.Reason {
			t.Fatalf("logged event %s %s v%d was not returned as such (%+v)", ev.ID, ev.Device, ev.Ver, r)
		}
	}
	for _, d := range all {
		info, err := e.store.Device(ctx, d)
		l, logged := last[d]
		if !logged {
			if !errors.Is(err, gateway.ErrNotFound) {
				t.Errorf("%s has no events but Device says %+v %v", d, info, err)
			}
			continue
		}
		if err != nil || info.State != gateway.Offline || info.Ver != l.Ver || l.State != gateway.Offline {
			t.Errorf("%s: store %+v %v, last event %s v%d", d, info, err, l.State, l.Ver)
		}
	}
	if n, err := c.ZCard(ctx, e.store.keys[shard].data[0]).Result(); err != nil || n != 0 {
		t.Errorf("deadline index holds %d entries after the final reap (%v)", n, err)
	}
	t.Logf("%d events; migration during rounds %d..%d of %d; %d calls retried, %d ASKING on the destination",
		len(log), before, after, writers*rounds, retries.Load(),
		commandCalls(t, ctx, []string{cl.Nodes[dst].Addr}, "asking")-asking)
}

// waitFor polls cond until it holds, failing the test after limit.
func waitFor(t *testing.T, limit time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(limit)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", limit, what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// store.redis.wait_replicas: a call that writes events waits for the
// replica; while the replica's link is cut it fails with ErrUnavailable
// (the uplink keeps the batch in its outbox), and the replay once the
// link is back succeeds, writing no second event. A call without events
// does not wait.
func TestWaitReplicas(t *testing.T) {
	s, _, link, replica := waitingStore(t)
	ctx := t.Context()
	if n, err := replica.Client(t).Exists(ctx, s.keys[0].data[2]).Result(); err != nil || n != 1 {
		t.Fatalf("events stream on the replica after a waited call: %d %v", n, err)
	}

	link.SetCut(true)
	connect := batch("gw", 1, write("dev-2", "s", gateway.Connect, 0))
	if _, err := s.Apply(ctx, 0, connect); !errors.Is(err, gateway.ErrUnavailable) {
		t.Fatalf("apply with events while the replica is cut off: %v, want ErrUnavailable", err)
	}
	// a renewal writes no event: no wait
	if _, err := s.Apply(ctx, 0, batch("gw", 1, write("dev-1", "s", gateway.Renew, 0))); err != nil {
		t.Fatalf("renewal while the replica is cut off: %v", err)
	}
	link.SetCut(false)
	replay := connect
	replay.Replay = true
	waitFor(t, 10*time.Second, "the replay to be acknowledged", func() bool {
		res, err := s.Apply(ctx, 0, replay)
		if err == nil && len(res.Events) != 0 {
			t.Fatalf("replay wrote %s", describe(res.Events))
		}
		return err == nil
	})
	if d, err := replica.Client(t).HExists(ctx, s.keys[0].data[1], "dev-2").Result(); err != nil || !d {
		t.Fatalf("dev-2 on the replica after the replay: %v %v", d, err)
	}
}

// A reset (the shard's state lost: a restart without persistence, a
// FLUSHALL) seen by a call that then fails its wait for the replicas is
// reported by the next call that succeeds: the caller restores after it,
// though the failed call already carried the new incarnation.
func TestWaitReplicasKeepsReset(t *testing.T) {
	s, c, link, _ := waitingStore(t)
	ctx := t.Context()

	link.SetCut(true)
	if err := c.FlushAll(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	replay := batch("gw", 1, write("dev-2", "s", gateway.Connect, 0))
	replay.Replay = true
	if _, err := s.Apply(ctx, 0, replay); !errors.Is(err, gateway.ErrUnavailable) {
		t.Fatalf("replay onto the lost state while the replica is cut off: %v, want ErrUnavailable", err)
	}
	link.SetCut(false)
	var res gateway.ApplyResult
	waitFor(t, 10*time.Second, "a call to be acknowledged", func() bool {
		var err error
		res, err = s.Apply(ctx, 0, replay)
		return err == nil
	})
	if !res.Reset {
		t.Fatal("the first acknowledged call after the loss did not report the reset")
	}
	if res, err := s.Apply(ctx, 0, batch("gw", 1, write("dev-2", "s", gateway.Renew, 0))); err != nil || res.Reset {
		t.Fatalf("the call after: reset %v %v, want none", res.Reset, err)
	}
}

// waitingStore opens a one-shard store with wait_replicas: 1 on a primary
// whose replica replicates through link, and returns it once the replica
// acknowledges a call (dev-1 connected), with its client.
func waitingStore(t *testing.T) (*Store, *redis.Client, *redistest.Proxy, *redistest.Server) {
	t.Helper()
	primary := redistest.Start(t)
	link := redistest.NewProxy(t, primary.Addr)
	replica := redistest.StartReplica(t, link.Addr())
	c := redis.NewClient(&redis.Options{Addr: primary.Addr})
	t.Cleanup(func() { c.Close() })
	clock := clocktest.New(time.UnixMilli(startMs))
	s, err := Open(t.Context(), c, Options{Prefix: uniquePrefix(), Shards: 1, Now: clock.Now,
		WaitReplicas: 1, WaitTimeout: 300 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	waitFor(t, 10*time.Second, "the replica to sync", func() bool {
		_, err := s.Apply(t.Context(), 0, batch("gw", 1, write("dev-1", "s", gateway.Connect, 0)))
		return err == nil
	})
	return s, c, link, replica
}
