package uplink

import (
	"context"
	"encoding/json"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/fleetgate/fleetgate/gateway"
	"github.com/fleetgate/fleetgate/gateway/clocktest"
	"github.com/fleetgate/fleetgate/internal/redistest"
	"github.com/fleetgate/fleetgate/internal/statefile"
	"github.com/fleetgate/fleetgate/store/redisstore"
)

// sickShard is a store whose shard sick fails every batch and probe at
// once (gateway.ErrUnavailable) while ill is set (with probesOK, every
// batch only), and that records every batch it is handed.
type sickShard struct {
	gateway.Store
	sick     int
	probesOK bool
	ill      atomic.Bool

	mu   sync.Mutex
	seen []seenBatch
}

type seenBatch struct {
	shard          int
	writes         int
	replay, behind bool
}

func (s *sickShard) ApplyShards(ctx context.Context, batches []gateway.ShardBatch) []gateway.ShardResult {
	out := make([]gateway.ShardResult, len(batches))
	var pass []gateway.ShardBatch
	var at []int
	s.mu.Lock()
	for i, sb := range batches {
		s.seen = append(s.seen, seenBatch{sb.Shard, len(sb.Batch.Writes), sb.Batch.Replay, sb.Batch.Behind})
		if s.ill.Load() && sb.Shard == s.sick {
			out[i].Err = fmt.Errorf("shard %d ill: %w", sb.Shard, gateway.ErrUnavailable)
			continue
		}
		pass, at = append(pass, sb), append(at, i)
	}
	s.mu.Unlock()
	for j, r := range s.Store.ApplyShards(ctx, pass) {
		out[at[j]] = r
	}
	return out
}

func (s *sickShard) Probe(ctx context.Context, shards []int) []error {
	out := s.Store.Probe(ctx, shards)
	for i, sh := range shards {
		if s.ill.Load() && !s.probesOK && sh == s.sick {
			out[i] = fmt.Errorf("shard %d ill: %w", sh, gateway.ErrUnavailable)
		}
	}
	return out
}

// batches returns the batches seen since the last call.
func (s *sickShard) batches() []seenBatch {
	s.mu.Lock()
	defer s.mu.Unlock()
	b := s.seen
	s.seen = nil
	return b
}

