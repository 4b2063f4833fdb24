package uplink

import (
	"context"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"
	"pgregory.net/rapid"

	"github.com/fleetgate/fleetgate/gateway"
)

// TestOutboxMatchesModel puts random batches of evidence for a few
// sessions into an outbox with a small bound and compares it after every
// batch with a model: one slot per session merged with the same rule,
// the oldest (first observation, then sequence) evicted over the bound;
// it also checks the two buckets against each other and the cached size
// and oldest time.
func TestOutboxMatchesModel(t *testing.T) {
	dir := t.TempDir()
	cases := 0
	rapid.Check(t, func(rt *rapid.T) {
		cases++
		db, err := bolt.Open(filepath.Join(dir, fmt.Sprintf("%d.db", cases)), 0o600, &bolt.Options{NoSync: true})
		if err != nil {
			rt.Fatal(err)
		}
		defer db.Close()
		maxSessions := rapid.IntRange(1, 6).Draw(rt, "max sessions")
		ob, err := OpenOutbox(db, OutboxOptions{Shards: 3, MaxSessions: maxSessions, Clock: wallBoot(t0.Add(time.Hour))})
		if err != nil {
			rt.Fatal(err)
		}
		model := map[key]modelEntry{}
		var seq uint64
		clock := 0
		for batch := range rapid.IntRange(1, 8).Draw(rt, "batches") {
			var items []item
			for range rapid.IntRange(1, 5).Draw(rt, fmt.Sprintf("batch %d size", batch)) {
				k := key{gateway.DeviceID(fmt.Sprintf("d%d", rapid.IntRange(0, 7).Draw(rt, "device"))), "s"}
				clock += rapid.IntRange(0, 3).Draw(rt, "step")
				var s slot
				s.add(rapid.SampledFrom([]gateway.Kind{gateway.Connect, gateway.Renew, gateway.Leave}).Draw(rt, "kind"), at(clock), 0)
				items = append(items, item{k, s})
			}
			evicted, _, err := ob.put(items)
			if err != nil {
				rt.Fatal(err)
			}
			for _, it := range items {
				e := model[it.key]
				e.merge(it.slot)
				seq++
				e.seq = seq
				model[it.key] = e
			}
			wantEvicted := 0
			for len(model) > maxSessions {
				var oldest key
				first := true
				for k, e := range model {
					o := model[oldest]
					if first || e.first().Before(o.first()) || (e.first().Equal(o.first()) && e.seq < o.seq) {
						oldest, first = k, false
					}
				}
				e := model[oldest]
				wantEvicted += e.n()
				delete(model, oldest)
			}
			if evicted != wantEvicted {
				rt.Fatalf("batch %d evicted %d writes, model %d", batch, evicted, wantEvicted)
			}
			checkOutbox(rt, db, ob, model)
		}
	})
}

// fataler is what checkOutbox needs of *testing.T and *rapid.T.
type fataler interface {
	Fatal(args ...any)
	Fatalf(format string, args ...any)
}

// modelEntry is a session's entry in the model of the outbox.
type modelEntry struct {
	slot
	seq uint64
}

// checkOutbox compares the outbox's buckets and cached size, in all and
// per shard (as kept and as counted again by a new open), and oldest time
// with want.
func checkOutbox(rt fataler, db *bolt.DB, ob *Outbox, want map[key]modelEntry) {
	held := make([]int, ob.shards)
	for k := range want {
		held[gateway.ShardOf(k.device, ob.shards)]++
	}
	again, err := OpenOutbox(db, OutboxOptions{Shards: ob.shards, Clock: ob.clock, Boot: ob.boot})
	if err != nil {
		rt.Fatal(err)
	}
	for sh, n := range held {
		if ob.held[sh] != n || again.held[sh] != n || ob.holds(sh) != (n > 0) {
			rt.Fatalf("shard %d: %d entries kept, %d counted at open; model %d", sh, ob.held[sh], again.held[sh], n)
		}
	}
	var oldest time.Time
	err = db.View(func(tx *bolt.Tx) error {
		sb, tb := tx.Bucket(bucketSessions), tx.Bucket(bucketByTime)
		if n, m := sb.Stats().KeyN, tb.Stats().KeyN; n != len(want) || m != len(want) {
			rt.Fatalf("%d session entries and %d index entries, model %d", n, m, len(want))
		}
		for k, e := range want {
			s, seq := e.slot, e.seq
			r, err := decodeRecord(sessionKey(k), sb.Get(sessionKey(k)))
			if err != nil {
				rt.Fatalf("%v: %v", k, err)
			}
			if r.seq != seq || r.kind != s.kind || !r.at.Equal(s.at) || !r.leave.Equal(s.leave) {
				rt.Fatalf("%v: stored %+v seq %d, model %+v seq %d", k, r.slot, r.seq, s, seq)
			}
			if got := tb.Get(timeKey(s.first(), seq)); string(got) != string(sessionKey(k)) {
				rt.Fatalf("%v: index entry %q", k, got)
			}
			if oldest.IsZero() || s.first().Before(oldest) {
				oldest = s.first()
			}
		}
		return nil
	})
	if err != nil {
		rt.Fatal(err)
	}
	if ob.Len() != len(want) || !ob.Oldest().Equal(oldest) {
		rt.Fatalf("cached len %d oldest %v, model %d %v", ob.Len(), ob.Oldest(), len(want), oldest)
	}
}

// TestOutboxHealsUnreadableEntries damages two entries' values in place:
// one is then overwritten by new evidence, the other is only found by a
// replay round. Both end up removed or replayed, the dangling index entry
// is cleaned up, and the size stays right.
func TestOutboxHealsUnreadableEntries(t *testing.T) {
	u, e := newEmbeddedUplink(t, Options{})
	items := []item{
		{key{"dev-a", "s"}, slot{kind: gateway.Renew, at: t0.Add(-3 * time.Second)}},
		{key{"dev-b", "s"}, slot{kind: gateway.Renew, at: t0.Add(-2 * time.Second)}},
		{key{"dev-c", "s"}, slot{kind: gateway.Renew, at: t0.Add(-time.Second)}},
	}
	if _, _, err := e.ob.put(items); err != nil {
		t.Fatal(err)
	}
	err := e.db.Update(func(tx *bolt.Tx) error {
		sb := tx.Bucket(bucketSessions)
		for _, d := range []gateway.DeviceID{"dev-a", "dev-b"} {
			if err := sb.Put(sessionKey(key{d, "s"}), []byte("garbage")); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := e.ob.put([]item{{key{"dev-a", "s"}, slot{kind: gateway.Connect, at: t0}}}); err != nil {
		t.Fatal(err)
	}
	if e.ob.Len() != 3 {
		t.Fatalf("len %d after overwriting an unreadable entry, want 3", e.ob.Len())
	}
	rp := &replayer{u: u}
	for round := 0; e.ob.Len() > 0; round++ {
		if round > 10 {
			t.Fatalf("outbox not empty after %d rounds: %d", round, e.ob.Len())
		}
		if err := rp.round(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	rp.wait()
	checkOutbox(t, e.db, e.ob, nil)
	for d, want := range map[gateway.DeviceID]bool{"dev-a": true, "dev-b": false, "dev-c": true} {
		_, err := e.store.Device(context.Background(), d)
		if got := err == nil; got != want {
			t.Fatalf("%s in the store: %v, want %v", d, err, want)
		}
	}
}
