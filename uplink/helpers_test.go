package uplink

import (
	"context"
	"fmt"
	"log/slog"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	bolt "go.etcd.io/bbolt"

	"github.com/fleetgate/fleetgate/gateway"
	"github.com/fleetgate/fleetgate/gateway/clocktest"
	"github.com/fleetgate/fleetgate/internal/redistest"
	"github.com/fleetgate/fleetgate/internal/statefile"
	"github.com/fleetgate/fleetgate/store/embedded"
	"github.com/fleetgate/fleetgate/store/redisstore"
)

const testShards = 4

// applyCall is one Store.Apply seen by countingStore.
type applyCall struct {
	shard  int
	writes int
	replay bool
	err    error
}

// countingStore records the batches applied to a real store, through
// Apply or ApplyShards; the empty batches that announce an epoch are
// counted apart, and so are the ApplyShards calls (round trips).
type countingStore struct {
	gateway.Store
	clock     *clocktest.Clock
	mu        sync.Mutex
	calls     []applyCall
	announces int
	multis    int
	covered   map[int]time.Time // per shard, the last coverage sent
}

var _ gateway.Store = (*countingStore)(nil)

func (c *countingStore) Apply(ctx context.Context, shard int, b gateway.Batch) (gateway.ApplyResult, error) {
	res, err := c.Store.Apply(ctx, shard, b)
	c.record(shard, b, err)
	return res, err
}

func (c *countingStore) ApplyShards(ctx context.Context, batches []gateway.ShardBatch) []gateway.ShardResult {
	out := c.Store.ApplyShards(ctx, batches)
	c.mu.Lock()
	c.multis++
	c.mu.Unlock()
	for i, sb := range batches {
		c.record(sb.Shard, sb.Batch, out[i].Err)
	}
	return out
}

func (c *countingStore) record(shard int, b gateway.Batch, err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if b.Covers && c.clock != nil {
		if c.covered == nil {
			c.covered = map[int]time.Time{}
		}
		c.covered[shard] = c.clock.Now().Add(-b.CoverAge)
	}
	if len(b.Writes) == 0 {
		c.announces++
	} else {
		c.calls = append(c.calls, applyCall{shard, len(b.Writes), b.Replay, err})
	}
}

// RoundTrips is the number of ApplyShards calls.
func (c *countingStore) RoundTrips() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.multis
}

func (c *countingStore) Announces() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.announces
}

// Covered is the coverage the last batch for shard reported (zero when
// none did).
func (c *countingStore) Covered(shard int) time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.covered[shard]
}

func (c *countingStore) Calls() []applyCall {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]applyCall(nil), c.calls...)
}

// env is an uplink under test with its parts.
type env struct {
	t     *testing.T
	clock *clocktest.Clock
	db    *bolt.DB
	ob    *Outbox
	store *countingStore
	u     *Uplink
	reg   *prometheus.Registry
}

func testLogger(t testing.TB) *slog.Logger {
	return slog.New(slog.NewTextHandler(tWriter{t}, &slog.HandlerOptions{Level: slog.LevelInfo}))
}

type tWriter struct{ t testing.TB }

func (w tWriter) Write(p []byte) (int, error) {
	w.t.Log(string(p))
	return len(p), nil
}

// newEnv opens a state file in a temporary directory, its outbox, and an
// uplink to the store that open returns, on a manual clock at t0.
func newEnv(t *testing.T, o Options, ob OutboxOptions, open func(db *bolt.DB, c *clocktest.Clock) gateway.Store) *env {
	t.Helper()
	e := &env{t: t, clock: clocktest.New(t0), reg: prometheus.NewRegistry()}
	db, err := statefile.Open(filepath.Join(t.TempDir(), "state.db"), testLogger(t), Migrations)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	e.db = db
	ob.Logger, ob.Clock, ob.Shards = testLogger(t), e.clock, testShards
	if e.ob, err = OpenOutbox(db, ob); err != nil {
		t.Fatal(err)
	}
	e.store = &countingStore{Store: open(db, e.clock), clock: e.clock}
	if o.Gateway == "" {
		o.Gateway = "gw-test"
	}
	if o.Epoch == 0 {
		o.Epoch = 1
	}
	o.Clock, o.Logger, o.Registerer = e.clock, testLogger(t), e.reg
	e.u = New(e.store, e.ob, o)
	return e
}

