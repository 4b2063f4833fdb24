package mqttpub

import (
	"slices"
	"time"

	"github.com/fleetgate/fleetgate/gateway"
)

// damper holds offline events back for a delay (Options.OfflineDelay):
// an offline event followed by the device's next online event (ver + 1)
// less than the delay later (store clock) is published as neither. Its
// decisions take now; it is used by one shard publisher's goroutine.
type damper struct {
	delay time.Duration
	held  map[gateway.DeviceID]heldEvent
}

// heldEvent is an offline event held back, the log position just before
// it (where a restart must resume so as not to lose it) and when it is
// published if nothing cancels it (local clock).
type heldEvent struct {
	ev     gateway.Event
	before string
	due    time.Time
}

func newDamper(delay time.Duration) *damper {
	return &damper{delay: delay, held: map[gateway.DeviceID]heldEvent{}}
}

// offer takes the next events of the shard's log (prev is the position
// before the first) and returns those to publish now, in log order, and
// how many events were damped.
func (d *damper) offer(evs []gateway.Event, prev string, now time.Time) ([]gateway.Event, int) {
	if d.delay <= 0 {
		return evs, 0
	}
	out := make([]gateway.Event, 0, len(evs))
	damped := 0
	for i, e := range evs {
		before := prev
		if i > 0 {
			before = evs[i-1].ID
		}
		h, isHeld := d.held[e.Device]
		if isHeld {
			delete(d.held, e.Device)
			if e.State == gateway.Online && e.Ver == h.ev.Ver+1 && e.At.Sub(h.ev.At) < d.delay {
				damped += 2
				continue
			}
			out = append(out, h.ev)
		}
		if e.State == gateway.Offline {
			d.held[e.Device] = heldEvent{ev: e, before: before, due: now.Add(d.delay)}
			continue
		}
		out = append(out, e)
	}
	return out, damped
}

// due returns the held events whose delay has passed at now, in log
// order, and forgets them.
func (d *damper) due(now time.Time) []gateway.Event {
	var out []gateway.Event
	for dev, h := range d.held {
		if !h.due.After(now) {
			out = append(out, h.ev)
			delete(d.held, dev)
		}
	}
	slices.SortFunc(out, func(a, b gateway.Event) int { return gateway.CompareLogIDs(a.ID, b.ID) })
	return out
}

// nextDue is the earliest time a held event is due.
func (d *damper) nextDue() (time.Time, bool) {
	var first time.Time
	for _, h := range d.held {
		if first.IsZero() || h.due.Before(first) {
			first = h.due
		}
	}
	return first, !first.IsZero()
}

// safe is the furthest position that may be saved while events are
// held: just before the earliest of them.
func (d *damper) safe() (string, bool) {
	var first string
	for _, h := range d.held {
		if first == "" || gateway.CompareLogIDs(h.before, first) < 0 {
			first = h.before
		}
	}
	return first, first != ""
}
