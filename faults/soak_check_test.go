//go:build faults

package faults

import (
	"fmt"
	"io"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/fleetgate/fleetgate/gateway"
	"github.com/fleetgate/fleetgate/uplink"
)

// soakTruth is what the soak's devices did, recorded as they do it and
// trimmed by the checker once judged, so that memory stays bounded over a
// long run.
type soakTruth struct {
	mu         sync.Mutex
	gateways   int
	devs       map[string]*devRecord
	ids        []string
	heartbeats int
	lives      int
}

func newSoakTruth(gateways int, plans []devicePlan) *soakTruth {
	tr := &soakTruth{gateways: gateways, devs: map[string]*devRecord{}}
	for _, p := range plans {
		tr.devs[p.id] = &devRecord{id: p.id, kind: p.kind, slots: make([]slotRecord, p.kind.slots())}
		tr.ids = append(tr.ids, p.id)
	}
	sort.Strings(tr.ids)
	return tr
}

// devRecord is one device's truth and the checker's state for it.
type devRecord struct {
	id    string
	kind  devKind
	slots []slotRecord
	lives []*lifeRecord // oldest first; judged ones trimmed
	// moves are when the device moved to another gateway (before the new
	// connection's CONNECT): later evidence went there.
	moves []time.Time
	chk   devCheck
}

// slotRecord is one instance's evidence: a device keeps one or two
// sessions of its own at once (a CoAP instance, an MQTT client).
type slotRecord struct {
	sends []time.Time // acknowledged evidence, timed just before sending
	acks  []time.Time // when each was acknowledged: the gateway had it by then
	gws   []int       // the gateway of each send
	// leaves are the goodbyes that ended the instance's presence, timed
	// before sending.
	leaves []time.Time
	// unsure are the goodbyes that got no answer, timed before sending:
	// a stopped gateway reads them when continued, so a leave may follow.
	unsure []time.Time
}

// lifeRecord is one life of a device as it went.
type lifeRecord struct {
	start time.Time
	end   time.Time // zero while it runs
	// byStop: ended by the fleet's stop, not by its plan: not judged.
	byStop bool
	// ends are the sessions the life left behind: each instance's last
	// one, an MQTT connection dropped without a goodbye, the persistent
	// session of a sleepy device on a gateway it moved away from. Each
	// lasts until its last evidence's lease, or its goodbye's grace.
	ends []sessionEnd
	// lastTry is, per gateway, the end of the last attempt to it,
	// acknowledged or not (the gateway may have seen it).
	lastTry []time.Time
	lastAck time.Time
	judged  bool
}

type sessionEnd struct {
	at    time.Time
	gw    int
	leave bool
}

// The fleet's side: each call records one thing a device did.

func (tr *soakTruth) beginLife(id string, at time.Time) *lifeRecord {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	d := tr.devs[id]
	lf := &lifeRecord{start: at, lastTry: make([]time.Time, tr.gateways)}
	d.lives = append(d.lives, lf)
	tr.lives++
	return lf
}

// attempt records evidence sent at try to gateway gw by instance slot,
// acknowledged when ok.
func (tr *soakTruth) attempt(id string, lf *lifeRecord, slot, gw int, try time.Time, ok bool) {
	done := time.Now()
	tr.mu.Lock()
	defer tr.mu.Unlock()
	lf.lastTry[gw] = done
	if ok {
		s := &tr.devs[id].slots[slot]
		s.sends, s.acks, s.gws = append(s.sends, try), append(s.acks, done), append(s.gws, gw)
		lf.lastAck = try
		tr.heartbeats++
	}
}

// sessionEnded records a session left behind at gateway gw, last heard at
// at, with a goodbye (timed before sending it) when leave.
func (tr *soakTruth) sessionEnded(lf *lifeRecord, gw int, at time.Time, leave bool) {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	// Sessions whose lease ran out long ago no longer matter.
	lf.ends = slices.DeleteFunc(lf.ends, func(e sessionEnd) bool { return e.at.Add(fast.lease + time.Second).Before(at) })
	lf.ends = append(lf.ends, sessionEnd{at: at, gw: gw, leave: leave})
}

// left records the goodbye (timed before sending) that ended instance
// slot's presence.
func (tr *soakTruth) left(id string, slot int, at time.Time) {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	s := &tr.devs[id].slots[slot]
	s.leaves = append(s.leaves, at)
}

