package embedded

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/fleetgate/fleetgate/gateway"
)

// BenchmarkReads measures the reads of the page and the API on 100,000
// devices in 16 shards (1 % of them offline, 1 % suspect at a window of
// 45 s): a page of 50 by last change, by ID of a prefix, by ID with the
// offline filter, Counts with the suspect window, Gateways; and, as the
// ceiling they avoid, one pass over every record of the file (what
// listing the fleet a page at a time by reading it all costs).
func BenchmarkReads(b *testing.B) {
	const devices, shards, page = 100_000, 16, 50
	f := newFixture(b, Options{Shards: shards})
	ctx := context.Background()
	byShard := map[int][]gateway.Write{}
	for i := range devices {
		d := gateway.DeviceID(fmt.Sprintf("site-%06d", i))
		// 1 %: evidence old enough that the deadline is within 45 s
		age := time.Duration(0)
		if i%100 == 1 {
			age = lease - 30*time.Second
		}
		byShard[gateway.ShardOf(d, shards)] = append(byShard[gateway.ShardOf(d, shards)], connect(d, "coap/default", age))
	}
	for s, ws := range byShard {
		for i := 0; i < len(ws); i += 5000 {
			f.apply(s, batch("gw-bench", 1, ws[i:min(i+5000, len(ws))]...))
		}
	}
	for i := 0; i < devices; i += 100 {
		d := gateway.DeviceID(fmt.Sprintf("site-%06d", i))
		f.apply(gateway.ShardOf(d, shards), batch("gw-bench", 1, leave(d, "coap/default", 0)))
	}
	list := func(q gateway.ListQuery) func(*testing.B) {
		return func(b *testing.B) {
			for range b.N {
				p, err := f.s.List(ctx, q)
				if err != nil || len(p.Devices) == 0 {
					b.Fatalf("List(%+v): %d devices, %v", q, len(p.Devices), err)
				}
			}
		}
	}
	b.Run("changed", list(gateway.ListQuery{Order: gateway.OrderChanged, Limit: page}))
	b.Run("prefix", list(gateway.ListQuery{Prefix: "site-0421", Limit: page}))
	b.Run("offline-by-id", list(gateway.ListQuery{State: gateway.Offline, Limit: page}))
	b.Run("counts", func(b *testing.B) {
		for range b.N {
			n, err := f.s.Counts(ctx, 45*time.Second)
			if err != nil || n.Suspect != devices/100 {
				b.Fatalf("Counts: %+v, %v", n, err)
			}
		}
	})
	b.Run("gateways", func(b *testing.B) {
		for range b.N {
			if gws, err := f.s.Gateways(ctx); err != nil || gws[0].Sessions != devices-devices/100 {
				b.Fatalf("Gateways: %+v, %v", gws, err)
			}
		}
	})
	b.Run("ceiling-full-pass", func(b *testing.B) {
		for range b.N {
			n := 0
			q := gateway.ListQuery{Limit: 10_000}
			for {
				p, err := f.s.List(ctx, q)
				if err != nil {
					b.Fatal(err)
				}
				n += len(p.Devices)
				if p.Next == "" {
					break
				}
				q.Cursor = p.Next
			}
			if n != devices {
				b.Fatalf("a full pass listed %d devices", n)
			}
		}
	})
}
