package admin_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net/http"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	bolt "go.etcd.io/bbolt"
	"pgregory.net/rapid"

	"github.com/fleetgate/fleetgate/admin"
	"github.com/fleetgate/fleetgate/gateway"
	"github.com/fleetgate/fleetgate/store/embedded"
)

// watchServer is an admin server over a real embedded store on the real
// clock (the watch API waits on real time).
func watchServer(t *testing.T, maxLen int64) (*embedded.Store, *admin.Client) {
	t.Helper()
	store := embeddedStore(t, maxLen)
	return store, serveAdmin(t, store)
}

// embeddedStore is an embedded store of shards shards in a fresh file,
// keeping maxLen events (0: the default).
func embeddedStore(t *testing.T, maxLen int64) *embedded.Store {
	t.Helper()
	db, err := bolt.Open(filepath.Join(t.TempDir(), "state.db"), 0o600, &bolt.Options{NoSync: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	store, err := embedded.Open(db, embedded.Options{Shards: shards, EventsMaxLen: maxLen})
	if err != nil {
		t.Fatal(err)
	}
	return store
}

// serveAdmin is an admin server over store, shut down at cleanup.
func serveAdmin(t *testing.T, store gateway.Store) *admin.Client {
	t.Helper()
	return admin.NewClient(serveAdminWith(t, admin.Options{Store: store}).Addr().String())
}

// serveAdminWith serves o (on 127.0.0.1:0, with a registry, status and
// timing unless set) until cleanup.
func serveAdminWith(t *testing.T, o admin.Options) *admin.Server {
	t.Helper()
	if o.Addr == "" {
		o.Addr = "127.0.0.1:0"
	}
	if o.Gatherer == nil {
		o.Gatherer = prometheus.NewRegistry()
	}
	if o.Status == nil {
		o.Status = func() admin.Status { return admin.Status{} }
	}
	if o.Timing == nil {
		o.Timing = func() (time.Duration, time.Duration) { return lease, suspect }
	}
	srv, err := admin.Listen(o)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- srv.Serve() }()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := srv.Shutdown(ctx); err != nil {
			t.Errorf("Shutdown: %v", err)
		}
		if err := <-done; err != nil {
			t.Errorf("Serve: %v", err)
		}
	})
	return srv
}

// fataler is what write needs of a testing.T or a rapid.T.
type fataler interface {
	Helper()
	Fatalf(format string, args ...any)
}

func connect(t fataler, store gateway.Store, gw string, devs ...gateway.DeviceID) []gateway.Event {
	return write(t, store, gw, gateway.Connect, devs...)
}

func write(t fataler, store gateway.Store, gw string, kind gateway.Kind, devs ...gateway.DeviceID) []gateway.Event {
	t.Helper()
	byShard := map[int][]gateway.Write{}
	for _, d := range devs {
		s := gateway.ShardOf(d, store.Shards())
		byShard[s] = append(byShard[s], gateway.Write{Device: d, Session: "s", Kind: kind})
	}
	var evs []gateway.Event
	for s, ws := range byShard {
		res, err := store.Apply(context.Background(), s, gateway.Batch{Gateway: gw, Epoch: 1, Lease: lease, Writes: ws})
		if err != nil {
			t.Fatalf("Apply: %v", err)
		}
		evs = append(evs, res.Events...)
	}
	return evs
}

func ids(prefix string, n int) []gateway.DeviceID {
	out := make([]gateway.DeviceID, n)
	for i := range out {
		out[i] = gateway.DeviceID(fmt.Sprintf("%s-%d", prefix, i))
	}
	return out
}

