//go:build faults

package faults

import (
	"context"
	"fmt"
	"os"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fleetgate/fleetgate/gateway"
	"github.com/fleetgate/fleetgate/uplink"
	"github.com/redis/go-redis/v9"
)

// shards is the gateways' presence.shards: enough to spread the shards
// over a 3-master Cluster.
const shards = 8

// event is one entry of a shard's `{P:s}:events` stream.
type event struct {
	shard    int
	id       string
	device   string
	state    string
	ver      int64
	at       time.Time
	reason   string
	gw       string
	session  string
	deadline time.Time
}

func (e event) String() string {
	return fmt.Sprintf("%s %s ver=%d reason=%s gw=%s at=%s", e.device, e.state, e.ver, e.reason, e.gw, e.at.Format("15:04:05.000"))
}

// collector tails every shard's event stream while the scenario runs, so
// that events a store later loses (restart, FLUSHALL, failover) stay in
// the log the checker reads: that log is what a consumer saw.
type collector struct {
	t      testing.TB
	mu     sync.Mutex
	client redis.UniversalClient
	last   [shards]string
	events []event
	quit   chan struct{}
	done   chan struct{}
}

// newCollector tails the streams of the Redis at addrs (one address: a
// standalone server; several: a Cluster).
func newCollector(t testing.TB, addrs ...string) *collector {
	c := &collector{t: t, quit: make(chan struct{}), done: make(chan struct{})}
	for i := range c.last {
		c.last[i] = "0"
	}
	c.point(addrs...)
	go c.loop()
	t.Cleanup(c.stop)
	return c
}

// point makes the collector read from addrs from now on (a failover).
func (c *collector) point(addrs ...string) {
	var cl redis.UniversalClient
	if len(addrs) == 1 {
		cl = redis.NewClient(&redis.Options{Addr: addrs[0], DialTimeout: 300 * time.Millisecond, ReadTimeout: 500 * time.Millisecond, MaxRetries: -1})
	} else {
		// go-redis reloads a Cluster's slots only every 60 s by default,
		// and not on a refused dial: after a failover the collector would
		// keep asking the dead master.
		cl = redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs, DialTimeout: 300 * time.Millisecond, ReadTimeout: 500 * time.Millisecond,
			MaxRetries: 2, ClusterStateReloadInterval: 500 * time.Millisecond})
	}
	c.mu.Lock()
	old := c.client
	c.client = cl
	c.mu.Unlock()
	if old != nil {
		old.Close()
	}
}