// A shard whose batches fail is down alone: the other shards' batches
// are written in the same call and in every flush after, not Behind,
// with a coverage its outbox entries do not hold back; the sick shard
// gets no store call (no batch, no keep-alive) until a probe finds it
// answering; its writes go to the outbox meanwhile, and after the probe
// too until its entries are replayed (order per session), then to the
// store again. /v1/status and the metrics name it while it is down.
func TestSickShardHoldsOnlyItself(t *testing.T) {
	const interval = time.Second
	sick := &sickShard{sick: 1}
	e := newEnv(t, Options{FlushInterval: interval, ProbeMin: 100 * time.Millisecond, ProbeMax: 100 * time.Millisecond},
		OutboxOptions{}, func(db *bolt.DB, c *clocktest.Clock) gateway.Store {
			sick.Store = embeddedStore(t)(db, c)
			return sick
		})
	u, ctx := e.u, t.Context()
	devs := make([]gateway.DeviceID, testShards)
	for sh := range devs {
		devs[sh] = devicesIn(sh, 1, "sick")[0]
	}
	enqueueAll := func(k gateway.Kind) {
		t.Helper()
		for _, d := range devs {
			mustEnqueue(t, u, evidence(d, k, e.clock.Now()))
		}
	}
	sick.ill.Store(true)
	enqueueAll(gateway.Connect)
	if err := u.flushOnce(ctx, true); err != nil {
		t.Fatal(err)
	}
	st := u.Status()
	if st.Up || len(st.ShardsDown) != 1 || st.ShardsDown[0].Shard != 1 || st.ShardsDown[0].LastError == "" ||
		!st.ShardsDown[0].Since.Equal(e.clock.Now()) || st.LastError == "" || st.OutboxSessions != 1 {
		t.Fatalf("status after shard 1 failed: %+v; want down, shard 1 alone down since now with its error, 1 outbox session", st)
	}
	if body, err := json.Marshal(st); err != nil || !strings.Contains(string(body), `"shards_down":[{"shard":1,"since":`) {
		t.Fatalf("status JSON %s (%v) lacks shards_down with shard 1", body, err)
	}
	if got := metricValue(t, e.reg, "fleetgate_uplink_shards_down", "", ""); got != 1 {
		t.Fatalf("fleetgate_uplink_shards_down = %v, want 1", got)
	}
	if got := metricValue(t, e.reg, "fleetgate_uplink_up", "", ""); got != 0 {
		t.Fatalf("fleetgate_uplink_up = %v with a shard down, want 0", got)
	}
	for sh, d := range devs {
		info, err := e.store.Device(ctx, d)
		if sh == 1 && err == nil || sh != 1 && (err != nil || info.State != gateway.Online) {
			t.Fatalf("device of shard %d after the first flush: %+v, %v", sh, info, err)
		}
	}
	sick.batches()
	for range 3 {
		e.clock.Advance(interval)
		enqueueAll(gateway.Renew)
		if err := u.flushOnce(ctx, false); err != nil {
			t.Fatal(err)
		}
	}
	written := map[int]int{}
	for _, b := range sick.batches() {
		if b.shard == 1 {
			t.Fatalf("shard 1 is down and got a store call: %+v", b)
		}
		if b.behind {
			t.Fatalf("shard %d has no outbox entries and was sent Behind: %+v", b.shard, b)
		}
		written[b.shard] += b.writes
	}
	if want := map[int]int{0: 3, 2: 3, 3: 3}; fmt.Sprint(written) != fmt.Sprint(want) {
		t.Fatalf("writes per shard while shard 1 was down: %v, want %v", written, want)
	}
	if got, want := e.store.Covered(0), e.clock.Now().Add(-interval); !got.Equal(want) {
		t.Fatalf("coverage of shard 0 while shard 1's outbox holds evidence: %v, want %v", got, want)
	}
	if n := u.Status().OutboxSessions; n != 1 {
		t.Fatalf("outbox sessions %d, want shard 1's one", n)
	}

	// Shard 1 answers again; a probe finds it.
	sick.ill.Store(false)
	e.clock.Advance(100 * time.Millisecond)
	if _, probed := u.probeOnce(ctx); !probed {
		t.Fatal("no probe due 100 ms after the last")
	}
	if st := u.Status(); !st.Up || len(st.ShardsDown) != 0 || st.LastError != "" {
		t.Fatalf("status after the probe answered: %+v, want up", st)
	}
	// Its outbox entry is not replayed yet: its new evidence joins it.
	mustEnqueue(t, u, evidence(devs[1], gateway.Renew, e.clock.Now()))
	newest := e.clock.Now()
	if err := u.flushOnce(ctx, true); err != nil {
		t.Fatal(err)
	}
	for _, b := range sick.batches() {
		if b.shard == 1 && b.writes > 0 {
			t.Fatalf("shard 1's write overtook its outbox entry: %+v", b)
		}
	}
	rp := &replayer{u: u}
	if err := rp.round(ctx); err != nil {
		t.Fatal(err)
	}
	rp.wait()
	if n := u.Status().OutboxSessions; n != 0 {
		t.Fatalf("outbox sessions %d after the replay, want 0", n)
	}
	info, err := e.store.Device(ctx, devs[1])
	if want := newest.Add(gateway.DefaultLease); err != nil || info.State != gateway.Online || !info.Deadline.Equal(want) {
		t.Fatalf("device of shard 1 after the replay: %+v, %v; want online until %v", info, err, want)
	}
	// Then shard 1's writes go to the store again.
	e.clock.Advance(interval)
	mustEnqueue(t, u, evidence(devs[1], gateway.Renew, e.clock.Now()))
	if err := u.flushOnce(ctx, true); err != nil {
		t.Fatal(err)
	}
	if !slices.ContainsFunc(sick.batches(), func(b seenBatch) bool { return b.shard == 1 && b.writes == 1 && !b.replay }) {
		t.Fatal("shard 1's write after the replay did not go to the store")
	}
	for _, ev := range allEvents(t, e.store) {
		if ev.State != gateway.Online {
			t.Fatalf("event %+v, want online ones only", ev)
		}
	}
}

