package redisstore

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/fleetgate/fleetgate/gateway"
	"github.com/fleetgate/fleetgate/store/storetest"
)

// inspected is a store the conformance suite checks inside too
// (storetest.Inspector): its index and session counts against its
// records (checkIndex).
type inspected struct {
	*Store
	c redis.UniversalClient
}

var _ storetest.Inspector = inspected{}

func (s inspected) Inspect(ctx context.Context) error { return checkIndex(ctx, s.c, s.Store) }

// chgMember is the change index member of a packed record of dev
// (record.lua, "Indexes"): its state, its since (the 6 bytes after the
// flags and the ver) and its ID.
func chgMember(dev, packed string) (string, error) {
	_, n := binary.Uvarint([]byte(packed[1:]))
	if len(packed) < 1+n+6 || n <= 0 {
		return "", fmt.Errorf("record of %s: %d bytes", dev, len(packed))
	}
	state := "0"
	if packed[0]&1 == 1 {
		state = "1"
	}
	return state + packed[1+n:1+n+6] + dev, nil
}

// checkIndex compares, on every shard, {P:s}:idx with what the records
// make it (each record by ID and by state and last change, and the mark
// of the incarnation it was built in) and the session counts ("$<ref>"
// in {P:s}:epochs) with the records' sessions.
func checkIndex(ctx context.Context, c redis.UniversalClient, s *Store) error {
	for i, k := range s.keys {
		recs, err := c.HGetAll(ctx, k.data[1]).Result()
		if err != nil {
			return err
		}
		tok, err := c.HGet(ctx, k.data[3], "~").Result()
		if err != nil && !errors.Is(err, redis.Nil) {
			return err
		}
		want := map[string]bool{"~" + tok: true}
		var devs []any
		for dev, p := range recs {
			if strings.HasPrefix(dev, "~") {
				continue
			}
			m, err := chgMember(dev, p)
			if err != nil {
				return err
			}
			want["i"+dev], want[m] = true, true
			devs = append(devs, dev)
		}
		members, err := c.ZRange(ctx, k.data[7], 0, -1).Result()
		if err != nil {
			return err
		}
		got := map[string]bool{}
		for _, m := range members {
			got[m] = true
		}
		if !maps.Equal(got, want) {
			return fmt.Errorf("shard %d: index %q, the records make it %q", i, slices.Sorted(maps.Keys(got)), slices.Sorted(maps.Keys(want)))
		}
		held := map[string]int64{}
		if len(devs) > 0 {
			res, err := s.view.Run(ctx, c, k.data, append([]any{"views"}, devs...)...).Slice()
			if err != nil {
				return err
			}
			for _, v := range res {
				d, err := parseView(v)
				if err != nil {
					return err
				}
				for _, x := range d.Sessions {
					held[x.Gateway]++
				}
			}
		}
		epochs, err := c.HGetAll(ctx, k.data[3]).Result()
		if err != nil {
			return err
		}
		counted := map[string]int64{}
		for f, v := range epochs {
			if ref, ok := strings.CutPrefix(f, "$"); ok {
				if n := num(v); n != 0 {
					counted[epochs["#"+ref]] = n
				}
			}
		}
		if !maps.Equal(counted, held) {
			return fmt.Errorf("shard %d: sessions counted %v, the records hold %v", i, counted, held)
		}
	}
	return nil
}

// TestIndexOfAnOlderStore: shards written without the index and the
// session counts (a store of an older release) get both built from their
// records by the first List or Gateways, in one pass a shard, and kept
// from then on; a shard whose incarnation changed (its state lost or
// replaced) gets them built again, whatever they held.
func TestIndexOfAnOlderStore(t *testing.T) {
	forBackends(t, func(t *testing.T, c redis.UniversalClient) {
		e := newEnv(t, c, 2)
		a, b := devicesIn(t, 2, 0, 2, "old"), devicesIn(t, 2, 1, 1, "old")
		e.apply(0, batch("gw-a", 1, write(a[0], "s1", gateway.Connect, 0), write(a[1], "s1", gateway.Connect, 0), write(a[1], "s2", gateway.Connect, 0)))
		e.apply(1, batch("gw-b", 1, write(b[0], "s1", gateway.Connect, 0)))
		e.clock.Advance(time.Millisecond)
		e.apply(0, batch("gw-a", 1, write(a[0], "s1", gateway.Leave, 0)))
		older := func() {
			t.Helper()
			for _, k := range e.store.keys {
				if err := c.Del(e.ctx, k.data[7]).Err(); err != nil {
					t.Fatal(err)
				}
				for ref := 1; ref <= 2; ref++ {
					if err := c.HDel(e.ctx, k.data[3], fmt.Sprintf("$%d", ref)).Err(); err != nil {
						t.Fatal(err)
					}
				}
			}
		}
		older()
		gws, err := e.store.Gateways(e.ctx)
		if err != nil {
			t.Fatal(err)
		}
		if len(gws) != 2 || gws[0].Sessions != 2 || gws[1].Sessions != 1 {
			t.Fatalf("Gateways of an older store = %+v, want gw-a with 2 sessions and gw-b with 1", gws)
		}
		if err := checkIndex(e.ctx, c, e.store); err != nil {
			t.Fatalf("built by Gateways: %v", err)
		}
		older()
		p, err := e.store.List(e.ctx, gateway.ListQuery{Order: gateway.OrderChanged})
		if err != nil {
			t.Fatal(err)
		}
		if len(p.Devices) != 3 || p.Devices[0].Device != a[0] {
			t.Fatalf("List by change of an older store = %v, want 3 devices, %s first", p.Devices, a[0])
		}
		if err := checkIndex(e.ctx, c, e.store); err != nil {
			t.Fatalf("built by List: %v", err)
		}
		e.clock.Advance(91 * time.Second)
		e.reap(0, 10)
		e.reap(1, 10)
		if err := checkIndex(e.ctx, c, e.store); err != nil {
			t.Fatalf("kept by the reaps: %v", err)
		}

		// a new incarnation token (the state was lost and written again):
		// whatever the index holds is built again
		for _, k := range e.store.keys {
			if err := c.ZAdd(e.ctx, k.data[7], redis.Z{Member: "ijunk"}).Err(); err != nil {
				t.Fatal(err)
			}
			if err := c.HSet(e.ctx, k.data[3], "~", "new").Err(); err != nil {
				t.Fatal(err)
			}
			if err := c.HSet(e.ctx, k.data[1], "~", "new").Err(); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := e.store.List(e.ctx, gateway.ListQuery{}); err != nil {
			t.Fatal(err)
		}
		if err := checkIndex(e.ctx, c, e.store); err != nil {
			t.Fatalf("after a new incarnation: %v", err)
		}
	})
}
