package redisstore

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/fleetgate/fleetgate/gateway"
	"github.com/fleetgate/fleetgate/internal/redistest"
	"github.com/fleetgate/fleetgate/store/storetest"
)

// TestWatchConformance runs the event log cases of the suite against the
// shared standalone server and the shared cluster.
func TestWatchConformance(t *testing.T) {
	forBackends(t, func(t *testing.T, c redis.UniversalClient) {
		storetest.RunWatch(t, watchOpener(c))
	})
}

func watchOpener(c redis.UniversalClient) storetest.WatchOpener {
	return func(t *testing.T, shards int, maxLen int64, now func() time.Time) gateway.Store {
		t.Helper()
		s, err := Open(t.Context(), c, Options{
			Prefix:       uniquePrefix(),
			Shards:       shards,
			EventsMaxLen: maxLen,
			Now:          now,
			Logger:       slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelWarn})),
		})
		if err != nil {
			t.Fatalf("redisstore.Open: %v", err)
		}
		t.Cleanup(func() {
			if err := s.Close(); err != nil {
				t.Errorf("close store: %v", err)
			}
		})
		return s
	}
}

// A restarted Redis is a new incarnation, whether its data went with it
// (persistence off) or came back from the AOF (the replication ID is
// new, and writes the AOF had not yet synced may be lost): a position
// of the old incarnation is refused with a resync, and a cursor taken
// after the restart is served.
func TestRestartIsANewIncarnation(t *testing.T) {
	for _, aof := range []bool{false, true} {
		t.Run(map[bool]string{false: "data lost", true: "aof"}[aof], func(t *testing.T) {
			var extra []string
			if aof {
				extra = []string{"--appendonly", "yes", "--appendfsync", "always"}
			}
			srv := redistest.Start(t, extra...)
			c := redis.NewClient(&redis.Options{Addr: srv.Addr, MaxRetries: 1, DialTimeout: 200 * time.Millisecond})
			t.Cleanup(func() { c.Close() })
			e := newEnv(t, c, 1)
			dev := devicesIn(t, 1, 0, 1, "inc")[0]
			e.apply(0, batch("gw", 1, write(dev, "s", gateway.Connect, 0)))
			before, err := e.store.SnapshotShard(e.ctx, 0, "", 0)
			if err != nil {
				t.Fatal(err)
			}
			if evs, err := e.store.ReadEvents(e.ctx, 0, gateway.Position{Incarnation: before.At.Incarnation, ID: "0"}, 10, 0); err != nil || len(evs) != 1 {
				t.Fatalf("ReadEvents before the restart: %d events, %v", len(evs), err)
			}

			srv.Restart()
			var re *gateway.ResyncError
			deadline := time.Now().Add(5 * time.Second)
			for {
				_, err = e.store.ReadEvents(e.ctx, 0, before.At, 10, 0)
				if !errors.Is(err, gateway.ErrUnavailable) || time.Now().After(deadline) {
					break
				}
				time.Sleep(20 * time.Millisecond)
			}
			if !errors.As(err, &re) || re.Reason != gateway.ResyncIncarnation {
				t.Fatalf("ReadEvents after a restart from a position before it = %v, want a resync (incarnation)", err)
			}
			after, err := e.store.SnapshotShard(e.ctx, 0, "", 10)
			if err != nil {
				t.Fatal(err)
			}
			if after.At.Incarnation == before.At.Incarnation {
				t.Fatalf("incarnation %s unchanged by the restart", after.At.Incarnation)
			}
			if kept := len(after.Devices) == 1; kept != aof {
				t.Errorf("after the restart the snapshot holds %d devices (aof %v)", len(after.Devices), aof)
			}
			if _, err := e.store.ReadEvents(e.ctx, 0, after.At, 10, 0); err != nil {
				t.Errorf("ReadEvents from the new incarnation's position: %v", err)
			}
		})
	}
}

// TestWaitEventsCap: a store serving 2 waits at once (WatchWaits) fails
// a third at once with gateway.ErrBusy (one of block 0 too: the watch
// API asks so before a stream starts), and serves one again when the
// waits ended, which they do at the end of their context.
func TestWaitEventsCap(t *testing.T) {
	forBackends(t, func(t *testing.T, c redis.UniversalClient) {
		s, err := Open(t.Context(), c, Options{Prefix: uniquePrefix(), Shards: 4, WatchWaits: 2})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		cur := make([]gateway.Position, 4)
		for i := range cur {
			p, err := s.SnapshotShard(t.Context(), i, "", 0)
			if err != nil {
				t.Fatal(err)
			}
			cur[i] = p.At
		}
		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		ended := make(chan error, 2)
		for range 2 {
			go func() {
				_, err := s.WaitEvents(ctx, cur, time.Minute)
				ended <- err
			}()
		}
		// the third, once both waits hold their slots: ErrBusy
		for deadline := time.Now().Add(5 * time.Second); len(s.reader().waits) < 2; time.Sleep(5 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("%d waits in progress after 5s, want 2", len(s.reader().waits))
			}
		}
		begin := time.Now()
		if _, err := s.WaitEvents(t.Context(), cur, time.Minute); !errors.Is(err, gateway.ErrBusy) || time.Since(begin) > time.Second {
			t.Errorf("a third wait beside two = %v after %v, want ErrBusy at once", err, time.Since(begin))
		}
		if _, err := s.WaitEvents(t.Context(), cur, 0); !errors.Is(err, gateway.ErrBusy) {
			t.Errorf("a wait of block 0 beside two = %v, want ErrBusy", err)
		}
		cancel()
		for range 2 {
			select {
			case err := <-ended:
				if err != nil {
					t.Errorf("wait ended by its context: %v, want none", err)
				}
			case <-time.After(3 * time.Second):
				t.Fatal("a wait still running 3s after its context ended")
			}
		}
		if _, err := s.WaitEvents(t.Context(), cur, 0); err != nil {
			t.Errorf("a wait after the others ended: %v", err)
		}
	})
}