// leftUnsure records a goodbye of instance slot (timed before sending)
// that got no answer: it may still be read.
func (tr *soakTruth) leftUnsure(id string, slot int, at time.Time) {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	s := &tr.devs[id].slots[slot]
	s.unsure = append(s.unsure, at)
}

// moved records a move of the device, timed before its first attempt to
// the new gateway.
func (tr *soakTruth) moved(id string, at time.Time) {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	d := tr.devs[id]
	d.moves = append(d.moves, at)
}

func (tr *soakTruth) endLife(lf *lifeRecord, byStop bool) {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	lf.end, lf.byStop = time.Now(), byStop
}

// faultRun is a fault as the nemesis ran it.
type faultRun struct {
	plannedFault
	info       kindInfo
	targetName string
	// gw is the gateway whose path the fault touches, -1 for all (a
	// Redis fault); shards, for a Cluster fault, the shards of the master.
	gw         int
	start, end time.Time // end is zero while it runs
}

func (f *faultRun) String() string {
	return fmt.Sprintf("#%d %s %s", f.n, f.kind, f.targetName)
}

// touches: the fault may have kept gateway g's writes from the store.
func (f *faultRun) touches(g int) bool { return f.info.outage && (f.gw < 0 || f.gw == g) }

// boundary is a store change that starts a new incarnation of its
// shards (a restart without persistence, a FLUSHALL, a failover: each may
// lose acknowledged writes, and the events lost with them were seen all
// the same): a device's events alternate within an incarnation (a
// consumer resyncs at a new one), so the alternation of the log is
// judged within each side of it.
type boundary struct {
	from, to time.Time
	shards   []int
}

// faultLog is the nemesis's record, shared with the checker.
type faultLog struct {
	mu    sync.Mutex
	t0    time.Time
	runs  []*faultRun
	kills []time.Time
	// outageKills are the kills during a store outage of that gateway
	// (expectations.outageKills).
	outageKills []time.Time
	boundaries  []boundary
}

func (fl *faultLog) begin(f *faultRun) {
	fl.mu.Lock()
	defer fl.mu.Unlock()
	f.start = time.Now()
	fl.runs = append(fl.runs, f)
	if f.kind == gwKill {
		fl.kills = append(fl.kills, f.start)
		// killed while its store calls failed or hung (or had, a call's
		// timeout ago): it may lose more (outageLossWindow)
		for _, r := range fl.runs {
			if r != f && r.touches(f.gw) && (r.end.IsZero() || f.start.Sub(r.end) <= uplink.DefaultTimeout) {
				fl.outageKills = append(fl.outageKills, f.start)
				break
			}
		}
	}
}

func (fl *faultLog) finish(f *faultRun) {
	fl.mu.Lock()
	defer fl.mu.Unlock()
	f.end = time.Now()
}

func (fl *faultLog) addBoundary(b boundary) {
	fl.mu.Lock()
	defer fl.mu.Unlock()
	fl.boundaries = append(fl.boundaries, b)
}

// rel is t as an offset from the fleet's start, as the schedule prints it.
func (fl *faultLog) rel(t time.Time) string {
	if t.IsZero() {
		return "now"
	}
	return fmt.Sprintf("+%.1fs", t.Sub(fl.t0).Seconds())
}

// soakResult is the soak's figures.
type soakResult struct {
	Devices, Lives, Judged, Heartbeats, Events int
	FalseOffline, MissedOffline, Repeated      int
	BrokenAlternation, VerBackwards            int
	Resurrected, Unseen                        int
	// HeldByCut: false offlines whose only recent evidence was
	// acknowledged by a gateway cut from the store (it was in that
	// gateway's outbox; the session that ran out was another gateway's),
	// which the store waits for within the gateway horizon.
	HeldByCut int
	// Not violations, counted apart: same-state events across a loss (a
	// new incarnation) and onlines a new incarnation brought back with no
	// event (judgeUnseen); offlines with reason gateway_lost, and those
	// after an outage of lease + grace or longer.
	AcrossLoss, GatewayLost, LostAfterLongOutage int
	Lags                                         []time.Duration
	examples                                     []string
}

func (r *soakResult) violations() int {
	return r.FalseOffline + r.HeldByCut + r.MissedOffline + r.Repeated + r.BrokenAlternation + r.VerBackwards + r.Resurrected + r.Unseen
}

