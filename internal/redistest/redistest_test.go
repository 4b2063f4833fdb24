package redistest

import (
	"context"
	"testing"

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
