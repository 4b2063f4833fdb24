package canary

import (
	"testing"
	"time"
)

var (
	t0   = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	plan = Plan{Heartbeat: 30 * time.Second, Live: 100 * time.Second, Bound: 94 * time.Second, GiveUp: 188 * time.Second}
)

func at(d time.Duration) time.Time { return t0.Add(d) }

func next(t *testing.T, s State, now time.Duration, want Action, wantAt time.Duration) {
	t.Helper()
	act, when := Next(s, plan, at(now))
	if act != want || !when.Equal(at(wantAt)) {
		t.Fatalf("Next at %s = %v at %s, want %v at %s", now, act, when.Sub(t0), want, wantAt)
	}
}

// A cycle: beats every heartbeat while live, stops at the end of the
// live phase after an acknowledged beat, times the offline from that
// beat on every expected path, and restarts once all of them saw it.
func TestCycle(t *testing.T) {
	s := Started(at(0), 7)
	next(t, s, 0, Beat, 0)
	s = Beaten(s, at(0), true)
	next(t, s, time.Second, Wait, 30*time.Second)
	next(t, s, 30*time.Second, Beat, 30*time.Second)
	s = Beaten(s, at(30*time.Second), true)
	s = Beaten(s, at(60*time.Second), true)
	s = Beaten(s, at(90*time.Second), true)
	next(t, s, 95*time.Second, Wait, 100*time.Second) // the end of the live phase comes before the next beat
	next(t, s, 100*time.Second, Stop, 100*time.Second)
	s = Halted(s, at(100*time.Second), [paths]bool{Log: true, Upstream: true})
	next(t, s, 101*time.Second, Wait, (90+188)*time.Second)

	// an online or an event at or below the base: nothing
	for _, ev := range []struct {
		offline bool
		ver     uint64
	}{{false, 9}, {true, 7}, {true, 3}} {
		if _, out, _ := Observe(s, Log, ev.offline, ev.ver, at(150*time.Second)); out != Ignored {
			t.Fatalf("Observe(%v, ver %d) = %v, want Ignored", ev.offline, ev.ver, out)
		}
	}
	s, out, d := Observe(s, Log, true, 9, at(182*time.Second))
	if out != Detected || d != 92*time.Second {
		t.Fatalf("Observe log = %v %s, want Detected 92s", out, d)
	}
	if _, out, _ := Observe(s, Log, true, 9, at(183*time.Second)); out != Ignored {
		t.Fatalf("the same path twice = %v, want Ignored", out)
	}
	next(t, s, 183*time.Second, Wait, (90+188)*time.Second) // upstream still awaited
	s, out, d = Observe(s, Upstream, true, 9, at(183*time.Second))
	if out != Detected || d != 93*time.Second {
		t.Fatalf("Observe upstream = %v %s, want Detected 93s", out, d)
	}
	next(t, s, 183*time.Second, Restart, 183*time.Second)
	if m := s.Missed(); len(m) != 0 {
		t.Fatalf("Missed = %v after both paths saw the offline", m)
	}
}

// Without a publisher of its shard the canary waits for the log alone.
func TestLogOnly(t *testing.T) {
	s := Beaten(Started(at(0), 0), at(90*time.Second), true)
	s = Halted(s, at(100*time.Second), [paths]bool{Log: true})
	if _, out, _ := Observe(s, Upstream, true, 1, at(150*time.Second)); out != Ignored {
		t.Fatalf("an upstream event not expected = %v, want Ignored", out)
	}
	s, out, _ := Observe(s, Log, true, 1, at(181*time.Second))
	if out != Detected {
		t.Fatalf("Observe = %v", out)
	}
	next(t, s, 181*time.Second, Restart, 181*time.Second)
}

// An offline that does not come within GiveUp of the last beat is
// missed on the paths that did not deliver it, and the canary goes live
// again.
func TestGiveUp(t *testing.T) {
	s := Beaten(Started(at(0), 0), at(90*time.Second), true)
	s = Halted(s, at(100*time.Second), [paths]bool{Log: true, Upstream: true})
	s, _, _ = Observe(s, Log, true, 4, at(180*time.Second))
	next(t, s, 277*time.Second, Wait, 278*time.Second)
	next(t, s, 278*time.Second, Restart, 278*time.Second)
	if m := s.Missed(); len(m) != 1 || m[0] != Upstream {
		t.Fatalf("Missed = %v, want [upstream]", m)
	}
	if m := Started(at(0), 0).Missed(); m != nil {
		t.Fatalf("a live canary misses nothing, got %v", m)
	}
}

// An offline while the canary heartbeats is a false offline, counted
// once whichever paths deliver it; before the first acknowledged beat
// of the phase (an offline of the cycle before, late) it is not.
func TestFalseOffline(t *testing.T) {
	s := Started(at(0), 5)
	if _, out, _ := Observe(s, Log, true, 6, at(time.Second)); out != Ignored {
		t.Fatalf("an offline before the first acknowledged beat = %v, want Ignored", out)
	}
	s = Beaten(s, at(2*time.Second), true)
	s, out, _ := Observe(s, Log, true, 8, at(40*time.Second))
	if out != FalseOffline {
		t.Fatalf("Observe = %v, want FalseOffline", out)
	}
	if _, out, _ := Observe(s, Upstream, true, 8, at(41*time.Second)); out != Ignored {
		t.Fatalf("the same false offline upstream = %v, want Ignored", out)
	}
	if _, out, _ := Observe(s, Log, true, 10, at(70*time.Second)); out != FalseOffline {
		t.Fatalf("a second false offline = %v, want FalseOffline", out)
	}
}

// A heartbeat the gateway does not acknowledge is tried again a
// heartbeat later; the canary does not stop before one was acknowledged,
// and times the offline from the last acknowledged one.
func TestUnansweredBeats(t *testing.T) {
	s := Started(at(0), 0)
	s = Beaten(s, at(0), false)
	next(t, s, time.Second, Wait, 30*time.Second)
	s = Beaten(s, at(90*time.Second), false)
	next(t, s, 110*time.Second, Wait, 120*time.Second) // live is over, but nothing was acknowledged
	s = Beaten(s, at(120*time.Second), true)
	s = Beaten(s, at(150*time.Second), false)
	next(t, s, 150*time.Second, Stop, 150*time.Second)
	s = Halted(s, at(150*time.Second), [paths]bool{Log: true})
	if _, _, d := Observe(s, Log, true, 1, at(212*time.Second)); d != 92*time.Second {
		t.Fatalf("detection %s, want 92s from the last acknowledged beat", d)
	}
	if s2 := Beaten(s, at(160*time.Second), true); s2.LastBeat != s.LastBeat {
		t.Fatalf("a beat while stopped moved LastBeat")
	}
}
