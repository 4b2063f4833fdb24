package sim

import "time"

// wheel is a hashed timer wheel: what every device does next, as one
// entry in the slot of its tick, so that a fleet of 100,000 devices is
// one goroutine waking every tick, not a goroutine and a timer per
// device. A slot holds the entries of every tick congruent to it
// modulo the slots; those of a later revolution wait there.
//
// The wheel has no clock: expire is given now.
type wheel struct {
	origin time.Time     // tick 0
	tick   time.Duration // width of a slot
	slots  [][]wheelEntry
	next   int64 // the first tick not yet expired
	n      int   // entries held
}

type wheelEntry struct {
	at int64 // when it is due, in nanoseconds after origin
	id int32
}

// newWheel makes a wheel of slots ticks of width tick, starting at
// origin; slots is rounded up to a power of two.
func newWheel(origin time.Time, tick time.Duration, slots int) *wheel {
	n := 1
	for n < slots {
		n <<= 1
	}
	return &wheel{origin: origin, tick: tick, slots: make([][]wheelEntry, n)}
}

// tickOf is the first tick at or after at: an entry never fires early.
func (w *wheel) tickOf(at int64) int64 {
	t := at / int64(w.tick)
	if at > t*int64(w.tick) {
		t++
	}
	return t
}

// add schedules id at at. An entry due at or before the last expired
// tick goes to the next one.
func (w *wheel) add(at time.Time, id int32) {
	ns := int64(at.Sub(w.origin))
	t := max(w.tickOf(ns), w.next)
	s := &w.slots[t&int64(len(w.slots)-1)]
	*s = append(*s, wheelEntry{at: ns, id: id})
	w.n++
}

// expire calls fire, in tick order, for every entry due at or before
// now, with the time it was due; fire may add entries, which fire in
// this call only if they are due in a later tick that now has reached.
// It looks at no more than one revolution of slots per call beyond
// those that hold entries due now, so a call after a long pause costs
// the slots, not the ticks missed.
func (w *wheel) expire(now time.Time, fire func(id int32, at time.Time)) {
	last := int64(now.Sub(w.origin)) / int64(w.tick)
	mask := int64(len(w.slots) - 1)
	if last-w.next >= int64(len(w.slots)) && w.n > 0 {
		// Behind by more than a revolution: every slot is due; skip
		// the empty revolutions to the earliest entry's tick.
		earliest := last
		for _, s := range w.slots {
			for _, e := range s {
				earliest = min(earliest, w.tickOf(e.at))
			}
		}
		w.next = max(w.next, earliest)
	}
	for w.next <= last {
		if w.n == 0 {
			w.next = last + 1
			break
		}
		cur := w.next
		w.next++ // what fire adds for cur or before goes to cur + 1
		s := &w.slots[cur&mask]
		kept := (*s)[:0]
		due := *s
		*s = nil // fire may add to this slot (a later revolution)
		for _, e := range due {
			if w.tickOf(e.at) > cur {
				kept = append(kept, e)
				continue
			}
			w.n--
			fire(e.id, w.origin.Add(time.Duration(e.at)))
		}
		// entries added by fire to this slot, then the kept ones
		*s = append(kept, *s...)
	}
}