// soakChecker holds the event log against the truth in windows: each
// window takes the events up to a cutoff that every event written before
// it has reached the collector, and judges what is settled by then.
type soakChecker struct {
	tm     timing
	truth  *soakTruth
	faults *faultLog
	logf   func(format string, args ...any)
	res    soakResult
	// pending holds each device's events past the last cutoff.
	pending map[string][]event
	// shown counts the violations printed, by kind.
	shown map[*int]int
	// dump, when set, gets every event judged (SOAK_DUMP).
	dump io.Writer
}

// devCheck is the checker's state for one device.
type devCheck struct {
	last event // zero state: no event yet
	vers []int64
	// hist holds the recent events, to read the state at a past time.
	hist       []event
	unseenDone bool
}

func newSoakChecker(tm timing, truth *soakTruth, faults *faultLog, logf func(string, ...any)) *soakChecker {
	return &soakChecker{tm: tm, truth: truth, faults: faults, logf: logf, pending: map[string][]event{}}
}

// soakKeep is how much judged history the checker keeps.
const soakKeep = 2 * time.Minute

// add takes events from the collector.
func (c *soakChecker) add(evs []event) {
	for _, e := range evs {
		c.pending[e.device] = append(c.pending[e.device], e)
	}
}

// window judges everything settled by cutoff.
func (c *soakChecker) window(cutoff time.Time) {
	c.truth.mu.Lock()
	defer c.truth.mu.Unlock()
	c.faults.mu.Lock()
	defer c.faults.mu.Unlock()
	for _, id := range c.truth.ids {
		d := c.truth.devs[id]
		evs := c.pending[id]
		n := 0
		for n < len(evs) && !evs[n].at.After(cutoff) {
			c.event(d, evs[n])
			n++
		}
		c.pending[id] = evs[n:]
		c.judgeLives(d, cutoff)
		c.judgeUnseen(d, cutoff)
		c.trim(d, cutoff)
	}
	c.res.Heartbeats = c.truth.heartbeats
}

func (c *soakChecker) x() expectations {
	return expectations{tm: c.tm, kills: c.faults.kills, outageKills: c.faults.outageKills}
}

// violation counts one broken invariant and, for the first few of each
// kind, prints it at once with the device's truth and events around it
// and the faults around at.
func (c *soakChecker) violation(count *int, at time.Time, d *devRecord, format string, args ...any) {
	*count++
	if c.shown == nil {
		c.shown = map[*int]int{}
	}
	if c.shown[count]++; c.shown[count] > 5 {
		return
	}
	msg := fmt.Sprintf(format, args...)
	c.res.examples = append(c.res.examples, msg)
	c.logf("VIOLATION %s; faults around %s: %s%s", msg, c.faults.rel(at), c.faultsAround(at), c.excerpt(d, at))
}

// faultsAround lists the faults that may bear on what happened at t.
func (c *soakChecker) faultsAround(t time.Time) string {
	var out []string
	for _, f := range c.faults.runs {
		if f.start.After(t) || (!f.end.IsZero() && f.end.Before(t.Add(-c.tm.lease-c.tm.grace-soakSettle))) {
			continue
		}
		out = append(out, fmt.Sprintf("%v %s..%s", f, c.faults.rel(f.start), c.faults.rel(f.end)))
	}
	if len(out) == 0 {
		return "none"
	}
	return strings.Join(out, ", ")
}

func (c *soakChecker) event(d *devRecord, e event) {
	ck := &d.chk
	c.res.Events++
	if c.dump != nil {
		fmt.Fprintf(c.dump, "%s shard=%d id=%s %v session=%s deadline=%s\n", c.faults.rel(e.at), e.shard, e.id, e, e.session, e.deadline.Format("15:04:05.000"))
	}
	if ck.last.state != "" {
		switch {
		case slices.Contains(ck.vers, e.ver):
			c.violation(&c.res.Repeated, e.at, d, "repeated %v", e)
		case e.ver < ck.last.ver:
			c.violation(&c.res.VerBackwards, e.at, d, "ver backwards %v after ver %d", e, ck.last.ver)
		}
		if e.state == ck.last.state {
			if c.acrossBoundary(e.shard, ck.last.at, e.at) {
				c.res.AcrossLoss++
			} else {
				c.violation(&c.res.BrokenAlternation, e.at, d, "broken alternation %v (previous %v)", e, ck.last)
			}
		}
	} else if e.state != "online" {
		c.violation(&c.res.BrokenAlternation, e.at, d, "broken alternation %v (first event)", e)
	}
	switch e.state {
	case "offline":
		c.offline(d, e)
	case "online":
		c.online(d, e)
		ck.unseenDone = false
	}
	if ck.vers = append(ck.vers, e.ver); len(ck.vers) > 32 {
		ck.vers = ck.vers[1:]
	}
	ck.hist = append(ck.hist, e)
	ck.last = e
}

