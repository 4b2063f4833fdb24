package sim

import (
	"testing"
	"time"

	"pgregory.net/rapid"
)

// Every entry fires exactly once, never before it is due, in the first
// expire whose now has reached its tick, and in tick order; entries
// added while firing (due now, in the past, or revolutions ahead) obey
// the same.
func TestWheelOrderAndBounds(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		origin := time.Unix(1000, 0)
		tick := time.Duration(rapid.IntRange(1, 50).Draw(t, "tick ms")) * time.Millisecond
		w := newWheel(origin, tick, rapid.IntRange(1, 64).Draw(t, "slots"))
		due := map[int32]time.Time{}
		placed := map[int32]int64{} // its tick, or the next one to expire when it was added
		fired := map[int32]int{}
		var nextID int32
		add := func(at time.Time) {
			due[nextID] = at
			placed[nextID] = max(w.tickOf(int64(at.Sub(origin))), w.next)
			w.add(at, nextID)
			nextID++
		}
		for range rapid.IntRange(0, 200).Draw(t, "entries") {
			add(origin.Add(time.Duration(rapid.Int64Range(0, int64(10*time.Second)).Draw(t, "at"))))
		}
		now := origin
		for range 400 {
			now = now.Add(time.Duration(rapid.Int64Range(0, int64(2*time.Second)).Draw(t, "step")))
			var lastTick int64 = -1
			before := nextID // those added while firing for the last tick wait for the next call
			w.expire(now, func(id int32, at time.Time) {
				if !at.Equal(due[id]) {
					t.Fatalf("entry %d fired with %v, was due %v", id, at, due[id])
				}
				if at.After(now) {
					t.Fatalf("entry %d due %v fired at %v", id, at, now)
				}
				tk := placed[id]
				if tk < lastTick {
					t.Fatalf("tick %d fired after tick %d", tk, lastTick)
				}
				lastTick = tk
				fired[id]++
				if nextID < 400 && rapid.Bool().Draw(t, "re-add") {
					add(now.Add(time.Duration(rapid.Int64Range(-int64(time.Second), int64(20*time.Second)).Draw(t, "again"))))
				}
			})
			// nothing due by now that was there before is left
			for id, at := range due {
				if id < before && fired[id] == 0 && placed[id] <= int64(now.Sub(origin)/tick) {
					t.Fatalf("entry %d due %v not fired by %v", id, at, now)
				}
			}
		}
		now = now.Add(time.Minute)
		w.expire(now, func(id int32, _ time.Time) { fired[id]++ })
		for id := range due {
			if fired[id] != 1 {
				t.Fatalf("entry %d fired %d times", id, fired[id])
			}
		}
		if w.n != 0 {
			t.Fatalf("%d entries left", w.n)
		}
	})
}
