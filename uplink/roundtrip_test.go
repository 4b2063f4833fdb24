package uplink

import (
	"errors"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/fleetgate/fleetgate/gateway"
	"github.com/fleetgate/fleetgate/internal/redistest"
	"github.com/fleetgate/fleetgate/internal/statefile"
	"github.com/fleetgate/fleetgate/store/redisstore"
)

// onePerShard returns a device ID hashing to each of shards.
func onePerShard(shards int, prefix string) []gateway.DeviceID {
	devs := make([]gateway.DeviceID, shards)
	for i, found := 0, 0; found < shards && i < 1_000_000; i++ {
		d := gateway.DeviceID(fmt.Sprintf("%s-%d", prefix, i))
		if sh := gateway.ShardOf(d, shards); devs[sh] == "" {
			devs[sh] = d
			found++
		}
	}
	return devs
}

// With the Redis store, a flush of writes for every shard is one round
// trip: one pipeline of one script call per shard. The first flush also
// records the process's epoch on every shard, in the same pipeline.
func TestFlushIsOneRoundTrip(t *testing.T) {
	const shards = 16
	srv := redistest.Start(t)
	c := srv.Client(t)
	rt := &redistest.RoundTrips{}
	store, err := redisstore.Open(t.Context(), c, redisstore.Options{Shards: shards})
	if err != nil {
		t.Fatal(err)
	}
	c.AddHook(rt)
	db, err := statefile.Open(filepath.Join(t.TempDir(), "state.db"), nil, Migrations)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	ob, err := OpenOutbox(db, OutboxOptions{Shards: shards})
	if err != nil {
		t.Fatal(err)
	}
	u := New(store, ob, Options{Gateway: "gw-rt", Epoch: 1, Timeout: 10 * time.Second})
	devs := onePerShard(shards, "rt")
	for round := 0; round < 3; round++ {
		for _, d := range devs {
			mustEnqueue(t, u, evidence(d, gateway.Connect, time.Now()))
		}
		before := rt.Total()
		if err := u.flushOnce(t.Context(), true); err != nil {
			t.Fatal(err)
		}
		if got := rt.Total() - before; got != 1 || rt.Singles() != 0 {
			t.Fatalf("flush %d: %d round trips (%d single calls so far), want 1 pipeline", round, got, rt.Singles())
		}
	}
	for _, d := range devs {
		if info, err := store.Device(t.Context(), d); err != nil || info.State != gateway.Online {
			t.Fatalf("device %s after the flushes: %+v %v, want online", d, info, err)
		}
	}
	if st := u.Status(); !st.Up || st.OutboxSessions != 0 {
		t.Fatalf("status after the flushes: %+v", st)
	}
}

// A new process announces its epoch on every shard before its first
// write, so a delayed batch of the previous process is fenced even on a
// shard the new one has not written to (the Redis store keeps epochs per
// shard).
func TestAnnounceFencesOlderEpochEverywhere(t *testing.T) {
	const shards = 16
	srv := redistest.Start(t)
	c := srv.Client(t)
	store, err := redisstore.Open(t.Context(), c, redisstore.Options{Shards: shards})
	if err != nil {
		t.Fatal(err)
	}
	db, err := statefile.Open(filepath.Join(t.TempDir(), "state.db"), nil, Migrations)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	ob, err := OpenOutbox(db, OutboxOptions{Shards: shards})
	if err != nil {
		t.Fatal(err)
	}
	devs := onePerShard(shards, "fence")
	old := gateway.Batch{Gateway: "gw-f", Epoch: 1, Lease: gateway.DefaultLease,
		Writes: []gateway.Write{{Device: devs[5], Session: "coap/default", Kind: gateway.Connect}}}
	if _, err := store.Apply(t.Context(), 5, old); err != nil {
		t.Fatalf("epoch 1 before the restart: %v", err)
	}
	u := New(store, ob, Options{Gateway: "gw-f", Epoch: 2, Timeout: 10 * time.Second})
	mustEnqueue(t, u, evidence(devs[0], gateway.Connect, time.Now()))
	if err := u.flushOnce(t.Context(), true); err != nil {
		t.Fatal(err)
	}
	// The old process's delayed batch for shard 5, which epoch 2 never wrote.
	if _, err := store.Apply(t.Context(), 5, old); !errors.Is(err, gateway.ErrFenced) {
		t.Fatalf("delayed epoch-1 batch on an unwritten shard: %v, want ErrFenced", err)
	}
}