func (c *soakChecker) acrossBoundary(shard int, a, b time.Time) bool {
	for _, bd := range c.faults.boundaries {
		if slices.Contains(bd.shards, shard) && !a.After(bd.to) && !b.Before(bd.from) {
			return true
		}
	}
	return false
}

func gwIndex(id string) int {
	if len(id) == 4 && strings.HasPrefix(id, "gw-") {
		return int(id[3] - 'a')
	}
	return -1
}

// offline judges an offline event: it is false when an instance of the
// device had acknowledged evidence less than the earliest offline before
// it and did not say goodbye since (the harness's rule, evidence a kill
// may have lost excepted). An expiry is judged at its deadline, when the
// lease ran out: evidence sent after it (its gateway was down until
// then) came too late to keep the session, unless the deadline is from
// before a loss of the shard's state. The offline of a goodbye that
// comes after the instance is back (a device that says goodbye and comes
// back at once) is the goodbye's, within its bound.
func (c *soakChecker) offline(d *devRecord, e event) {
	if e.reason == "gateway_lost" {
		c.res.GatewayLost++
	}
	early := c.tm.earliestOffline()
	at := e.at
	// (a deadline from before a loss of the shard's state comes from an
	// older state a restart brought back, design §3.6 "Replaced state":
	// it is judged when written)
	if !e.deadline.IsZero() && e.deadline.Before(at) && !c.acrossBoundary(e.shard, e.deadline, e.at) {
		at = e.deadline
	}
	// A leave that ends a life whose last session said goodbye is that
	// life's, within the goodbye's bound: evidence of a life begun since
	// (a device that comes back at once, on either instance) is not
	// evidence against it.
	if e.reason == "leave" {
		if end, ok := c.leftLife(d, e.shard, e.at); ok && end.Before(at) {
			at = end
		}
	}
	var recent time.Time
	seen, cut := 0, 0
	for _, s := range d.slots {
		last, ok := c.lastHeard(s, at)
		if !ok || at.Sub(last) >= early {
			continue
		}
		// A goodbye after the evidence, up to the event, ended the
		// instance (an expiry then names a session it had left behind).
		bye := lastBefore(s.leaves, e.at)
		if bye.After(last) || (!bye.IsZero() && e.reason == "leave" && !e.at.After(c.goodbyeBy(e.shard, bye))) {
			continue
		}
		// the leave of a goodbye that got no answer, read late
		if u := lastBefore(s.unsure, e.at); !u.IsZero() && e.reason == "leave" && !e.at.After(c.goodbyeBy(e.shard, u)) {
			continue
		}
		recent = later(recent, last)
		// The evidence since the last move went to the gateway the
		// device moved to.
		from := later(later(at.Add(-early), bye), lastBefore(d.moves, at))
		for i, t := range s.sends {
			if !t.Before(from) && !s.acks[i].After(at) {
				seen++
				if c.cutBetween(s.gws[i], gwIndex(e.gw), t, at) {
					cut++
				}
			}
		}
	}
	if recent.IsZero() {
		return
	}
	switch {
	case e.reason == "gateway_lost" && c.longOutage(gwIndex(e.gw), e.at):
		c.res.LostAfterLongOutage++
	case seen > 0 && cut == seen:
		c.violation(&c.res.HeldByCut, e.at, d, "held by a cut gateway %v: evidence %v before, through a gateway cut from the store",
			e, at.Sub(recent).Round(time.Millisecond))
	default:
		c.violation(&c.res.FalseOffline, e.at, d, "false offline %v: evidence %v before", e, at.Sub(recent).Round(time.Millisecond))
	}
}

// leftLife is the end of the device's last life ended by t when one of
// the sessions it left behind ended with a goodbye whose bound t is
// within, and no offline came since that end: a leave at t may be its.
func (c *soakChecker) leftLife(d *devRecord, shard int, t time.Time) (time.Time, bool) {
	for i := len(d.lives) - 1; i >= 0; i-- {
		lf := d.lives[i]
		if lf.end.IsZero() || lf.end.After(t) {
			continue
		}
		var bye time.Time
		for _, e := range lf.ends {
			if e.leave {
				bye = later(bye, e.at)
			}
		}
		prev := d.chk.last
		if bye.IsZero() || t.After(c.goodbyeBy(shard, bye)) || (prev.state == "offline" && !prev.at.Before(lf.end)) {
			return time.Time{}, false
		}
		return lf.end, true
	}
	return time.Time{}, false
}

