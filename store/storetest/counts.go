package storetest

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/fleetgate/fleetgate/gateway"
)

// countByScan counts the store's devices by stored state through List,
// every page: the full scan Counts must agree with.
func countByScan(ctx context.Context, s gateway.Store) (gateway.Counts, error) {
	var n gateway.Counts
	cursor := ""
	for range maxPages {
		p, err := s.List(ctx, gateway.ListQuery{Cursor: cursor, Limit: 1000})
		if err != nil {
			return n, fmt.Errorf("List(cursor %q): %w", cursor, err)
		}
		for _, d := range p.Devices {
			if d.State == gateway.Online {
				n.Online++
			} else {
				n.Offline++
			}
		}
		if p.Next == "" {
			return n, nil
		}
		cursor = p.Next
	}
	return n, fmt.Errorf("List did not end after %d pages", maxPages)
}

// checkCounts compares Counts with a full scan.
func checkCounts(ctx context.Context, s gateway.Store) error {
	want, err := countByScan(ctx, s)
	if err != nil {
		return err
	}
	got, err := s.Counts(ctx)
	if err != nil {
		return fmt.Errorf("Counts: %w", err)
	}
	if got != want {
		return fmt.Errorf("Counts = %+v, a scan of the devices counts %+v", got, want)
	}
	return nil
}

// testCounts: Counts follows every kind of transition (connect, leave,
// expiry by a reap, expiry dropped by a write, a restore that brings a
// record back without an event), on several shards, and writes that
// change no state (renewals, replays, fenced batches) move nothing.
func testCounts(t *testing.T, open Opener) {
	e := newEnv(t, open, 4)
	want := func(what string, online, offline int64) {
		t.Helper()
		got, err := e.store.Counts(e.ctx)
		if err != nil {
			t.Fatalf("%s: Counts: %v", what, err)
		}
		if w := (gateway.Counts{Online: online, Offline: offline}); got != w {
			t.Fatalf("%s: Counts = %+v, want %+v", what, got, w)
		}
		if err := checkCounts(e.ctx, e.store); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	}
	want("empty store", 0, 0)
	var devs []gateway.DeviceID
	for s := range 4 {
		devs = append(devs, devicesIn(t, 4, s, 2, "count")...)
	}
	for _, d := range devs {
		e.apply(batch(gwA, 1, wr(d, "s1", gateway.Connect, 0)))
	}
	want("8 connects on 4 shards", 8, 0)
	for _, d := range devs {
		e.apply(batch(gwA, 1, wr(d, "s1", gateway.Renew, 0)))
		e.apply(replayed(batch(gwA, 1, wr(d, "s1", gateway.Renew, 0))))
	}
	want("renewals and replays", 8, 0)
	e.apply(batch(gwA, 1, wr(devs[0], "s1", gateway.Leave, 0), wr(devs[1], "s2", gateway.Connect, 0)))
	e.apply(batch(gwA, 1, wr(devs[1], "s1", gateway.Leave, 0)))
	want("a leave of the last session and one of two", 7, 1)
	e.apply(batch(gwA, 2, wr(devs[2], "s1", gateway.Leave, 0)))
	if err := e.applyErr(batch(gwA, 1, wr(devs[3], "s1", gateway.Leave, 0))); err == nil {
		t.Fatal("a batch of an older epoch was applied")
	}
	want("a leave, then a fenced leave", 6, 2)

	// devs[4] renews, the others run out: one is dropped by a write of
	// its own (a connect after its deadline: offline, then online), the
	// others by the reap
	e.clock.Advance(lease - time.Second)
	e.apply(batch(gwA, 2, wr(devs[4], "s1", gateway.Renew, 0)))
	e.clock.Advance(2 * time.Second)
	e.apply(batch(gwA, 2, wr(devs[5], "s9", gateway.Connect, 0)))
	want("due, not reaped yet", 6, 2)
	for s := range 4 {
		for i := 0; ; i++ {
			if i > 8 {
				t.Fatalf("Reap(%d) still reports More", s)
			}
			if !e.reap(s, 1).More {
				break
			}
		}
	}
	want("reaped", 2, 6)

	// a restore brings a record back online without an event, and creates
	// one the store never had
	fresh := gateway.DeviceID("count-restored")
	e.apply(restored(batch(gwA, 2, wr(devs[0], "s1", gateway.Renew, 0))))
	e.apply(restored(batch(gwA, 2, wr(fresh, "s1", gateway.Renew, 0))))
	want("restores", 4, 5)
}
