// Package ratelimit is the token bucket of the front ends' rate limits
// (CoAP datagrams and requests, MQTT connects, adapter evidence): a Bucket
// for one stream, and a Limiter that keeps a Bucket per key (a source
// address, a source endpoint, a device) in a table whose size stays
// bounded; and Prefix, the network (/24, /64) that per-network bounds
// group source addresses by.
package ratelimit

import (
	"math"
	"sync"
	"time"
)

// AddressFactor is how many times the rate of one device one source
// address may use, all its ports and connections together. Devices behind
// a NAT (a site router, a cellular carrier) share an address, each with
// its own source port, so the limits that bite are per endpoint and per
// device; the per-address limit only bounds one host that sprays from
// many ports or connections. At a rate of 20 a second an address gets
// 5,000: 10,000 devices behind it at a 30 s heartbeat send about 330
// datagrams a second, and when they all reconnect after a gateway restart
// they are back within seconds.
const AddressFactor = 250

// Bucket is a token bucket that holds at most rate tokens (a burst of one
// second's worth) and gains rate tokens a second; each event takes one.
// The rate (positive) is its owner's and passed to every call, so that a
// table of buckets spends 16 bytes on each. Time is read as Unix
// nanoseconds; time that goes backwards adds no tokens.
type Bucket struct {
	tokens float64
	at     int64 // when tokens was last computed, Unix nanoseconds
}

// Full is a bucket holding rate tokens: what a new stream or key gets. A
// full bucket stays full whatever the time, so it needs none.
func Full(rate float64) Bucket { return Bucket{tokens: rate} }

// Take takes a token at now. When there is none it takes nothing and
// returns false and how long until there is one.
func (b *Bucket) Take(rate float64, now time.Time) (bool, time.Duration) {
	return b.take(rate, now.UnixNano())
}

func (b *Bucket) take(rate float64, now int64) (bool, time.Duration) {
	b.tokens = b.level(rate, now)
	b.at = now
	if b.tokens < 1 {
		return false, time.Duration(math.Ceil((1 - b.tokens) / rate * float64(time.Second)))
	}
	b.tokens--
	return true, 0
}

// level is b's tokens at now, in Unix nanoseconds.
func (b Bucket) level(rate float64, now int64) float64 {
	return min(rate, b.tokens+rate*float64(max(now-b.at, 0))/float64(time.Second))
}

// Limiter is a rate limit per key: a Bucket per key, all of one rate.
// Its table forgets the keys whose buckets are full again; since a full
// bucket is what a new key gets, forgetting one changes no decision. It
// is safe for concurrent use.
type Limiter[K comparable] struct {
	rate float64
	// max bounds the table (0: no bound).
	max int

	mu      sync.Mutex
	buckets map[K]Bucket
	// sweepAt is the table size at which a new key sweeps it.
	sweepAt int
	swept   int64 // when the table was last swept, Unix nanoseconds
	// peak is the most keys the table has held since it was last
	// rebuilt: a Go map keeps the room of its peak after deletes.
	peak int
}

// minSweep is the smallest table a Limiter without a bound sweeps.
const minSweep = 1024

// sweepEvery spaces the sweeps of a bounded table that is full, so that
// a flood of new keys costs one table scan per sweepEvery, not one per
// event.
const sweepEvery = 100 * time.Millisecond

// New is a Limiter of rate (positive) events a second per key, with
// bursts of as many, whose table has no bound: it is swept whenever it
// has doubled since the last sweep (from minSweep keys on), so its size
// follows the number of keys that took a token within about a second.
// A sweep that leaves a quarter of the table's peak or less rebuilds it,
// so that its memory follows too (a burst of keys, such as every device
// back at once after a restart, is not kept for good). A new key is
// never refused.
func New[K comparable](rate int) *Limiter[K] {
	return &Limiter[K]{rate: float64(rate), buckets: make(map[K]Bucket), sweepAt: minSweep}
}

// NewBounded is a Limiter of rate (positive) events a second per key,
// with bursts of as many, that keeps at most maxKeys keys. Below the
// bound it is swept as New's is; when the table is full of keys that
// took a token within the last second, a new key is refused for a
// second: state never piles up, whatever the number of (spoofed) keys. A
// full table is swept at most once per sweepEvery.
func NewBounded[K comparable](rate, maxKeys int) *Limiter[K] {
	return &Limiter[K]{rate: float64(rate), max: maxKeys, buckets: make(map[K]Bucket), sweepAt: min(minSweep, maxKeys)}
}

// Allow takes a token of key at now. When there is none it returns false
// and how long until there is one.
func (l *Limiter[K]) Allow(key K, at time.Time) (bool, time.Duration) {
	now := at.UnixNano()
	l.mu.Lock()
	defer l.mu.Unlock()
	b, ok := l.buckets[key]
	if !ok {
		if !l.room(now) {
			return false, time.Second
		}
		b = Full(l.rate)
	}
	allowed, wait := b.take(l.rate, now)
	l.buckets[key] = b
	l.peak = max(l.peak, len(l.buckets))
	return allowed, wait
}

// room sweeps the table for a new key at now when it is due, and reports
// whether the key may be added.
func (l *Limiter[K]) room(now int64) bool {
	if len(l.buckets) < l.sweepAt {
		return true
	}
	if l.max == 0 || len(l.buckets) < l.max {
		l.sweep(now)
		return true
	}
	if now-l.swept >= int64(sweepEvery) || now < l.swept {
		l.swept = now
		l.sweep(now)
	}
	return len(l.buckets) < l.max
}

// sweep forgets the keys whose buckets are full at now, rebuilds the
// table when that left a quarter of its peak or less, and sets the size
// of the next sweep: twice what is left, within the bound.
func (l *Limiter[K]) sweep(now int64) {
	for k, b := range l.buckets {
		if b.level(l.rate, now) >= l.rate {
			delete(l.buckets, k)
		}
	}
	if n := len(l.buckets); l.peak > minSweep && n <= l.peak/4 {
		kept := make(map[K]Bucket, n)
		for k, b := range l.buckets {
			kept[k] = b
		}
		l.buckets, l.peak = kept, n
	}
	l.sweepAt = max(minSweep, 2*len(l.buckets))
	if l.max > 0 {
		l.sweepAt = min(l.sweepAt, l.max)
	}
}

// Len is the number of keys in the table.
func (l *Limiter[K]) Len() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.buckets)
}