// lastHeard is the newest evidence of instance s that its gateway had
// acknowledged by at (a stopped gateway reads a request when continued)
// and no kill may have lost; its sending time.
func (c *soakChecker) lastHeard(s slotRecord, at time.Time) (time.Time, bool) {
	x := c.x()
	for i := sort.Search(len(s.sends), func(i int) bool { return s.sends[i].After(at) }) - 1; i >= 0; i-- {
		if t := s.sends[i]; !x.mayBeLost(t) && !s.acks[i].After(at) {
			return t, true
		}
	}
	return time.Time{}, false
}

// goodbyeBy is when the offline of a goodbye said at bye to a session of
// shard must have come: the leave grace, a flush and processing, or a
// settle after the faults it met; and a goodbye said within the grace
// after a new incarnation of the shard began is held to that grace's end
// (docs/design.md §3.6: a gateway may not have restored the device yet).
func (c *soakChecker) goodbyeBy(shard int, bye time.Time) time.Time {
	by := bye.Add(c.onlineWait())
	if end, ok := c.chainEnd(-1, bye, by); !ok {
		return bye.Add(time.Hour)
	} else if !end.IsZero() {
		by = later(by, end.Add(soakSettle+c.onlineWait()))
	}
	for _, b := range c.faults.boundaries { // (window holds c.faults.mu)
		if slices.Contains(b.shards, shard) && !bye.Before(b.from) && !bye.After(b.to.Add(c.tm.grace)) {
			by = later(by, b.to.Add(c.tm.grace+c.onlineWait()))
		}
	}
	return by
}

// excerpt is the device's truth and events around t, for a violation's
// message: its last attempts per instance, goodbyes and moves in the 10 s
// before, and its last events.
func (c *soakChecker) excerpt(d *devRecord, t time.Time) string {
	var b strings.Builder
	from := t.Add(-10 * time.Second)
	for i, s := range d.slots {
		n := sort.Search(len(s.sends), func(j int) bool { return s.sends[j].After(t) })
		var sends []string
		for j := max(n-3, 0); j < n; j++ {
			sends = append(sends, fmt.Sprintf("%s gw-%c", c.faults.rel(s.sends[j]), 'a'+s.gws[j]))
		}
		fmt.Fprintf(&b, "\n      %s: evidence %s", instances[i], strings.Join(sends, ", "))
		for _, l := range s.leaves {
			if l.After(from) && !l.After(t) {
				fmt.Fprintf(&b, ", goodbye %s", c.faults.rel(l))
			}
		}
	}
	for _, m := range d.moves {
		if m.After(from) && !m.After(t) {
			fmt.Fprintf(&b, ", moved %s", c.faults.rel(m))
		}
	}
	for _, lf := range d.lives {
		if lf.end.IsZero() || lf.end.After(from) {
			fmt.Fprintf(&b, "\n      life %s..%s", c.faults.rel(lf.start), c.faults.rel(lf.end))
		}
	}
	h := d.chk.hist
	for _, e := range h[max(len(h)-4, 0):] {
		fmt.Fprintf(&b, "\n      event %s %v", c.faults.rel(e.at), e)
	}
	return b.String()
}

// cutBetween: evidence sent at at to gateway gw, another than owner, sat
// in gw's outbox while gw was cut from the store until after t.
func (c *soakChecker) cutBetween(gw, owner int, at, t time.Time) bool {
	if gw == owner {
		return false
	}
	for _, f := range c.faults.runs {
		if f.info.cut && f.gw == gw && !f.start.After(t) && (f.end.IsZero() || !f.end.Add(soakSettle).Before(at)) {
			return true
		}
	}
	return false
}

// longOutage: gateway g's path to the store was faulty for lease + grace
// or longer (less a second) in one stretch before t, and t falls where
// its devices may go offline with reason gateway_lost.
func (c *soakChecker) longOutage(g int, t time.Time) bool {
	long := c.tm.lease + c.tm.grace - time.Second
	for _, s := range c.stretches(g) {
		if s[1].Sub(s[0]) >= long && !t.Before(s[0].Add(long)) && !t.After(s[1].Add(c.tm.grace+c.after())) {
			return true
		}
	}
	return false
}

