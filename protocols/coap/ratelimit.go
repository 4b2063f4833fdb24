package coap

import (
	"math"
	"net/netip"
	"sync"
	"time"
)

// maxRateSources bounds the rate limiter's table. A source whose bucket
// is full again (it sent nothing for a second) is evicted, since a full
// bucket is what a new source gets; only sources that sent within the
// last second are kept, about 60 bytes each.
const maxRateSources = 1 << 16

// evictEvery spaces the evictions a full table triggers, so that a flood
// of new sources costs one table scan per evictEvery, not one per datagram.
const evictEvery = 100 * time.Millisecond

// limiter is the per-source rate limit: a token bucket per source IP
// holding at most rate tokens (a burst of one second's worth), refilled
// at rate tokens a second. Each datagram takes a token.
type limiter struct {
	rate float64

	mu      sync.Mutex
	buckets map[netip.Addr]bucket
	evicted int64 // when evict last ran, Unix nanoseconds
}

type bucket struct {
	tokens float64
	at     int64 // when tokens was last computed, Unix nanoseconds
}

// refill is b's tokens at now, in Unix nanoseconds.
func (l *limiter) refill(b bucket, now int64) float64 {
	return min(l.rate, b.tokens+l.rate*float64(max(now-b.at, 0))/float64(time.Second))
}

func newLimiter(rate int) *limiter {
	return &limiter{rate: float64(rate), buckets: make(map[netip.Addr]bucket)}
}

// allow takes a token of src at now. When there is none it returns false
// and how long until there is one. When the table is full of sources
// that sent within the last second, a new source is refused for a second:
// state never piles up, whatever the number of (spoofed) sources.
func (l *limiter) allow(src netip.Addr, at time.Time) (bool, time.Duration) {
	now := at.UnixNano()
	l.mu.Lock()
	defer l.mu.Unlock()
	b, ok := l.buckets[src]
	switch {
	case ok:
		b.tokens = l.refill(b, now)
	case len(l.buckets) >= maxRateSources && !l.evict(now):
		return false, time.Second
	default:
		b.tokens = l.rate
	}
	b.at = now
	if b.tokens < 1 {
		l.buckets[src] = b
		return false, time.Duration(math.Ceil((1 - b.tokens) / l.rate * float64(time.Second)))
	}
	b.tokens--
	l.buckets[src] = b
	return true, 0
}

// evict removes the sources whose buckets are full again, at most once
// per evictEvery, and reports whether there is room for a new source.
func (l *limiter) evict(now int64) bool {
	if now-l.evicted >= int64(evictEvery) || now < l.evicted {
		l.evicted = now
		for src, b := range l.buckets {
			if l.refill(b, now) >= l.rate {
				delete(l.buckets, src)
			}
		}
	}
	return len(l.buckets) < maxRateSources
}

// size is the number of sources in the table.
func (l *limiter) size() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.buckets)
}
