package redisstore

import (
	"context"
	"fmt"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/fleetgate/fleetgate/gateway"
	"github.com/fleetgate/fleetgate/gateway/clocktest"
	"github.com/fleetgate/fleetgate/internal/redistest"
)

// The test binary shares one standalone server and one 3-master cluster,
// started on first use and stopped by TestMain; every test works under
// its own key prefix. Tests that restart a server start their own.
var shared struct {
	tb            *binaryTB
	serverOnce    sync.Once
	server        *redistest.Server
	clusterOnce   sync.Once
	cluster       *redistest.Cluster
	prefixCounter atomic.Int64
}

func TestMain(m *testing.M) {
	shared.tb = &binaryTB{}
	code := m.Run()
	shared.tb.cleanup()
	os.Exit(code)
}

// binaryTB is the testing.TB the shared servers are started with: it
// lives as long as the test binary. redistest calls only the methods
// defined here; the embedded nil TB is there to satisfy the interface.
type binaryTB struct {
	testing.TB
	mu       sync.Mutex
	cleanups []func()
	dirs     []string
}

func (b *binaryTB) Helper() {}

func (b *binaryTB) Fatalf(format string, args ...any) { panic(fmt.Sprintf(format, args...)) }

func (b *binaryTB) Fatal(args ...any) { panic(fmt.Sprint(args...)) }

func (b *binaryTB) Logf(format string, args ...any) { fmt.Fprintf(os.Stderr, format+"\n", args...) }

func (b *binaryTB) Cleanup(f func()) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.cleanups = append(b.cleanups, f)
}

func (b *binaryTB) TempDir() string {
	d, err := os.MkdirTemp("", "redisstore-test-")
	if err != nil {
		panic(err)
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	b.dirs = append(b.dirs, d)
	return d
}

func (b *binaryTB) cleanup() {
	b.mu.Lock()
	defer b.mu.Unlock()
	for i := len(b.cleanups) - 1; i >= 0; i-- {
		b.cleanups[i]()
	}
	for _, d := range b.dirs {
		os.RemoveAll(d)
	}
}

func sharedServer() *redistest.Server {
	shared.serverOnce.Do(func() { shared.server = redistest.Start(shared.tb) })
	return shared.server
}

func sharedCluster() *redistest.Cluster {
	shared.clusterOnce.Do(func() { shared.cluster = redistest.StartCluster(shared.tb, 3) })
	return shared.cluster
}

// clusterStore starts a Cluster of 3 masters with a replica each and
// dials a store on it with o (closed at cleanup); master[sh] is the index
// in cl.Nodes of the master of shard sh.
func clusterStore(t *testing.T, o Options) (cl *redistest.Cluster, s *Store, master []int) {
	t.Helper()
	cl = redistest.StartClusterWithReplicas(t, 3)
	s, err := Dial(t.Context(), DialConfig{Addrs: cl.Addrs(), Options: o})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	master = make([]int, o.Shards)
	for sh := range master {
		master[sh] = cl.MasterOfKey(t, s.keys[sh].data[0])
	}
	return cl, s, master
}

// backend is a Redis deployment a test runs against.
type backend struct {
	name   string
	client func(t *testing.T) redis.UniversalClient
}

var backends = []backend{
	{"standalone", func(t *testing.T) redis.UniversalClient { return sharedServer().Client(t) }},
	{"cluster", func(t *testing.T) redis.UniversalClient { return sharedCluster().Client(t) }},
}

// forBackends runs fn as a subtest per backend.
func forBackends(t *testing.T, fn func(t *testing.T, c redis.UniversalClient)) {
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) { fn(t, b.client(t)) })
	}
}

// uniquePrefix returns a key prefix no other test of this binary uses.
func uniquePrefix() string {
	return fmt.Sprintf("t%d", shared.prefixCounter.Add(1))
}

// startMs is where test clocks start (2030-01-01T00:00:00Z).
const startMs = 1_893_456_000_000

// env is a store on a manual clock.
type env struct {
	t     *testing.T
	ctx   context.Context
	c     redis.UniversalClient
	clock *clocktest.Clock
	store *Store
}

func newEnv(t *testing.T, c redis.UniversalClient, shards int) *env {
	t.Helper()
	clock := clocktest.New(time.UnixMilli(startMs))
	s, err := Open(t.Context(), c, Options{Prefix: uniquePrefix(), Shards: shards, Now: clock.Now})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return &env{t: t, ctx: t.Context(), c: c, clock: clock, store: s}
}

