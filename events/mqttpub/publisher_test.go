package mqttpub_test

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/fleetgate/fleetgate/events/mqttpub"
	"github.com/fleetgate/fleetgate/gateway"
	"github.com/fleetgate/fleetgate/internal/redistest"
	"github.com/fleetgate/fleetgate/store/redisstore"
)

const shards = 4

// TestMain doubles as the publisher process of the kill -9 test: with
// MQTTPUB_CHILD set, the test binary runs one publisher until killed.
func TestMain(m *testing.M) {
	if os.Getenv("MQTTPUB_CHILD") != "" {
		os.Exit(childPublisher())
	}
	os.Exit(m.Run())
}

func childPublisher() int {
	ctx := context.Background()
	c := redis.NewClient(&redis.Options{Addr: os.Getenv("MQTTPUB_REDIS")})
	store, err := redisstore.Open(ctx, c, redisstore.Options{Prefix: os.Getenv("MQTTPUB_PREFIX"), Shards: shards})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	p, err := mqttpub.New(store, mqttpub.Options{
		URL: os.Getenv("MQTTPUB_BROKER"), Owner: os.Getenv("MQTTPUB_OWNER"), QoS: 1, RetainState: true,
		LockTTL: time.Second, Batch: 50,
		Logger: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})),
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	if err := p.Run(ctx); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return 0
}

var prefixes struct {
	sync.Mutex
	n int
}

func uniquePrefix() string {
	prefixes.Lock()
	defer prefixes.Unlock()
	prefixes.n++
	return fmt.Sprintf("pub%d", prefixes.n)
}

// redisStore opens a Redis store under a fresh prefix of srv.
func redisStore(t testing.TB, srv *redistest.Server, prefix string) *redisstore.Store {
	t.Helper()
	c := srv.Client(t)
	s, err := redisstore.Open(t.Context(), c, redisstore.Options{Prefix: prefix, Shards: shards})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// runPublisher runs a publisher until the test ends (or stop is called).
func runPublisher(t *testing.T, store gateway.Store, b *broker, o mqttpub.Options) (p *mqttpub.Publisher, stop func()) {
	t.Helper()
	o.URL, o.TLS = b.url(), b.tlsConfig()
	o.Username, o.Password = b.user, b.pass
	if o.Owner == "" {
		o.Owner = "test-" + strconv.Itoa(int(time.Now().UnixNano()%1e6))
	}
	if o.QoS == 0 {
		o.QoS = 1
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelWarn}))
	}
	p, err := mqttpub.New(store, o)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- p.Run(ctx) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			select {
			case err := <-done:
				if err != nil {
					t.Errorf("Run: %v", err)
				}
			case <-time.After(10 * time.Second):
				t.Errorf("Run did not end within 10s of its context")
			}
		})
	}
	t.Cleanup(stop)
	return p, stop
}

func devices(prefix string, n int) []gateway.DeviceID {
	out := make([]gateway.DeviceID, n)
	for i := range out {
		out[i] = gateway.DeviceID(fmt.Sprintf("%s-%d", prefix, i))
	}
	return out
}

// apply writes kind for devs, one batch per shard.
func apply(t testing.TB, store gateway.Store, kind gateway.Kind, devs ...gateway.DeviceID) {
	t.Helper()
	by := map[int][]gateway.Write{}
	for _, d := range devs {
		s := gateway.ShardOf(d, shards)
		by[s] = append(by[s], gateway.Write{Device: d, Session: "s", Kind: kind})
	}
	for s, ws := range by {
		if _, err := store.Apply(context.Background(), s, gateway.Batch{Gateway: "gw", Epoch: 1, Lease: time.Hour, Writes: ws}); err != nil {
			t.Fatalf("Apply: %v", err)
		}
	}
}

type stateVer struct {
	state gateway.State
	ver   uint64
}

// storeStates reads every device's state and ver.
func storeStates(t testing.TB, store gateway.Store) map[gateway.DeviceID]stateVer {
	t.Helper()
	out := map[gateway.DeviceID]stateVer{}
	cursor := ""
	for range 1000 {
		page, err := store.List(context.Background(), gateway.ListQuery{Cursor: cursor, Limit: 1000})
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range page.Devices {
			out[d.Device] = stateVer{d.State, d.Ver}
		}
		if cursor = page.Next; cursor == "" {
			return out
		}
	}
	t.Fatal("List did not end")
	return nil
}

