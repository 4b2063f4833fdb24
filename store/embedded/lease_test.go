package embedded

import (
	"context"
	"testing"
	"time"
)

func TestShardLock(t *testing.T) {
	f := newFixture(t, Options{Shards: 2})
	ctx := context.Background()
	acquire := func(shard int, owner string, want bool) {
		t.Helper()
		ok, err := f.s.AcquireShard(ctx, shard, owner, 10*time.Second)
		if err != nil || ok != want {
			t.Fatalf("AcquireShard(%d, %s) = %v, %v; want %v", shard, owner, ok, err, want)
		}
	}
	acquire(0, "r1", true)
	acquire(0, "r2", false)
	acquire(1, "r2", true)
	f.clk.Advance(9 * time.Second)
	acquire(0, "r1", true) // extends to +19s
	f.clk.Advance(9 * time.Second)
	acquire(0, "r2", false)
	f.clk.Advance(time.Second)
	acquire(0, "r2", true) // r1's lease ran out
	if err := f.s.ReleaseShard(ctx, 0, "r1"); err != nil {
		t.Fatal(err)
	}
	acquire(0, "r1", false) // r1 released nothing it did not hold
	if err := f.s.ReleaseShard(ctx, 0, "r2"); err != nil {
		t.Fatal(err)
	}
	acquire(0, "r1", true)
	if _, err := f.s.AcquireShard(ctx, 0, "r1", 0); err == nil {
		t.Fatal("ttl 0 accepted")
	}
}
