package uplink

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/fleetgate/fleetgate/gateway"
)

func TestFlushOneStoreCallPerShard(t *testing.T) {
	u, e := newEmbeddedUplink(t, Options{MaxBatch: 10, QueueLimit: 1000})
	// 10 devices in each shard, a connect then a renew each: coalesced to
	// one write per session, so one full batch per shard.
	var devs []gateway.DeviceID
	for sh := range testShards {
		devs = append(devs, devicesIn(sh, 25, "d")...)
	}
	for _, d := range devs {
		mustEnqueue(t, u, evidence(d, gateway.Connect, t0.Add(-2*time.Second)))
	}
	for _, d := range devs {
		mustEnqueue(t, u, evidence(d, gateway.Renew, t0.Add(-time.Second)))
	}
	if got := u.Status().Pending; got != len(devs) {
		t.Fatalf("pending %d, want %d (one write per session)", got, len(devs))
	}
	if err := u.flushOnce(context.Background(), true); err != nil {
		t.Fatal(err)
	}
	calls := e.store.Calls()
	if len(calls) != testShards {
		t.Fatalf("one flush made %d store calls, want %d (one per shard): %+v", len(calls), testShards, calls)
	}
	seen := map[int]bool{}
	for _, c := range calls {
		if c.writes != 10 || c.replay || c.err != nil || seen[c.shard] {
			t.Fatalf("call %+v: want 10 writes, no replay, no error, one per shard", c)
		}
		seen[c.shard] = true
	}
	if err := u.Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	for _, c := range e.store.Calls() {
		if c.writes > 10 {
			t.Fatalf("batch of %d writes over MaxBatch 10", c.writes)
		}
	}
	if n := len(e.store.Calls()); n != 3*testShards {
		t.Fatalf("%d store calls for 25 sessions per shard at MaxBatch 10, want %d", n, 3*testShards)
	}
	for _, d := range devs {
		info, err := e.store.Device(context.Background(), d)
		if err != nil || info.State != gateway.Online {
			t.Fatalf("device %s: %+v, %v; want online", d, info, err)
		}
	}
	for _, ev := range allEvents(t, e.store) {
		if ev.Reason != gateway.ReasonConnect {
			t.Fatalf("event %+v: want reason connect (a coalesced connect stays a connect)", ev)
		}
	}
	if got := metricValue(t, e.reg, "fleetgate_renewals_written_total", "kind", "connect"); got != float64(len(devs)) {
		t.Fatalf("fleetgate_renewals_written_total{kind=connect} = %v, want %d", got, len(devs))
	}
}

func TestRunFlushesAtMaxBatchAndInterval(t *testing.T) {
	u, e := newEmbeddedUplink(t, Options{MaxBatch: 8, FlushInterval: time.Second})
	e.run()
	waitFor(t, "flush timer armed", 5*time.Second, nil, func() bool { return e.clock.Timers() == 1 })
	for _, d := range devicesIn(1, 8, "full") {
		mustEnqueue(t, u, evidence(d, gateway.Connect, t0))
	}
	waitFor(t, "flush at MaxBatch without the clock moving", 5*time.Second, nil, func() bool {
		return len(e.store.Calls()) == 1 && u.Status().Pending == 0
	})
	mustEnqueue(t, u, evidence(devicesIn(2, 1, "late")[0], gateway.Renew, t0))
	waitFor(t, "flush timer re-armed", 5*time.Second, nil, func() bool { return e.clock.Timers() == 1 })
	if n := len(e.store.Calls()); n != 1 {
		t.Fatalf("%d store calls before the interval passed, want 1", n)
	}
	e.clock.Advance(time.Second)
	waitFor(t, "flush at the interval", 5*time.Second, nil, func() bool { return len(e.store.Calls()) == 2 })
	if c := e.store.Calls()[1]; c.shard != 2 || c.writes != 1 {
		t.Fatalf("interval flush %+v, want shard 2 with 1 write", c)
	}
}

