package redisstore

import (
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/fleetgate/fleetgate/gateway"
)

func TestList(t *testing.T) {
	forBackends(t, func(t *testing.T, c redis.UniversalClient) {
		e := newEnv(t, c, 3)
		want := map[gateway.DeviceID]gateway.State{}
		for shard := 0; shard < 3; shard++ {
			b := batch("gw", 1)
			for i, d := range devicesIn(t, 3, shard, 7+shard, "list") {
				b.Writes = append(b.Writes, write(d, "s", gateway.Connect, 0))
				want[d] = gateway.Online
				if i%3 == 0 {
					b.Writes = append(b.Writes, write(d, "s", gateway.Leave, 0))
					want[d] = gateway.Offline
				}
			}
			e.apply(shard, b)
		}
		for _, filter := range []gateway.State{"", gateway.Online, gateway.Offline} {
			got := map[gateway.DeviceID]gateway.State{}
			q := gateway.ListQuery{State: filter, Limit: 4}
			for page := 0; ; page++ {
				if page > 20 {
					t.Fatalf("filter %q: more than 20 pages", filter)
				}
				p, err := e.store.List(e.ctx, q)
				if err != nil {
					t.Fatal(err)
				}
				if len(p.Devices) > 4 {
					t.Fatalf("page of %d devices, limit 4", len(p.Devices))
				}
				for _, d := range p.Devices {
					if _, dup := got[d.Device]; dup {
						t.Fatalf("filter %q: %s listed twice", filter, d.Device)
					}
					got[d.Device] = d.State
				}
				if p.Next == "" {
					break
				}
				q.Cursor = p.Next
			}
			n := 0
			for d, st := range want {
				if filter != "" && st != filter {
					continue
				}
				n++
				if got[d] != st {
					t.Errorf("filter %q: %s is %q, want %s", filter, d, got[d], st)
				}
			}
			if len(got) != n {
				t.Errorf("filter %q: listed %d devices, want %d", filter, len(got), n)
			}
		}
	})
}

// A shard hash beyond 128 fields is a hash table, where HSCAN steps hold
// some buckets each; pages of any size still list every device once.
func TestListLargeShard(t *testing.T) {
	e := newEnv(t, sharedServer().Client(t), 2)
	want := map[gateway.DeviceID]bool{}
	for shard := 0; shard < 2; shard++ {
		b := batch("gw", 1)
		for _, d := range devicesIn(t, 2, shard, 300, "large") {
			b.Writes = append(b.Writes, write(d, "s", gateway.Connect, 0))
			want[d] = true
		}
		e.apply(shard, b)
	}
	got := map[gateway.DeviceID]bool{}
	q := gateway.ListQuery{}
	for page := 0; ; page++ {
		if page > 200 {
			t.Fatal("more than 200 pages")
		}
		q.Limit = 1 + page%13
		p, err := e.store.List(e.ctx, q)
		if err != nil {
			t.Fatal(err)
		}
		if len(p.Devices) > q.Limit {
			t.Fatalf("page of %d devices, limit %d", len(p.Devices), q.Limit)
		}
		for _, d := range p.Devices {
			if got[d.Device] {
				t.Fatalf("%s listed twice", d.Device)
			}
			got[d.Device] = true
		}
		if p.Next == "" {
			break
		}
		q.Cursor = p.Next
	}
	if len(got) != len(want) {
		t.Fatalf("listed %d devices, want %d", len(got), len(want))
	}
}

func TestEventsPaging(t *testing.T) {
	e := newEnv(t, sharedServer().Client(t), 1)
	for i := 0; i < 5; i++ {
		e.apply(0, batch("gw", 1, write("d", "s", gateway.Connect, 0), write("d", "s", gateway.Leave, 0)))
	}
	all, err := e.store.Events(e.ctx, 0, "", 100)
	if err != nil || len(all) != 10 {
		t.Fatalf("all: %d %v", len(all), err)
	}
	page, err := e.store.Events(e.ctx, 0, all[3].ID, 4)
	if err != nil || len(page) != 4 || page[0].ID != all[4].ID || page[3].ID != all[7].ID {
		t.Fatalf("page after %s: %s %v", all[3].ID, describe(page), err)
	}
	if zero, err := e.store.Events(e.ctx, 0, "0", 2); err != nil || len(zero) != 2 || zero[0].ID != all[0].ID {
		t.Fatalf("after 0: %s %v", describe(zero), err)
	}
	checkAlternation(t, all)
	for i, ev := range all {
		if ev.Ver != ver(0, uint64(i+1)) || ev.Gateway != "gw" || ev.Session != "s" || !ev.At.Equal(ms(0)) {
			t.Fatalf("event %d: %s", i, describe(all[i:i+1]))
		}
	}
}
