package diskq

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/fleetgate/fleetgate/gateway"
	"github.com/fleetgate/fleetgate/gateway/clocktest"
)

// fixture is a queue in a file of its own on a manual clock.
type fixture struct {
	t     *testing.T
	path  string
	o     Options
	clock *clocktest.Clock
	q     *Queue
}

func newFixture(t *testing.T, o Options) *fixture {
	t.Helper()
	f := &fixture{t: t, path: filepath.Join(t.TempDir(), "bridge.db"), clock: clocktest.New(t0)}
	o.Path, o.Clock = f.path, f.clock
	if o.MaxBytes == 0 {
		o.MaxBytes = 1 << 20
	}
	o.Logger = slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelWarn}))
	f.o = o
	f.open()
	t.Cleanup(func() {
		if err := f.q.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return f
}

func (f *fixture) open() {
	f.t.Helper()
	q, err := Open(f.o)
	if err != nil {
		f.t.Fatalf("Open: %v", err)
	}
	f.q = q
}

func (f *fixture) reopen() {
	f.t.Helper()
	if err := f.q.Close(); err != nil {
		f.t.Fatalf("Close: %v", err)
	}
	f.open()
}

// msg is message i of the fixture, received now.
func (f *fixture) msg(i int) gateway.Message {
	return gateway.Message{Device: "dev-1", Topic: fmt.Sprintf("t/%d", i), Payload: []byte("payload"), QoS: 1, Received: f.clock.Now(), Source: "mqtt"}
}

func (f *fixture) put(msgs ...gateway.Message) {
	f.t.Helper()
	if _, err := f.q.Put(context.Background(), msgs); err != nil {
		f.t.Fatalf("Put: %v", err)
	}
}

// topics reads everything there is and returns the topics in order.
func (f *fixture) topics() []string {
	f.t.Helper()
	got, err := f.q.Read(done(), 0, 1000)
	if err != nil && !errors.Is(err, context.Canceled) {
		f.t.Fatalf("Read: %v", err)
	}
	var out []string
	for _, m := range got {
		out = append(out, m.Topic)
	}
	return out
}

// update changes the file under the queue, in its bucket.
func (f *fixture) update(fn func(b, msgs *bolt.Bucket) error) {
	f.t.Helper()
	if err := f.q.db.Update(func(tx *bolt.Tx) error {
		b := tx.Bucket(f.q.bucket)
		return fn(b, b.Bucket(bucketMsgs))
	}); err != nil {
		f.t.Fatal(err)
	}
}

// damage flips a byte in the value of message id.
func (f *fixture) damage(id uint64) {
	f.t.Helper()
	f.update(func(_, msgs *bolt.Bucket) error {
		v := msgs.Get(idKey(id))
		if v == nil {
			return fmt.Errorf("no message %d", id)
		}
		w := append([]byte(nil), v...)
		w[len(w)-1] ^= 0x40
		return msgs.Put(idKey(id), w)
	})
}

func done() context.Context {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	return ctx
}

func equal(a, b []string) bool { return fmt.Sprint(a) == fmt.Sprint(b) }

// A damaged message is dropped when Read comes to it and counted under
// gateway.DropCorrupt; the messages around it are read, the queue's counts go
// down, and its bytes are zero once it is empty.
func TestDamagedDroppedAtRead(t *testing.T) {
	f := newFixture(t, Options{})
	f.put(f.msg(1), f.msg(2), f.msg(3))
	f.damage(2)
	if got := f.topics(); !equal(got, []string{"t/1", "t/3"}) {
		t.Fatalf("read %v, want t/1 and t/3", got)
	}
	s := f.q.Stats()
	if s.Messages != 2 || s.Dropped[gateway.DropCorrupt] != 1 {
		t.Fatalf("Stats %+v, want 2 messages, 1 dropped as corrupt", s)
	}
	if err := f.q.Ack([]uint64{1, 3}); err != nil {
		t.Fatal(err)
	}
	if s := f.q.Stats(); s.Messages != 0 || s.Bytes != 0 {
		t.Fatalf("Stats of the emptied queue %+v", s)
	}
}

// A damaged message at the head is dropped, as corrupt, when a Put
// needs its room; a damaged head does not stop the expiry of the
// messages behind it at Read.
func TestDamagedHeadDroppedForRoom(t *testing.T) {
	f := newFixture(t, Options{MaxBytes: 3 * int64(gateway.Message{Device: "dev-1", Topic: "t/1", Payload: []byte("payload"), Source: "mqtt"}.Size())})
	f.put(f.msg(1), f.msg(2), f.msg(3))
	f.damage(1)
	f.put(f.msg(4))
	s := f.q.Stats()
	if s.Messages != 3 || s.Dropped[gateway.DropCorrupt] != 1 || s.Dropped[gateway.DropFull] != 0 {
		t.Fatalf("Stats %+v, want 3 messages and the damaged one dropped as corrupt", s)
	}
	if got := f.topics(); !equal(got, []string{"t/2", "t/3", "t/4"}) {
		t.Fatalf("read %v", got)
	}
}

// Read drops at most scanDrops messages per commit and goes on until it
// has found a message or looked at them all.
func TestReadDropsInRounds(t *testing.T) {
	f := newFixture(t, Options{MaxAge: time.Minute})
	var old []gateway.Message
	for i := range 2*scanDrops + 10 {
		m := f.msg(i)
		m.Received = f.clock.Now().Add(-time.Hour)
		old = append(old, m)
	}
	fresh := f.msg(-1)
	f.put(append(old, fresh)...)
	before := f.q.commits.Load()
	if got := f.topics(); !equal(got, []string{"t/-1"}) {
		t.Fatalf("read %v, want the fresh message only", got)
	}
	if n := f.q.commits.Load() - before; n != 3 {
		t.Fatalf("Read dropped %d expired messages in %d commits, want 3", len(old), n)
	}
	if s := f.q.Stats(); s.Dropped[gateway.DropExpired] != uint64(len(old)) || s.Messages != 1 {
		t.Fatalf("Stats %+v", s)
	}
}

// Open reads the queue's size from its meta record; an unreadable one,
// or one behind the last message, is rebuilt by counting the messages,
// and IDs go on after the last one.
func TestMetaRebuilt(t *testing.T) {
	for name, damage := range map[string]func(b *bolt.Bucket) error{
		"missing":   func(b *bolt.Bucket) error { return b.Delete(keyMeta) },
		"too short": func(b *bolt.Bucket) error { return b.Put(keyMeta, []byte{format, 1}) },
		"behind": func(b *bolt.Bucket) error {
			return b.Put(keyMeta, meta{last: 1, count: 1, bytes: 1}.encode())
		},
	} {
		t.Run(name, func(t *testing.T) {
			f := newFixture(t, Options{})
			f.put(f.msg(1), f.msg(2), f.msg(3))
			want := f.q.Stats()
			f.update(func(b, _ *bolt.Bucket) error { return damage(b) })
			f.reopen()
			if s := f.q.Stats(); s.Messages != want.Messages || s.Bytes != want.Bytes || !s.Oldest.Equal(want.Oldest) {
				t.Fatalf("Stats after the rebuild %+v, want %+v", s, want)
			}
			f.put(f.msg(4))
			got, err := f.q.Read(done(), 3, 10)
			if err != nil || len(got) != 1 || got[0].ID != 4 {
				t.Fatalf("Read after 3 = %v, %v; want message 4 with ID 4", got, err)
			}
		})
	}
}

// A queue written by a newer release is refused, and the file left as
// it is.
func TestNewerFormatRefused(t *testing.T) {
	f := newFixture(t, Options{})
	f.put(f.msg(1))
	newer := append([]byte{format + 1}, make([]byte, metaLen-1)...)
	f.update(func(b, _ *bolt.Bucket) error { return b.Put(keyMeta, newer) })
	if err := f.q.Close(); err != nil {
		t.Fatal(err)
	}
	before, err := os.ReadFile(f.path)
	if err != nil {
		t.Fatal(err)
	}
	if q, err := Open(f.o); !errors.Is(err, ErrNewerFormat) {
		if q != nil {
			q.Close()
		}
		t.Fatalf("Open of a newer queue = %v, want ErrNewerFormat", err)
	}
	after, err := os.ReadFile(f.path)
	if err != nil {
		t.Fatal(err)
	}
	if string(before) != string(after) {
		t.Fatal("Open of a newer queue changed the file")
	}
	// Let the cleanup close a queue: a fresh one elsewhere.
	f.path = filepath.Join(t.TempDir(), "other.db")
	f.o.Path = f.path
	f.open()
}

// Open refuses bounds it cannot keep.
func TestOpenRefusesBadOptions(t *testing.T) {
	dir := t.TempDir()
	for _, o := range []Options{
		{MaxBytes: 0},
		{MaxBytes: -1},
		{MaxBytes: 1, MaxAge: -time.Second},
		{MaxBytes: 1, CommitInterval: -time.Second},
	} {
		o.Path = filepath.Join(dir, "q.db")
		if q, err := Open(o); err == nil {
			q.Close()
			t.Errorf("Open(%+v) succeeded", o)
		}
	}
}

// Puts from many goroutines that wait together share commits: with a
// commit interval, 64 concurrent Puts take a few commits, not 64, and
// each returns within about the interval plus one commit.
func TestGroupCommit(t *testing.T) {
	const every, putters = 50 * time.Millisecond, 64
	f := newFixture(t, Options{CommitInterval: every})
	f.put(f.msg(0)) // a commit: the next ones wait for the interval
	before := f.q.commits.Load()
	var wg sync.WaitGroup
	var mu sync.Mutex
	var longest time.Duration
	for i := range putters {
		wg.Go(func() {
			start := time.Now()
			if _, err := f.q.Put(context.Background(), []gateway.Message{f.msg(i + 1)}); err != nil {
				t.Error(err)
			}
			mu.Lock()
			longest = max(longest, time.Since(start))
			mu.Unlock()
		})
	}
	wg.Wait()
	commits := f.q.commits.Load() - before
	t.Logf("%d Puts in %d commits, the longest waited %v", putters, commits, longest)
	if commits > 4 {
		t.Fatalf("%d concurrent Puts took %d commits", putters, commits)
	}
	// A loaded machine may delay a commit; a second interval is slack.
	if longest > 3*every+time.Second {
		t.Fatalf("a Put waited %v with a commit interval of %v", longest, every)
	}
	if s := f.q.Stats(); s.Messages != putters+1 {
		t.Fatalf("Stats %+v, want %d messages", s, putters+1)
	}
}

// At most one commit per interval: Puts one after another are spaced by
// the interval.
func TestCommitInterval(t *testing.T) {
	const every, puts = 20 * time.Millisecond, 10
	f := newFixture(t, Options{CommitInterval: every})
	f.put(f.msg(0))
	start := time.Now()
	for i := range puts {
		f.put(f.msg(i + 1))
	}
	if took := time.Since(start); took < puts*every-every/2 {
		t.Fatalf("%d Puts one after another took %v with a commit interval of %v", puts, took, every)
	}
}

// A Put whose context ends while it waits for its commit returns the
// context's error; its messages are committed all the same.
func TestPutContextEndsWhileWaiting(t *testing.T) {
	f := newFixture(t, Options{CommitInterval: 300 * time.Millisecond})
	f.put(f.msg(0))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Millisecond)
	defer cancel()
	if _, err := f.q.Put(ctx, []gateway.Message{f.msg(1)}); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Put = %v, want context.DeadlineExceeded", err)
	}
	got, err := f.q.Read(context.Background(), 1, 1)
	if err != nil || len(got) != 1 || got[0].Topic != "t/1" {
		t.Fatalf("Read = %v, %v; want the message of the Put whose context ended", got, err)
	}
}