func TestEnqueueBackpressure(t *testing.T) {
	u, e := newEmbeddedUplink(t, Options{MaxBatch: 2, QueueLimit: 4})
	devs := devicesIn(0, 6, "bp")
	for _, d := range devs[:4] {
		mustEnqueue(t, u, evidence(d, gateway.Renew, t0))
	}
	// A renew of a pending session coalesces and is taken at the limit.
	mustEnqueue(t, u, evidence(devs[0], gateway.Renew, t0.Add(time.Second)))

	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	err := u.Enqueue(ctx, evidence(devs[4], gateway.Renew, t0))
	cancel()
	if !errors.Is(err, gateway.ErrOverloaded) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Enqueue over the limit = %v, want ErrOverloaded and DeadlineExceeded", err)
	}
	if p := u.Status().Pending; p != 4 {
		t.Fatalf("pending %d, want the limit 4", p)
	}
	done := make(chan error, 1)
	go func() { done <- u.Enqueue(context.Background(), evidence(devs[5], gateway.Renew, t0)) }()
	if err := u.flushOnce(context.Background(), true); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("blocked Enqueue returned %v after a flush", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Enqueue still blocked after a flush made room")
	}
	if err := u.Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	for _, d := range []gateway.DeviceID{devs[0], devs[5]} {
		if info, err := e.store.Device(context.Background(), d); err != nil || info.State != gateway.Online {
			t.Fatalf("device %s: %+v, %v; want online", d, info, err)
		}
	}
	if _, err := e.store.Device(context.Background(), devs[4]); !errors.Is(err, gateway.ErrNotFound) {
		t.Fatalf("refused evidence reached the store: %v", err)
	}
}

func TestFencedBatchDroppedNotBuffered(t *testing.T) {
	newer, e := newEmbeddedUplink(t, Options{Gateway: "gw", Epoch: 2})
	for sh := range testShards {
		mustEnqueue(t, newer, evidence(devicesIn(sh, 1, "new")[0], gateway.Connect, t0))
	}
	if err := newer.Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	stale := New(e.store, e.ob, Options{Gateway: "gw", Epoch: 1, Clock: e.clock, Logger: testLogger(t)})
	devs := append(devicesIn(0, 2, "stale"), devicesIn(3, 1, "stale")...)
	for _, d := range devs {
		mustEnqueue(t, stale, evidence(d, gateway.Connect, t0))
	}
	if err := stale.Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	st := stale.Status()
	if st.Dropped.Fenced != 3 || st.OutboxSessions != 0 || !st.Up {
		t.Fatalf("status %+v: want 3 fenced writes dropped, nothing buffered, still up", st)
	}
	for _, d := range devs {
		if _, err := e.store.Device(context.Background(), d); !errors.Is(err, gateway.ErrNotFound) {
			t.Fatalf("fenced write of %s reached the store: %v", d, err)
		}
	}
}

func TestBufferedSessionNotOvertakenByNewEvidence(t *testing.T) {
	// An outbox left by a previous process holds a connect; the new
	// process sees the device leave before the replay. The leave must not
	// reach the store before the older connect.
	u, e := newEmbeddedUplink(t, Options{})
	if _, _, err := e.ob.put([]item{{key{"dev-a", "coap/default"}, slot{kind: gateway.Connect, at: t0.Add(-10 * time.Second)}}}); err != nil {
		t.Fatal(err)
	}
	mustEnqueue(t, u, evidence("dev-a", gateway.Leave, t0.Add(-time.Second)))
	if err := u.Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	if n := len(e.store.Calls()); n != 0 {
		t.Fatalf("flush went to the store (%d calls) while the outbox was not replayed", n)
	}
	if got := e.ob.Len(); got != 1 {
		t.Fatalf("outbox holds %d sessions, want 1 (coalesced)", got)
	}
	e.run()
	waitFor(t, "outbox replayed", 10*time.Second, nil, func() bool { return e.ob.Len() == 0 })
	info, err := e.store.Device(context.Background(), "dev-a")
	if err == nil && info.State == gateway.Online {
		t.Fatalf("device online after its leave was replayed: %+v", info)
	}
	for _, c := range e.store.Calls() {
		if !c.replay {
			t.Fatalf("call %+v is not a replay", c)
		}
	}
}

