package coap

import (
	"math"
	"net"
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

// addressFactor is how many times RequestsPerSecond one source address
// may send, all its ports together (the per-address limit). Devices
// behind a NAT (a site router, a cellular carrier) share an address but
// each has its own source port, so the limits that bite are per endpoint
// (address and port) and per device; the per-address limit only bounds
// one host that sprays datagrams from many ports. At the default 20/s it
// is 5,000 datagrams a second: 10,000 devices behind one address at the
// shipped 30 s heartbeat send about 330 a second, and 2,000 at a 1 s
// heartbeat 2,000 (docs/benchmarks.md, "Many devices behind one address").
const addressFactor = 250

// limiter is a rate limit per key (a source endpoint, a source address, a
// device): a token bucket per key holding at most rate tokens (a burst of
// one second's worth), refilled at rate tokens a second. Each datagram
// takes a token.
type limiter[K comparable] struct {
	rate float64

	mu      sync.Mutex
	buckets map[K]bucket
	evicted int64 // when evict last ran, Unix nanoseconds
}

type bucket struct {
	tokens float64
	at     int64 // when tokens was last computed, Unix nanoseconds
}

// refill is b's tokens at now, in Unix nanoseconds.
func (l *limiter[K]) refill(b bucket, now int64) float64 {
	return min(l.rate, b.tokens+l.rate*float64(max(now-b.at, 0))/float64(time.Second))
}

func newLimiter[K comparable](rate int) *limiter[K] {
	return &limiter[K]{rate: float64(rate), buckets: make(map[K]bucket)}
}

// allow takes a token of src at now. When there is none it returns false
// and how long until there is one. When the table is full of sources
// that sent within the last second, a new source is refused for a second:
// state never piles up, whatever the number of (spoofed) sources.
func (l *limiter[K]) allow(src K, at time.Time) (bool, time.Duration) {
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
func (l *limiter[K]) evict(now int64) bool {
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

// size is the number of keys in the table.
func (l *limiter[K]) size() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.buckets)
}

// allowSource takes a token of src's endpoint and then one of its
// address (UDP datagrams, DTLS handshakes and requests). A datagram the
// endpoint's limit refuses takes nothing from its address, whose budget
// the devices behind the same NAT share.
func (s *Server) allowSource(src netip.AddrPort, now time.Time) (bool, time.Duration) {
	src = netip.AddrPortFrom(src.Addr().Unmap(), src.Port())
	if ok, wait := s.endpoints.allow(src, now); !ok {
		return false, wait
	}
	return s.limit.allow(src.Addr(), now)
}

// endpointOf is the source endpoint of a peer address.
func endpointOf(a net.Addr) netip.AddrPort {
	if ua, ok := a.(*net.UDPAddr); ok {
		return ua.AddrPort()
	}
	return netip.AddrPort{}
}