func (c *collector) loop() {
	defer close(c.done)
	for i := 0; i < 1_000_000; i++ {
		c.poll()
		select {
		case <-c.quit:
			return
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// poll reads what is new in every shard; false if some shard failed.
func (c *collector) poll() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	ok := true
	for s := 0; s < shards; s++ {
		for round := 0; round < 100; round++ {
			ctx, cancel := context.WithTimeout(context.Background(), 700*time.Millisecond)
			msgs, err := c.client.XRangeN(ctx, fmt.Sprintf("{fleetgate:%d}:events", s), "("+c.last[s], "+", 500).Result()
			cancel()
			if err != nil {
				ok = false
				break
			}
			for _, m := range msgs {
				c.last[s] = m.ID
				if m.Values["device"] == nil {
					continue // a gateway event
				}
				c.events = append(c.events, parseEvent(s, m))
			}
			if len(msgs) < 500 {
				break
			}
		}
	}
	return ok
}

func parseEvent(shard int, m redis.XMessage) event {
	str := func(k string) string { s, _ := m.Values[k].(string); return s }
	ms := func(k string) time.Time {
		v, err := strconv.ParseInt(str(k), 10, 64)
		if err != nil {
			return time.Time{}
		}
		return time.UnixMilli(v)
	}
	ver, _ := strconv.ParseInt(str("ver"), 10, 64)
	return event{shard: shard, id: m.ID, device: str("device"), state: str("state"), ver: ver, at: ms("at"),
		reason: str("reason"), gw: str("gw"), session: str("session"), deadline: ms("deadline")}
}

// stop ends the tailing after a last complete read (bounded); safe twice.
func (c *collector) stop() {
	select {
	case <-c.quit:
		return
	default:
	}
	close(c.quit)
	<-c.done
	for i := 0; i < 20 && !c.poll(); i++ {
		time.Sleep(100 * time.Millisecond)
	}
	c.mu.Lock()
	c.client.Close()
	c.mu.Unlock()
}

// log returns the events collected so far, in the order each shard's
// stream holds them.
func (c *collector) log() []event {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.events)
}

// expectations are what a scenario's faults allow.
type expectations struct {
	tm timing
	// faultStart and faultEnd bound the fault (zero: none). A device that
	// ends while its offline could be held by the fault gets the bound
	// max(end + lease + grace, faultEnd + grace) + runner + lock_ttl +
	// processing.
	faultStart, faultEnd time.Time
	// lostOK: offline events with reason gateway_lost are expected (a
	// gateway cut for longer than lease + grace) and counted apart.
	lostOK bool
	// end is when the fleet stopped: events after it are not judged.
	end time.Time
	// kills are when a gateway was killed -9. The evidence a gateway
	// acknowledged within a flush interval before (lossWindow) may still
	// have been in its in-memory queue, which a kill loses: only the
	// outbox is durable (invariant 8, docs/design.md §7). The false-offline check
	// does not count on such evidence.
	kills []time.Time
	// outageKills are the kills of a gateway whose store calls were
	// failing or hanging then: its evidence waits in memory for a call to
	// time out (uplink.DefaultTimeout) before it goes to the outbox, so a
	// kill may lose that much more (outageLossWindow).
	outageKills []time.Time
	// losses are when the store lost its state (FLUSHALL, a restart
	// without persistence): two events of the same state on either side
	// of one are not a broken alternation (the new incarnation does not
	// know what consumers last saw; they resync there, docs/design.md
	// §3.6), they are counted apart.
	losses []time.Time
}

// acrossLoss: a loss came between two events at a and b.
func (x expectations) acrossLoss(a, b time.Time) bool {
	return slices.ContainsFunc(x.losses, func(l time.Time) bool { return !l.Before(a) && !l.After(b) })
}

// lossWindow is how long before a kill -9 acknowledged evidence may not
// have reached the outbox yet: a flush interval and the flush's own time.
func (x expectations) lossWindow() time.Duration { return x.tm.flush + 100*time.Millisecond }

// outageLossWindow is lossWindow for a kill during a store outage: a
// store call's timeout more.
func (x expectations) outageLossWindow() time.Duration { return uplink.DefaultTimeout + x.lossWindow() }

// lastKept is the newest of ts before at that no kill may have lost.
func (x expectations) lastKept(ts []time.Time, at time.Time) (time.Time, bool) {
	i := sort.Search(len(ts), func(i int) bool { return ts[i].After(at) })
	for ; i > 0; i-- {
		if s := ts[i-1]; !x.mayBeLost(s) {
			return s, true
		}
	}
	return time.Time{}, false
}

// mayBeLost: evidence acknowledged at s may have died in a killed
// gateway's queue.
func (x expectations) mayBeLost(s time.Time) bool {
	return slices.ContainsFunc(x.kills, func(k time.Time) bool { return !s.After(k) && k.Sub(s) <= x.lossWindow() }) ||
		slices.ContainsFunc(x.outageKills, func(k time.Time) bool { return !s.After(k) && k.Sub(s) <= x.outageLossWindow() })
}

// result is one scenario's figures (the columns of docs/reliability.md).
type result struct {
	Devices, Heartbeats int
	FalseOffline        int // offline while the device's evidence was inside its lease
	MissedOffline       int // ended, and not offline within the bound
	Repeated            int // (device, ver) seen more than once
	BrokenAlternation   int // two events of the same state in a row, or an offline first
	VerBackwards        int // a ver lower than the device's previous one
	Resurrected         int // online again after an offline, with no evidence since
	Unseen              int // acknowledged evidence that never produced an online event (unless it lapsed during the fault)
	GatewayLost         int // offline events with reason gateway_lost
	AcrossLoss          int // same state twice in a row across a loss (not a violation)
	Events              int
	Lags                []time.Duration // at − last evidence, devices that went silent
	examples            []string
}

func (r *result) note(format string, args ...any) {
	if len(r.examples) < 20 {
		r.examples = append(r.examples, fmt.Sprintf(format, args...))
	}
}

func quantile(d []time.Duration, q float64) time.Duration {
	if len(d) == 0 {
		return 0
	}
	s := slices.Clone(d)
	slices.Sort(s)
	i := int(q*float64(len(s)-1) + 0.5)
	return s[i]
}

// row is the result as a docs/reliability.md table row.
func (r result) row(name string) string {
	lag := "–"
	if len(r.Lags) > 0 {
		lag = fmt.Sprintf("%.1f / %.1f / %.1f", quantile(r.Lags, 0.5).Seconds(), quantile(r.Lags, 0.99).Seconds(), quantile(r.Lags, 1).Seconds())
	}
	return fmt.Sprintf("| %s | %d | %d | %d | %d | %d | %d | %d | %d | %d | %s |", name, r.Devices, r.Heartbeats,
		r.FalseOffline, r.MissedOffline, r.Repeated, r.BrokenAlternation, r.Resurrected, r.Unseen, r.GatewayLost, lag)
}

// check compares the event log with the truth.
func check(truth map[string]*devTruth, log []event, x expectations) result {
	var r result
	byDev := map[string][]event{}
	for _, e := range log {
		if _, ok := truth[e.device]; ok && !e.at.After(x.end) {
			byDev[e.device] = append(byDev[e.device], e)
		}
	}
	ids := make([]string, 0, len(truth))
	for id := range truth {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	tm := x.tm
	for _, id := range ids {
		d, evs := truth[id], byDev[id]
		r.Devices++
		r.Heartbeats += len(d.sends)
		r.Events += len(evs)
		seen := map[int64]bool{}
		for i, e := range evs {
			if seen[e.ver] {
				r.Repeated++
				r.note("repeated %v", e)
			}
			seen[e.ver] = true
			if i > 0 && e.ver < evs[i-1].ver {
				r.VerBackwards++
				r.note("ver backwards %v after ver %d", e, evs[i-1].ver)
			}
			if i > 0 && e.state == evs[i-1].state && x.acrossLoss(evs[i-1].at, e.at) {
				r.AcrossLoss++
			} else if (i == 0 && e.state != "online") || (i > 0 && e.state == evs[i-1].state) {
				r.BrokenAlternation++
				r.note("broken alternation %v (previous %v)", e, prev(evs, i))
			}
			switch e.state {
			case "offline":
				if e.reason == "gateway_lost" && x.lostOK {
					r.GatewayLost++
					continue
				}
				if e.reason == "gateway_lost" {
					r.GatewayLost++
				}
				if s, ok := x.lastKept(d.sends, e.at); ok && e.at.Sub(s) < tm.earliestOffline() && !(d.leftAt.After(s) && !d.leftAt.After(e.at)) {
					r.FalseOffline++
					r.note("false offline %v: evidence %v before", e, e.at.Sub(s).Round(time.Millisecond))
				}
			case "online":
				if why := resurrected(d, evs, i, tm); why != "" {
					r.Resurrected++
					r.note("resurrected %v: %s", e, why)
				}
			}
		}
		lapsed := false
		if len(d.sends) > 0 && !slices.ContainsFunc(evs, func(e event) bool { return e.state == "online" }) {
			// Evidence buffered during a fault that lapsed before the fault
			// ended is dropped by design, never written (no resurrection).
			lapsed = !x.faultEnd.IsZero() && !d.lastEvidence().Add(tm.earliestOffline()).After(x.faultEnd) && len(evs) == 0
			if !lapsed {
				r.Unseen++
				r.note("unseen %s: %d heartbeats, no online event", id, len(d.sends))
			}
		}
		end := d.ended()
		if end.IsZero() || len(d.sends) == 0 || lapsed {
			continue
		}
		bound := x.bound(d)
		var state string
		for _, e := range evs {
			if !e.at.After(bound) {
				state = e.state
			}
		}
		if state != "offline" {
			r.MissedOffline++
			r.note("missed offline %s (ended %s, bound %s): events %v", id, end.Format("15:04:05.000"), bound.Format("15:04:05.000"), evs)
		}
		if d.leftAt.IsZero() {
			last := d.lastEvidence()
			for _, e := range evs {
				if e.state == "offline" && e.at.After(last) {
					r.Lags = append(r.Lags, e.at.Sub(last))
					break
				}
			}
		}
	}
	return r
}

// resurrected says why online event evs[i] has no evidence to stand on
// ("" when it has): after a leave and its offline, with no evidence since
// (a stale renewal replayed past the leave tombstone), or later than the lease of
// the device's last evidence (lapsed evidence replayed, invariant 8).
// An online that follows a false offline is the second half of a flap,
// counted there, not here.
func resurrected(d *devTruth, evs []event, i int, tm timing) string {
	e := evs[i]
	if !d.leftAt.IsZero() && i > 0 && evs[i-1].state == "offline" && !evs[i-1].at.Before(d.leftAt) && e.at.After(d.leftAt) {
		return fmt.Sprintf("after the leave at %s and its offline at %s", d.leftAt.Format("15:04:05.000"), evs[i-1].at.Format("15:04:05.000"))
	}
	// The last attempt, acknowledged or not: the gateway may have seen it.
	if last := d.lastTry; len(d.sends) > 0 && !d.ended().IsZero() && d.ended().Before(e.at) && e.at.After(last.Add(tm.lease+100*time.Millisecond)) {
		return fmt.Sprintf("the last evidence at %s had lapsed", last.Format("15:04:05.000"))
	}
	return ""
}

// bound is when a device that ended must be offline.
func (x expectations) bound(d *devTruth) time.Time {
	tm := x.tm
	end, hold := d.ended(), tm.lease
	if !d.leftAt.IsZero() {
		// A leave takes effect at once, or after the leave grace of
		// two flush intervals and the flush that sends it.
		hold = 3 * tm.flush
	}
	if !d.lastTry.IsZero() && d.lastTry.After(end) {
		end = d.lastTry
	}
	after := gateway.CoverageWait(tm.flush) + tm.runnerInterval + tm.lockTTL + tm.processing
	b := end.Add(hold)
	if !x.faultEnd.IsZero() && end.Add(hold+after).After(x.faultStart) {
		// A device whose gateway the store did not hear at its deadline
		// is held for the grace from that deadline (the bound check-config
		// prints for devices of a lost gateway).
		if g := end.Add(hold + tm.grace); g.After(b) {
			b = g
		}
		if g := x.faultEnd.Add(tm.grace); g.After(b) {
			b = g
		}
	}
	return b.Add(after)
}

func prev(evs []event, i int) any {
	if i == 0 {
		return "none"
	}
	return evs[i-1]
}

// assertClean logs the figures and fails on any broken invariant.
func assertClean(t *testing.T, name string, r result, truth map[string]*devTruth, log []event) {
	t.Helper()
	t.Logf("figures: %s", r.row(name))
	t.Logf("events %d, versions backwards %d", r.Events, r.VerBackwards)
	if path := os.Getenv("FAULTS_REPORT"); path != "" {
		if f, err := os.OpenFile(path, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644); err == nil {
			fmt.Fprintln(f, r.row(name))
			f.Close()
		}
	}
	var bad []string
	for _, c := range []struct {
		what string
		n    int
	}{
		{"false offline", r.FalseOffline}, {"missed offline", r.MissedOffline}, {"repeated (device, ver)", r.Repeated},
		{"broken alternation", r.BrokenAlternation}, {"versions backwards", r.VerBackwards},
		{"resurrected", r.Resurrected}, {"unseen", r.Unseen},
	} {
		if c.n != 0 {
			bad = append(bad, fmt.Sprintf("%d %s", c.n, c.what))
		}
	}
	if r.Devices == 0 || r.Heartbeats == 0 {
		bad = append(bad, "no devices or no heartbeats")
	}
	if len(bad) > 0 {
		dump(t, truth, log)
		t.Errorf("%s: %s; examples:\n  %s", name, strings.Join(bad, ", "), strings.Join(r.examples, "\n  "))
	}
}

// dump writes the event log and the truth to $FAULTS_DUMP/<test>.txt
// when FAULTS_DUMP names a directory, to study a failure.
func dump(t *testing.T, truth map[string]*devTruth, log []event) {
	dir := os.Getenv("FAULTS_DUMP")
	if dir == "" {
		return
	}
	var sb strings.Builder
	for _, e := range log {
		fmt.Fprintf(&sb, "event shard=%d id=%s %v session=%s\n", e.shard, e.id, e, e.session)
	}
	ids := make([]string, 0, len(truth))
	for id := range truth {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	for _, id := range ids {
		d := truth[id]
		var first, last string
		if n := len(d.sends); n > 0 {
			first, last = d.sends[0].Format("15:04:05.000"), d.sends[n-1].Format("15:04:05.000")
		}
		fmt.Fprintf(&sb, "truth %s %s sends=%d first=%s last=%s lastTry=%s left=%s stopped=%s moves=%d\n", id, d.proto, len(d.sends), first, last,
			d.lastTry.Format("15:04:05.000"), d.leftAt.Format("15:04:05.000"), d.stoppedAt.Format("15:04:05.000"), d.moves)
	}
	path := fmt.Sprintf("%s/%s.txt", dir, strings.ReplaceAll(t.Name(), "/", "_"))
	if err := os.WriteFile(path, []byte(sb.String()), 0o644); err == nil {
		t.Logf("event log and truth: %s", path)
	}
}
