package refusal

import (
	"fmt"
	"testing"
	"time"

	"pgregory.net/rapid"
)

var t0 = time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC)

func TestLimiterLogsFirstThenOnceAPeriodWithTheCount(t *testing.T) {
	l := NewLimiter(time.Minute, 16, 100)
	k := Key{"mqtt", "dev-1", "bad_credentials"}
	if d := l.Allow(k, t0); !d.Log || d.Suppressed != 0 {
		t.Fatalf("first refusal: %+v, want logged", d)
	}
	for i := 1; i <= 5; i++ {
		if d := l.Allow(k, t0.Add(time.Duration(i)*time.Second)); d.Log {
			t.Fatalf("refusal %d within the minute logged", i)
		}
	}
	// Another reason of the same device, and another device, are their own keys.
	if d := l.Allow(Key{"mqtt", "dev-1", "rate"}, t0.Add(6*time.Second)); !d.Log {
		t.Fatal("the device's first refusal for another reason was not logged")
	}
	if d := l.Allow(Key{"coap", "dev-1", "bad_credentials"}, t0.Add(6*time.Second)); !d.Log {
		t.Fatal("the device's first refusal over another protocol was not logged")
	}
	if d := l.Allow(k, t0.Add(time.Minute)); !d.Log || d.Suppressed != 5 {
		t.Fatalf("refusal after the minute: %+v, want logged after 5 suppressed", d)
	}
	if s := l.Flush(t0.Add(3 * time.Minute)); len(s) != 0 {
		t.Fatalf("flush with nothing suppressed: %+v", s)
	}
}

func TestLimiterFlushSummarisesEndedPeriods(t *testing.T) {
	l := NewLimiter(time.Minute, 16, 100)
	k := Key{"coap", "dev-2", "unknown_device"}
	l.Allow(k, t0)
	l.Allow(k, t0.Add(10*time.Second))
	l.Allow(k, t0.Add(20*time.Second))
	if s := l.Flush(t0.Add(30 * time.Second)); len(s) != 0 {
		t.Fatalf("flush within the period: %+v, want nothing yet", s)
	}
	s := l.Flush(t0.Add(61 * time.Second))
	if len(s) != 1 || s[0] != (Summary{Key: k, Count: 2}) {
		t.Fatalf("flush after the period: %+v, want 2 for %v", s, k)
	}
	if s := l.Flush(t0.Add(200 * time.Second)); len(s) != 0 {
		t.Fatalf("second flush: %+v, want nothing: the count was reset", s)
	}
	// Summarised by Flush: the next refusal is logged with no count.
	if d := l.Allow(k, t0.Add(201*time.Second)); !d.Log || d.Suppressed != 0 {
		t.Fatalf("refusal after the summary: %+v", d)
	}
}

func TestLimiterGlobalBoundSummarisesPerProtocolAndReason(t *testing.T) {
	l := NewLimiter(time.Minute, 1000, 10)
	logged := 0
	for i := range 500 {
		if l.Allow(Key{"mqtt", fmt.Sprintf("rnd-%d", i), "unknown_device"}, t0.Add(time.Duration(i)*time.Millisecond)).Log {
			logged++
		}
	}
	if logged != 10 {
		t.Fatalf("%d lines for 500 new devices within a minute, want the burst, 10", logged)
	}
	s := l.Flush(t0.Add(2 * time.Minute))
	if len(s) != 1 || s[0] != (Summary{Key: Key{Protocol: "mqtt", Reason: "unknown_device"}, Count: 490}) {
		t.Fatalf("flush: %+v, want 490 for mqtt unknown_device over many devices", s)
	}
	// A new period allows new lines again.
	if !l.Allow(Key{"mqtt", "rnd-x", "unknown_device"}, t0.Add(3*time.Minute)).Log {
		t.Fatal("a new device in a new period was not logged")
	}
}

func TestLimiterEvictsLeastRecentlyRefusedKeepingItsCount(t *testing.T) {
	l := NewLimiter(time.Minute, 2, 100)
	a, b, c := Key{"mqtt", "a", "rate"}, Key{"mqtt", "b", "rate"}, Key{"mqtt", "c", "rate"}
	l.Allow(a, t0)
	l.Allow(a, t0.Add(time.Second)) // suppressed: 1 for a
	l.Allow(b, t0.Add(2*time.Second))
	l.Allow(c, t0.Add(3*time.Second)) // evicts a
	if l.Len() != 2 {
		t.Fatalf("%d keys held, want at most 2", l.Len())
	}
	s := l.Flush(t0.Add(4 * time.Second))
	if len(s) != 1 || s[0] != (Summary{Key: Key{Protocol: "mqtt", Reason: "rate"}, Count: 1}) {
		t.Fatalf("flush: %+v, want the evicted key's 1 in the overflow", s)
	}
}

