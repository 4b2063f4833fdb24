package runner

import (
	"testing"
	"time"
)

func TestFairShareFollowsTheRunnersSeen(t *testing.T) {
	for _, c := range []struct {
		held, refused, want int
	}{
		{held: 16, refused: 0, want: 16}, // alone
		{held: 8, refused: 8, want: 8},   // two runners, even split
		{held: 6, refused: 10, want: 6},  // three runners: 6, 5, 5
		{held: 5, refused: 11, want: 4},  // … seen from one of the fives
		{held: 0, refused: 16, want: 1},  // a stand-by: the others hold all
	} {
		l := newLeases(16, "runner-a", time.Second)
		for s := range c.held {
			l.hold(s, time.Unix(1000, 0))
		}
		p := l.begin(time.Unix(0, 0)) // round 1: odd, half the shards
		if p.even || p.fair != 8 || p.mayTake(8) || !p.mayTake(7) {
			t.Fatalf("first round %+v: want odd, fair share 8", p)
		}
		l.end(p)
		p = l.begin(time.Unix(1, 0)) // round 2: even, every shard tried
		if !p.even || !p.mayTake(16) {
			t.Fatalf("second round %+v: want even, every shard tried", p)
		}
		p.refused = c.refused
		l.end(p)
		if p = l.begin(time.Unix(2, 0)); p.fair != c.want || p.mayTake(c.want) || (c.want > 0 && !p.mayTake(c.want-1)) {
			t.Errorf("held %d, refused %d: third round %+v, want fair share %d", c.held, c.refused, p, c.want)
		}
	}
}

func TestRoundsAreDueEveryRenewal(t *testing.T) {
	l := newLeases(4, "runner-a", 10*time.Second)
	t0 := time.Unix(100, 0)
	if !l.roundDue(t0) {
		t.Fatal("first round not due at once")
	}
	l.begin(t0)
	if l.roundDue(t0.Add(10*time.Second-time.Millisecond)) || !l.roundDue(t0.Add(10*time.Second)) {
		t.Fatal("next round not due exactly one renewal period later")
	}
	if d := l.untilRound(t0.Add(3 * time.Second)); d != 7*time.Second {
		t.Fatalf("untilRound %v, want 7s", d)
	}
	l.hold(1, t0.Add(5*time.Second))
	l.hold(3, t0.Add(9*time.Second))
	if gone := l.expire(t0.Add(5 * time.Second)); len(gone) != 1 || gone[0] != 1 {
		t.Fatalf("expired %v at t0+5s, want [1]", gone)
	}
	if h := l.held(); len(h) != 1 || h[0] != 3 {
		t.Fatalf("held %v, want [3]", h)
	}
}
