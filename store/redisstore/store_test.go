package redisstore

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/fleetgate/fleetgate/gateway"
)

func ms(d time.Duration) time.Time { return time.UnixMilli(startMs).Add(d) }

func TestLifecycle(t *testing.T) {
	forBackends(t, func(t *testing.T, c redis.UniversalClient) {
		e := newEnv(t, c, 4)
		dev := devicesIn(t, 4, 2, 1, "life")[0]
		evs := e.apply(2, batch("gw-a", 1, write(dev, "gw-a/1/7", gateway.Connect, 2*time.Second)))
		if len(evs) != 1 || evs[0].State != gateway.Online || evs[0].Ver != ver(0, 1) || evs[0].Reason != gateway.ReasonConnect ||
			evs[0].Gateway != "gw-a" || evs[0].Session != "gw-a/1/7" || !evs[0].At.Equal(ms(0)) || evs[0].Shard != 2 {
			t.Fatalf("connect events: %s", describe(evs))
		}
		d := e.device(dev)
		if d.State != gateway.Online || d.Ver != ver(0, 1) || !d.Deadline.Equal(ms(88*time.Second)) || !d.Since.Equal(ms(0)) ||
			len(d.Sessions) != 1 || d.Sessions[0].ID != "gw-a/1/7" || d.Sessions[0].Gateway != "gw-a" || d.Sessions[0].Epoch != 1 {
			t.Fatalf("after connect: %+v", d)
		}

		// A second session from another gateway; a renewal of the first.
		e.clock.Advance(10 * time.Second)
		evs = e.apply(2, batch("gw-b", 4,
			write(dev, "coap/default", gateway.Renew, 0),
			write(dev, "coap/default", gateway.Renew, 0)))
		if len(evs) != 0 {
			t.Fatalf("second session wrote events: %s", describe(evs))
		}
		e.clock.Advance(5 * time.Second)
		e.apply(2, batch("gw-a", 1, write(dev, "gw-a/1/7", gateway.Renew, time.Second)))
		d = e.device(dev)
		slices.SortFunc(d.Sessions, func(a, b gateway.SessionInfo) int { return strings.Compare(string(a.ID), string(b.ID)) })
		want := []gateway.SessionInfo{
			{ID: "coap/default", Deadline: ms(100 * time.Second), Gateway: "gw-b", Epoch: 4},
			{ID: "gw-a/1/7", Deadline: ms(104 * time.Second), Gateway: "gw-a", Epoch: 1},
		}
		if !slices.EqualFunc(d.Sessions, want, sameSession) || !d.Deadline.Equal(ms(104*time.Second)) ||
			d.Gateway != "gw-a" || d.Session != "gw-a/1/7" {
			t.Fatalf("two sessions: %+v", d)
		}

		// Leaving one session keeps the device online; the deadline drops
		// to the other session's.
		if evs := e.apply(2, batch("gw-a", 1, write(dev, "gw-a/1/7", gateway.Leave, 0))); len(evs) != 0 {
			t.Fatalf("leave of one of two sessions: %s", describe(evs))
		}
		d = e.device(dev)
		if d.State != gateway.Online || !d.Deadline.Equal(ms(100*time.Second)) || len(d.Sessions) != 1 {
			t.Fatalf("after first leave: %+v", d)
		}
		e.clock.Advance(time.Second)
		evs = e.apply(2, batch("gw-b", 4, write(dev, "coap/default", gateway.Leave, 0)))
		if len(evs) != 1 || evs[0].State != gateway.Offline || evs[0].Reason != gateway.ReasonLeave || evs[0].Ver != ver(0, 2) ||
			!evs[0].At.Equal(ms(16*time.Second)) || evs[0].Session != "coap/default" || evs[0].Gateway != "gw-b" {
			t.Fatalf("last leave: %s", describe(evs))
		}
		d = e.device(dev)
		if d.State != gateway.Offline || d.Ver != ver(0, 2) || !d.Since.Equal(ms(16*time.Second)) || !d.Deadline.IsZero() ||
			len(d.Sessions) != 0 || d.Session != "coap/default" || d.Gateway != "gw-b" {
			t.Fatalf("offline: %+v", d)
		}
		if n, err := c.ZCard(e.ctx, e.store.keys[2].data[0]).Result(); err != nil || n != 0 {
			t.Fatalf("deadline index after leave: %d entries, %v", n, err)
		}
		// The record outlives the sessions: the next connect is ver 3.
		evs = e.apply(2, batch("gw-a", 1, write(dev, "gw-a/1/8", gateway.Connect, 0)))
		if len(evs) != 1 || evs[0].Ver != ver(0, 3) || evs[0].State != gateway.Online {
			t.Fatalf("reconnect: %s", describe(evs))
		}
		if got := e.events(2); len(got) != 3 {
			t.Fatalf("log: %s", describe(got))
		} else {
			checkAlternation(t, got)
		}
	})
}

