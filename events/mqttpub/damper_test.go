package mqttpub

import (
	"testing"
	"time"

	"github.com/fleetgate/fleetgate/gateway"
)

func ev(id, dev string, state gateway.State, ver uint64, atMs int64) gateway.Event {
	return gateway.Event{ID: id, Device: gateway.DeviceID(dev), State: state, Ver: ver, At: time.UnixMilli(atMs)}
}

func ids(evs []gateway.Event) []string {
	var out []string
	for _, e := range evs {
		out = append(out, e.ID)
	}
	return out
}

func TestDamper(t *testing.T) {
	now := time.Unix(1000, 0)
	d := newDamper(2 * time.Second)
	out, damped := d.offer([]gateway.Event{
		ev("1-0", "a", gateway.Online, 1, 1000),
		ev("2-0", "a", gateway.Offline, 2, 2000), // held
		ev("3-0", "b", gateway.Offline, 4, 2500), // held
		ev("4-0", "a", gateway.Online, 3, 3999),  // within 2s of a's offline: both damped
	}, "0", now)
	if got := ids(out); len(got) != 1 || got[0] != "1-0" || damped != 2 {
		t.Fatalf("offer = %v damped %d, want [1-0] and 2", got, damped)
	}
	if safe, ok := d.safe(); !ok || safe != "2-0" {
		t.Errorf("safe = %q %v, want 2-0 (just before b's held offline)", safe, ok)
	}
	if next, ok := d.nextDue(); !ok || !next.Equal(now.Add(2*time.Second)) {
		t.Errorf("nextDue = %v %v", next, ok)
	}
	if due := d.due(now.Add(time.Second)); len(due) != 0 {
		t.Errorf("due before the delay: %v", ids(due))
	}
	// b comes back too late: its offline is published first, then the online
	out, damped = d.offer([]gateway.Event{ev("5-0", "b", gateway.Online, 5, 4500)}, "4-0", now.Add(time.Second))
	if got := ids(out); len(got) != 2 || got[0] != "3-0" || got[1] != "5-0" || damped != 0 {
		t.Errorf("late online: %v damped %d, want [3-0 5-0]", got, damped)
	}
	if _, ok := d.safe(); ok {
		t.Errorf("nothing held, yet safe reports a position")
	}
	// a held offline with nothing after it is published once due
	d.offer([]gateway.Event{ev("6-0", "c", gateway.Offline, 2, 5000)}, "5-0", now)
	if due := d.due(now.Add(2 * time.Second)); len(due) != 1 || due[0].ID != "6-0" {
		t.Errorf("due = %v, want [6-0]", ids(due))
	}
	// no delay: everything passes at once
	if out, damped := newDamper(0).offer([]gateway.Event{ev("1-0", "a", gateway.Offline, 2, 0)}, "0", now); len(out) != 1 || damped != 0 {
		t.Errorf("no delay: %v %d", ids(out), damped)
	}
}