// stretches merges the faults touching gateway g (those less than
// soakSettle apart) into [from, to] stretches; a running fault ends now.
func (c *soakChecker) stretches(g int) [][2]time.Time {
	var out [][2]time.Time
	for _, f := range c.faults.runs {
		if !f.touches(g) {
			continue
		}
		end := f.end
		if end.IsZero() {
			end = time.Now()
		}
		if n := len(out); n > 0 && !f.start.After(out[n-1][1].Add(soakSettle)) {
			out[n-1][1] = later(out[n-1][1], end)
			continue
		}
		out = append(out, [2]time.Time{f.start, end})
	}
	return out
}

// online judges an online event: resurrected when the device had made no
// attempt for longer than the lease (lapsed evidence replayed), or when
// it follows the offline of a life that ended with every goodbye said,
// with no attempt since (a stale renewal replayed past the tombstone).
func (c *soakChecker) online(d *devRecord, e event) {
	lf := c.lifeAt(d, e.at)
	if lf == nil {
		c.violation(&c.res.Resurrected, e.at, d, "resurrected %v: no attempt before it", e)
		return
	}
	if lf.end.IsZero() || !lf.end.Before(e.at) {
		return
	}
	last, known := c.lastAttempt(lf)
	if !known {
		return
	}
	if e.at.Sub(last) > c.tm.lease+100*time.Millisecond {
		c.violation(&c.res.Resurrected, e.at, d, "resurrected %v: the last attempt at %s had lapsed", e, c.faults.rel(last))
		return
	}
	prev := d.chk.last
	if bye, ok := allLeft(lf); ok && prev.state == "offline" && !prev.at.Before(bye.Truncate(time.Millisecond)) && !last.After(bye.Add(500*time.Millisecond)) {
		c.violation(&c.res.Resurrected, e.at, d, "resurrected %v: after the goodbye at %s and its offline at %s", e, c.faults.rel(bye), c.faults.rel(prev.at))
	}
}

// lifeAt is the device's last life begun at or before t, an event's
// time: events are timed to the millisecond (truncated), and a gateway
// may write the online of a life's first evidence within the
// millisecond the life began.
func (c *soakChecker) lifeAt(d *devRecord, t time.Time) *lifeRecord {
	for i := len(d.lives) - 1; i >= 0; i-- {
		if !d.lives[i].start.Truncate(time.Millisecond).After(t) {
			return d.lives[i]
		}
	}
	return nil
}

// allLeft: every session the life left behind ended with a goodbye;
// the last goodbye's time.
func allLeft(lf *lifeRecord) (time.Time, bool) {
	var bye time.Time
	for _, e := range lf.ends {
		if !e.leave {
			return time.Time{}, false
		}
		bye = later(bye, e.at)
	}
	return bye, len(lf.ends) > 0
}

// readLate is the latest time gateway gw may have read a request sent at
// at: at, or a second after the end of a fault that kept the gateway
// from reading (stopped, starved); false while such a fault runs.
func (c *soakChecker) readLate(gw int, at time.Time) (time.Time, bool) {
	for _, f := range c.faults.runs {
		if !f.info.readsLate || f.gw != gw || f.start.After(at) {
			continue
		}
		if f.end.IsZero() {
			return time.Time{}, false
		}
		if !f.end.Add(100 * time.Millisecond).Before(at) {
			at = later(at, f.end.Add(time.Second))
		}
	}
	return at, true
}

// lastAttempt is when a gateway may last have read an attempt of the
// (ended) life; false while that is not known yet.
func (c *soakChecker) lastAttempt(lf *lifeRecord) (time.Time, bool) {
	var last time.Time
	for gw, at := range lf.lastTry {
		if at.IsZero() {
			continue
		}
		r, ok := c.readLate(gw, at)
		if !ok {
			return time.Time{}, false
		}
		last = later(last, r)
	}
	return last, true
}

// after is what comes after a deadline before the offline: the coverage
// wait, a runner pass, a runner failover and processing.
func (c *soakChecker) after() time.Duration {
	return gateway.CoverageWait(c.tm.flush) + c.tm.runnerInterval + c.tm.lockTTL + c.tm.processing
}