// Close commits the Puts it finds waiting: each returns nil and its
// message is in the file, or ErrQueueClosed and it is not.
func TestClosePending(t *testing.T) {
	f := newFixture(t, Options{CommitInterval: 200 * time.Millisecond})
	f.put(f.msg(0))
	var wg sync.WaitGroup
	results := make([]error, 16)
	for i := range results {
		wg.Go(func() { _, results[i] = f.q.Put(context.Background(), []gateway.Message{f.msg(i + 1)}) })
	}
	time.Sleep(20 * time.Millisecond)
	if err := f.q.Close(); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	f.open()
	held := map[string]bool{}
	for _, topic := range f.topics() {
		held[topic] = true
	}
	for i, err := range results {
		topic := fmt.Sprintf("t/%d", i+1)
		switch {
		case err == nil && !held[topic]:
			t.Errorf("Put of %s returned nil and is not in the file", topic)
		case errors.Is(err, gateway.ErrQueueClosed) && held[topic]:
			t.Errorf("Put of %s failed and is in the file", topic)
		case err != nil && !errors.Is(err, gateway.ErrQueueClosed):
			t.Errorf("Put of %s: %v", topic, err)
		}
	}
}

// Two queues in one file keep apart: their own IDs, sizes and drops,
// concurrent Puts to both, and one closed leaves the other working.
func TestTwoQueuesInOneFile(t *testing.T) {
	db, err := OpenFile(filepath.Join(t.TempDir(), "bridge.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	up, err := OpenDB(db, Options{Bucket: "up", MaxBytes: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	defer up.Close()
	cmds, err := OpenDB(db, Options{Bucket: "commands", MaxBytes: 300, CommitInterval: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	m := gateway.Message{Device: "dev-1", Topic: "t", Payload: make([]byte, 30), Received: t0}
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			for range 25 {
				if _, err := up.Put(context.Background(), []gateway.Message{m}); err != nil {
					t.Error(err)
				}
				if _, err := cmds.Put(context.Background(), []gateway.Message{m}); err != nil {
					t.Error(err)
				}
			}
		})
	}
	wg.Wait()
	size := int64(m.Size())
	if s := up.Stats(); s.Messages != 100 || s.Bytes != 100*size || s.Dropped[gateway.DropFull] != 0 {
		t.Fatalf("up: %+v", s)
	}
	if s := cmds.Stats(); s.Messages != int(300/size) || s.Dropped[gateway.DropFull] != uint64(100-300/size) {
		t.Fatalf("commands: %+v", s)
	}
	if err := cmds.Close(); err != nil {
		t.Fatal(err)
	}
	got, err := up.Read(done(), 0, 1000)
	if err != nil || len(got) != 100 || got[0].ID != 1 || got[99].ID != 100 {
		t.Fatalf("up holds %d messages (%v), want IDs 1..100", len(got), err)
	}
	if _, err := up.Put(context.Background(), []gateway.Message{m}); err != nil {
		t.Fatalf("Put to one queue after the other closed: %v", err)
	}
}

// Put of no message and Ack of no ID commit nothing (no fsync).
func TestEmptyCallsCommitNothing(t *testing.T) {
	f := newFixture(t, Options{})
	f.put(f.msg(1))
	before := f.q.commits.Load()
	f.put()
	if err := f.q.Ack(nil); err != nil {
		t.Fatal(err)
	}
	if n := f.q.commits.Load() - before; n != 0 {
		t.Fatalf("an empty Put and an empty Ack made %d commits", n)
	}
}