func sameSession(a, b gateway.SessionInfo) bool {
	return a.ID == b.ID && a.Deadline.Equal(b.Deadline) && a.Gateway == b.Gateway && a.Epoch == b.Epoch
}

// A renewal after the deadline but before the runner reaped the device
// writes offline (expired, at the old deadline) and then online.
func TestExpiredThenRenewed(t *testing.T) {
	forBackends(t, func(t *testing.T, c redis.UniversalClient) {
		e := newEnv(t, c, 2)
		dev := devicesIn(t, 2, 1, 1, "exp")[0]
		b := gateway.Batch{Gateway: "gw", Epoch: 1, Lease: 10 * time.Second,
			Writes: []gateway.Write{write(dev, "coap/x", gateway.Connect, 0)}}
		e.apply(1, b)
		e.clock.Advance(15 * time.Second)
		b.Writes[0].Kind = gateway.Renew
		evs := e.apply(1, b)
		if len(evs) != 2 ||
			evs[0].State != gateway.Offline || evs[0].Reason != gateway.ReasonExpired || evs[0].Ver != ver(0, 2) ||
			!evs[0].Deadline.Equal(ms(10*time.Second)) || !evs[0].At.Equal(ms(15*time.Second)) ||
			evs[1].State != gateway.Online || evs[1].Reason != gateway.ReasonRenew || evs[1].Ver != ver(0, 3) {
			t.Fatalf("events: %s", describe(evs))
		}
		d := e.device(dev)
		if d.State != gateway.Online || d.Ver != ver(0, 3) || !d.Deadline.Equal(ms(25*time.Second)) || !d.Since.Equal(ms(15*time.Second)) {
			t.Fatalf("device: %+v", d)
		}
		if r := e.reap(1, 10); len(r.Offline) != 0 || r.More || !r.Next.Equal(ms(25*time.Second)) {
			t.Fatalf("reap found %+v", r)
		}
		checkAlternation(t, e.events(1))
	})
}

func TestLapsedAndStaleEvidence(t *testing.T) {
	forBackends(t, func(t *testing.T, c redis.UniversalClient) {
		e := newEnv(t, c, 1)
		// Evidence older than the lease is never written.
		if evs := e.apply(0, batch("gw", 1, write("lapsed", "s", gateway.Connect, 90*time.Second))); len(evs) != 0 {
			t.Fatalf("lapsed connect: %s", describe(evs))
		}
		if _, err := e.store.Device(e.ctx, "lapsed"); !errors.Is(err, gateway.ErrNotFound) {
			t.Fatalf("lapsed device: %v, want ErrNotFound", err)
		}
		// A leave older than the session's newest evidence is ignored; a
		// renewal older than the deadline extends nothing.
		e.apply(0, batch("gw", 1, write("d", "s", gateway.Renew, 0)))
		e.clock.Advance(time.Second)
		e.apply(0, batch("gw", 1, write("d", "s", gateway.Renew, 30*time.Second)))
		if evs := e.apply(0, batch("gw", 1, write("d", "s", gateway.Leave, 2*time.Second))); len(evs) != 0 {
			t.Fatalf("stale leave: %s", describe(evs))
		}
		d := e.device("d")
		if d.State != gateway.Online || !d.Deadline.Equal(ms(90*time.Second)) {
			t.Fatalf("after stale writes: %+v", d)
		}
		// Replaying a batch twice writes nothing new.
		b := batch("gw", 1, write("d", "s", gateway.Leave, 0), write("d", "s", gateway.Connect, 0))
		b.Replay = true
		first := e.apply(0, b)
		if len(first) != 2 || first[1].Reason != gateway.ReasonReplay {
			t.Fatalf("replay: %s", describe(first))
		}
		b.Writes = b.Writes[1:]
		if again := e.apply(0, b); len(again) != 0 {
			t.Fatalf("replayed twice: %s", describe(again))
		}
	})
}