// latestPresence is the last presence message of each device.
func latestPresence(msgs []received) map[gateway.DeviceID]stateVer {
	out := map[gateway.DeviceID]stateVer{}
	for _, m := range msgs {
		if strings.Contains(m.topic, "/presence/") {
			out[m.env.Device] = stateVer{m.env.State, m.env.Ver}
		}
	}
	return out
}

func equalStates(a, b map[gateway.DeviceID]stateVer) bool {
	if len(a) != len(b) {
		return false
	}
	for d, v := range a {
		if b[d] != v {
			return false
		}
	}
	return true
}

func TestRetainedPresenceMatchesStore(t *testing.T) {
	srv := redistest.Start(t)
	for _, withTLS := range []bool{false, true} {
		t.Run(map[bool]string{false: "plain", true: "tls+password"}[withTLS], func(t *testing.T) {
			b := startBroker(t, withTLS)
			store := redisStore(t, srv, uniquePrefix())
			devs := devices("r", 40)
			apply(t, store, gateway.Connect, devs...)
			apply(t, store, gateway.Leave, devs[:10]...)
			const prefix = "site/fleet"
			watcher := subscribe(t, b, prefix, "#")
			runPublisher(t, store, b, mqttpub.Options{TopicPrefix: prefix, RetainState: true})
			want := storeStates(t, store)
			watcher.await(t, 20*time.Second, "presence of the snapshot", func(m []received) bool { return equalStates(latestPresence(m), want) })
			// live changes after the snapshot
			apply(t, store, gateway.Connect, devs[:5]...)
			apply(t, store, gateway.Leave, devs[30:]...)
			apply(t, store, gateway.Connect, "r-new")
			want = storeStates(t, store)
			watcher.await(t, 20*time.Second, "presence after live changes", func(m []received) bool { return equalStates(latestPresence(m), want) })
			for _, m := range watcher.snapshot() {
				if strings.Contains(m.topic, "/events/") && m.env.Reason == gateway.ReasonSnapshot {
					t.Errorf("snapshot entry on the events topic: %+v", m)
				}
			}
			// a new subscriber gets the snapshot from the retained messages
			fresh := subscribe(t, b, prefix, "presence/+")
			fresh.await(t, 10*time.Second, "retained presence equal to the store", func(m []received) bool {
				return equalStates(latestPresence(m), want)
			})
			for _, m := range fresh.snapshot() {
				if !m.retained {
					t.Errorf("presence message %s not retained", m.topic)
				}
			}
		})
	}
}

// checkOrder checks that, per device, each new ver arrived on the
// events topic as the next one (duplicates of older ones aside).
func checkOrder(t *testing.T, msgs []received) {
	t.Helper()
	maxVer := map[gateway.DeviceID]uint64{}
	for _, m := range msgs {
		if !strings.Contains(m.topic, "/events/") {
			continue
		}
		d, v := m.env.Device, m.env.Ver
		if v > maxVer[d] {
			if maxVer[d] != 0 && v != maxVer[d]+1 {
				t.Errorf("device %s: ver %d arrived after ver %d: out of order or a gap", d, v, maxVer[d])
			}
			maxVer[d] = v
		}
	}
}

// missing counts the events of the store's logs that never arrived on
// the events topic.
func missing(store gateway.Store, msgs []received) int {
	got := map[gateway.DeviceID]map[uint64]bool{}
	for _, m := range msgs {
		if strings.Contains(m.topic, "/events/") {
			if got[m.env.Device] == nil {
				got[m.env.Device] = map[uint64]bool{}
			}
			got[m.env.Device][m.env.Ver] = true
		}
	}
	n := 0
	for s := range shards {
		after := ""
		for range 10000 {
			evs, err := store.Events(context.Background(), s, after, 1000)
			if err != nil || len(evs) == 0 {
				break
			}
			for _, e := range evs {
				if !got[e.Device][e.Ver] {
					n++
				}
			}
			after = evs[len(evs)-1].ID
		}
	}
	return n
}

