package redisstore

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/fleetgate/fleetgate/gateway"
)

// TestDeadMasterFailsFast: while a killed Cluster master waits for its
// replica's promotion, an ApplyShards call over every shard applies the
// healthy shards' batches and fails the dead one's, and returns well
// inside the call timeout. With go-redis's default five dials per
// attempt it took 3.3 s (past the 2 s call timeout): the uplink's flushes
// stalled behind it, healthy shards included.
func TestDeadMasterFailsFast(t *testing.T) {
	const shards = 6
	cl, s, master := clusterStore(t, Options{Prefix: uniquePrefix(), Shards: shards})
	victim := master[0]
	healthy := -1
	for sh := range shards {
		if master[sh] != victim {
			healthy = sh
		}
	}
	if healthy < 0 {
		t.Fatal("every shard hashed to the killed master")
	}
	call := func(epoch uint64) ([]gateway.ShardResult, time.Duration) {
		var bs []gateway.ShardBatch
		for sh := range shards {
			dev := devicesIn(t, shards, sh, 1, "dead")[0]
			bs = append(bs, gateway.ShardBatch{Shard: sh, Batch: batch("gw", epoch, write(dev, "s", gateway.Renew, 0))})
		}
		ctx, cancel := context.WithTimeout(t.Context(), callTimeout)
		defer cancel()
		start := time.Now()
		res := s.ApplyShards(ctx, bs)
		return res, time.Since(start)
	}
	if res, _ := call(1); res[0].Err != nil || res[healthy].Err != nil {
		t.Fatalf("before the kill: %v, %v", res[0].Err, res[healthy].Err)
	}
	cl.Nodes[victim].Kill()
	for i := range 3 {
		res, took := call(1)
		if res[healthy].Err != nil {
			t.Fatalf("call %d: healthy shard %d: %v", i, healthy, res[healthy].Err)
		}
		if !errors.Is(res[0].Err, gateway.ErrUnavailable) {
			t.Fatalf("call %d: shard 0 on the killed master: %v, want ErrUnavailable", i, res[0].Err)
		}
		if took >= callTimeout/2 {
			t.Fatalf("call %d took %v with a dead master, want well under the %v call timeout", i, took, callTimeout)
		}
	}
}