// TestLimiterProperties drives the limiter with random refusals and
// checks its promises: every refusal is logged or in exactly one
// summary; a key logs at most once a period; no period has more lines
// than the burst (summaries of many devices aside); the table is
// bounded.
func TestLimiterProperties(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		every := time.Duration(rapid.IntRange(1, 60).Draw(t, "every_s")) * time.Second
		maxKeys := rapid.IntRange(1, 8).Draw(t, "maxKeys")
		burst := rapid.IntRange(1, 8).Draw(t, "burst")
		l := NewLimiter(every, maxKeys, burst)
		devices := rapid.IntRange(1, 12).Draw(t, "devices")
		now := t0
		var refusals, logged, summarised uint64
		lastLog := map[Key]time.Time{}
		var windowStart time.Time // the limiter starts its first period at its first call
		windowLines := 0
		steps := rapid.IntRange(1, 300).Draw(t, "steps")
		for range steps {
			now = now.Add(time.Duration(rapid.IntRange(0, 20_000).Draw(t, "step_ms")) * time.Millisecond)
			if now.Sub(windowStart) >= every {
				windowStart, windowLines = now, 0
			}
			if rapid.IntRange(0, 9).Draw(t, "flush") == 0 {
				for _, s := range l.Flush(now) {
					summarised += s.Count
					if s.Key.Device != "" {
						windowLines++
					}
				}
			} else {
				k := Key{
					Protocol: rapid.SampledFrom([]string{"coap", "mqtt"}).Draw(t, "protocol"),
					Device:   fmt.Sprintf("d%d", rapid.IntRange(0, devices-1).Draw(t, "device")),
					Reason:   rapid.SampledFrom([]string{"rate", "bad_credentials"}).Draw(t, "reason"),
				}
				refusals++
				d := l.Allow(k, now)
				summarised += d.Suppressed
				if d.Log {
					logged++
					windowLines++
					if last, ok := lastLog[k]; ok && now.Sub(last) < every {
						t.Fatalf("%v logged at %v and again %v later, within %v", k, last, now.Sub(last), every)
					}
					lastLog[k] = now
				}
			}
			if windowLines > burst {
				t.Fatalf("%d lines in a period, burst %d", windowLines, burst)
			}
			if l.Len() > maxKeys {
				t.Fatalf("%d keys held, max %d", l.Len(), maxKeys)
			}
		}
		for _, s := range l.Flush(now.Add(every)) {
			summarised += s.Count
		}
		// What the last flush could not summarise within the burst went
		// to the overflow: one more flush.
		for _, s := range l.Flush(now.Add(2 * every)) {
			summarised += s.Count
		}
		if logged+summarised != refusals {
			t.Fatalf("%d refusals: %d logged + %d summarised", refusals, logged, summarised)
		}
	})
}

// TestLimiterBoundedUnderFloods holds 100,000 refused devices and a
// flood of a million random IDs to the table's bound and the lines to
// the burst.
func TestLimiterBoundedUnderFloods(t *testing.T) {
	l := NewLimiter(Every, MaxKeys, Burst)
	now := t0
	lines := 0
	for i := range 1_000_000 {
		now = now.Add(time.Millisecond)
		if i%10 == 0 { // the fleet: 100,000 devices
			if l.Allow(Key{"mqtt", fmt.Sprintf("dev-%d", i/10), "bad_credentials"}, now).Log {
				lines++
			}
			continue
		}
		if l.Allow(Key{"mqtt", fmt.Sprintf("%x", uint64(i)*2654435761), "unknown_device"}, now).Log {
			lines++
		}
		if l.Len() > MaxKeys {
			t.Fatalf("%d keys held after %d refusals", l.Len(), i)
		}
	}
	// 1,000 s of refusals: at most Burst lines a minute.
	if periods := int(now.Sub(t0)/Every) + 1; lines > periods*Burst {
		t.Fatalf("%d lines in %d periods, burst %d", lines, periods, Burst)
	}
	if s := l.Flush(now.Add(Every)); len(s) > Burst+2 {
		t.Fatalf("%d summaries in one flush", len(s))
	}
}
