package ratelimit

import (
	"net/netip"
	"runtime"
	"testing"
	"time"
)

var start = time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)

func addr(i int) netip.Addr {
	return netip.AddrFrom4([4]byte{10, byte(i >> 16), byte(i >> 8), byte(i)})
}

func TestBucket(t *testing.T) {
	const rate = 4
	b := Full(rate)
	now := start
	for i := range rate {
		if ok, wait := b.Take(rate, now); !ok || wait != 0 {
			t.Fatalf("token %d of the burst: %v, wait %v", i, ok, wait)
		}
	}
	if ok, wait := b.Take(rate, now); ok || wait != time.Second/rate {
		t.Fatalf("beyond the burst: %v, wait %v, want a quarter of a second", ok, wait)
	}
	// Time going backwards adds nothing.
	if ok, _ := b.Take(rate, now.Add(-time.Hour)); ok {
		t.Fatal("a token an hour earlier")
	}
	now = now.Add(-time.Hour)
	if ok, wait := b.Take(rate, now.Add(time.Second/rate/2)); ok || wait != time.Second/rate/2 {
		t.Fatalf("half a token later: %v, wait %v", ok, wait)
	}
	if ok, _ := b.Take(rate, now.Add(time.Second/rate)); !ok {
		t.Fatal("refused after a quarter of a second")
	}
	// However long the pause, the burst is rate tokens.
	now = now.Add(time.Hour)
	for i := range rate {
		if ok, _ := b.Take(rate, now); !ok {
			t.Fatalf("token %d after an hour refused", i)
		}
	}
	if ok, _ := b.Take(rate, now); ok {
		t.Fatal("a burst beyond rate after an hour")
	}
}

func TestLimiterPerKey(t *testing.T) {
	l := New[netip.Addr](1)
	if ok, _ := l.Allow(addr(1), start); !ok {
		t.Fatal("first event of a key refused")
	}
	if ok, wait := l.Allow(addr(1), start); ok || wait != time.Second {
		t.Fatalf("second event of a key at rate 1: %v, wait %v", ok, wait)
	}
	if ok, _ := l.Allow(addr(2), start); !ok {
		t.Fatal("another key shares the first one's bucket")
	}
}

func TestLimiterBounded(t *testing.T) {
	const bound = 1 << 12
	l := NewBounded[netip.Addr](2, bound)
	now := start
	for i := range bound {
		if ok, _ := l.Allow(addr(i), now); !ok {
			t.Fatalf("source %d refused its first datagram", i)
		}
	}
	// Full of sources that sent just now: a new one waits a second.
	if ok, wait := l.Allow(addr(bound), now); ok || wait != time.Second {
		t.Fatalf("new source with a full table: %v, wait %v", ok, wait)
	}
	// Known sources keep their own buckets meanwhile.
	if ok, _ := l.Allow(addr(7), now); !ok {
		t.Fatal("known source refused its second datagram")
	}
	if ok, wait := l.Allow(addr(7), now); ok || wait != time.Second/2 {
		t.Fatalf("known source's third datagram: %v, wait %v", ok, wait)
	}
	// A second later every bucket is full again: swept, room for more.
	now = now.Add(time.Second)
	if ok, _ := l.Allow(addr(bound), now); !ok {
		t.Fatal("new source refused after the table emptied")
	}
	if n := l.Len(); n != 1 {
		t.Fatalf("%d sources kept, want 1", n)
	}
}

func TestLimiterSweptWhenDoubled(t *testing.T) {
	l := New[netip.Addr](2)
	now := start
	for i := range minSweep {
		if ok, _ := l.Allow(addr(i), now); !ok {
			t.Fatalf("source %d refused its first connect", i)
		}
	}
	// The table reached minSweep, but every bucket was used just now:
	// nothing is forgotten and the new key is allowed all the same.
	if ok, _ := l.Allow(addr(minSweep), now); !ok {
		t.Fatal("new source refused with a table to sweep")
	}
	if n := l.Len(); n != minSweep+1 {
		t.Fatalf("%d keys after a sweep that found no full bucket, want %d", n, minSweep+1)
	}
	// The next sweep waits for the table to double.
	now = now.Add(time.Second)
	if ok, _ := l.Allow(addr(minSweep+1), now); !ok {
		t.Fatal("new source refused")
	}
	if n := l.Len(); n != minSweep+2 {
		t.Fatalf("%d keys, want %d: swept before the table doubled", n, minSweep+2)
	}
	for i := minSweep + 2; i < 2*minSweep; i++ {
		l.Allow(addr(i), now)
	}
	// Doubled: the buckets of a second ago are full again and forgotten.
	if ok, _ := l.Allow(addr(2*minSweep), now); !ok {
		t.Fatal("new source refused")
	}
	if n, want := l.Len(), minSweep; n != want {
		t.Fatalf("%d keys after the sweep, want the %d that connected in this second", n, want)
	}
}

// A bounded table is swept as an unbounded one is, not only when full:
// the gateway's tables are bounded far above a site's fleet, and a table
// that waited for its bound kept a bucket for every device that ever
// sent.
func TestLimiterBoundedSweptBeforeFull(t *testing.T) {
	l := NewBounded[netip.Addr](2, 1<<16)
	now := start
	for i := range minSweep {
		l.Allow(addr(i), now)
	}
	now = now.Add(time.Second)
	if ok, _ := l.Allow(addr(minSweep), now); !ok {
		t.Fatal("new source refused")
	}
	if n := l.Len(); n != 1 {
		t.Fatalf("%d sources kept a second after the others sent, want 1", n)
	}
}

// A table that a burst of keys grew gives its room back once a sweep has
// forgotten them: every device of a site back at once after a restart
// must not leave a bucket's room per device for good.
func TestLimiterGivesBackItsRoom(t *testing.T) {
	const burst, wave = 100_000, 32_000
	l := NewBounded[netip.AddrPort](1, 1<<20)
	now := start
	for i := range burst {
		l.Allow(netip.AddrPortFrom(addr(i), 5683), now)
	}
	peak := heapBytes()
	now = now.Add(2 * time.Second)
	for i := range wave {
		l.Allow(netip.AddrPortFrom(addr(burst+i), 5683), now)
	}
	after := heapBytes()
	if n := l.Len(); n > wave {
		t.Fatalf("%d keys after the sweep, want at most the %d of the second wave", n, wave)
	}
	// the wave's keys in a table sized for them: a map's room is a power
	// of two, so half the burst's (without the rebuild: all of it)
	if after > peak*6/10 {
		t.Fatalf("heap %d B with %d keys left, %d B with the burst's %d: the table kept its peak's room", after, l.Len(), peak, burst)
	}
	runtime.KeepAlive(l)
}

// heapBytes is the live heap after a collection.
func heapBytes() uint64 {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}