// bound is when an ended life must be offline: the latest end of the
// sessions it left behind (a lease after the last evidence, or the leave
// grace after a goodbye) plus after; when faults overlap that (chained:
// a fault that overlaps the widened bound widens it again), the bound of
// expectations: at least a grace more, and a grace after the last
// fault's end. False while a fault of the chain runs.
func (c *soakChecker) bound(lf *lifeRecord) (time.Time, bool) {
	var base time.Time
	for _, e := range lf.ends {
		at, ok := c.readLate(e.gw, e.at)
		if !ok {
			return time.Time{}, false
		}
		hold := c.tm.lease
		if e.leave && at.Equal(e.at) {
			hold = 3 * c.tm.flush
		}
		base = later(base, at.Add(hold))
	}
	last, ok := c.lastAttempt(lf)
	if !ok {
		return time.Time{}, false
	}
	for gw, at := range lf.lastTry {
		if r, _ := c.readLate(gw, at); !at.IsZero() && r.After(at) {
			base = later(base, r.Add(c.tm.lease))
		}
	}
	if base.IsZero() {
		if last.IsZero() {
			// no attempt reached a gateway (every gateway it tried was
			// down throughout): the device was never seen in this life
			return time.Time{}, true
		}
		base = last.Add(c.tm.lease)
	}
	b := base.Add(c.after())
	for changed := true; changed; {
		changed = false
		for _, f := range c.faults.runs {
			if !f.info.outage || !f.start.Before(b) || (!f.end.IsZero() && !f.end.Add(soakSettle).After(lf.end)) {
				continue
			}
			if f.end.IsZero() {
				return time.Time{}, false
			}
			nb := later(base.Add(c.tm.grace), f.end.Add(c.tm.grace)).Add(c.after())
			if nb.After(b) {
				b, changed = nb, true
			}
		}
	}
	return b, true
}

// judgeLives judges each ended life whose bound has passed: if the device
// did not come back by then, its state at the bound is offline.
func (c *soakChecker) judgeLives(d *devRecord, cutoff time.Time) {
	for i, lf := range d.lives {
		if lf.judged || lf.end.IsZero() {
			continue
		}
		if lf.byStop {
			lf.judged = true
			continue
		}
		b, ok := c.bound(lf)
		if !ok || b.After(cutoff) {
			return
		}
		lf.judged = true
		if b.IsZero() {
			continue // never seen: it owes no offline (bound)
		}
		c.res.Judged++
		if i+1 < len(d.lives) && !d.lives[i+1].start.After(b) {
			continue
		}
		var state string
		for _, e := range d.chk.hist {
			if !e.at.After(b) {
				state = e.state
			}
		}
		if state != "offline" {
			c.violation(&c.res.MissedOffline, b, d, "missed offline %s: life %s..%s, bound %s",
				d.id, c.faults.rel(lf.start), c.faults.rel(lf.end), c.faults.rel(b))
			continue
		}
		if _, left := allLeft(lf); !left && !lf.lastAck.IsZero() {
			for _, e := range d.chk.hist {
				if e.state == "offline" && e.at.After(lf.lastAck) {
					c.res.Lags = append(c.res.Lags, e.at.Sub(lf.lastAck))
					break
				}
			}
		}
	}
}

// judgeUnseen: acknowledged evidence after the device's offline (or
// before its first event) must bring it online, within a flush and
// processing, or a settle after the faults it met: unseen otherwise.
// Evidence that lapsed during a fault (a lease ran out before the fault
// ended, in an outbox or a stopped store), and evidence a kill may have
// lost, is not required to.
func (c *soakChecker) judgeUnseen(d *devRecord, cutoff time.Time) {
	ck := &d.chk
	if ck.last.state == "online" || ck.unseenDone {
		return
	}
	since := ck.last.at // zero: no event yet
	x := c.x()
	var first time.Time
	gw := -1
	for _, s := range d.slots {
		for i, at := range s.sends {
			if !at.After(since) || (!first.IsZero() && !at.Before(first)) {
				continue
			}
			if x.mayBeLost(at) {
				continue
			}
			end, ok := c.chainEnd(s.gws[i], at, at.Add(c.onlineWait()))
			if !ok {
				return
			}
			if !end.Before(at.Add(c.tm.earliestOffline())) {
				continue
			}
			first, gw = at, s.gws[i]
			break
		}
	}
	if first.IsZero() {
		return
	}
	end, ok := c.chainEnd(gw, first, first.Add(c.onlineWait()))
	if !ok {
		return
	}
	by := later(first, end.Add(soakSettle)).Add(c.onlineWait())
	if by.After(cutoff) {
		return
	}
	ck.unseenDone = true
	// a new incarnation of its shard in between may have brought back a
	// state that has the device online: its evidence then renews it with
	// no event, and a consumer resyncs at the new incarnation and sees it
	// online there (design §3.6, "Replaced state and loss")
	if ck.last.state != "" && c.acrossBoundary(ck.last.shard, since, by) {
		c.res.AcrossLoss++
		return
	}
	c.violation(&c.res.Unseen, by, d, "unseen %s: evidence at %s through gw-%c, no online by %s",
		d.id, c.faults.rel(first), 'a'+gw, c.faults.rel(by))
}