func TestSnapshotPagesWithOneCursor(t *testing.T) {
	store, c := watchServer(t, 0)
	connect(t, store, "gw", ids("d", 25)...)
	write(t, store, "gw", gateway.Leave, ids("d", 5)...)
	ctx := t.Context()
	seen := map[gateway.DeviceID]gateway.Envelope{}
	page, cursor := "", ""
	for i := 0; ; i++ {
		if i > 100 {
			t.Fatal("no last page after 100")
		}
		b, err := c.Snapshot(ctx, "", page, 4)
		if err != nil {
			t.Fatal(err)
		}
		if len(b.Devices) > 4 {
			t.Fatalf("page of %d over the limit", len(b.Devices))
		}
		if cursor != "" && b.Cursor != cursor {
			t.Fatalf("cursor changed between pages: %s then %s", cursor, b.Cursor)
		}
		cursor = b.Cursor
		for _, d := range b.Devices {
			if _, dup := seen[d.Device]; dup {
				t.Errorf("device %s on two pages", d.Device)
			}
			seen[d.Device] = d
		}
		if page = b.Next; page == "" {
			break
		}
	}
	if len(seen) != 25 {
		t.Fatalf("snapshot has %d devices, want 25", len(seen))
	}
	for _, d := range ids("d", 25) {
		// an online device's one transition has the store time of its
		// connect (its since) as ver; an offline one's second is above it
		got := seen[d]
		want, ok := gateway.Online, got.Ver == uint64(got.At.UnixMilli())
		if d < "d-5" && len(d) == 3 {
			want, ok = gateway.Offline, got.Ver > 1<<40
		}
		if got.State != want || !ok || got.Reason != gateway.ReasonSnapshot {
			t.Errorf("%s = %+v, want %s reason snapshot", d, got, want)
		}
	}
	on, err := c.Snapshot(ctx, "offline", "", 100)
	if err != nil {
		t.Fatal(err)
	}
	if len(on.Devices) != 5 {
		t.Errorf("state=offline: %d devices, want 5", len(on.Devices))
	}
	var ae *admin.Error
	if _, err := c.Snapshot(ctx, "", "garbage", 10); !errors.As(err, &ae) || ae.Code != 400 {
		t.Errorf("bad page: %v, want a 400", err)
	}
}

