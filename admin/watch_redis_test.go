package admin_test

import (
	"context"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/fleetgate/fleetgate/admin"
	"github.com/fleetgate/fleetgate/gateway"
	"github.com/fleetgate/fleetgate/internal/redistest"
	"github.com/fleetgate/fleetgate/store/redisstore"
)

// redisClients counts a node's client connections (CLIENT LIST): all of
// them, and those blocked in XREAD.
func redisClients(t *testing.T, rc *redis.Client) (total, blocked int) {
	t.Helper()
	list, err := rc.ClientList(t.Context()).Result()
	if err != nil {
		t.Fatalf("CLIENT LIST: %v", err)
	}
	for line := range strings.Lines(list) {
		total++
		var flags, cmd string
		for f := range strings.FieldsSeq(line) {
			if v, ok := strings.CutPrefix(f, "flags="); ok {
				flags = v
			}
			if v, ok := strings.CutPrefix(f, "cmd="); ok {
				cmd = v
			}
		}
		if strings.Contains(flags, "b") && cmd == "xread" {
			blocked++
		}
	}
	return total, blocked
}

// idleStreams opens n watch streams at the current position; each hands
// its events to its channel. They end with stop, or at cleanup.
func idleStreams(t *testing.T, c *admin.Client, n int) (got []chan gateway.Envelope, stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	stop = func() {
		cancel()
		wg.Wait()
	}
	t.Cleanup(stop)
	got = make([]chan gateway.Envelope, n)
	for i := range got {
		got[i] = make(chan gateway.Envelope, 16)
		wg.Go(func() {
			err := c.Watch(ctx, "", time.Minute, func(e gateway.Envelope) error {
				select {
				case got[i] <- e:
				default:
				}
				return nil
			})
			if err != nil && ctx.Err() == nil {
				t.Errorf("watch stream %d: %v", i, err)
			}
		})
	}
	return got, stop
}

// waitBlocked waits up to 20s for want XREADs blocked on the nodes, and
// returns the nodes' connections then.
func waitBlocked(t *testing.T, want int, nodes ...*redis.Client) (total, blocked int) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		total, blocked = 0, 0
		for _, rc := range nodes {
			tt, b := redisClients(t, rc)
			total, blocked = total+tt, blocked+b
		}
		if blocked >= want || time.Now().After(deadline) {
			return total, blocked
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestIdleWatchStreamsOneConnectionEach: 40 idle watch streams over a
// standalone Redis with 16 shards wait with one blocked XREAD each (they
// held one per shard, 640, and the readers' pool of 256 made the
// sixteenth stream on fail), and each gets the next event.
func TestIdleWatchStreamsOneConnectionEach(t *testing.T) {
	const n, shards = 40, 16
	srv := redistest.Start(t)
	rc := srv.Client(t)
	store, err := redisstore.Open(t.Context(), rc, redisstore.Options{Prefix: "idle", Shards: shards})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })
	c := serveAdmin(t, store)
	base, _ := redisClients(t, rc)
	got, _ := idleStreams(t, c, n)
	total, blocked := waitBlocked(t, n, rc)
	t.Logf("%d idle streams: %d connections (%d before), %d blocked in XREAD", n, total, base, blocked)
	if blocked != n {
		t.Fatalf("%d XREADs blocked for %d idle streams, want %d (one each)", blocked, n, n)
	}
	if total > base+n+16 {
		t.Errorf("%d connections for %d idle streams (%d before them), want at most %d", total, n, base, base+n+16)
	}
	// hold: the count stays so over a few waits' worth of time
	time.Sleep(500 * time.Millisecond)
	if _, b := redisClients(t, rc); b != n {
		t.Errorf("%d XREADs blocked after 500ms, want %d", b, n)
	}
	ev := connect(t, store, "gw", "idle-dev")[0]
	for i, ch := range got {
		select {
		case e := <-ch:
			if e.Device != ev.Device || e.Ver != ev.Ver {
				t.Errorf("stream %d got %s ver %d, want %s ver %d", i, e.Device, e.Ver, ev.Device, ev.Ver)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("stream %d: no event within 10s of the write", i)
		}
	}
}

