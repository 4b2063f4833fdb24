package runner

import (
	"bufio"
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/fleetgate/fleetgate/gateway"
	"github.com/fleetgate/fleetgate/internal/redistest"
	"github.com/fleetgate/fleetgate/store/redisstore"
)

// The fault test re-executes this test binary as a runner process; these
// environment variables make TestMain run the child instead of the tests.
const (
	envChildAddr  = "FLEETGATE_RUNNER_CHILD_ADDR"
	envChildOwner = "FLEETGATE_RUNNER_CHILD_OWNER"
)

// The fault test's runner settings, shared by the children and the final
// runner: short leases so that a killed runner's shards come free fast,
// and a small batch so that reaping takes many calls to be killed between.
const (
	faultPrefix   = "fg-fault"
	faultShards   = 16
	faultLockTTL  = 300 * time.Millisecond
	faultInterval = 100 * time.Millisecond
	faultBatch    = 10
	faultDevices  = 2000 // in faultKills waves
	faultKills    = 10
)

func TestMain(m *testing.M) {
	if addr := os.Getenv(envChildAddr); addr != "" {
		os.Exit(runChild(addr, os.Getenv(envChildOwner)))
	}
	os.Exit(m.Run())
}

// runChild runs a runner on the Redis store at addr with the system
// clock until it is killed (or interrupted). It writes "ready" to stdout
// once the store is open, then one line per offline event it reaps.
func runChild(addr, owner string) int {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	c := redis.NewClient(&redis.Options{Addr: addr})
	defer c.Close()
	s, err := redisstore.Open(ctx, c, redisstore.Options{Prefix: faultPrefix, Shards: faultShards, Logger: log})
	if err != nil {
		log.Error("child: open store", "err", err)
		return 1
	}
	defer s.Close()
	fmt.Println("ready")
	r := New(s, Options{
		Owner: owner, Interval: faultInterval, Batch: faultBatch, LockTTL: faultLockTTL, Logger: log,
		OnEvent: func(ev gateway.Event) { fmt.Println("offline", ev.Device) },
	})
	if err := r.Run(ctx); err != nil {
		log.Error("child: run", "err", err)
		return 1
	}
	return 0
}

// child is a runner process.
type child struct {
	cmd    *exec.Cmd
	ready  chan struct{} // closed when the child has opened the store
	events atomic.Int64  // offline events it reported
	done   chan struct{} // closed when its stdout is closed
	log    string        // file of its stderr
}

// startChild starts a runner process owned by owner.
func startChild(t *testing.T, addr, owner string) *child {
	t.Helper()
	c := &child{ready: make(chan struct{}), done: make(chan struct{}), log: filepath.Join(t.TempDir(), "stderr")}
	stderr, err := os.Create(c.log)
	if err != nil {
		t.Fatalf("runner child stderr: %v", err)
	}
	defer stderr.Close()
	c.cmd = exec.Command(os.Args[0], "-test.run=^$")
	c.cmd.Env = append(os.Environ(), envChildAddr+"="+addr, envChildOwner+"="+owner)
	c.cmd.Stderr = stderr
	c.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	out, err := c.cmd.StdoutPipe()
	if err != nil {
		t.Fatalf("runner child stdout: %v", err)
	}
	if err := c.cmd.Start(); err != nil {
		t.Fatalf("start runner child: %v", err)
	}
	go func() {
		defer close(c.done)
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			if sc.Text() == "ready" {
				close(c.ready)
				continue
			}
			c.events.Add(1)
		}
	}()
	return c
}

// killAt waits until the child is ready, then until the moment chosen by
// rng: a random time, or (every other kill) right after a random number
// of reaped events (at most 3s), so that kills fall between the reap
// calls of a busy runner too. It kills the child with SIGKILL.
func (c *child) killAt(t *testing.T, i int, rng *rand.Rand) {
	t.Helper()
	select {
	case <-c.ready:
	case <-time.After(waitLimit):
		t.Fatalf("child %d not ready after %v", i, waitLimit)
	}
	if i%2 == 0 {
		<-time.After(time.Duration(rng.Int64N(int64(700 * time.Millisecond))))
	} else {
		k := 1 + rng.Int64N(40)
		limit := time.Now().Add(3 * time.Second)
		for c.events.Load() < k && time.Now().Before(limit) {
			time.Sleep(time.Millisecond)
		}
	}
	if err := c.cmd.Process.Kill(); err != nil {
		t.Fatalf("kill child %d: %v", i, err)
	}
	<-c.done
	if err := c.cmd.Wait(); err == nil {
		t.Fatalf("child %d exited cleanly before its kill", i)
	}
}

