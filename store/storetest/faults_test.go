package storetest

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/fleetgate/fleetgate/gateway"
	"github.com/fleetgate/fleetgate/store/embedded"
)

// TestPropertiesCatchFaults runs the property check against the embedded
// store with one bug injected at a time and requires a failure for each;
// the same store without a fault must pass.
func TestPropertiesCatchFaults(t *testing.T) {
	t.Chdir(t.TempDir()) // rapid writes its fail files under ./testdata
	// Minimising a caught failure is not what this test is about; rapid
	// reads its limit from its flag only.
	shrink := flag.Lookup("rapid.shrinktime")
	old := shrink.Value.String()
	if err := shrink.Value.Set("100ms"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { shrink.Value.Set(old) })
	faults := []struct {
		name string
		wrap func(gateway.Store) gateway.Store
	}{
		{"Apply returns one event too few", func(s gateway.Store) gateway.Store {
			return &faulty{Store: s, apply: func(r gateway.ApplyResult) gateway.ApplyResult {
				if n := len(r.Events); n > 0 {
					r.Events = r.Events[:n-1]
				}
				return r
			}}
		}},
		{"old epochs accepted", func(s gateway.Store) gateway.Store {
			newest := map[string]uint64{}
			return &faulty{Store: s, batch: func(b gateway.Batch) gateway.Batch {
				newest[b.Gateway] = max(newest[b.Gateway], b.Epoch)
				b.Epoch = newest[b.Gateway]
				return b
			}}
		}},
		{"lapsed evidence resurrected", func(s gateway.Store) gateway.Store {
			return &faulty{Store: s, write: func(b gateway.Batch, w gateway.Write) gateway.Write {
				if w.Kind != gateway.Leave && w.Age >= b.Lease {
					w.Age = b.Lease - time.Millisecond
				}
				return w
			}}
		}},
		{"leave ignores newer evidence", func(s gateway.Store) gateway.Store {
			return &faulty{Store: s, write: func(_ gateway.Batch, w gateway.Write) gateway.Write {
				if w.Kind == gateway.Leave {
					w.Age = 0
				}
				return w
			}}
		}},
		{"leave ends every session of the device", func(s gateway.Store) gateway.Store {
			return &faulty{Store: s, batch: func(b gateway.Batch) gateway.Batch {
				var ws []gateway.Write
				for _, w := range b.Writes {
					ws = append(ws, w)
					if w.Kind == gateway.Leave {
						for _, other := range propSessions {
							ws = append(ws, gateway.Write{Device: w.Device, Session: other, Kind: gateway.Leave})
						}
					}
				}
				b.Writes = ws
				return b
			}}
		}},
		{"replay flag lost", func(s gateway.Store) gateway.Store {
			return &faulty{Store: s, batch: func(b gateway.Batch) gateway.Batch {
				b.Replay = false
				return b
			}}
		}},
		{"Reap exceeds its limit", func(s gateway.Store) gateway.Store {
			return &faulty{Store: s, reapLimit: func(n int) int { return n + 1 }}
		}},
		{"Reap never reports More", func(s gateway.Store) gateway.Store {
			return &faulty{Store: s, reap: func(r gateway.ReapResult) gateway.ReapResult {
				r.More = false
				return r
			}}
		}},
	}
	t.Run("no fault", func(t *testing.T) {
		if rec := runFaulty(t, func(s gateway.Store) gateway.Store { return s }); rec.failed {
			t.Errorf("the properties fail the embedded store without a fault:\n%s", rec.report())
		}
	})
	for _, f := range faults {
		t.Run(f.name, func(t *testing.T) {
			rec := runFaulty(t, f.wrap)
			if !rec.failed {
				t.Errorf("the properties did not catch the fault %q", f.name)
				return
			}
			t.Logf("caught: %s", rec.first())
		})
	}
}

