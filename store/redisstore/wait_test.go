package redisstore

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/fleetgate/fleetgate/gateway"
	"github.com/fleetgate/fleetgate/internal/redistest"
)

// store.redis.wait_replicas on a Cluster with a replica per master: a
// call waits on each master it wrote events to. While one master's
// replica is stopped, only the batches of that master's shards fail with
// ErrUnavailable (renewals, which wait for nothing, do not), and within
// the wait timeout; once the replica runs again their replay succeeds,
// writing no second event, and the replica has it. A store dialled with
// one node's address waits the same way.
func TestWaitReplicasCluster(t *testing.T) {
	const shards = 6
	const waitTimeout = 300 * time.Millisecond
	opts := Options{Prefix: uniquePrefix(), Shards: shards, WaitReplicas: 1, WaitTimeout: waitTimeout}
	cl, s, master := clusterStore(t, opts)
	ctx := t.Context()
	victim := master[0]
	replica := replicaOf(t, cl, victim)
	healthy := 0
	for sh := range shards {
		if master[sh] != victim {
			healthy++
		}
	}
	if healthy == 0 {
		t.Fatal("every shard hashed to one master")
	}
	round := 0
	connects := func() []gateway.ShardBatch {
		round++
		var bs []gateway.ShardBatch
		for sh := range shards {
			dev := devicesIn(t, shards, sh, round, "wait")[round-1]
			bs = append(bs, gateway.ShardBatch{Shard: sh, Batch: batch("gw", 1, write(dev, "s", gateway.Connect, 0))})
		}
		return bs
	}
	waitFor(t, 10*time.Second, "every master's replica to acknowledge", func() bool {
		for _, r := range s.ApplyShards(ctx, connects()) {
			if r.Err != nil {
				return false
			}
		}
		return true
	})

	cl.Nodes[replica].Signal(syscall.SIGSTOP)
	cut := connects()
	start := time.Now()
	res := s.ApplyShards(ctx, cut)
	if took := time.Since(start); took > waitTimeout+time.Second {
		t.Errorf("the call took %v with one replica stopped, want about the wait timeout %v", took, waitTimeout)
	}
	for sh, r := range res {
		switch {
		case master[sh] == victim && !errors.Is(r.Err, gateway.ErrUnavailable):
			t.Errorf("shard %d, on the master whose replica is stopped: %v, want ErrUnavailable", sh, r.Err)
		case master[sh] != victim && (r.Err != nil || len(r.Result.Events) != 1):
			t.Errorf("shard %d, on a healthy master: %v %s, want one event", sh, r.Err, describe(r.Result.Events))
		}
	}
	var renew []gateway.ShardBatch
	for _, sb := range cut {
		w := sb.Batch.Writes[0]
		w.Kind = gateway.Renew
		renew = append(renew, gateway.ShardBatch{Shard: sb.Shard, Batch: batch("gw", 1, w)})
	}
	for sh, r := range s.ApplyShards(ctx, renew) {
		if r.Err != nil {
			t.Errorf("renewal of shard %d while a replica is stopped: %v", sh, r.Err)
		}
	}
	cl.Nodes[replica].Signal(syscall.SIGCONT)

	var replay []gateway.ShardBatch
	for _, sb := range cut {
		if master[sb.Shard] == victim {
			sb.Batch.Replay = true
			replay = append(replay, sb)
		}
	}
	waitFor(t, 10*time.Second, "the replay to be acknowledged", func() bool {
		ok := true
		for i, r := range s.ApplyShards(ctx, replay) {
			if r.Err == nil && len(r.Result.Events) != 0 {
				t.Fatalf("replay of shard %d wrote %s", replay[i].Shard, describe(r.Result.Events))
			}
			ok = ok && r.Err == nil
		}
		return ok
	})
	rc := redis.NewClient(&redis.Options{Addr: cl.Nodes[replica].Addr,
		OnConnect: func(ctx context.Context, cn *redis.Conn) error { return cn.ReadOnly(ctx).Err() }})
	defer rc.Close()
	for _, sb := range replay {
		dev := string(sb.Batch.Writes[0].Device)
		if d, err := rc.HExists(ctx, s.keys[sb.Shard].data[1], dev).Result(); err != nil || !d {
			t.Errorf("%s on the replica after the replay: %v %v", dev, d, err)
		}
	}

	one, err := Dial(ctx, DialConfig{Addrs: []string{cl.Nodes[victim].Addr}, Options: opts})
	if err != nil {
		t.Fatal(err)
	}
	defer one.Close()
	for sh, r := range one.ApplyShards(ctx, connects()) {
		if r.Err != nil || len(r.Result.Events) != 1 {
			t.Errorf("shard %d through a store dialled with one node's address: %v %s, want one event", sh, r.Err, describe(r.Result.Events))
		}
	}
}

// replicaOf is the index in cl.Nodes of the replica of master m (INFO
// replication on m: slave0:ip=...,port=...).
func replicaOf(t *testing.T, cl *redistest.Cluster, m int) int {
	t.Helper()
	rc := redis.NewClient(&redis.Options{Addr: cl.Nodes[m].Addr})
	defer rc.Close()
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Second)
	defer cancel()
	info, err := rc.Info(ctx, "replication").Result()
	if err != nil {
		t.Fatal(err)
	}
	for i, n := range cl.Nodes {
		_, port, _ := strings.Cut(n.Addr, ":")
		if strings.Contains(info, fmt.Sprintf(",port=%s,", port)) {
			return i
		}
	}
	t.Fatalf("master %s names no replica among the nodes: %q", cl.Nodes[m].Addr, info)
	return -1
}