func TestFencing(t *testing.T) {
	forBackends(t, func(t *testing.T, c redis.UniversalClient) {
		e := newEnv(t, c, 1)
		e.apply(0, batch("gw", 5, write("d", "gw/5/1", gateway.Connect, 0)))
		before := e.device("d")
		e.clock.Advance(time.Second)
		_, err := e.store.Apply(e.ctx, 0, batch("gw", 4,
			write("d", "gw/5/1", gateway.Leave, 0),
			write("e", "gw/4/1", gateway.Connect, 0)))
		if !errors.Is(err, gateway.ErrFenced) {
			t.Fatalf("stale epoch: %v, want ErrFenced", err)
		}
		if after := e.device("d"); after.State != before.State || !after.Deadline.Equal(before.Deadline) || after.Ver != before.Ver {
			t.Fatalf("fenced batch changed the device: %+v -> %+v", before, after)
		}
		if _, err := e.store.Device(e.ctx, "e"); !errors.Is(err, gateway.ErrNotFound) {
			t.Fatalf("fenced connect created a device: %v", err)
		}
		if got := e.events(0); len(got) != 1 {
			t.Fatalf("log after fenced batch: %s", describe(got))
		}
		// A newer epoch is accepted and then fences the older one; another
		// gateway is not affected.
		e.apply(0, batch("gw", 6, write("d", "gw/6/1", gateway.Connect, 0)))
		if _, err := e.store.Apply(e.ctx, 0, batch("gw", 5)); !errors.Is(err, gateway.ErrFenced) {
			t.Fatalf("epoch 5 after 6: %v", err)
		}
		e.apply(0, batch("other", 1, write("d", "x", gateway.Renew, 0)))
	})
}

func TestInputErrors(t *testing.T) {
	e := newEnv(t, sharedServer().Client(t), 4)
	dev := devicesIn(t, 4, 1, 1, "in")[0]
	if _, err := e.store.Apply(e.ctx, 2, batch("gw", 1, write(dev, "s", gateway.Renew, 0))); !errors.Is(err, gateway.ErrWrongShard) {
		t.Fatalf("wrong shard: %v", err)
	}
	for _, shard := range []int{-1, 4} {
		if _, err := e.store.Apply(e.ctx, shard, batch("gw", 1)); !errors.Is(err, gateway.ErrBadShard) {
			t.Fatalf("apply shard %d: %v", shard, err)
		}
		if _, err := e.store.Reap(e.ctx, shard, 1); !errors.Is(err, gateway.ErrBadShard) {
			t.Fatalf("reap shard %d: %v", shard, err)
		}
		if _, err := e.store.Events(e.ctx, shard, "", 1); !errors.Is(err, gateway.ErrBadShard) {
			t.Fatalf("events shard %d: %v", shard, err)
		}
		if _, err := e.store.AcquireShard(e.ctx, shard, "o", time.Second); !errors.Is(err, gateway.ErrBadShard) {
			t.Fatalf("acquire shard %d: %v", shard, err)
		}
	}
	if _, err := e.store.List(e.ctx, gateway.ListQuery{Cursor: "9.0.0"}); err == nil {
		t.Fatal("list accepted a cursor of shard 9 of 4")
	}
	if _, err := e.store.List(e.ctx, gateway.ListQuery{State: gateway.Suspect}); err == nil {
		t.Fatal("list accepted a suspect filter")
	}
	if _, err := e.store.Events(e.ctx, 0, "12-x", 1); err == nil || errors.Is(err, gateway.ErrUnavailable) {
		t.Fatalf("events after a malformed position: %v", err)
	}
	if _, err := Open(e.ctx, e.c, Options{Prefix: "a{b}", Shards: 1}); err == nil {
		t.Fatal("opened with braces in the prefix")
	}
}