// onlineWait is how long evidence takes to bring its device online
// without a fault: the leave grace and a flush, and processing.
func (c *soakChecker) onlineWait() time.Duration { return 3*c.tm.flush + c.tm.processing }

// chainEnd is the end of the chain of faults touching gateway gw (-1:
// any gateway) that overlap [from, to] (each one extending to to its end
// plus soakSettle plus onlineWait), or zero; false while one of them
// runs.
func (c *soakChecker) chainEnd(gw int, from, to time.Time) (time.Time, bool) {
	var end time.Time
	for changed := true; changed; {
		changed = false
		for _, f := range c.faults.runs {
			if !f.info.outage || (gw >= 0 && !f.touches(gw)) || !f.start.Before(to) || (!f.end.IsZero() && !f.end.Add(soakSettle).After(from)) {
				continue
			}
			if f.end.IsZero() {
				return time.Time{}, false
			}
			if f.end.After(end) {
				end = f.end
				if t := end.Add(soakSettle + c.onlineWait()); t.After(to) {
					to, changed = t, true
				}
			}
		}
	}
	return end, true
}

// trim drops what no later window needs: evidence, goodbyes and events
// older than soakKeep (the newest of each kept), judged lives (the last
// two kept).
func (c *soakChecker) trim(d *devRecord, cutoff time.Time) {
	old := cutoff.Add(-soakKeep)
	for i := range d.slots {
		s := &d.slots[i]
		if n := sort.Search(len(s.sends), func(j int) bool { return s.sends[j].After(old) }); n > 1 {
			s.sends, s.acks, s.gws = s.sends[n-1:], s.acks[n-1:], s.gws[n-1:]
		}
		if n := sort.Search(len(s.leaves), func(j int) bool { return s.leaves[j].After(old) }); n > 1 {
			s.leaves = s.leaves[n-1:]
		}
		if n := sort.Search(len(s.unsure), func(j int) bool { return s.unsure[j].After(old) }); n > 1 {
			s.unsure = s.unsure[n-1:]
		}
	}
	if n := sort.Search(len(d.moves), func(j int) bool { return d.moves[j].After(old) }); n > 1 {
		d.moves = d.moves[n-1:]
	}
	if n := sort.Search(len(d.chk.hist), func(j int) bool { return d.chk.hist[j].at.After(old) }); n > 1 {
		d.chk.hist = d.chk.hist[n-1:]
	}
	n := 0
	for n < len(d.lives)-2 && d.lives[n].judged && d.lives[n].end.Before(old) {
		n++
	}
	d.lives = d.lives[n:]
}

// lastBefore is the newest of ts (sorted) not after t, or zero.
func lastBefore(ts []time.Time, t time.Time) time.Time {
	i := sort.Search(len(ts), func(i int) bool { return ts[i].After(t) })
	if i == 0 {
		return time.Time{}
	}
	return ts[i-1]
}

func later(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

// summary is the figures as the run prints them.
func (r soakResult) summary() string {
	lag := "–"
	if len(r.Lags) > 0 {
		lag = fmt.Sprintf("%.1f / %.1f / %.1f s", quantile(r.Lags, 0.5).Seconds(), quantile(r.Lags, 0.99).Seconds(), quantile(r.Lags, 1).Seconds())
	}
	return fmt.Sprintf("devices %d, lives %d (judged %d), heartbeats %d, events %d; false offline %d, missed offline %d, repeated (device, ver) %d, "+
		"broken alternation %d, versions backwards %d, resurrected %d, unseen %d, held by a cut gateway %d; apart: same state across a loss %d, "+
		"gateway_lost %d (after an outage ≥ lease + grace: %d); detection lag p50 / p99 / max %s",
		r.Devices, r.Lives, r.Judged, r.Heartbeats, r.Events, r.FalseOffline, r.MissedOffline, r.Repeated, r.BrokenAlternation, r.VerBackwards,
		r.Resurrected, r.Unseen, r.HeldByCut, r.AcrossLoss, r.GatewayLost, r.LostAfterLongOutage, lag)
}
