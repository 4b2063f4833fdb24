package auth

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"fmt"
	"net/netip"
	"runtime"
	"sync"
	"time"

	"github.com/fleetgate/fleetgate/gateway"
	"github.com/fleetgate/fleetgate/internal/ratelimit"
)

// Tuning of the password guard (docs/security.md has the reasoning).
const (
	// unknownPerSecond and unknownBurst are the global budget of bcrypt
	// comparisons for IDs that have no password in the file (unknown
	// devices): a flood of random IDs gets at most that much CPU, however
	// many addresses it comes from, and never takes the slots of known
	// devices.
	unknownPerSecond = 2
	unknownBurst     = 4
	// backoffMin and backoffMax bound the wait after a failed check of a
	// known device from a source address before a password of that
	// device from that address is compared again; the wait doubles with
	// each consecutive failure and a success clears it.
	backoffMin = 250 * time.Millisecond
	backoffMax = 8 * time.Second
	// contestedPerSecond is the global budget of comparisons for known
	// devices in backoff from another source: the right password from
	// a new source gets through an attack from elsewhere, while an
	// attacker with many addresses gets no more comparisons than this.
	contestedPerSecond = 4
	// maxSourceFailures bounds the backoffs per (source, device) kept;
	// beyond it a failure from a new source is not recorded, and that
	// source's next checks take from the contested budget.
	maxSourceFailures = 1 << 16
	// slotWait bounds the wait for a comparison slot (GOMAXPROCS of them);
	// beyond it the check is refused with gateway.ErrOverloaded.
	slotWait = 2 * time.Second
	// maxCached bounds the cache of verified passwords.
	maxCached = 1 << 20
	// maxPad bounds the padding of a refusal that did no comparison, and
	// firstPad is the padding before any comparison was timed.
	maxPad   = time.Second
	firstPad = 100 * time.Millisecond
)

// guard makes a failed password check cost the attacker, not the fleet,
// while every refusal takes about the time of a bcrypt comparison, so that
// the time does not tell whether an ID exists:
//
//   - a device whose password was verified since the start (and whose
//     entry in the file has not changed) is verified again from a cache
//     of HMAC-SHA256(key, password), without bcrypt;
//   - a known device whose check from a source address failed is
//     compared again from that address only after a backoff (250 ms
//     doubling to 8 s); a check within it is refused without
//     comparison. A check from another address is compared, within a
//     global budget of contestedPerSecond while the device is in backoff
//     anywhere, so that wrong passwords from one place never keep the
//     right one from another out;
//   - an unknown device is compared (against the dummy hash) within a
//     global budget of unknownPerSecond, kept apart from the known ones;
//     beyond it the check is refused without comparison;
//   - a refusal without comparison waits the running average time of a
//     comparison, holding no CPU slot.
//
// The guard is shared by the successive devices sets of a Reloadable, so
// that a reload keeps the cache of the devices whose entry did not change.
type guard struct {
	key [32]byte
	// slots are the comparisons of known devices at once (GOMAXPROCS);
	// stranger is the one comparison of an unknown device at a time,
	// never waited for, so that strangers never queue ahead of devices.
	slots    chan struct{}
	stranger chan struct{}
	// now and pause are the clock and time.Sleep; tests replace them.
	now   func() time.Time
	pause func(time.Duration)

	mu sync.Mutex
	ok map[gateway.DeviceID]verified
	// fails is the backoff of each known device from any source (it
	// says the device is contested), srcFails the one per source.
	fails     map[gateway.DeviceID]failure
	srcFails  map[sourced]failure
	contested ratelimit.Bucket
	tokens    float64
	last      time.Time
	avg       time.Duration // running average of a comparison
	// timing: a comparison is being timed for the first average.
	timing bool
}

type verified struct {
	rev string
	mac [sha256.Size]byte
}

type failure struct {
	n     int
	until time.Time
}

// sourced is a device checked from a source address.
type sourced struct {
	from   netip.Addr
	device gateway.DeviceID
}

func newGuard() *guard {
	g := &guard{
		slots:    make(chan struct{}, runtime.GOMAXPROCS(0)),
		stranger: make(chan struct{}, 1),
		now:      time.Now,
		pause:    time.Sleep,
		ok:       make(map[gateway.DeviceID]verified),
		fails:    make(map[gateway.DeviceID]failure),
		srcFails: make(map[sourced]failure),
		tokens:   unknownBurst,

		contested: ratelimit.Full(contestedPerSecond),
	}
	if _, err := rand.Read(g.key[:]); err != nil {
		panic(fmt.Sprintf("auth: no randomness for the password cache key: %v", err))
	}
	return g
}

func (g *guard) mac(password []byte) [sha256.Size]byte {
	h := hmac.New(sha256.New, g.key[:])
	h.Write(password)
	var out [sha256.Size]byte
	h.Sum(out[:0])
	return out
}

// cached reports whether password is the one verified last for device at
// revision rev.
func (g *guard) cached(device gateway.DeviceID, rev string, password []byte) bool {
	g.mu.Lock()
	v, ok := g.ok[device]
	g.mu.Unlock()
	if !ok || v.rev != rev {
		return false
	}
	m := g.mac(password)
	return hmac.Equal(v.mac[:], m[:])
}