func (e *env) apply(shard int, b gateway.Batch) []gateway.Event {
	e.t.Helper()
	res, err := e.store.Apply(e.ctx, shard, b)
	if err != nil {
		e.t.Fatalf("apply: %v", err)
	}
	return res.Events
}

func (e *env) reap(shard, limit int) gateway.ReapResult {
	e.t.Helper()
	res, err := e.store.Reap(e.ctx, shard, limit)
	if err != nil {
		e.t.Fatalf("reap: %v", err)
	}
	return res
}

func (e *env) device(id gateway.DeviceID) gateway.DeviceInfo {
	e.t.Helper()
	d, err := e.store.Device(e.ctx, id)
	if err != nil {
		e.t.Fatalf("device %s: %v", id, err)
	}
	return d
}

// events reads the devices' events of the whole log of shard (not the
// gateway events: allEvents).
func (e *env) events(shard int) []gateway.Event {
	e.t.Helper()
	return slices.DeleteFunc(e.allEvents(shard), gateway.Event.IsGateway)
}

// allEvents reads the whole log of shard.
func (e *env) allEvents(shard int) []gateway.Event {
	e.t.Helper()
	var all []gateway.Event
	after := ""
	for range 10000 {
		page, err := e.store.Events(e.ctx, shard, after, 500)
		if err != nil {
			e.t.Fatalf("events: %v", err)
		}
		all = append(all, page...)
		if len(page) < 500 {
			return all
		}
		after = page[len(page)-1].ID
	}
	e.t.Fatalf("event log of shard %d too long", shard)
	return nil
}

// devicesIn returns n device IDs "<prefix>-<i>" of shard.
func devicesIn(t testing.TB, shards, shard, n int, prefix string) []gateway.DeviceID {
	t.Helper()
	var ids []gateway.DeviceID
	for i := 0; i < 100*n*shards && len(ids) < n; i++ {
		id := gateway.DeviceID(fmt.Sprintf("%s-%d", prefix, i))
		if gateway.ShardOf(id, shards) == shard {
			ids = append(ids, id)
		}
	}
	if len(ids) < n {
		t.Fatalf("found only %d devices of shard %d/%d", len(ids), shard, shards)
	}
	return ids
}

func write(d gateway.DeviceID, s gateway.SessionID, k gateway.Kind, age time.Duration) gateway.Write {
	return gateway.Write{Device: d, Session: s, Kind: k, Age: age}
}

func batch(gw string, epoch uint64, ws ...gateway.Write) gateway.Batch {
	return gateway.Batch{Gateway: gw, Epoch: epoch, Lease: 90 * time.Second, Writes: ws}
}

// describe prints events compactly for failure messages.
// ver is the ver of the n-th transition of a device first written at
// ms(at): its first is the store time in ms (lua/record.lua, nextver).
func ver(at time.Duration, n uint64) uint64 { return uint64(ms(at).UnixMilli()) + n - 1 }

func describe(evs []gateway.Event) string {
	s := ""
	for _, e := range evs {
		s += fmt.Sprintf("\n  %s %s v%d %s at+%dms gw=%s sess=%s", e.Device, e.State, e.Ver, e.Reason,
			e.At.UnixMilli()-startMs, e.Gateway, e.Session)
		if !e.Deadline.IsZero() {
			s += fmt.Sprintf(" deadline+%dms", e.Deadline.UnixMilli()-startMs)
		}
	}
	return s
}

// checkAlternation verifies that the events of each device in evs (in log
// order) alternate online/offline starting with online, ver +1 each, and
// returns each device's last event.
func checkAlternation(t *testing.T, evs []gateway.Event) map[gateway.DeviceID]gateway.Event {
	t.Helper()
	last := map[gateway.DeviceID]gateway.Event{}
	for _, e := range evs {
		p, seen := last[e.Device]
		wantState, wantVer := gateway.Online, uint64(e.At.UnixMilli())
		if seen {
			wantVer = p.Ver + 1
			// a new incarnation (a slot moved to another node) may jump
			// to the store time (lua/record.lua, nextver)
			if at := uint64(e.At.UnixMilli()); e.Ver == at && at > wantVer {
				wantVer = at
			}
			if p.State == gateway.Online {
				wantState = gateway.Offline
			}
		}
		if e.State != wantState || e.Ver != wantVer {
			t.Fatalf("device %s: event %s is %s v%d, want %s v%d", e.Device, e.ID, e.State, e.Ver, wantState, wantVer)
		}
		last[e.Device] = e
	}
	return last
}
