package redistest

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

func TestStandaloneRestart(t *testing.T) {
	s := Start(t)
	c := s.Client(t)
	ctx := context.Background()
	if err := c.Set(ctx, "k", "v", 0).Err(); err != nil {
		t.Fatal(err)
	}
	s.Restart()
	if n, err := c.Exists(ctx, "k").Result(); err != nil || n != 0 {
		t.Fatalf("after restart: exists=%d err=%v, want 0 and nil", n, err)
	}
	if ticks, err := ProcStat(s.Pid()); err != nil || ticks < 0 {
		t.Fatalf("procstat: %d %v", ticks, err)
	}
}

func TestClusterMigrateSlot(t *testing.T) {
	cl := StartCluster(t, 3)
	c := cl.Client(t)
	ctx := context.Background()
	key := "{fleetgate:1}:exp"
	if err := c.ZAdd(ctx, key, redis.Z{Score: 1, Member: "a"}).Err(); err != nil {
		t.Fatal(err)
	}
	slot := int(c.ClusterKeySlot(ctx, key).Val())
	owner := -1
	for i := range cl.Nodes {
		if cl.Nodes[i].Client(t).Exists(ctx, key).Val() == 1 {
			owner = i
		}
	}
	dst := (owner + 1) % 3
	cl.MigrateSlot(t, slot, dst)
	if n := cl.Nodes[dst].Client(t).Exists(ctx, key).Val(); n != 1 {
		t.Fatalf("key not on node %d after migration", dst)
	}
	if n, err := c.ZCard(ctx, key).Result(); err != nil || n != 1 {
		t.Fatalf("zcard via cluster client after migration: %d %v", n, err)
	}
}

// A replica started by StartReplica has the primary's data and follows
// its writes.
func TestStartReplica(t *testing.T) {
	p := Start(t)
	pc := p.Client(t)
	ctx := context.Background()
	if err := pc.Set(ctx, "before", "1", 0).Err(); err != nil {
		t.Fatal(err)
	}
	r := StartReplica(t, p.Addr)
	rc := r.Client(t)
	if err := pc.Set(ctx, "after", "2", 0).Err(); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		a, _ := rc.Get(ctx, "after").Result()
		b, _ := rc.Get(ctx, "before").Result()
		if a == "2" && b == "1" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("replica has before=%q after=%q, want 1 and 2", b, a)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err := rc.Set(ctx, "x", "1", 0).Err(); err == nil {
		t.Fatal("a write to the replica succeeded; want READONLY")
	}
}

// StartClusterWithReplicas gives 3 masters and 3 replicas, and the master
// of a key is a master.
func TestStartClusterWithReplicas(t *testing.T) {
	c := StartClusterWithReplicas(t, 3)
	roles := map[string]int{}
	for i := range c.Nodes {
		roles[c.Role(i)]++
	}
	if roles["master"] != 3 || roles["slave"] != 3 {
		t.Fatalf("roles %v, want 3 masters and 3 slaves", roles)
	}
	if m := c.MasterOfKey(t, "{fleetgate:0}:exp"); c.Role(m) != "master" {
		t.Fatalf("MasterOfKey = node %d, a %q", m, c.Role(m))
	}
}

// A delayed proxy answers no sooner than the delay, in order, and at
// once again when the delay ends.
func TestProxyDelay(t *testing.T) {
	srv := Start(t)
	px := NewProxy(t, srv.Addr)
	c := redis.NewClient(&redis.Options{Addr: px.Addr(), ReadTimeout: 5 * time.Second})
	defer c.Close()
	if err := c.Ping(t.Context()).Err(); err != nil {
		t.Fatal(err)
	}
	px.SetDelay(300*time.Millisecond, 400*time.Millisecond)
	start := time.Now()
	for i := range 3 {
		if got, err := c.Incr(t.Context(), "n").Result(); err != nil || got != int64(i+1) {
			t.Fatalf("INCR %d through the delay: %d, %v", i, got, err)
		}
	}
	if took := time.Since(start); took < 900*time.Millisecond {
		t.Fatalf("3 calls through a delay of 300-400 ms took %v", took)
	}
	px.SetDelay(0, 0)
	start = time.Now()
	if err := c.Ping(t.Context()).Err(); err != nil || time.Since(start) > 200*time.Millisecond {
		t.Fatalf("PING after the delay ended: %v after %v", err, time.Since(start))
	}
}
