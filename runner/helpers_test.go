package runner

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/fleetgate/fleetgate/gateway"
	"github.com/fleetgate/fleetgate/gateway/clocktest"
	"github.com/fleetgate/fleetgate/store/embedded"
)

// t0 is where every manual test clock starts (a whole millisecond, so
// store times compare exactly).
var t0 = time.UnixMilli(1_893_456_000_000).UTC()

// waitLimit bounds every wait for a condition.
const waitLimit = 15 * time.Second

// waitFor polls cond until it holds, failing the test after waitLimit.
func waitFor(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(waitLimit)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", waitLimit, what)
		}
		time.Sleep(time.Millisecond)
	}
}

// openBolt opens a bbolt file in the test's temporary directory.
func openBolt(t testing.TB) *bolt.DB {
	t.Helper()
	db, err := bolt.Open(filepath.Join(t.TempDir(), "state.db"), 0o600, &bolt.Options{Timeout: time.Second})
	if err != nil {
		t.Fatalf("open bolt: %v", err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}

// openEmbedded opens an embedded store on db whose clock is clk.
func openEmbedded(t testing.TB, db *bolt.DB, shards int, clk *clocktest.Clock) *embedded.Store {
	t.Helper()
	s, err := embedded.Open(db, embedded.Options{Shards: shards, Now: clk.Now})
	if err != nil {
		t.Fatalf("open embedded store: %v", err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// deviceIDs returns n device IDs with prefix.
func deviceIDs(prefix string, n int) []gateway.DeviceID {
	ids := make([]gateway.DeviceID, n)
	for i := range ids {
		ids[i] = gateway.DeviceID(fmt.Sprintf("%s-%05d", prefix, i))
	}
	return ids
}

// connect writes a connect for every device (one session each, observed
// now) in one batch per shard, at most 500 writes per batch.
func connect(t testing.TB, s gateway.Store, ids []gateway.DeviceID, lease time.Duration) {
	t.Helper()
	byShard := make(map[int][]gateway.Write)
	for _, id := range ids {
		shard := gateway.ShardOf(id, s.Shards())
		byShard[shard] = append(byShard[shard], gateway.Write{
			Device: id, Session: gateway.SessionID("test/" + string(id)), Kind: gateway.Connect,
		})
	}
	for shard, ws := range byShard {
		for len(ws) > 0 {
			n := min(len(ws), 500)
			b := gateway.Batch{Gateway: "gw-test", Epoch: 1, Lease: lease, Writes: ws[:n]}
			if _, err := s.Apply(context.Background(), shard, b); err != nil {
				t.Fatalf("apply connects to shard %d: %v", shard, err)
			}
			ws = ws[n:]
		}
	}
}

// events collects the offline events a runner hands to OnEvent.
type events struct {
	mu  sync.Mutex
	all []gateway.Event
}

func (e *events) add(ev gateway.Event) {
	e.mu.Lock()
	e.all = append(e.all, ev)
	e.mu.Unlock()
}

func (e *events) len() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return len(e.all)
}

func (e *events) list() []gateway.Event {
	e.mu.Lock()
	defer e.mu.Unlock()
	return slices.Clone(e.all)
}

func (e *events) byDevice() map[gateway.DeviceID][]gateway.Event {
	e.mu.Lock()
	defer e.mu.Unlock()
	m := make(map[gateway.DeviceID][]gateway.Event)
	for _, ev := range e.all {
		m[ev.Device] = append(m[ev.Device], ev)
	}
	return m
}

// start runs r until the test ends (or the returned stop is called) and
// checks that Run returns nil.
func start(t testing.TB, r *Runner) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			select {
			case err := <-done:
				if err != nil {
					t.Errorf("Run: %v", err)
				}
			case <-time.After(waitLimit):
				t.Errorf("Run did not return within %v of cancel", waitLimit)
			}
		})
	}
	t.Cleanup(stop)
	return stop
}

// asleep waits until n runners are asleep on clk. Each runner holds at
// most one timer, which it creates at the end of a cycle, and the clock's
// Advance removes the timers it fires at once; so n timers means that
// every runner woken by the last Advance has finished its cycle.
func asleep(t testing.TB, clk *clocktest.Clock, n int) {
	t.Helper()
	waitFor(t, fmt.Sprintf("%d runner(s) asleep on the clock", n), func() bool { return clk.Timers() == n })
}

// step advances clk by d and waits until the n runners are asleep again.
func step(t testing.TB, clk *clocktest.Clock, d time.Duration, n int) {
	t.Helper()
	clk.Advance(d)
	asleep(t, clk, n)
}