// TestReadEventsEndsWithContext: a ReadEvents waiting on the server
// (its XREAD BLOCK counted in blocked_clients) returns, empty and without
// error, soon after its context ends, not at the end of its block.
func TestReadEventsEndsWithContext(t *testing.T) {
	forBackends(t, func(t *testing.T, c redis.UniversalClient) {
		s, err := Open(t.Context(), c, Options{Prefix: uniquePrefix(), Shards: 4})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		p, err := s.SnapshotShard(t.Context(), 2, "", 0)
		if err != nil {
			t.Fatal(err)
		}
		before := blockedClients(t, c)
		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		type read struct {
			evs []gateway.Event
			err error
		}
		done := make(chan read, 1)
		go func() {
			evs, err := s.ReadEvents(ctx, 2, p.At, 10, time.Minute)
			done <- read{evs, err}
		}()
		for deadline := time.Now().Add(5 * time.Second); blockedClients(t, c) <= before; time.Sleep(5 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatal("no XREAD blocked on the server after 5s")
			}
		}
		cancel()
		select {
		case r := <-done:
			if r.err != nil || len(r.evs) != 0 {
				t.Errorf("ReadEvents ended by its context = %v, %v; want nothing, no error", r.evs, r.err)
			}
		case <-time.After(3 * time.Second):
			t.Fatal("ReadEvents still waiting 3s after its context ended")
		}
		for deadline := time.Now().Add(3 * time.Second); blockedClients(t, c) > before; time.Sleep(5 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatal("the XREAD is still blocked on the server 3s after its read returned")
			}
		}
	})
}

// blockedClients sums INFO's blocked_clients over the masters of c.
func blockedClients(t *testing.T, c redis.UniversalClient) int {
	t.Helper()
	var mu sync.Mutex
	n := 0
	count := func(ctx context.Context, node *redis.Client) error {
		info, err := node.Info(ctx, "clients").Result()
		if err != nil {
			return err
		}
		for line := range strings.Lines(info) {
			if v, ok := strings.CutPrefix(strings.TrimSpace(line), "blocked_clients:"); ok {
				b, err := strconv.Atoi(v)
				if err != nil {
					return err
				}
				mu.Lock()
				n += b
				mu.Unlock()
			}
		}
		return nil
	}
	var err error
	switch c := c.(type) {
	case *redis.ClusterClient:
		err = c.ForEachMaster(t.Context(), count)
	case *redis.Client:
		err = count(t.Context(), c)
	default:
		t.Fatalf("client %T", c)
	}
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// A shard's hash starts as a listpack (HSCAN returns it whole, in
// insertion order) and becomes a hash table when a record outgrows a
// listpack value: a snapshot paging through the listpack when that
// happens must still return every device (view.lua, LISTPACK).
func TestSnapshotAcrossHashConversion(t *testing.T) {
	forBackends(t, func(t *testing.T, c redis.UniversalClient) {
		e := newEnv(t, c, 1)
		devs := []gateway.DeviceID{"conv-a", "conv-b", "conv-c", "conv-d"}
		for _, d := range devs {
			e.apply(0, batch("gw", 1, write(d, "s", gateway.Connect, 0)))
		}
		if enc := c.ObjectEncoding(e.ctx, e.store.keys[0].data[1]).Val(); enc != "listpack" {
			t.Fatalf("shard hash is %s, want a listpack to start with", enc)
		}
		seen := map[gateway.DeviceID]bool{}
		p, err := e.store.SnapshotShard(e.ctx, 0, "", 1)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range p.Devices {
			seen[d.Device] = true
		}
		// one device's record grows past a listpack value: 12 sessions
		b := batch("gw", 1)
		for i := range 12 {
			b.Writes = append(b.Writes, write("conv-a", gateway.SessionID(fmt.Sprintf("a-long-session-name-%d", i)), gateway.Connect, 0))
		}
		e.apply(0, b)
		if enc := c.ObjectEncoding(e.ctx, e.store.keys[0].data[1]).Val(); enc != "hashtable" {
			t.Fatalf("shard hash is %s, want a hash table after the big record", enc)
		}
		for next := p.Next; next != ""; {
			p, err := e.store.SnapshotShard(e.ctx, 0, next, 1)
			if err != nil {
				t.Fatal(err)
			}
			for _, d := range p.Devices {
				seen[d.Device] = true
			}
			next = p.Next
		}
		for _, d := range devs {
			if !seen[d] {
				t.Errorf("snapshot missed %s (seen %v)", d, seen)
			}
		}
	})
}