func TestKill9LosesNothing(t *testing.T) {
	srv := redistest.Start(t)
	b := startBroker(t, false)
	prefix := uniquePrefix()
	store := redisStore(t, srv, prefix)
	sub := subscribe(t, b, mqttpub.DefaultTopicPrefix, "events/+")
	startAtLogStart(t, store)
	child := func(owner string) *exec.Cmd {
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), "MQTTPUB_CHILD=1", "MQTTPUB_REDIS="+srv.Addr, "MQTTPUB_PREFIX="+prefix,
			"MQTTPUB_BROKER="+b.url(), "MQTTPUB_OWNER="+owner)
		cmd.Stderr = t.Output()
		cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
		return cmd
	}
	// a fleet flapping while the publisher is killed and replaced
	devs := devices("k", 60)
	writes := make(chan struct{})
	go func() {
		defer close(writes)
		for i := range 150 {
			kind := gateway.Connect
			if i%2 == 1 {
				kind = gateway.Leave
			}
			apply(t, store, kind, devs[(i*7)%60:min(60, (i*7)%60+20)]...)
			time.Sleep(10 * time.Millisecond)
		}
	}()
	first := child("first")
	sub.await(t, 20*time.Second, "the first publisher publishing", func(m []received) bool { return len(m) > 50 })
	if err := first.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = first.Wait()
	child("second")
	<-writes
	sub.await(t, 30*time.Second, "every event of the logs delivered", func(m []received) bool {
		return missing(store, m) == 0
	})
	checkOrder(t, sub.snapshot())
}

// startAtLogStart saves every shard's publisher position at the start of
// its log, as a publisher that had published nothing yet would have.
func startAtLogStart(t testing.TB, store gateway.Store) {
	t.Helper()
	for s := range shards {
		head, err := store.SnapshotShard(t.Context(), s, "", 0)
		if err != nil {
			t.Fatal(err)
		}
		if _, ok, err := store.AcquirePublisher(t.Context(), s, "setup", time.Second); err != nil || !ok {
			t.Fatalf("AcquirePublisher: %v %v", ok, err)
		}
		if err := store.SavePublisher(t.Context(), s, "setup", gateway.Position{Incarnation: head.At.Incarnation, ID: "0"}); err != nil {
			t.Fatal(err)
		}
		if err := store.ReleasePublisher(t.Context(), s, "setup"); err != nil {
			t.Fatal(err)
		}
	}
}

func TestBrokerDownTenSeconds(t *testing.T) {
	srv := redistest.Start(t)
	b := startBroker(t, false)
	store := redisStore(t, srv, uniquePrefix())
	devs := devices("b", 20)
	p, _ := runPublisher(t, store, b, mqttpub.Options{TopicPrefix: "fg", RetainState: true})
	apply(t, store, gateway.Connect, devs...)
	sub := subscribe(t, b, "fg", "#")
	want := storeStates(t, store)
	sub.await(t, 20*time.Second, "presence before the outage", func(m []received) bool { return equalStates(latestPresence(m), want) })
	b.Stop()
	apply(t, store, gateway.Leave, devs[:10]...)
	time.Sleep(10 * time.Second) // the broker stays down 10s while events pile up
	if p.Stats().Connected {
		t.Errorf("publisher reports a connection while the broker is down")
	}
	apply(t, store, gateway.Connect, devs[:3]...)
	b.Start()
	after := subscribe(t, b, "fg", "#")
	want = storeStates(t, store)
	after.await(t, 30*time.Second, "presence after the outage equal to the store", func(m []received) bool {
		return equalStates(latestPresence(m), want)
	})
	after.await(t, 10*time.Second, "the events of the outage", func(m []received) bool {
		n := 0
		for _, x := range m {
			if strings.Contains(x.topic, "/events/") && x.env.Ver >= 2 {
				n++
			}
		}
		return n >= 13
	})
}