// Batches beyond the scripts' 1000-argument chunks.
func TestLargeBatch(t *testing.T) {
	e := newEnv(t, sharedServer().Client(t), 1)
	devs := devicesIn(t, 1, 0, 1200, "large")
	b := batch("gw", 1)
	for _, d := range devs {
		b.Writes = append(b.Writes, write(d, "s", gateway.Connect, 0))
	}
	if evs := e.apply(0, b); len(evs) != len(devs) {
		t.Fatalf("connect: %d events", len(evs))
	}
	if n, err := e.c.ZCard(e.ctx, e.store.keys[0].data[0]).Result(); err != nil || n != int64(len(devs)) {
		t.Fatalf("deadline index: %d, %v", n, err)
	}
	for i := range b.Writes {
		b.Writes[i].Kind = gateway.Leave
	}
	if evs := e.apply(0, b); len(evs) != len(devs) {
		t.Fatalf("leave: %d events", len(evs))
	}
	if d := e.device(devs[len(devs)-1]); d.State != gateway.Offline || d.Ver != ver(0, 2) {
		t.Fatalf("last device: %+v", d)
	}
	if n, err := e.c.ZCard(e.ctx, e.store.keys[0].data[0]).Result(); err != nil || n != 0 {
		t.Fatalf("deadline index after leaving: %d, %v", n, err)
	}
}

func TestManySessions(t *testing.T) {
	forBackends(t, func(t *testing.T, c redis.UniversalClient) {
		e := newEnv(t, c, 1)
		b := batch("gw", 300)
		for i := 0; i < 70; i++ {
			b.Writes = append(b.Writes, write("many", gateway.SessionID(fmt.Sprintf("gw/300/%d", 1000+i)), gateway.Connect,
				time.Duration(i)*time.Millisecond))
		}
		if evs := e.apply(0, b); len(evs) != 1 {
			t.Fatalf("events: %s", describe(evs))
		}
		d := e.device("many")
		// the last writer is the newest evidence: session 1000, age 0
		if len(d.Sessions) != 70 || !d.Deadline.Equal(ms(90*time.Second)) || d.Session != "gw/300/1000" {
			t.Fatalf("device: %d sessions, deadline %v, last %s", len(d.Sessions), d.Deadline, d.Session)
		}
		for i, s := range d.Sessions {
			if s.ID != gateway.SessionID(fmt.Sprintf("gw/300/%d", 1000+i)) || !s.Deadline.Equal(ms(90*time.Second-time.Duration(i)*time.Millisecond)) ||
				s.Epoch != 300 || s.Gateway != "gw" {
				t.Fatalf("session %d: %+v", i, s)
			}
		}
	})
}

// The packed record of a single-session device stays within one 32-byte
// allocation (record.lua documents the format; its ver, the store time in
// ms, takes 6 of them).
func TestRecordSize(t *testing.T) {
	e := newEnv(t, sharedServer().Client(t), 1)
	e.apply(0, batch("site-a-1", 3,
		write("conn", "site-a-1/3/123456", gateway.Connect, 0),
		write("coap", "coap/default", gateway.Renew, 0)))
	for dev, want := range map[string]int{"conn": 20, "coap": 30} {
		rec, err := e.c.HGet(e.ctx, e.store.keys[0].data[1], dev).Result()
		if err != nil {
			t.Fatal(err)
		}
		if len(rec) != want {
			t.Errorf("record of %s: %d bytes %x, want %d", dev, len(rec), rec, want)
		}
	}
	for _, dev := range []gateway.DeviceID{"conn", "coap"} {
		if d := e.device(dev); len(d.Sessions) != 1 || d.Sessions[0].Gateway != "site-a-1" || d.Sessions[0].Epoch != 3 {
			t.Errorf("%s: %+v", dev, d)
		}
	}
	// Reaping rewrites both records as offline ones naming the session.
	e.clock.Advance(time.Hour)
	r := e.reap(0, 10)
	if len(r.Offline) != 2 {
		t.Fatalf("reap: %s", describe(r.Offline))
	}
	for dev, sess := range map[gateway.DeviceID]gateway.SessionID{"conn": "site-a-1/3/123456", "coap": "coap/default"} {
		d := e.device(dev)
		if d.State != gateway.Offline || d.Ver != ver(0, 2) || d.Session != sess || d.Gateway != "site-a-1" ||
			!d.Since.Equal(ms(time.Hour)) || len(d.Sessions) != 0 {
			t.Errorf("%s after reap: %+v", dev, d)
		}
	}
}

