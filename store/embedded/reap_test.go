package embedded

import (
	"context"
	"testing"
	"time"

	"github.com/fleetgate/fleetgate/gateway"
)

func TestReap(t *testing.T) {
	const shards = 2
	f := newFixture(t, Options{Shards: shards})
	ctx := context.Background()
	var devs []gateway.DeviceID
	for i := range 5 {
		d := deviceIn("r", 1, shards, i)
		devs = append(devs, d)
		// Deadlines t0+lease+0s, +1s, ... +4s.
		f.apply(1, batch("gw-a", 1, connect(d, "a", 0)))
		f.clk.Advance(time.Second)
	}
	res, err := f.s.Reap(ctx, 1, 10)
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Offline) != 0 || res.More || !res.Next.Equal(t0.Add(lease)) {
		t.Fatalf("nothing due: %+v", res)
	}
	f.clk.Set(t0.Add(lease + 2*time.Second)) // the first three are due
	res, err = f.s.Reap(ctx, 1, 2)
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Offline) != 2 || !res.More || !res.Next.Equal(t0.Add(lease+2*time.Second)) {
		t.Fatalf("first reap: %+v", res)
	}
	for i, e := range res.Offline {
		f.wantEvent(e, devs[i], gateway.Offline, 2, gateway.ReasonExpired)
		if !e.Deadline.Equal(t0.Add(lease+time.Duration(i)*time.Second)) || !e.At.Equal(f.clk.Now()) {
			t.Fatalf("expired event %+v", e)
		}
	}
	res, err = f.s.Reap(ctx, 1, 2)
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Offline) != 1 || res.More || !res.Next.Equal(t0.Add(lease+3*time.Second)) {
		t.Fatalf("second reap: %+v", res)
	}
	if info := f.device(devs[2]); info.State != gateway.Offline || info.Ver != f.firstVer(1, devs[2])+1 || len(info.Sessions) != 0 {
		t.Fatalf("reaped device: %+v", info)
	}
	// A device that was reaped is not reported expired again by Apply.
	if evs := f.apply(1, batch("gw-a", 1, leave(devs[0], "a", 0))); len(evs) != 0 {
		t.Fatalf("leave after reap: %+v", evs)
	}
	f.clk.Advance(time.Hour)
	res, err = f.s.Reap(ctx, 1, 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Offline) != 0 || !res.More {
		t.Fatalf("limit 0: %+v", res)
	}
	if res, err = f.s.Reap(ctx, 1, 100); err != nil || len(res.Offline) != 2 || res.More || !res.Next.IsZero() {
		t.Fatalf("last reap: %+v, %v", res, err)
	}
	if res, err = f.s.Reap(ctx, 0, 100); err != nil || len(res.Offline) != 0 || !res.Next.IsZero() {
		t.Fatalf("empty shard: %+v, %v", res, err)
	}
	checkConsistent(t, f.db, shards, true)
}
