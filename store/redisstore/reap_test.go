package redisstore

import (
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/fleetgate/fleetgate/gateway"
)

func TestReap(t *testing.T) {
	forBackends(t, func(t *testing.T, c redis.UniversalClient) {
		e := newEnv(t, c, 3)
		devs := devicesIn(t, 3, 0, 5, "reap")
		b := gateway.Batch{Gateway: "gw", Epoch: 1, Lease: 10 * time.Second}
		for i, d := range devs {
			b.Writes = append(b.Writes, write(d, "s", gateway.Connect, time.Duration(i)*time.Second))
		}
		e.apply(0, b)
		if r := e.reap(0, 10); len(r.Offline) != 0 || r.More || !r.Next.Equal(ms(6*time.Second)) {
			t.Fatalf("nothing due: %+v", r)
		}
		// devs[0] gets a second, longer session: its deadline is 15s.
		e.clock.Set(ms(5 * time.Second))
		e.apply(0, gateway.Batch{Gateway: "gw", Epoch: 1, Lease: 10 * time.Second,
			Writes: []gateway.Write{write(devs[0], "t", gateway.Renew, 0)}})
		e.clock.Set(ms(10 * time.Second))
		// Limit 0 handles nothing and reports what is due.
		if r := e.reap(0, 0); len(r.Offline) != 0 || !r.More || !r.Next.Equal(ms(6*time.Second)) {
			t.Fatalf("limit 0: %+v", r)
		}
		// Due: devs[4] (6s) devs[3] (7s) devs[2] (8s) devs[1] (9s).
		r := e.reap(0, 3)
		if len(r.Offline) != 3 || !r.More || r.Trimmed != 0 || !r.Next.Equal(ms(9*time.Second)) {
			t.Fatalf("first reap: %+v %s", r, describe(r.Offline))
		}
		for i, ev := range r.Offline {
			d := devs[4-i]
			if ev.Device != d || ev.State != gateway.Offline || ev.Reason != gateway.ReasonExpired || ev.Ver != ver(0, 2) ||
				!ev.Deadline.Equal(ms(time.Duration(6+i)*time.Second)) || !ev.At.Equal(ms(10*time.Second)) ||
				ev.Gateway != "gw" || ev.Session != "s" {
				t.Fatalf("offline %d: %s", i, describe(r.Offline))
			}
		}
		r = e.reap(0, 3)
		if len(r.Offline) != 1 || r.Offline[0].Device != devs[1] || r.Trimmed != 0 || r.More || !r.Next.Equal(ms(15*time.Second)) {
			t.Fatalf("second reap: %+v %s", r, describe(r.Offline))
		}
		d := e.device(devs[0])
		if d.State != gateway.Online || len(d.Sessions) != 2 || !d.Deadline.Equal(ms(15*time.Second)) {
			t.Fatalf("device with a live session: %+v", d)
		}
		e.clock.Set(ms(15 * time.Second))
		r = e.reap(0, 3)
		if len(r.Offline) != 1 || r.Offline[0].Session != "t" || r.More || !r.Next.IsZero() {
			t.Fatalf("last reap: %+v %s", r, describe(r.Offline))
		}
		checkAlternation(t, e.events(0))
		if r := e.reap(1, 3); len(r.Offline) != 0 || r.More || !r.Next.IsZero() {
			t.Fatalf("empty shard: %+v", r)
		}
	})
}
