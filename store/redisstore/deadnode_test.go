package redisstore

import (
	"context"
	"errors"
	"slices"
	"syscall"
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

// TestStoppedMasterFailsOnlyItsShards: with one Cluster master hung
// (SIGSTOP; its replica is not promoted yet), an ApplyShards call over
// every shard applies the others' batches and reports them applied, and
// Probe fails the hung master's shards alone; once it is continued (or
// its replica promoted), every shard answers. (A single
// go-redis Cluster pipeline that retries the hung node reported every
// batch failed, the applied ones too.)
func TestStoppedMasterFailsOnlyItsShards(t *testing.T) {
	const shards = 6
	cl, s, master := clusterStore(t, Options{Prefix: uniquePrefix(), Shards: shards})
	all := make([]int, shards)
	var bs []gateway.ShardBatch
	for sh := range shards {
		all[sh] = sh
		dev := devicesIn(t, shards, sh, 1, "stop")[0]
		bs = append(bs, gateway.ShardBatch{Shard: sh, Batch: batch("gw", 1, write(dev, "s", gateway.Renew, 0))})
	}
	if !slices.ContainsFunc(master, func(m int) bool { return m != master[0] }) {
		t.Fatal("every shard hashed to one master")
	}
	const timeout = 500 * time.Millisecond
	probe := func() []error {
		ctx, cancel := context.WithTimeout(t.Context(), timeout)
		defer cancel()
		return s.Probe(ctx, all)
	}
	for sh, err := range probe() {
		if err != nil {
			t.Fatalf("before the stop: shard %d: %v", sh, err)
		}
	}
	victim := cl.Nodes[master[0]]
	victim.Signal(syscall.SIGSTOP)
	stopped := true
	defer func() {
		if stopped {
			victim.Signal(syscall.SIGCONT)
		}
	}()
	check := func(what string, errs []error) {
		t.Helper()
		for sh, err := range errs {
			if hung := master[sh] == master[0]; hung != errors.Is(err, gateway.ErrUnavailable) || !hung && err != nil {
				t.Errorf("%s: shard %d (on the stopped master: %v): %v", what, sh, hung, err)
			}
		}
	}
	ctx, cancel := context.WithTimeout(t.Context(), timeout)
	res := s.ApplyShards(ctx, bs)
	cancel()
	errs := make([]error, len(res))
	for i, r := range res {
		errs[i] = r.Err
	}
	check("ApplyShards", errs)
	check("Probe", probe())
	victim.Signal(syscall.SIGCONT)
	stopped = false
	waitFor(t, 10*time.Second, "every shard to answer after SIGCONT", func() bool {
		return !slices.ContainsFunc(probe(), func(err error) bool { return err != nil })
	})
}