// mayCompare decides whether a check of device (known: it has a password)
// from address from at now may run a comparison: for a known device,
// outside the backoff of that address for it, and within the contested
// budget while the device is in backoff from any address; for an unknown
// one, within the global budget when its slot is free (the caller then
// calls strangerDone after the comparison).
func (g *guard) mayCompare(device gateway.DeviceID, from netip.Addr, known bool, now time.Time) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	if known {
		switch {
		case now.Before(g.srcFails[sourced{from, device}].until):
			return false
		case now.Before(g.fails[device].until):
			ok, _ := g.contested.Take(contestedPerSecond, now)
			return ok
		}
		return true
	}
	select {
	case g.stranger <- struct{}{}:
	default:
		return false
	}
	if d := now.Sub(g.last); d > 0 {
		g.tokens = min(unknownBurst, g.tokens+d.Seconds()*unknownPerSecond)
		g.last = now
	}
	if g.tokens < 1 {
		<-g.stranger
		return false
	}
	g.tokens--
	return true
}

// strangerDone frees the slot of an unknown device's comparison.
func (g *guard) strangerDone() { <-g.stranger }

// failed starts or doubles the backoffs of known device, checked from
// address from, at now: the device's own and the address's for it.
func (g *guard) failed(device gateway.DeviceID, from netip.Addr, now time.Time) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.fails[device] = g.fails[device].next(now)
	key := sourced{from, device}
	f, ok := g.srcFails[key]
	if !ok && len(g.srcFails) >= maxSourceFailures {
		for k, f := range g.srcFails { // forget the backoffs that ended
			if !now.Before(f.until) {
				delete(g.srcFails, k)
			}
		}
		if len(g.srcFails) >= maxSourceFailures {
			return
		}
	}
	g.srcFails[key] = f.next(now)
}

// next is f after one more failure at now.
func (f failure) next(now time.Time) failure {
	f.n++
	f.until = now.Add(backoff(f.n))
	return f
}

// backoff is the wait after the n-th consecutive failure (n ≥ 1).
func backoff(n int) time.Duration {
	if n > 6 { // backoffMin << 5 = 8 s
		return backoffMax
	}
	return min(backoffMin<<(n-1), backoffMax)
}

// succeeded clears device's backoffs, its own and that of address from,
// and caches its password.
func (g *guard) succeeded(device gateway.DeviceID, from netip.Addr, rev string, password []byte) {
	m := g.mac(password)
	g.mu.Lock()
	defer g.mu.Unlock()
	delete(g.fails, device)
	delete(g.srcFails, sourced{from, device})
	if _, ok := g.ok[device]; !ok && len(g.ok) >= maxCached {
		for k := range g.ok { // evict one, at random
			delete(g.ok, k)
			break
		}
	}
	g.ok[device] = verified{rev: rev, mac: m}
}

// compare runs cmp (a bcrypt comparison) in one of the slots, folds its
// time into the average and reports whether it matched; it returns
// gateway.ErrOverloaded when no slot freed up within slotWait. An unknown
// device's comparison runs in its own slot, taken by mayCompare.
func (g *guard) compare(cmp func() error, known bool) (bool, error) {
	if !known {
		return g.timed(cmp), nil
	}
	select {
	case g.slots <- struct{}{}:
	default:
		t := time.NewTimer(slotWait)
		defer t.Stop()
		select {
		case g.slots <- struct{}{}:
		case <-t.C:
			return false, fmt.Errorf("device credentials: no password check slot within %v: %w", slotWait, gateway.ErrOverloaded)
		}
	}
	defer func() { <-g.slots }()
	return g.timed(cmp), nil
}

// timed runs cmp, folds its time into the average and reports whether it
// matched.
func (g *guard) timed(cmp func() error) bool {
	start := time.Now()
	err := cmp()
	took := time.Since(start)
	g.mu.Lock()
	if g.avg == 0 {
		g.avg = took
	} else {
		g.avg += (took - g.avg) / 8
	}
	g.mu.Unlock()
	return err == nil
}

// pad waits about as long as a comparison takes, without one. Before any
// comparison was timed, the first pad times calibrate (one comparison)
// and the others wait firstPad.
func (g *guard) pad(calibrate func() error) {
	g.mu.Lock()
	avg, first := g.avg, g.avg == 0 && !g.timing
	if first {
		g.timing = true
	}
	g.mu.Unlock()
	switch {
	case first:
		_, _ = g.compare(calibrate, true)
	case avg == 0:
		g.pause(firstPad)
	default:
		g.pause(min(avg, maxPad))
	}
}

// carry prepares g for the devices set next: verified passwords of a
// device whose entry changed, or that is gone, are forgotten.
func (g *guard) carry(next *Devices) {
	g.mu.Lock()
	defer g.mu.Unlock()
	for id, v := range g.ok {
		if next.byID[string(id)].rev != v.rev {
			delete(g.ok, id)
		}
	}
	for id := range g.fails {
		if _, ok := next.byID[string(id)]; !ok {
			delete(g.fails, id)
		}
	}
	for k := range g.srcFails {
		if _, ok := next.byID[string(k.device)]; !ok {
			delete(g.srcFails, k)
		}
	}
	next.guard = g
}