func embeddedStore(t *testing.T) func(*bolt.DB, *clocktest.Clock) gateway.Store {
	return func(db *bolt.DB, c *clocktest.Clock) gateway.Store {
		s, err := embedded.Open(db, embedded.Options{Shards: testShards, Now: c.Now, Logger: testLogger(t)})
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
}

// redisClient is a client that gives up on a hung server within the
// caller's context deadline and never retries on its own.
func redisClient(t testing.TB, addr string) *redis.Client {
	c := redis.NewClient(&redis.Options{
		Addr: addr, ContextTimeoutEnabled: true, MaxRetries: -1,
		DialTimeout: 300 * time.Millisecond, ReadTimeout: 2 * time.Second, WriteTimeout: 2 * time.Second,
	})
	t.Cleanup(func() { c.Close() })
	return c
}

// redisStore opens the Redis store on srv with Redis TIME as its clock
// (so that a probe really reaches the server); ages still come from the
// uplink's manual clock.
func redisStore(t *testing.T, srv *redistest.Server) func(*bolt.DB, *clocktest.Clock) gateway.Store {
	return func(*bolt.DB, *clocktest.Clock) gateway.Store {
		s, err := redisstore.Open(context.Background(), redisClient(t, srv.Addr), redisstore.Options{
			Prefix: "up", Shards: testShards, Logger: testLogger(t),
		})
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
}

// redisStoreOnClock is redisStore on the test clock, as the ages are.
func redisStoreOnClock(t *testing.T, srv *redistest.Server) func(*bolt.DB, *clocktest.Clock) gateway.Store {
	return func(_ *bolt.DB, c *clocktest.Clock) gateway.Store {
		s, err := redisstore.Open(t.Context(), redisClient(t, srv.Addr), redisstore.Options{
			Prefix: "up", Shards: testShards, Now: c.Now, Logger: testLogger(t)})
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
}

func newEmbeddedUplink(t *testing.T, o Options) (*Uplink, *env) {
	e := newEnv(t, o, OutboxOptions{}, embeddedStore(t))
	return e.u, e
}

// run starts the uplink's loops until the test ends.
func (e *env) run() {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- e.u.Run(ctx) }()
	e.t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				e.t.Errorf("Run: %v", err)
			}
		case <-time.After(20 * time.Second):
			e.t.Errorf("Run did not return after cancel")
		}
	})
}

// waitFor polls cond until it holds, calling step (if any) between polls,
// and fails the test after limit.
func waitFor(t testing.TB, what string, limit time.Duration, step func(), cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(limit)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", limit, what)
		}
		if step != nil {
			step()
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// devicesIn returns n device IDs that hash to shard.
func devicesIn(shard, n int, prefix string) []gateway.DeviceID {
	var out []gateway.DeviceID
	for i := 0; len(out) < n && i < 1000*n+1000; i++ {
		d := gateway.DeviceID(fmt.Sprintf("%s-%d", prefix, i))
		if gateway.ShardOf(d, testShards) == shard {
			out = append(out, d)
		}
	}
	return out
}

func evidence(d gateway.DeviceID, k gateway.Kind, t time.Time) gateway.Evidence {
	return gateway.Evidence{Device: d, Session: "coap/default", Kind: k, ObservedAt: t, Protocol: "coap"}
}

func mustEnqueue(t testing.TB, u *Uplink, evs ...gateway.Evidence) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, ev := range evs {
		if err := u.Enqueue(ctx, ev); err != nil {
			t.Fatalf("enqueue %s: %v", ev.Device, err)
		}
	}
}

// allEvents reads every event of every shard of s.
func allEvents(t testing.TB, s gateway.Store) []gateway.Event {
	t.Helper()
	var out []gateway.Event
	for sh := range s.Shards() {
		after := ""
		for range 1000 {
			evs, err := s.Events(context.Background(), sh, after, 1000)
			if err != nil {
				t.Fatalf("events of shard %d: %v", sh, err)
			}
			if len(evs) == 0 {
				break
			}
			out = append(out, evs...)
			after = evs[len(evs)-1].ID
		}
	}
	return out
}

// metricValue gathers reg and returns the value of the series name with
// the label pair (labelName == "" for an unlabelled series).
func metricValue(t testing.TB, reg *prometheus.Registry, name, labelName, labelValue string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			match := labelName == ""
			for _, lp := range m.GetLabel() {
				if lp.GetName() == labelName && lp.GetValue() == labelValue {
					match = true
				}
			}
			if !match {
				continue
			}
			switch {
			case m.GetCounter() != nil:
				return m.GetCounter().GetValue()
			case m.GetGauge() != nil:
				return m.GetGauge().GetValue()
			}
		}
	}
	t.Fatalf("no series %s{%s=%q}", name, labelName, labelValue)
	return 0
}

// everyShard is the want of Outbox.oldestRecords for every one of shards.
func everyShard(shards int) []bool {
	want := make([]bool, shards)
	for i := range want {
		want[i] = true
	}
	return want
}

// testBoot is the boot the tests' records are written in.
var testBoot = clocktest.DefaultBoot

// wallBoot returns a test clock at start whose boot began at the Unix
// epoch: times since its boot, as the outbox keeps them, equal its
// wall-clock times, so that tests can compare stored entries with them
// (entries must be observed before start).
func wallBoot(start time.Time) *clocktest.Clock {
	c := clocktest.New(start)
	c.Reboot(testBoot, start.Sub(time.Unix(0, 0)))
	return c
}
