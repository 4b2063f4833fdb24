//go:build faults

package faults

import (
	"strings"
	"testing"
	"time"
)

// The checker counts what it must, on a made-up log: a clean device, a
// false offline followed by its replay online (a flap), a repeated
// version, a missed offline and a resurrection after a leave.
func TestCheckerCounts(t *testing.T) {
	tm := fast
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	at := func(d time.Duration) time.Time { return t0.Add(d) }
	beats := func(from, to time.Duration) []time.Time {
		var ts []time.Time
		for d := from; d <= to; d += 500 * time.Millisecond {
			ts = append(ts, at(d))
		}
		return ts
	}
	truth := map[string]*devTruth{
		"clean":   {id: "clean", sends: beats(0, 5*time.Second), stoppedAt: at(5 * time.Second), lastTry: at(5 * time.Second)},
		"flap":    {id: "flap", sends: beats(0, 20*time.Second)},
		"repeat":  {id: "repeat", sends: beats(0, 20*time.Second)},
		"missed":  {id: "missed", sends: beats(0, 2*time.Second), stoppedAt: at(2 * time.Second), lastTry: at(2 * time.Second)},
		"revived": {id: "revived", sends: beats(0, 3*time.Second), leftAt: at(3500 * time.Millisecond), lastTry: at(3500 * time.Millisecond)},
	}
	ev := func(dev, state string, ver int64, d time.Duration, reason string) event {
		return event{device: dev, state: state, ver: ver, at: at(d), reason: reason}
	}
	log := []event{
		ev("clean", "online", 1, 100*time.Millisecond, "connect"),
		ev("clean", "offline", 2, 9*time.Second, "expired"),
		ev("flap", "online", 1, 100*time.Millisecond, "connect"),
		ev("flap", "offline", 2, 10*time.Second, "expired"),
		ev("flap", "online", 3, 10500*time.Millisecond, "replay"),
		ev("repeat", "online", 1, 100*time.Millisecond, "connect"),
		ev("repeat", "online", 1, 12*time.Second, "renew"),
		ev("missed", "online", 1, 100*time.Millisecond, "connect"),
		ev("revived", "online", 1, 100*time.Millisecond, "connect"),
		ev("revived", "offline", 2, 3600*time.Millisecond, "leave"),
		ev("revived", "online", 3, 5*time.Second, "replay"),
	}
	r := check(truth, log, expectations{tm: tm, end: at(30 * time.Second)})
	want := result{Devices: 5, FalseOffline: 1, MissedOffline: 2, Repeated: 1, BrokenAlternation: 1, Resurrected: 1}
	got := result{Devices: r.Devices, FalseOffline: r.FalseOffline, MissedOffline: r.MissedOffline, Repeated: r.Repeated,
		BrokenAlternation: r.BrokenAlternation, Resurrected: r.Resurrected}
	if got.Devices != want.Devices || got.FalseOffline != want.FalseOffline || got.MissedOffline != want.MissedOffline ||
		got.Repeated != want.Repeated || got.BrokenAlternation != want.BrokenAlternation || got.Resurrected != want.Resurrected {
		t.Fatalf("check = %+v, want %+v; examples %q", got, want, r.examples)
	}
	if len(r.Lags) != 1 || r.Lags[0] != 4*time.Second {
		t.Fatalf("lags %v, want [4s] (clean: offline at 9s, last evidence at 5s)", r.Lags)
	}
}

// Evidence a gateway acknowledged within its loss window before it was
// killed -9 may have died in its queue: an offline that is early only
// against that evidence is not false; one early against evidence outside
// the window is.
func TestCheckerKillLossWindow(t *testing.T) {
	tm := fast
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	at := func(d time.Duration) time.Time { return t0.Add(d) }
	kill := at(1300 * time.Millisecond)
	truth := map[string]*devTruth{
		// connect at 0, one renewal 50 ms before the kill, the device
		// gone with the gateway; offline 3.5 s after the connect (lease 4 s)
		"in-window": {id: "in-window", sends: []time.Time{at(0), at(1250 * time.Millisecond)},
			stoppedAt: at(1300 * time.Millisecond), lastTry: at(1250 * time.Millisecond)},
		// the same renewal 500 ms before the kill had time to reach the outbox
		"before-window": {id: "before-window", sends: []time.Time{at(0), at(800 * time.Millisecond)},
			stoppedAt: at(1300 * time.Millisecond), lastTry: at(800 * time.Millisecond)},
	}
	log := []event{
		{device: "in-window", state: "online", ver: 1, at: at(10 * time.Millisecond), reason: "connect"},
		{device: "in-window", state: "offline", ver: 2, at: at(3500 * time.Millisecond), reason: "expired"},
		{device: "before-window", state: "online", ver: 1, at: at(10 * time.Millisecond), reason: "connect"},
		{device: "before-window", state: "offline", ver: 2, at: at(3500 * time.Millisecond), reason: "expired"},
	}
	x := expectations{tm: tm, end: at(30 * time.Second), kills: []time.Time{kill}}
	if r := check(truth, log, x); r.FalseOffline != 1 || !strings.Contains(strings.Join(r.examples, "\n"), "before-window") {
		t.Fatalf("false offline %d, want 1 (before-window); examples %q", r.FalseOffline, r.examples)
	}
	x.kills = nil
	if r := check(truth, log, x); r.FalseOffline != 2 {
		t.Fatalf("without the kill: false offline %d, want 2; examples %q", r.FalseOffline, r.examples)
	}
}

// Two onlines of a device on either side of a store loss are counted
// apart (the new incarnation does not know consumers saw it online);
// without the loss between them they break the alternation.
func TestCheckerAcrossLoss(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	at := func(d time.Duration) time.Time { return t0.Add(d) }
	truth := map[string]*devTruth{"d": {id: "d", sends: []time.Time{at(0), at(time.Second), at(2 * time.Second)}}}
	log := []event{
		{device: "d", state: "online", ver: 1, at: at(10 * time.Millisecond), reason: "connect"},
		{device: "d", state: "online", ver: 100, at: at(2 * time.Second), reason: "connect"},
	}
	x := expectations{tm: fast, end: at(3 * time.Second), losses: []time.Time{at(1500 * time.Millisecond)}}
	if r := check(truth, log, x); r.AcrossLoss != 1 || r.BrokenAlternation != 0 {
		t.Fatalf("with the loss: across %d, broken %d; want 1, 0", r.AcrossLoss, r.BrokenAlternation)
	}
	x.losses = []time.Time{at(2500 * time.Millisecond)}
	if r := check(truth, log, x); r.AcrossLoss != 0 || r.BrokenAlternation != 1 {
		t.Fatalf("loss after both: across %d, broken %d; want 0, 1", r.AcrossLoss, r.BrokenAlternation)
	}
}