// A shard that answers probes but fails every batch is probed with a
// growing backoff (each failed replay after a successful probe counts as
// a failed probe), not every ProbeMin.
func TestShardFailingWritesBacksOff(t *testing.T) {
	const probeMin = 100 * time.Millisecond
	sick := &sickShard{sick: 1, probesOK: true}
	e := newEnv(t, Options{ProbeMin: probeMin, ProbeMax: time.Minute}, OutboxOptions{},
		func(db *bolt.DB, c *clocktest.Clock) gateway.Store {
			sick.Store = embeddedStore(t)(db, c)
			return sick
		})
	u, ctx := e.u, t.Context()
	sick.ill.Store(true)
	mustEnqueue(t, u, evidence(devicesIn(1, 1, "flaky")[0], gateway.Connect, e.clock.Now()))
	if err := u.flushOnce(ctx, true); err != nil {
		t.Fatal(err)
	}
	rp := &replayer{u: u}
	var waits []time.Duration
	for range 4 {
		_, wait := u.probeDue(e.clock.Now())
		if wait <= 0 {
			t.Fatalf("no probe ahead with shard 1 down: %+v", u.Status())
		}
		waits = append(waits, wait)
		e.clock.Advance(wait)
		if _, probed := u.probeOnce(ctx); !probed || !u.Status().Up {
			t.Fatalf("probe at its time: probed %v, status %+v; want it up", probed, u.Status())
		}
		if err := rp.round(ctx); err == nil {
			t.Fatal("replay of the shard that fails every batch succeeded")
		}
		rp.wait()
	}
	// backoff(n) is within [probeMin·2ⁿ/2, probeMin·2ⁿ]
	if waits[3] < 4*probeMin {
		t.Fatalf("waits before the probes %v: the fourth is under %v", waits, 4*probeMin)
	}
}

// storeAcks records when the store acknowledged each write, per device:
// its evidence's observation time (the call's start less the write's
// Age) and the acknowledgement's time, in order.
type storeAcks struct {
	gateway.Store
	mu  sync.Mutex
	got map[gateway.DeviceID][]storeAck
}

type storeAck struct{ observed, at time.Time }

func (s *storeAcks) ApplyShards(ctx context.Context, batches []gateway.ShardBatch) []gateway.ShardResult {
	start := time.Now()
	out := s.Store.ApplyShards(ctx, batches)
	at := time.Now()
	s.mu.Lock()
	defer s.mu.Unlock()
	for i, sb := range batches {
		if out[i].Err != nil {
			continue
		}
		for _, w := range sb.Batch.Writes {
			s.got[w.Device] = append(s.got[w.Device], storeAck{start.Add(-w.Age), at})
		}
	}
	return out
}

func (s *storeAcks) acks(d gateway.DeviceID) []storeAck {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.got[d])
}

