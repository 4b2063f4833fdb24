package redisstore

import (
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

func TestRunnerLease(t *testing.T) {
	forBackends(t, func(t *testing.T, c redis.UniversalClient) {
		e := newEnv(t, c, 2)
		ok, err := e.store.AcquireShard(e.ctx, 1, "a", time.Minute)
		if err != nil || !ok {
			t.Fatalf("a acquires: %v %v", ok, err)
		}
		if ok, err := e.store.AcquireShard(e.ctx, 1, "b", time.Minute); err != nil || ok {
			t.Fatalf("b acquires a held lease: %v %v", ok, err)
		}
		if ok, err := e.store.AcquireShard(e.ctx, 1, "a", time.Minute); err != nil || !ok {
			t.Fatalf("a extends: %v %v", ok, err)
		}
		if err := e.store.ReleaseShard(e.ctx, 1, "b"); err != nil {
			t.Fatal(err)
		}
		if ok, _ := e.store.AcquireShard(e.ctx, 1, "b", time.Minute); ok {
			t.Fatal("b's release freed a's lease")
		}
		if err := e.store.ReleaseShard(e.ctx, 1, "a"); err != nil {
			t.Fatal(err)
		}
		if ok, err := e.store.AcquireShard(e.ctx, 1, "b", 50*time.Millisecond); err != nil || !ok {
			t.Fatalf("b after release: %v %v", ok, err)
		}
		// The lease runs out on the store clock.
		e.clock.Advance(49 * time.Millisecond)
		if ok, _ := e.store.AcquireShard(e.ctx, 1, "a", time.Minute); ok {
			t.Fatal("a took b's lease before it ran out")
		}
		e.clock.Advance(time.Millisecond)
		if ok, err := e.store.AcquireShard(e.ctx, 1, "a", time.Minute); err != nil || !ok {
			t.Fatalf("a after b's lease ran out: %v %v", ok, err)
		}
	})
}
