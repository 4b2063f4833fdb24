package adapter

import (
	"fmt"
	"testing"
	"time"
)

func TestBackoffSequence(t *testing.T) {
	b := DefaultBackoff
	var l crashLog
	t0 := time.Unix(0, 0)
	now := t0
	// Crashes 4 minutes apart never gather five in 10 minutes, and each
	// attempt ran only a second: the delay doubles up to the cap.
	var got []time.Duration
	for range 9 {
		started := now
		now = now.Add(time.Second) // ran one second
		w, failed := b.next(&l, started, now, 0)
		if failed {
			t.Fatalf("failed after %d crashes 4 minutes apart", len(got)+1)
		}
		got = append(got, w)
		now = now.Add(4 * time.Minute)
	}
	want := []time.Duration{time.Second, 2 * time.Second, 4 * time.Second, 8 * time.Second, 16 * time.Second, 32 * time.Second, 64 * time.Second, 120 * time.Second, 120 * time.Second}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("delays %v, want %v", got, want)
	}
}

func TestBackoffCapsAndFails(t *testing.T) {
	b := DefaultBackoff
	var l crashLog
	now := time.Unix(0, 0)
	var w time.Duration
	var failed bool
	for i := range 5 {
		started := now
		now = now.Add(time.Second)
		w, failed = b.next(&l, started, now, 0.99)
		if i < 4 && failed {
			t.Fatalf("failed after %d crashes", i+1)
		}
		if w > b.Max || w < b.Min {
			t.Fatalf("wait %s outside [%s, %s]", w, b.Min, b.Max)
		}
	}
	if !failed || w != b.Max {
		t.Fatalf("fifth crash in a minute: failed %v wait %s; want failed and retried at %s", failed, w, b.Max)
	}
	// Healthy for 10 minutes: everything resets.
	started := now.Add(w)
	now = started.Add(b.ResetAfter)
	w, failed = b.next(&l, started, now, 0)
	if failed || w != b.Min {
		t.Fatalf("after 10 min healthy: wait %s failed %v, want %s and not failed", w, failed, b.Min)
	}
}

func TestBackoffJitter(t *testing.T) {
	b := DefaultBackoff
	var l crashLog
	now := time.Unix(0, 0)
	w, _ := b.next(&l, now, now, 0.5)
	if w != time.Second+125*time.Millisecond {
		t.Fatalf("wait %s, want 1.125s (jitter adds up to a quarter)", w)
	}
}