// TestStoppedMasterHoldsOnlyItsShards runs the uplink on the real clock
// against a Redis Cluster one of whose masters is hung (SIGSTOP) for
// 5 s, devices renewing every 50 ms on every shard: once the first flush
// after the stop has waited for the call timeout, every write of the
// other masters' shards is acknowledged within a flush interval or so
// (well under the timeout); the hung master's shards are buffered and
// replayed after SIGCONT; no device's writes are acknowledged out of
// order, and no device goes offline. It logs the latencies (observation
// to acknowledgement) of the healthy shards' writes observed during the
// stop (docs/reliability.md, "A hung Cluster master").
func TestStoppedMasterHoldsOnlyItsShards(t *testing.T) {
	const (
		shards   = 8
		interval = 100 * time.Millisecond
		timeout  = 2 * time.Second // the Redis client's call timeout
		stopFor  = 5 * time.Second
	)
	cl := redistest.StartCluster(t, 3)
	for _, n := range cl.Nodes {
		// the other masters keep serving their slots while one is hung
		// (a Cluster without replicas refuses every slot otherwise)
		if err := n.Client(t).ConfigSet(t.Context(), "cluster-require-full-coverage", "no").Err(); err != nil {
			t.Fatal(err)
		}
	}
	rs, err := redisstore.Dial(t.Context(), redisstore.DialConfig{Addrs: cl.Addrs(),
		Options: redisstore.Options{Prefix: "hung", Shards: shards, Logger: testLogger(t)}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rs.Close() })
	master := make([]int, shards)
	for sh := range shards {
		master[sh] = cl.MasterOfKey(t, fmt.Sprintf("{hung:%d}:exp", sh))
	}
	victim := master[0]
	if !slices.ContainsFunc(master, func(m int) bool { return m != victim }) {
		t.Fatal("every shard hashed to one master")
	}
	db, err := statefile.Open(filepath.Join(t.TempDir(), "state.db"), testLogger(t), Migrations)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	ob, err := OpenOutbox(db, OutboxOptions{Shards: shards, Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	store := &storeAcks{Store: rs, got: map[gateway.DeviceID][]storeAck{}}
	u := New(store, ob, Options{Gateway: "gw-hung", Epoch: 1, Lease: 30 * time.Second, FlushInterval: interval,
		Timeout: timeout, ProbeMin: 100 * time.Millisecond, ProbeMax: time.Second, Logger: testLogger(t)})
	ctx, cancel := context.WithCancel(t.Context())
	ran := make(chan error, 1)
	go func() { ran <- u.Run(ctx) }()
	var devs []gateway.DeviceID
	for sh := range shards {
		for i := 0; len(devs) < 2*(sh+1) && i < 10000; i++ {
			if d := gateway.DeviceID(fmt.Sprintf("hung-%d", i)); gateway.ShardOf(d, shards) == sh {
				devs = append(devs, d)
			}
		}
	}
	sendStop := make(chan struct{})
	sent := make(chan struct{})
	go func() {
		defer close(sent)
		kind := gateway.Connect
		for {
			for _, d := range devs {
				if err := u.Enqueue(ctx, evidence(d, kind, time.Now())); err != nil {
					t.Errorf("enqueue %s: %v", d, err)
					return
				}
			}
			kind = gateway.Renew
			select {
			case <-sendStop:
				return
			case <-time.After(50 * time.Millisecond):
			}
		}
	}()
	time.Sleep(time.Second)
	stopped := time.Now()
	cl.Nodes[victim].Signal(syscall.SIGSTOP)
	hung := true
	defer func() {
		if hung {
			cl.Nodes[victim].Signal(syscall.SIGCONT)
		}
	}()
	time.Sleep(stopFor)
	st := u.Status()
	if st.Up || len(st.ShardsDown) == 0 {
		t.Fatalf("status with a master stopped: %+v, want its shards down", st)
	}
	// the flush that found them down waited for the call timeout; the
	// next one carries what queued meanwhile
	settle := st.ShardsDown[0].Since.Add(3 * interval)
	continued := time.Now()
	cl.Nodes[victim].Signal(syscall.SIGCONT)
	hung = false
	waitFor(t, "every shard up and the outbox replayed", 20*time.Second, nil, func() bool {
		st := u.Status()
		return st.Up && st.OutboxSessions == 0
	})
	caughtUp := time.Now()
	time.Sleep(3 * interval)
	close(sendStop)
	<-sent
	cancel()
	if err := <-ran; err != nil {
		t.Fatal(err)
	}

	// Healthy shards: the latency (observation to acknowledgement) of the
	// writes observed during the stop, and how far behind the store was
	// for a device (now less the newest evidence it acknowledged); once
	// the shards were found down, neither near the call timeout.
	var all, settled []time.Duration
	var behind, behindSettled time.Duration
	for _, d := range devs {
		acks := store.acks(d)
		for i, a := range acks {
			if i > 0 && a.observed.Before(acks[i-1].observed) {
				t.Errorf("device %s: evidence of %v acknowledged after that of %v", d,
					a.observed.Format(time.StampMicro), acks[i-1].observed.Format(time.StampMicro))
			}
		}
		if master[gateway.ShardOf(d, shards)] == victim {
			continue
		}
		for _, a := range acks {
			if !a.observed.Before(stopped) && a.observed.Before(continued) {
				lat := a.at.Sub(a.observed)
				all = append(all, lat)
				if a.observed.After(settle) {
					settled = append(settled, lat)
				}
			}
		}
		behind = max(behind, maxLag(acks, stopped, continued))
		behindSettled = max(behindSettled, maxLag(acks, settle, continued))
	}
	if len(settled) == 0 {
		t.Fatal("no write of a healthy shard acknowledged during the stop")
	}
	slices.Sort(all)
	slices.Sort(settled)
	q := func(l []time.Duration, p float64) time.Duration {
		return l[int(p*float64(len(l)-1))].Round(time.Millisecond)
	}
	t.Logf("healthy shards, writes observed during the stop: %d acknowledged, latency p50 %v p99 %v max %v; the store at most %v behind a device",
		len(all), q(all, .5), q(all, .99), q(all, 1), behind.Round(time.Millisecond))
	t.Logf("from %v after the stop on (the shards found down, and a flush more): %d acknowledged, latency p50 %v p99 %v max %v; the store at most %v behind a device",
		settle.Sub(stopped).Round(time.Millisecond), len(settled), q(settled, .5), q(settled, .99), q(settled, 1), behindSettled.Round(time.Millisecond))
	t.Logf("hung master's shards: outbox replayed %v after SIGCONT", caughtUp.Sub(continued).Round(time.Millisecond))
	if behindSettled >= timeout/2 {
		t.Errorf("the store was %v behind a device of a healthy shard with a master stopped, want well under the %v call timeout",
			behindSettled, timeout)
	}
	for _, ev := range allEvents(t, rs) {
		if ev.State != gateway.Online {
			t.Errorf("event %+v: no device stopped sending", ev)
		}
	}
}

// maxLag is how far behind its device the store was at worst between from
// and to, given the device's acknowledgements in the order they came: at
// each moment, that moment less the newest evidence acknowledged by then.
func maxLag(acks []storeAck, from, to time.Time) time.Duration {
	var (
		newest time.Time
		worst  time.Duration
	)
	at := func(x time.Time) {
		if x.After(from) && !x.After(to) && !newest.IsZero() {
			worst = max(worst, x.Sub(newest))
		}
	}
	for _, a := range acks {
		if a.at.After(to) {
			break
		}
		at(a.at)
		if a.observed.After(newest) {
			newest = a.observed
		}
	}
	at(to)
	return worst
}

// A replay round reads the entries of the shards it wants only: those of
// the others are passed over, and do not count against its scan.
func TestOldestRecordsOfWantedShards(t *testing.T) {
	_, e := newEmbeddedUplink(t, Options{})
	e.clock.Advance(time.Minute) // every entry is observed before now
	var items []item
	for i, d := range devicesIn(0, 3, "other") {
		items = append(items, item{key{d, "s"}, slot{kind: gateway.Renew, at: at(2 * i)}})
	}
	wanted := devicesIn(2, 2, "wanted")
	for i, d := range wanted {
		items = append(items, item{key{d, "s"}, slot{kind: gateway.Renew, at: at(2*i + 1)}})
	}
	if _, _, err := e.ob.put(items); err != nil {
		t.Fatal(err)
	}
	want := make([]bool, testShards)
	want[2] = true
	perShard, unknown, bad, err := e.ob.oldestRecords(want, 10, len(wanted), nil)
	if err != nil || len(unknown) != 0 || len(bad) != 0 {
		t.Fatal(err, unknown, bad)
	}
	var got []gateway.DeviceID
	for sh, recs := range perShard {
		for _, r := range recs {
			if sh != 2 {
				t.Errorf("entry of shard %d read: %s", sh, r.device)
			}
			got = append(got, r.device)
		}
	}
	if !slices.Equal(got, wanted) {
		t.Fatalf("entries read %v, want shard 2's %v", got, wanted)
	}
}

// A leave waits the leave grace in the queue of a shard that is down as
// well: the outbox's replay writes it at once, so without the wait a
// device that moved to another gateway and said goodbye here would be
// offline whenever this gateway's shard was down at the time.
func TestLeaveGraceWhileShardDown(t *testing.T) {
	const interval = time.Second
	sick := &sickShard{sick: 1}
	e := newEnv(t, Options{FlushInterval: interval, ProbeMin: time.Minute, ProbeMax: time.Minute},
		OutboxOptions{}, func(db *bolt.DB, c *clocktest.Clock) gateway.Store {
			sick.Store = embeddedStore(t)(db, c)
			return sick
		})
	u, ctx := e.u, t.Context()
	d := devicesIn(1, 1, "leaver")[0]
	mustEnqueue(t, u, evidence(d, gateway.Connect, e.clock.Now()))
	if err := u.flushOnce(ctx, true); err != nil {
		t.Fatal(err)
	}
	sick.ill.Store(true)
	mustEnqueue(t, u, evidence(devicesIn(1, 1, "other")[0], gateway.Connect, e.clock.Now()))
	if err := u.flushOnce(ctx, true); err != nil {
		t.Fatal(err)
	}
	if st := u.Status(); len(st.ShardsDown) != 1 {
		t.Fatalf("status after shard 1 failed: %+v, want it down", st)
	}
	mustEnqueue(t, u, evidence(d, gateway.Leave, e.clock.Now()))
	e.clock.Advance(LeaveGraceFlushes*interval - time.Millisecond)
	if err := u.flushOnce(ctx, false); err != nil {
		t.Fatal(err)
	}
	if st := u.Status(); st.Pending != 1 || st.OutboxSessions != 1 {
		t.Fatalf("inside the leave grace: %+v; want the leave pending, the other connect alone in the outbox", st)
	}
	e.clock.Advance(time.Millisecond)
	if err := u.flushOnce(ctx, false); err != nil {
		t.Fatal(err)
	}
	if st := u.Status(); st.Pending != 0 || st.OutboxSessions != 2 {
		t.Fatalf("after the leave grace: %+v; want the leave in the outbox", st)
	}
}