func TestOutboxCoalescesAndEvictsOldest(t *testing.T) {
	_, e := newEmbeddedUplink(t, Options{})
	e.clock.Advance(time.Minute) // every entry is observed before now
	ob, err := OpenOutbox(e.db, OutboxOptions{Shards: 1, MaxSessions: 5, Clock: e.clock})
	if err != nil {
		t.Fatal(err)
	}
	put := func(d string, k gateway.Kind, sec int) int {
		t.Helper()
		var s slot
		s.add(k, at(sec), 0)
		n, _, err := ob.put([]item{{key{gateway.DeviceID(d), "s"}, s}})
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	for i := range 5 {
		put(fmt.Sprintf("d%d", i), gateway.Renew, i)
	}
	// d0 renews: its entry moves to the back of the time order.
	put("d0", gateway.Renew, 10)
	if ob.Len() != 5 || !ob.Oldest().Equal(at(1)) {
		t.Fatalf("len %d oldest %v, want 5 and %v", ob.Len(), ob.Oldest(), at(1))
	}
	if n := put("d5", gateway.Connect, 11); n != 1 {
		t.Fatalf("evicted %d writes, want 1", n)
	}
	perShard, _, bad, err := ob.oldestRecords([]bool{true}, 100, 100, nil)
	if err != nil || len(bad) != 0 {
		t.Fatal(err, bad)
	}
	var got []string
	for _, r := range perShard[0] {
		got = append(got, fmt.Sprintf("%s@%d", r.device, int(r.first().Sub(t0)/time.Second)))
	}
	want := "[d2@2 d3@3 d4@4 d0@10 d5@11]"
	if fmt.Sprint(got) != want {
		t.Fatalf("entries oldest first %v, want %s", got, want)
	}
	// Reopening recounts the same state from the file.
	again, err := OpenOutbox(e.db, OutboxOptions{Shards: 1, MaxSessions: 5, Clock: e.clock})
	if err != nil || again.Len() != 5 || !again.Oldest().Equal(at(2)) {
		t.Fatalf("reopened: len %d oldest %v err %v", again.Len(), again.Oldest(), err)
	}
}

func TestReplayRemovesOnlyUnchangedEntries(t *testing.T) {
	_, e := newEmbeddedUplink(t, Options{})
	k := key{"d", "s"}
	if _, _, err := e.ob.put([]item{{k, slot{kind: gateway.Renew, at: at(1)}}}); err != nil {
		t.Fatal(err)
	}
	perShard, _, _, err := e.ob.oldestRecords(everyShard(testShards), 10, 10, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := e.ob.put([]item{{k, slot{kind: gateway.Renew, at: at(2)}}}); err != nil {
		t.Fatal(err)
	}
	if err := e.ob.remove(perShard[gateway.ShardOf(k.device, testShards)], nil); err != nil {
		t.Fatal(err)
	}
	if e.ob.Len() != 1 || !e.ob.Oldest().Equal(at(2)) {
		t.Fatalf("newer entry removed with the replayed one: len %d oldest %v", e.ob.Len(), e.ob.Oldest())
	}
}

func TestOpenOutboxRebuildsDamagedIndex(t *testing.T) {
	_, e := newEmbeddedUplink(t, Options{})
	e.clock.Advance(time.Minute) // every entry is observed before now
	var items []item
	for i, d := range []gateway.DeviceID{"a", "b", "c"} {
		items = append(items, item{key{d, "s"}, slot{kind: gateway.Renew, at: at(i)}})
	}
	if _, _, err := e.ob.put(items); err != nil {
		t.Fatal(err)
	}
	err := e.db.Update(func(tx *bolt.Tx) error {
		tb := tx.Bucket(bucketByTime)
		k, _ := tb.Cursor().First() // a's index entry
		if err := tb.Delete(k); err != nil {
			return err
		}
		return tx.Bucket(bucketSessions).Put(sessionKey(key{"c", "s"}), []byte("garbage"))
	})
	if err != nil {
		t.Fatal(err)
	}
	ob, err := OpenOutbox(e.db, OutboxOptions{Shards: 1, Logger: testLogger(t), Clock: e.clock})
	if err != nil {
		t.Fatal(err)
	}
	if ob.Len() != 2 || !ob.Oldest().Equal(at(0)) {
		t.Fatalf("rebuilt outbox: len %d oldest %v, want 2 and %v", ob.Len(), ob.Oldest(), at(0))
	}
	if _, _, err := ob.put([]item{{key{"d", "s"}, slot{kind: gateway.Renew, at: at(0)}}}); err != nil {
		t.Fatal(err)
	}
	perShard, _, bad, err := ob.oldestRecords([]bool{true}, 10, 10, nil)
	if err != nil || len(bad) != 0 {
		t.Fatal(err, bad)
	}
	var got []string
	seqs := map[uint64]bool{}
	for _, r := range perShard[0] {
		got = append(got, string(r.device))
		seqs[r.seq] = true
	}
	if fmt.Sprint(got) != "[a d b]" || len(seqs) != 3 {
		t.Fatalf("entries %v with %d distinct sequence numbers, want [a d b] and 3", got, len(seqs))
	}
}

func TestSetTimingAppliesToNextFlush(t *testing.T) {
	u, e := newEmbeddedUplink(t, Options{MaxBatch: 10})
	u.SetTiming(30*time.Second, 2*time.Second, 4)
	if tm := u.timing(); tm.lease != 30*time.Second || tm.interval != 2*time.Second || tm.maxBatch != 4 || tm.queueLimit != 16 {
		t.Fatalf("timing %+v after SetTiming(30s, 2s, 4)", tm)
	}
	for _, d := range devicesIn(0, 10, "st") {
		mustEnqueue(t, u, evidence(d, gateway.Renew, t0))
	}
	if err := u.flushOnce(context.Background(), true); err != nil {
		t.Fatal(err)
	}
	if calls := e.store.Calls(); len(calls) != 1 || calls[0].writes != 4 {
		t.Fatalf("calls %+v, want one batch of 4", calls)
	}
	info, err := e.store.Device(context.Background(), devicesIn(0, 1, "st")[0])
	if err != nil || !info.Deadline.Equal(t0.Add(30*time.Second)) {
		t.Fatalf("device %+v, %v: want deadline now + the new lease", info, err)
	}
}

// A leave waits LeaveGraceFlushes flush intervals in the queue, so that a
// device that moved to another gateway and then said goodbye here is not
// offline in between (the other gateway's connect lands first); renewals
// of other sessions are not held back, and the final flush sends it.
func TestLeaveGrace(t *testing.T) {
	u, e := newEmbeddedUplink(t, Options{FlushInterval: time.Second})
	d, other := devicesIn(0, 1, "lg")[0], devicesIn(0, 1, "other")[0]
	mustEnqueue(t, u, evidence(d, gateway.Connect, t0))
	if err := u.flushOnce(context.Background(), false); err != nil {
		t.Fatal(err)
	}
	e.clock.Set(t0.Add(time.Second))
	mustEnqueue(t, u, evidence(d, gateway.Leave, e.clock.Now()), evidence(other, gateway.Connect, e.clock.Now()))
	e.clock.Advance(LeaveGraceFlushes*time.Second - time.Millisecond)
	if err := u.flushOnce(context.Background(), false); err != nil {
		t.Fatal(err)
	}
	if info, err := e.store.Device(context.Background(), d); err != nil || info.State != gateway.Online {
		t.Fatalf("device %s inside the leave grace: %+v %v, want still online", d, info, err)
	}
	if info, err := e.store.Device(context.Background(), other); err != nil || info.State != gateway.Online {
		t.Fatalf("another device's connect was held back with the leave: %+v %v", info, err)
	}
	if got := u.Status().Pending; got != 1 {
		t.Fatalf("pending %d, want the leave", got)
	}
	e.clock.Advance(time.Millisecond)
	if err := u.flushOnce(context.Background(), false); err != nil {
		t.Fatal(err)
	}
	if info, err := e.store.Device(context.Background(), d); err != nil || info.State != gateway.Offline {
		t.Fatalf("device %s after the leave grace: %+v %v, want offline", d, info, err)
	}

	// The final flush does not wait.
	mustEnqueue(t, u, evidence(other, gateway.Leave, e.clock.Now()))
	if err := u.Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	if info, _ := e.store.Device(context.Background(), other); info.State != gateway.Offline {
		t.Fatalf("final flush kept the leave: %+v", info)
	}
}
