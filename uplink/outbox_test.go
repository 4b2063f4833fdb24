package uplink

import (
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
		ob, err := OpenOutbox(db, OutboxOptions{MaxSessions: maxSessions})
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
				s.add(rapid.SampledFrom([]gateway.Kind{gateway.Connect, gateway.Renew, gateway.Leave}).Draw(rt, "kind"), at(clock))
				items = append(items, item{k, s})
			}
			evicted, err := ob.put(items)
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

// modelEntry is a session's entry in the model of the outbox.
type modelEntry struct {
	slot
	seq uint64
}

// checkOutbox compares the outbox's buckets and cached size and oldest
// time with want.
func checkOutbox(rt *rapid.T, db *bolt.DB, ob *Outbox, want map[key]modelEntry) {
	var oldest time.Time
	err := db.View(func(tx *bolt.Tx) error {
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