// A runner killed (SIGKILL) between any two steps loses no offline event:
// the entry it was about to reap is still in the deadline index, and the
// next runner reaps it (invariant 7, docs/design.md §7).
func TestKilledRunnerLosesNoOfflineEvent(t *testing.T) {
	srv := redistest.Start(t)
	client := srv.Client(t)
	ctx := t.Context()
	s, err := redisstore.Open(ctx, client, redisstore.Options{Prefix: faultPrefix, Shards: faultShards, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatalf("open redis store: %v", err)
	}

	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, seed))
	children := make([]*child, faultKills)
	t.Cleanup(func() {
		if t.Failed() {
			for i, c := range children {
				if c == nil {
					continue
				}
				if b, _ := os.ReadFile(c.log); len(b) > 0 {
					t.Logf("child %d stderr:\n%s", i, b)
				}
			}
		}
	})
	// Before each child, a wave of devices with leases from 300ms to
	// 750ms, so that entries fall due while every child runs.
	var ids []gateway.DeviceID
	for i := range children {
		wave := deviceIDs(fmt.Sprintf("w%d", i), faultDevices/faultKills)
		const classes = 10
		for c := range classes {
			var group []gateway.DeviceID
			for j := c; j < len(wave); j += classes {
				group = append(group, wave[j])
			}
			connect(t, s, group, 300*time.Millisecond+time.Duration(c)*50*time.Millisecond)
		}
		ids = append(ids, wave...)
		children[i] = startChild(t, srv.Addr, fmt.Sprintf("child-%d", i))
		children[i].killAt(t, i, rng)
	}
	byChildren := countOffline(t, s)

	// A last runner finishes the work the killed ones left.
	var final events
	r := New(s, Options{Owner: "final", Interval: faultInterval, Batch: faultBatch, LockTTL: faultLockTTL, OnEvent: final.add})
	stop := start(t, r)
	waitFor(t, "an empty deadline index", func() bool { return indexSize(t, client) == 0 })
	stop()
	t.Logf("offline events: %d by %d killed runners, %d by the final one", byChildren, faultKills, final.len())
	if byChildren == 0 {
		t.Errorf("the killed runners reaped nothing: the kills did not hit a working runner")
	}

	// Every device: online (ver: the store time, ms), then exactly one
	// offline, one ver more.
	got := make(map[gateway.DeviceID][]gateway.Event)
	for shard := range faultShards {
		for _, ev := range readLog(t, s, shard) {
			got[ev.Device] = append(got[ev.Device], ev)
		}
	}
	for _, id := range ids {
		evs := got[id]
		if len(evs) != 2 || evs[0].State != gateway.Online || evs[0].Ver != uint64(evs[0].At.UnixMilli()) ||
			evs[1].State != gateway.Offline || evs[1].Ver != evs[0].Ver+1 || evs[1].Reason != gateway.ReasonExpired {
			t.Fatalf("device %s: events %+v, want online then one offline (expired), one ver more", id, evs)
		}
	}
	if len(got) != len(ids) {
		t.Fatalf("events for %d devices, want %d", len(got), len(ids))
	}
}

// indexSize is the number of entries left in every shard's deadline index.
func indexSize(t *testing.T, c *redis.Client) int64 {
	t.Helper()
	var n int64
	for shard := range faultShards {
		k, err := c.ZCard(t.Context(), fmt.Sprintf("{%s:%d}:exp", faultPrefix, shard)).Result()
		if err != nil {
			t.Fatalf("zcard shard %d: %v", shard, err)
		}
		n += k
	}
	return n
}

// countOffline counts the offline events in every shard's log.
func countOffline(t *testing.T, s gateway.Store) int {
	t.Helper()
	n := 0
	for shard := range s.Shards() {
		for _, ev := range readLog(t, s, shard) {
			if ev.State == gateway.Offline {
				n++
			}
		}
	}
	return n
}

// readLog reads a shard's whole event log.
func readLog(t *testing.T, s gateway.Store, shard int) []gateway.Event {
	t.Helper()
	const page, maxPages = 500, 1000
	var all []gateway.Event
	after := "0"
	for range maxPages {
		evs, err := s.Events(t.Context(), shard, after, page)
		if err != nil {
			t.Fatalf("events of shard %d after %s: %v", shard, after, err)
		}
		if len(evs) == 0 {
			return all
		}
		all = append(all, evs...)
		after = evs[len(evs)-1].ID
	}
	t.Fatalf("shard %d: more than %d pages of events", shard, maxPages)
	return nil
}

// A store outage is logged and retried every cycle: once Redis answers
// again, the same runner reaps what falls due, without a restart.
func TestRetriesThroughAStoreOutage(t *testing.T) {
	srv := redistest.Start(t)
	// No client retries: each call fails at once while Redis is down
	// (by default a call retries and redials for about 0.5s).
	client := redis.NewClient(&redis.Options{Addr: srv.Addr, MaxRetries: -1, DialerRetries: 1})
	t.Cleanup(func() { client.Close() })
	s, err := redisstore.Open(t.Context(), client, redisstore.Options{Prefix: "fg-outage", Shards: faultShards, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatalf("open redis store: %v", err)
	}
	var got events
	r := New(s, Options{Owner: "runner", Interval: faultInterval, Batch: faultBatch, LockTTL: faultLockTTL, OnEvent: got.add})
	start(t, r)

	before := deviceIDs("before", 50)
	connect(t, s, before, 200*time.Millisecond)
	waitFor(t, "devices reaped before the outage", func() bool { return got.len() == len(before) })
	srv.Kill()
	// Renewals fail, so the runner's leases run out: it holds nothing.
	waitFor(t, "the runner's leases to run out", func() bool { return len(r.Status().Shards) == 0 })
	srv.Restart() // an empty server: persistence is off
	// go-redis keeps answering with the last dial error until its pool
	// has dialled again.
	waitFor(t, "the client to reconnect", func() bool { return client.Ping(t.Context()).Err() == nil })
	after := deviceIDs("after", 50)
	connect(t, s, after, 200*time.Millisecond)
	waitFor(t, "devices reaped after the outage", func() bool { return got.len() == len(before)+len(after) })
	checkOnce(t, append(before, after...), &got)
}
