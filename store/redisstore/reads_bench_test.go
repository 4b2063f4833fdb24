package redisstore

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/fleetgate/fleetgate/gateway"
	"github.com/fleetgate/fleetgate/gateway/clocktest"
	"github.com/fleetgate/fleetgate/internal/redistest"
)

// BenchmarkReads measures the reads of the page and the API on 100,000
// devices in 16 shards (1 % of them offline, 1 % suspect at a window of
// 45 s), each with the wall time and the Redis server's CPU per call: a
// page of 50 by last change, by ID of a prefix, by ID with the offline
// filter, Counts with the suspect window, Gateways; the first read after
// the index was dropped (it builds it, one pass a shard, as after an
// upgrade); and, as the ceiling they avoid, reading every device a page
// of 1,000 at a time.
func BenchmarkReads(b *testing.B) {
	const devices, shards, page = 100_000, 16, 50
	srv := redistest.Start(b)
	c := srv.Client(b)
	ctx := context.Background()
	clock := clocktest.New(time.UnixMilli(startMs))
	s, err := Open(ctx, c, Options{Prefix: "bench", Shards: shards, Now: clock.Now})
	if err != nil {
		b.Fatal(err)
	}
	const lease = 90 * time.Second
	byShard := map[int][]gateway.Write{}
	for i := range devices {
		d := gateway.DeviceID(fmt.Sprintf("site-%06d", i))
		age := time.Duration(0)
		if i%100 == 1 {
			age = lease - 30*time.Second
		}
		byShard[gateway.ShardOf(d, shards)] = append(byShard[gateway.ShardOf(d, shards)], gateway.Write{Device: d, Session: "coap/default", Kind: gateway.Connect, Age: age})
	}
	for sh, ws := range byShard {
		for i := 0; i < len(ws); i += 1000 {
			if _, err := s.Apply(ctx, sh, gateway.Batch{Gateway: "gw-bench", Epoch: 1, Lease: lease, Writes: ws[i:min(i+1000, len(ws))]}); err != nil {
				b.Fatal(err)
			}
		}
	}
	for i := 0; i < devices; i += 100 {
		d := gateway.DeviceID(fmt.Sprintf("site-%06d", i))
		if _, err := s.Apply(ctx, gateway.ShardOf(d, shards), gateway.Batch{Gateway: "gw-bench", Epoch: 1, Lease: lease,
			Writes: []gateway.Write{{Device: d, Session: "coap/default", Kind: gateway.Leave}}}); err != nil {
			b.Fatal(err)
		}
	}
	run := func(name string, fn func() error) {
		b.Run(name, func(b *testing.B) {
			var spent cost
			for range b.N {
				measure(b, srv, &spent, func() {
					if err := fn(); err != nil {
						b.Fatal(err)
					}
				})
			}
			b.ReportMetric(float64(spent.ticks)*float64(clockTick.Microseconds())/float64(b.N), "redis-cpu-us/op")
		})
	}
	list := func(q gateway.ListQuery) func() error {
		return func() error {
			p, err := s.List(ctx, q)
			if err == nil && len(p.Devices) == 0 {
				err = fmt.Errorf("List(%+v): no device", q)
			}
			return err
		}
	}
	run("build", func() error {
		for _, k := range s.keys {
			if err := c.Del(ctx, k.data[7]).Err(); err != nil {
				return err
			}
		}
		return list(gateway.ListQuery{Order: gateway.OrderChanged, Limit: page})()
	})
	run("changed", list(gateway.ListQuery{Order: gateway.OrderChanged, Limit: page}))
	run("prefix", list(gateway.ListQuery{Prefix: "site-0421", Limit: page}))
	run("offline-by-id", list(gateway.ListQuery{State: gateway.Offline, Limit: page}))
	run("counts", func() error {
		n, err := s.Counts(ctx, 45*time.Second)
		if err == nil && n.Suspect != devices/100 {
			err = fmt.Errorf("Counts: %+v", n)
		}
		return err
	})
	run("gateways", func() error {
		gws, err := s.Gateways(ctx)
		if err == nil && gws[0].Sessions != devices-devices/100 {
			err = fmt.Errorf("Gateways: %+v", gws)
		}
		return err
	})
	run("ceiling-full-pass", func() error {
		n := 0
		q := gateway.ListQuery{Limit: 1000}
		for {
			p, err := s.List(ctx, q)
			if err != nil {
				return err
			}
			n += len(p.Devices)
			if p.Next == "" {
				break
			}
			q.Cursor = p.Next
		}
		if n != devices {
			return fmt.Errorf("a full pass listed %d devices", n)
		}
		return nil
	})
}
