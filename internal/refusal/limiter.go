// Package refusal reports the front ends' refusals of devices
// (gateway.Refusals): one log line per device and reason at the default
// level, rate-limited with a count of what was suppressed, the counter
// fleetgate_refused_total{protocol,reason}, and each device's last
// refusal for the admin API (docs/design.md §6.13).
package refusal

import (
	"cmp"
	"container/list"
	"maps"
	"slices"
	"time"
)

// Key is what the log limit counts by: one device's refusals for one
// reason over one protocol.
type Key struct{ Protocol, Device, Reason string }

// Decision is the Limiter's answer for one refusal: Log it, after a
// summary of the Suppressed refusals of its key before it (0: none).
type Decision struct {
	Log        bool
	Suppressed uint64
}

// Summary is a count of suppressed refusals. Its Key's Device is ""
// for refusals suppressed by the global bound (or whose key was
// evicted from the table): those of many devices, summarised per
// protocol and reason.
type Summary struct {
	Key   Key
	Count uint64
}

// Limiter decides which refusals are logged: the first of a key, then
// at most one a key every Every; the others are counted, and their count
// comes out in a Summary (from Flush once the key's period has ended,
// or before the key's next logged line). Memory is bounded whatever the
// devices: at most maxKeys keys are held (the least recently refused
// goes first, once its period has ended), and at most burst lines are
// allowed in all every every; refusals beyond either are counted per
// protocol and reason only. Every
// refusal is either logged or counted in exactly one Summary.
//
// Limiter is a pure decision: the time is an argument, nothing runs by
// itself. It is not safe for concurrent use.
type Limiter struct {
	every   time.Duration
	maxKeys int
	burst   int

	keys map[Key]*list.Element // of *entry, in lru
	lru  list.List             // most recently refused first

	// window and lines: the start of the global period and the lines
	// allowed in it.
	window time.Time
	lines  int
	// overflow counts refusals suppressed by the global bound or held
	// by an evicted key, per protocol and reason (Key.Device "").
	overflow map[Key]uint64
}

type entry struct {
	key Key
	// logged is when the key's last line was allowed.
	logged     time.Time
	suppressed uint64
}

// NewLimiter returns a Limiter that logs a key at most once every
// every, holds at most maxKeys keys and allows at most burst lines in
// all every every (each at least 1).
func NewLimiter(every time.Duration, maxKeys, burst int) *Limiter {
	return &Limiter{
		every: every, maxKeys: max(maxKeys, 1), burst: max(burst, 1),
		keys: make(map[Key]*list.Element), overflow: make(map[Key]uint64),
	}
}

// Len is the number of keys held.
func (l *Limiter) Len() int { return len(l.keys) }

// Allow decides on a refusal of key k at now.
func (l *Limiter) Allow(k Key, now time.Time) Decision {
	if now.Sub(l.window) >= l.every || now.Before(l.window) {
		l.window, l.lines = now, 0
	}
	el, held := l.keys[k]
	if held {
		l.lru.MoveToFront(el)
		e := el.Value.(*entry)
		if now.Sub(e.logged) < l.every && !now.Before(e.logged) {
			e.suppressed++
			return Decision{}
		}
		if l.lines >= l.burst {
			e.suppressed++
			return Decision{}
		}
		l.lines++
		d := Decision{Log: true, Suppressed: e.suppressed}
		e.logged, e.suppressed = now, 0
		return d
	}
	if l.lines >= l.burst || (len(l.keys) >= l.maxKeys && !l.evict(now)) {
		l.overflow[Key{Protocol: k.Protocol, Reason: k.Reason}]++
		return Decision{}
	}
	l.lines++
	l.keys[k] = l.lru.PushFront(&entry{key: k, logged: now})
	return Decision{Log: true}
}

// evict drops the least recently refused key, unless its period runs
// still (it would be logged again within it: the new key is then
// refused a place); its suppressed count goes to the overflow.
func (l *Limiter) evict(now time.Time) bool {
	el := l.lru.Back()
	e := el.Value.(*entry)
	if now.Sub(e.logged) < l.every && !now.Before(e.logged) {
		return false
	}
	if e.suppressed > 0 {
		l.overflow[Key{Protocol: e.key.Protocol, Reason: e.key.Reason}] += e.suppressed
	}
	l.lru.Remove(el)
	delete(l.keys, e.key)
	return true
}

// Flush returns the summaries due at now: each key whose period has
// ended with refusals suppressed (within the global bound; beyond it
// they join the overflow), then the overflow per protocol and reason.
// The counts summarised are reset.
func (l *Limiter) Flush(now time.Time) []Summary {
	if now.Sub(l.window) >= l.every || now.Before(l.window) {
		l.window, l.lines = now, 0
	}
	var out []Summary
	for el := l.lru.Front(); el != nil; el = el.Next() {
		e := el.Value.(*entry)
		if e.suppressed == 0 || (now.Sub(e.logged) < l.every && !now.Before(e.logged)) {
			continue
		}
		if l.lines < l.burst {
			l.lines++
			out = append(out, Summary{Key: e.key, Count: e.suppressed})
		} else {
			l.overflow[Key{Protocol: e.key.Protocol, Reason: e.key.Reason}] += e.suppressed
		}
		e.suppressed = 0
	}
	for _, k := range slices.SortedFunc(maps.Keys(l.overflow), compareKeys) {
		out = append(out, Summary{Key: k, Count: l.overflow[k]})
		delete(l.overflow, k)
	}
	return out
}

func compareKeys(a, b Key) int {
	return cmp.Or(cmp.Compare(a.Protocol, b.Protocol), cmp.Compare(a.Reason, b.Reason), cmp.Compare(a.Device, b.Device))
}