func TestOnePublisherPerShard(t *testing.T) {
	srv := redistest.Start(t)
	b := startBroker(t, false)
	store := redisStore(t, srv, uniquePrefix())
	a, stopA := runPublisher(t, store, b, mqttpub.Options{Owner: "a", LockTTL: 600 * time.Millisecond})
	bb, _ := runPublisher(t, store, b, mqttpub.Options{Owner: "b", LockTTL: 600 * time.Millisecond})
	awaitShards := func(what string, cond func(a, b []int) bool) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for !cond(a.Stats().Shards, bb.Stats().Shards) {
			if time.Now().After(deadline) {
				t.Fatalf("%s: a holds %v, b holds %v", what, a.Stats().Shards, bb.Stats().Shards)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	awaitShards("every shard published once", func(x, y []int) bool {
		seen := map[int]int{}
		for _, s := range append(append([]int{}, x...), y...) {
			seen[s]++
		}
		for s := range shards {
			if seen[s] != 1 {
				return false
			}
		}
		return true
	})
	stopA()
	awaitShards("b takes over a's shards", func(_, y []int) bool { return len(y) == shards })
}

func TestOfflineDelayDampsFlaps(t *testing.T) {
	srv := redistest.Start(t)
	b := startBroker(t, false)
	store := redisStore(t, srv, uniquePrefix())
	sub := subscribe(t, b, "fg", "#")
	apply(t, store, gateway.Connect, "flap", "gone")
	p, _ := runPublisher(t, store, b, mqttpub.Options{TopicPrefix: "fg", OfflineDelay: 2 * time.Second})
	sub.await(t, 20*time.Second, "both online", func(m []received) bool { return len(latestPresence(m)) == 2 })
	apply(t, store, gateway.Leave, "flap", "gone")
	apply(t, store, gateway.Connect, "flap") // back within the delay
	sub.await(t, 20*time.Second, "gone's offline after the delay", func(m []received) bool {
		for _, x := range m {
			if x.env.Device == "gone" && x.env.State == gateway.Offline {
				return true
			}
		}
		return false
	})
	// flap's first ver is its online one; the damped leave and connect
	// have the two after it
	var first uint64
	for _, x := range sub.snapshot() {
		if x.env.Device != "flap" {
			continue
		}
		if first == 0 {
			first = x.env.Ver
		}
		if x.env.Ver > first {
			t.Errorf("flap's damped event published: %+v", x.env)
		}
	}
	if s := p.Stats(); s.Damped != 2 {
		t.Errorf("Damped = %d, want 2", s.Damped)
	}
}

// A Redis restart (data kept by the AOF, but a new incarnation) while
// the publisher runs: its position cannot be served any more, so it
// publishes the shards' snapshot again on the presence topics, then
// goes on with the events written after the restart.
func TestRedisRestartRepublishesSnapshot(t *testing.T) {
	srv := redistest.Start(t, "--appendonly", "yes", "--appendfsync", "always")
	b := startBroker(t, false)
	store := redisStore(t, srv, uniquePrefix())
	devs := devices("i", 20)
	apply(t, store, gateway.Connect, devs...)
	sub := subscribe(t, b, "fg", "#")
	runPublisher(t, store, b, mqttpub.Options{TopicPrefix: "fg", RetainState: true})
	want := storeStates(t, store)
	sub.await(t, 20*time.Second, "presence before the restart", func(m []received) bool { return equalStates(latestPresence(m), want) })
	snapshots := func(m []received) int {
		n := 0
		for _, x := range m {
			if x.env.Reason == gateway.ReasonSnapshot {
				n++
			}
		}
		return n
	}
	before := snapshots(sub.snapshot())

	srv.Restart()
	// nothing but the publisher reads the store until it has published
	// the snapshot again (a List or Device would load the scripts a
	// snapshot page needs)
	ping := srv.Client(t)
	deadline := time.Now().Add(10 * time.Second)
	for ping.Ping(t.Context()).Err() != nil {
		if time.Now().After(deadline) {
			t.Fatal("redis not back within 10s of its restart")
		}
		time.Sleep(50 * time.Millisecond)
	}
	apply(t, store, gateway.Leave, devs[:5]...)
	sub.await(t, 30*time.Second, "the snapshot published again", func(m []received) bool {
		return snapshots(m) >= before+len(devs)
	})
	want = storeStates(t, store)
	sub.await(t, 20*time.Second, "presence equal to the store after the restart", func(m []received) bool {
		return equalStates(latestPresence(m), want)
	})
}
