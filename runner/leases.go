package runner

import (
	"slices"
	"time"
)

// leases is a runner's view of its shard leases, used by Run's goroutine
// only. The store holds the truth (AcquireShard is the only way to learn
// whether another runner holds a shard, and it takes a free shard at
// once); this side remembers when each lease was taken and decides which
// free shards to ask for, so that several runners share the shards:
//
//   - Every runner walks the shards in an order rotated by a hash of its
//     Owner, so runners starting together contend for different shards.
//   - A lease round runs every LockTTL/3; it extends every lease held.
//   - In odd rounds a runner takes free shards only while it holds fewer
//     than its fair share; in even rounds it tries every shard. So a
//     runner under its share gets a freed shard first, and a shard no one
//     holds is still taken within two rounds by any runner.
//   - The fair share is ceil(shards/n), n being the runners it can infer:
//     itself plus others ≈ (shards refused in the last even round) / (its
//     own count), i.e. assuming the others hold about as many as it does.
//     Before any even round it is half the shards, leaving room for a
//     peer that starts at the same time.
//
// A runner that starts while the others already hold every shard gets
// none: it stands by and takes over the shards of a runner that stops
// (released at once) or dies (after its lease runs out).
type leases struct {
	shards     int
	order      []int
	renewEvery time.Duration
	until      map[int]time.Time // held shard → local end of its lease
	round      int
	fair       int
	nextRound  time.Time // zero: a round is due at once
}

// round is one lease round in progress.
type round struct {
	even    bool
	fair    int
	refused int // shards another runner holds
}

// mayTake reports whether the round may ask for one more free shard
// while held are held.
func (p *round) mayTake(held int) bool { return p.even || held < p.fair }

func newLeases(shards int, owner string, renewEvery time.Duration) *leases {
	l := &leases{
		shards:     shards,
		renewEvery: renewEvery,
		until:      make(map[int]time.Time),
		fair:       ceilDiv(shards, 2),
	}
	start := rotation(owner, shards)
	for i := range shards {
		l.order = append(l.order, (start+i)%shards)
	}
	return l
}

// roundDue reports whether a lease round is due at now.
func (l *leases) roundDue(now time.Time) bool { return !now.Before(l.nextRound) }

// untilRound is how long from now until the next lease round.
func (l *leases) untilRound(now time.Time) time.Duration { return l.nextRound.Sub(now) }

// begin starts a round at now.
func (l *leases) begin(now time.Time) *round {
	l.round++
	l.nextRound = now.Add(l.renewEvery)
	return &round{even: l.round%2 == 0, fair: l.fair}
}

// end closes a round; an even round, which tried every shard, sets the
// fair share of the next rounds.
func (l *leases) end(p *round) {
	if !p.even {
		return
	}
	runners := 1 + ceilDiv(p.refused, max(len(l.until), 1))
	l.fair = ceilDiv(l.shards, runners)
}

func (l *leases) holds(shard int) bool {
	_, ok := l.until[shard]
	return ok
}

func (l *leases) count() int { return len(l.until) }

// hold records a lease of shard valid until end.
func (l *leases) hold(shard int, end time.Time) { l.until[shard] = end }

func (l *leases) drop(shard int) { delete(l.until, shard) }

// expire forgets the leases that ran out by now (renewals failed) and
// returns their shards.
func (l *leases) expire(now time.Time) []int {
	var gone []int
	for shard, end := range l.until {
		if !end.After(now) {
			gone = append(gone, shard)
			delete(l.until, shard)
		}
	}
	slices.Sort(gone)
	return gone
}

// held lists the shards held, ascending.
func (l *leases) held() []int {
	s := make([]int, 0, len(l.until))
	for shard := range l.until {
		s = append(s, shard)
	}
	slices.Sort(s)
	return s
}

func ceilDiv(a, b int) int { return (a + b - 1) / b }