func TestMetaMismatch(t *testing.T) {
	forBackends(t, func(t *testing.T, c redis.UniversalClient) {
		prefix := uniquePrefix()
		if _, err := Open(t.Context(), c, Options{Prefix: prefix, Shards: 4}); err != nil {
			t.Fatal(err)
		}
		if _, err := Open(t.Context(), c, Options{Prefix: prefix, Shards: 4}); err != nil {
			t.Fatalf("reopen: %v", err)
		}
		if _, err := Open(t.Context(), c, Options{Prefix: prefix, Shards: 8}); !errors.Is(err, gateway.ErrShardMismatch) {
			t.Fatalf("8 shards over 4: %v", err)
		}
		if err := c.HSet(t.Context(), prefix+":meta", "schema", "0").Err(); err != nil {
			t.Fatal(err)
		}
		if _, err := Open(t.Context(), c, Options{Prefix: prefix, Shards: 4}); !errors.Is(err, gateway.ErrShardMismatch) {
			t.Fatalf("schema 0: %v", err)
		}
		if _, err := Open(t.Context(), c, Options{Prefix: prefix, Shards: 0}); err == nil {
			t.Fatal("opened with 0 shards")
		}
	})
}

// The steady-state renewal leaves the packed record as it is and moves the
// deadline only; any other change (another gateway or epoch, another last
// session, a ver of several bytes) still rewrites what it must.
func TestRenewalFastPath(t *testing.T) {
	e := newEnv(t, sharedServer().Client(t), 1)
	rec := func() string {
		t.Helper()
		r, err := e.c.HGet(e.ctx, e.store.keys[0].data[1], "fast").Result()
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	renew := func(gw string, epoch uint64, sess gateway.SessionID) {
		t.Helper()
		e.clock.Advance(time.Second)
		if evs := e.apply(0, batch(gw, epoch, write("fast", sess, gateway.Renew, 0))); len(evs) != 0 {
			t.Fatalf("renewal by %s@%d wrote %s", gw, epoch, describe(evs))
		}
		d := e.device("fast")
		if !d.Deadline.Equal(e.clock.Now().Add(90*time.Second)) || len(d.Sessions) != 1 ||
			d.Sessions[0].Gateway != gw || d.Sessions[0].Epoch != epoch || d.Gateway != gw || d.Session != sess {
			t.Fatalf("after renewal by %s@%d of %s: %+v", gw, epoch, sess, d)
		}
	}
	// Cycle the record 70 times (ver counts on from the store time).
	for i := 0; i < 70; i++ {
		e.apply(0, batch("gw-a", 1, write("fast", "coap/x", gateway.Connect, 0), write("fast", "coap/x", gateway.Leave, 0)))
	}
	e.apply(0, batch("gw-a", 1, write("fast", "coap/x", gateway.Connect, 0)))
	if d := e.device("fast"); d.Ver != ver(0, 141) {
		t.Fatalf("ver %d, want %d", d.Ver, ver(0, 141))
	}
	steps := []struct {
		gw      string
		epoch   uint64
		sess    gateway.SessionID
		rewrite bool
	}{
		{"gw-a", 1, "coap/x", false},
		{"gw-b", 1, "coap/x", true}, // the session moved to another gateway
		{"gw-b", 1, "coap/x", false},
		{"gw-b", 2, "coap/x", true}, // that gateway restarted
		{"gw-b", 2, "coap/x", false},
		{"gw-b", 2, "gw-b/2/77", true}, // a second session, written last
		{"gw-b", 2, "gw-b/2/77", true}, // two sessions: offsets move
	}
	for i, st := range steps {
		before := rec()
		if i < 5 {
			renew(st.gw, st.epoch, st.sess)
		} else {
			e.clock.Advance(time.Second)
			e.apply(0, batch(st.gw, st.epoch, write("fast", st.sess, gateway.Renew, 0)))
		}
		if rewritten := rec() != before; rewritten != st.rewrite {
			t.Fatalf("step %d (%s@%d %s): record rewritten %v, want %v", i, st.gw, st.epoch, st.sess, rewritten, st.rewrite)
		}
	}
	d := e.device("fast")
	if len(d.Sessions) != 2 || !d.Deadline.Equal(e.clock.Now().Add(90*time.Second)) || d.Ver != ver(0, 141) {
		t.Fatalf("two sessions: %+v", d)
	}
	for _, s := range d.Sessions {
		want := e.clock.Now().Add(90 * time.Second)
		if s.ID == "coap/x" {
			want = want.Add(-2 * time.Second)
		}
		if !s.Deadline.Equal(want) || s.Gateway != "gw-b" || s.Epoch != 2 {
			t.Fatalf("session %+v, want deadline %v", s, want)
		}
	}
}