// busyAnswer opens one more watch stream and checks it is refused with
// a 503 that says why, before the stream starts.
func busyAnswer(t *testing.T, c *admin.Client) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, c.Base+"/v1/watch?format=jsonl", nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("one more watch stream: %v (want a 503 at once)", err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<16))
	if resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") == "" ||
		!strings.Contains(string(body), gateway.ErrBusy.Error()) || !strings.Contains(string(body), "waits in progress") {
		t.Errorf("one more watch stream = %d Retry-After %q %s, want 503 with Retry-After and the reason", resp.StatusCode, resp.Header.Get("Retry-After"), body)
	}
}

// TestWatchStreamsOverTheCapGet503: a store that serves 3 waits at once
// (redisstore Options.WatchWaits) holds 3 idle streams and refuses the
// fourth with a 503, at once (it waited for a pooled connection); once
// the streams end their waits are given back at once, not at the end of
// their blocking reads.
func TestWatchStreamsOverTheCapGet503(t *testing.T) {
	srv := redistest.Start(t)
	rc := srv.Client(t)
	store, err := redisstore.Open(t.Context(), rc, redisstore.Options{Prefix: "cap", Shards: 16, WatchWaits: 3})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })
	c := serveAdmin(t, store)
	got, stop := idleStreams(t, c, 3)
	if _, blocked := waitBlocked(t, 3, rc); blocked != 3 {
		t.Fatalf("%d XREADs blocked for 3 idle streams, want 3", blocked)
	}
	busyAnswer(t, c)
	// streams whose clients left give their waits back within a second
	// (the keep-alive is a minute): new streams are served
	stop()
	deadline := time.Now().Add(time.Second)
	for _, b := redisClients(t, rc); b != 0; _, b = redisClients(t, rc) {
		if time.Now().After(deadline) {
			t.Fatalf("%d XREADs still blocked 1s after their streams ended", b)
		}
		time.Sleep(10 * time.Millisecond)
	}
	got, _ = idleStreams(t, c, 3)
	if _, blocked := waitBlocked(t, 3, rc); blocked != 3 {
		t.Fatalf("%d XREADs blocked for 3 new idle streams, want 3", blocked)
	}
	ev := connect(t, store, "gw", "cap-dev")[0]
	everyStreamGets(t, got, ev)
}

// TestClusterIdleWatchStreams: on a Cluster of 3 masters a wait is one
// blocked XREAD per shard (CROSSSLOT forbids one over all), so a store
// with 16 shards serves Options.WatchWaits idle streams (default 64),
// each holding 16 connections spread over the masters; the next gets a
// 503, and the streams held get the next event.
func TestClusterIdleWatchStreams(t *testing.T) {
	const shards = 16
	streams := 64
	if testing.Short() {
		streams = 8
	}
	cl := redistest.StartCluster(t, 3)
	store, err := redisstore.Open(t.Context(), cl.Client(t), redisstore.Options{Prefix: "idle", Shards: shards, WatchWaits: streams})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })
	var nodes []*redis.Client
	for _, n := range cl.Nodes {
		nodes = append(nodes, n.Client(t))
	}
	c := serveAdmin(t, store)
	begin := time.Now()
	got, _ := idleStreams(t, c, streams)
	total, blocked := waitBlocked(t, streams*shards, nodes...)
	t.Logf("%d idle streams: %d connections on the 3 masters, %d blocked in XREAD, after %v", streams, total, blocked, time.Since(begin))
	if blocked != streams*shards {
		t.Fatalf("%d XREADs blocked for %d idle streams, want %d (one per shard)", blocked, streams, streams*shards)
	}
	busyAnswer(t, c)
	ev := connect(t, store, "gw", "cluster-dev")[0]
	everyStreamGets(t, got, ev)
	// the waits that ended unblocked the others: no XREAD stays blocked
	// past its wait (each stream waits again, once)
	time.Sleep(500 * time.Millisecond)
	if _, b := waitBlocked(t, streams*shards, nodes...); b != streams*shards {
		for i, n := range cl.Nodes {
			t.Logf("node %d %s: %s", i, n.Addr, n.Log())
		}
		t.Errorf("%d XREADs blocked after the event, want %d", b, streams*shards)
	}
}

// everyStreamGets checks that each idle stream of got receives ev, the
// next event written, within 10 s.
func everyStreamGets(t *testing.T, got []chan gateway.Envelope, ev gateway.Event) {
	t.Helper()
	for i, ch := range got {
		select {
		case e := <-ch:
			if e.Device != ev.Device {
				t.Errorf("stream %d got %s, want %s", i, e.Device, ev.Device)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("stream %d: no event within 10s of the write", i)
		}
	}
}