func TestWatchStreamsEventsWithCursors(t *testing.T) {
	store, c := watchServer(t, 0)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	cursor, err := c.SnapshotAll(ctx, func(gateway.Envelope) {})
	if err != nil {
		t.Fatal(err)
	}
	written := connect(t, store, "gw", ids("w", 10)...)
	got := make(chan gateway.Envelope, 100)
	done := make(chan error, 1)
	go func() {
		done <- c.Watch(ctx, cursor, 200*time.Millisecond, func(e gateway.Envelope) error { got <- e; return nil })
	}()
	var last gateway.Envelope
	for range written {
		select {
		case last = <-got:
			if last.State != gateway.Online || last.Ver != uint64(last.At.UnixMilli()) || last.Cursor == "" || last.Reason != gateway.ReasonConnect {
				t.Errorf("event %+v", last)
			}
		case <-time.After(5 * time.Second):
			t.Fatal("events not streamed within 5s")
		}
	}
	// a later write arrives while the stream is live
	time.Sleep(300 * time.Millisecond) // past a keep-alive
	connect(t, store, "gw", "late")
	select {
	case e := <-got:
		if e.Device != "late" {
			t.Errorf("live event %+v, want device late", e)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("live event not streamed within 5s")
	}
	cancel()
	if err := <-done; err != nil {
		t.Errorf("Watch after cancel: %v", err)
	}
	// resuming from the cursor of the 10th event yields only "late"
	ctx2, cancel2 := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel2()
	err = c.Watch(ctx2, last.Cursor, 0, func(e gateway.Envelope) error {
		if e.Device != "late" {
			t.Errorf("resumed stream sent %s, want late", e.Device)
		}
		cancel2()
		return nil
	})
	if err != nil {
		t.Errorf("resumed Watch: %v", err)
	}
}

func TestWatchSSE(t *testing.T) {
	store, c := watchServer(t, 0)
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, c.Base+"/v1/watch?keepalive=100ms", nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if ct := resp.Header.Get("Content-Type"); ct != "text/event-stream" {
		t.Fatalf("Content-Type %q", ct)
	}
	connect(t, store, "gw", "sse-1")
	sc := bufio.NewScanner(resp.Body)
	var lines []string
	keepAlive := false
	for sc.Scan() && len(lines) < 3 {
		l := sc.Text()
		if l == ": keep-alive" {
			keepAlive = true
			continue
		}
		if l != "" {
			lines = append(lines, l)
		}
	}
	if len(lines) != 3 || !strings.HasPrefix(lines[0], "id: v1:") || lines[1] != "event: presence" ||
		!strings.HasPrefix(lines[2], `data: {"device":"sse-1","state":"online","ver":1`) ||
		!strings.Contains(lines[2], `"cursor":"`+strings.TrimPrefix(lines[0], "id: ")+`"`) {
		t.Errorf("SSE event = %q", lines)
	}
	_ = keepAlive // a keep-alive may or may not precede the event
	// an idle stream sends keep-alives
	deadline := time.Now().Add(5 * time.Second)
	for sc.Scan() && time.Now().Before(deadline) {
		if sc.Text() == ": keep-alive" {
			return
		}
	}
	t.Error("no keep-alive on an idle stream")
}

func TestWatchResync(t *testing.T) {
	store, c := watchServer(t, 10)
	ctx := t.Context()
	cursor, err := c.SnapshotAll(ctx, func(gateway.Envelope) {})
	if err != nil {
		t.Fatal(err)
	}
	// a foreign incarnation
	cur, err := gateway.ParseCursor(cursor, shards)
	if err != nil {
		t.Fatal(err)
	}
	cur[1].Incarnation = "other"
	err = c.Watch(ctx, cur.String(), 0, func(gateway.Envelope) error { return nil })
	var re *admin.ErrResync
	if !errors.As(err, &re) || re.Reason != gateway.ResyncIncarnation || re.Shard != 1 || !errors.Is(err, gateway.ErrResyncRequired) {
		t.Errorf("Watch in another incarnation = %v, want resync (incarnation) on shard 1", err)
	}
	// trimmed: 10 events a shard at most are kept
	connect(t, store, "gw", ids("t", 200)...)
	err = c.Watch(ctx, cursor, 0, func(gateway.Envelope) error { return nil })
	if !errors.As(err, &re) || re.Reason != gateway.ResyncTrimmed {
		t.Errorf("Watch after a trimmed cursor = %v, want resync (trimmed)", err)
	}
	var ae *admin.Error
	if err := c.Watch(ctx, "v1:nonsense", 0, func(gateway.Envelope) error { return nil }); !errors.As(err, &ae) || ae.Code != 400 {
		t.Errorf("Watch with a malformed cursor = %v, want 400", err)
	}
}

// A stream whose position is trimmed away while it runs (the consumer
// fell a whole log behind) ends with a resync message, which the client
// returns as ErrResync.
func TestWatchResyncMidStream(t *testing.T) {
	store, c := watchServer(t, 10)
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	cursor, err := c.SnapshotAll(ctx, func(gateway.Envelope) {})
	if err != nil {
		t.Fatal(err)
	}
	connect(t, store, "gw", "first")
	streaming := make(chan struct{})
	done := make(chan error, 1)
	go func() {
		n := 0
		done <- c.Watch(ctx, cursor, 0, func(gateway.Envelope) error {
			if n++; n == 1 {
				close(streaming)
			}
			return nil
		})
	}()
	select {
	case <-streaming:
	case err := <-done:
		t.Fatalf("Watch ended before its first event: %v", err)
	case <-ctx.Done():
		t.Fatal("no first event within 20s")
	}
	// one transaction a shard: each shard's log is trimmed past the
	// stream's position before its reader wakes
	connect(t, store, "gw", ids("m", 200)...)
	select {
	case err := <-done:
		var re *admin.ErrResync
		if !errors.As(err, &re) || re.Reason != gateway.ResyncTrimmed || !errors.Is(err, gateway.ErrResyncRequired) {
			t.Errorf("Watch trimmed mid-stream = %v, want a resync (trimmed)", err)
		}
	case <-ctx.Done():
		t.Fatal("the stream did not end within 20s of its position being trimmed")
	}
}

// TestSnapshotPlusWatchProperty: a fleet of writers changes devices
// while a consumer takes a snapshot through the API and watches from its
// cursor. Every event it keeps is the next ver of its device and flips
// the state it held (a device's first is online), so its view is at
// every point a state of the store's history; once the writers are
// done its view equals the store's.
func TestSnapshotPlusWatchProperty(t *testing.T) {
	rapid.Check(t, func(rt *rapid.T) {
		store, c := watchServer(t, 0)
		ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
		defer cancel()
		devs := ids("p", rapid.IntRange(1, 8).Draw(rt, "devices"))
		pre := rapid.IntRange(0, 20).Draw(rt, "before")
		type op struct {
			dev  gateway.DeviceID
			kind gateway.Kind
		}
		opGen := rapid.Custom(func(rt *rapid.T) op {
			return op{rapid.SampledFrom(devs).Draw(rt, "dev"), rapid.SampledFrom([]gateway.Kind{gateway.Connect, gateway.Leave}).Draw(rt, "kind")}
		})
		before := rapid.SliceOfN(opGen, pre, pre).Draw(rt, "before ops")
		during := rapid.SliceOfN(rapid.SliceOfN(opGen, 0, 30), 1, 3).Draw(rt, "writers")
		for _, o := range before {
			write(rt, store, "gw-0", o.kind, o.dev)
		}
		var wg sync.WaitGroup
		for w, ops := range during {
			wg.Go(func() {
				for _, o := range ops {
					write(rt, store, fmt.Sprintf("gw-%d", w+1), o.kind, o.dev)
				}
			})
		}
		type known struct {
			state gateway.State
			ver   uint64
		}
		var mu sync.Mutex
		view := map[gateway.DeviceID]known{}
		cursor, err := c.SnapshotAll(ctx, func(e gateway.Envelope) { view[e.Device] = known{e.State, e.Ver} })
		if err != nil {
			rt.Fatalf("snapshot: %v", err)
		}
		wctx, stop := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() {
			done <- c.Watch(wctx, cursor, 0, func(e gateway.Envelope) error {
				mu.Lock()
				defer mu.Unlock()
				k := view[e.Device]
				if e.Ver <= k.ver {
					return nil
				}
				if k.ver != 0 && e.Ver != k.ver+1 {
					return fmt.Errorf("device %s: ver %d after %d: a gap", e.Device, e.Ver, k.ver)
				}
				// at every point the view is a state the device was in:
				// each event applied is the transition out of the state held
				if (k.ver != 0 && e.State == k.state) || (k.ver == 0 && e.State != gateway.Online) {
					return fmt.Errorf("device %s: %s ver %d applied to %s ver %d: not a transition", e.Device, e.State, e.Ver, k.state, k.ver)
				}
				view[e.Device] = known{e.State, e.Ver}
				return nil
			})
		}()
		wg.Wait()
		want := map[gateway.DeviceID]known{}
		for _, d := range devs {
			info, err := store.Device(ctx, d)
			if errors.Is(err, gateway.ErrNotFound) {
				continue
			}
			if err != nil {
				rt.Fatal(err)
			}
			want[d] = known{info.State, info.Ver}
		}
		equal := func() bool {
			mu.Lock()
			defer mu.Unlock()
			if len(view) != len(want) {
				return false
			}
			for d, k := range want {
				if view[d] != k {
					return false
				}
			}
			return true
		}
		for i := 0; !equal(); i++ {
			select {
			case err := <-done:
				rt.Fatalf("watch ended: %v", err)
			case <-time.After(10 * time.Millisecond):
			}
			if i == 500 {
				mu.Lock()
				rt.Fatalf("after 5s the view %v differs from the store %v", view, want)
			}
		}
		stop()
		if err := <-done; err != nil {
			rt.Fatalf("watch: %v", err)
		}
	})
}