// runFaulty runs the property check on embedded stores wrapped by wrap
// and returns what it reported.
func runFaulty(t *testing.T, wrap func(gateway.Store) gateway.Store) *recorder {
	rec := &recorder{name: t.Name()}
	open := func(t *testing.T, shards int, now func() time.Time) gateway.Store {
		db, err := bolt.Open(filepath.Join(t.TempDir(), "fleetgate.db"), 0o600, &bolt.Options{Timeout: time.Second, NoSync: true})
		if err != nil {
			t.Fatalf("open bbolt: %v", err)
		}
		t.Cleanup(func() { db.Close() })
		s, err := embedded.Open(db, embedded.Options{Shards: shards, Now: now})
		if err != nil {
			t.Fatalf("embedded.Open: %v", err)
		}
		t.Cleanup(func() { s.Close() })
		return wrap(s)
	}
	func() {
		defer func() {
			if p := recover(); p != nil && p != errFailNow {
				panic(p)
			}
		}()
		checkProperties(rec, t, open)
	}()
	return rec
}

// errFailNow is what recorder.FailNow panics with.
var errFailNow = errors.New("recorder: FailNow")

// recorder is a rapid.TB that records failures instead of failing the
// test; FailNow unwinds with errFailNow.
type recorder struct {
	name   string
	mu     sync.Mutex
	failed bool
	msgs   []string
}

func (r *recorder) Helper()                   {}
func (r *recorder) Name() string              { return r.name }
func (r *recorder) Logf(string, ...any)       {}
func (r *recorder) Log(...any)                {}
func (r *recorder) Skipf(f string, a ...any)  { panic("skip: " + fmt.Sprintf(f, a...)) }
func (r *recorder) Skip(a ...any)             { panic("skip: " + fmt.Sprint(a...)) }
func (r *recorder) SkipNow()                  { panic("skip") }
func (r *recorder) Error(a ...any)            { r.record(fmt.Sprint(a...)) }
func (r *recorder) Errorf(f string, a ...any) { r.record(fmt.Sprintf(f, a...)) }
func (r *recorder) Fatal(a ...any)            { r.record(fmt.Sprint(a...)); r.FailNow() }
func (r *recorder) Fatalf(f string, a ...any) { r.record(fmt.Sprintf(f, a...)); r.FailNow() }
func (r *recorder) FailNow()                  { r.Fail(); panic(errFailNow) }

func (r *recorder) Fail() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.failed = true
}

func (r *recorder) Failed() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.failed
}

func (r *recorder) record(msg string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.failed = true
	r.msgs = append(r.msgs, msg)
}

func (r *recorder) report() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return strings.Join(r.msgs, "\n")
}

// first is the first line of the first failure.
func (r *recorder) first() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.msgs) == 0 {
		return ""
	}
	line, _, _ := strings.Cut(r.msgs[0], "\n")
	return line
}

// faulty is a store with a bug injected where a hook is set.
var _ gateway.Store = (*faulty)(nil)

type faulty struct {
	gateway.Store
	batch     func(gateway.Batch) gateway.Batch
	write     func(gateway.Batch, gateway.Write) gateway.Write
	apply     func(gateway.ApplyResult) gateway.ApplyResult
	reapLimit func(int) int
	reap      func(gateway.ReapResult) gateway.ReapResult
}

func (f *faulty) Apply(ctx context.Context, shard int, b gateway.Batch) (gateway.ApplyResult, error) {
	if f.batch != nil {
		b = f.batch(b)
	}
	if f.write != nil {
		ws := make([]gateway.Write, len(b.Writes))
		for i, w := range b.Writes {
			ws[i] = f.write(b, w)
		}
		b.Writes = ws
	}
	r, err := f.Store.Apply(ctx, shard, b)
	if err == nil && f.apply != nil {
		r = f.apply(r)
	}
	return r, err
}

// ApplyShards goes through Apply, so that every write meets the hooks.
func (f *faulty) ApplyShards(ctx context.Context, batches []gateway.ShardBatch) []gateway.ShardResult {
	out := make([]gateway.ShardResult, len(batches))
	for i, sb := range batches {
		out[i].Result, out[i].Err = f.Apply(ctx, sb.Shard, sb.Batch)
	}
	return out
}

func (f *faulty) Reap(ctx context.Context, shard int, limit int) (gateway.ReapResult, error) {
	if f.reapLimit != nil {
		limit = f.reapLimit(limit)
	}
	r, err := f.Store.Reap(ctx, shard, limit)
	if err == nil && f.reap != nil {
		r = f.reap(r)
	}
	return r, err
}
