package sim

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net"
	"sync"
	"time"

	"github.com/fleetgate/fleetgate/sim/check"
	"github.com/fleetgate/fleetgate/sim/mqttc"
)

// mqttFleet plays the MQTT devices from the scheduler's goroutine with
// the simulator's own client (sim/mqttc). A connection has one goroutine
// of its own, which dials, reads the CONNACK and then reads packets and
// hands them to the scheduler; the device's decisions and its writes
// happen on the scheduler's goroutine. Each device connects from its
// own address in 127.0.0.0/8.
type mqttFleet struct {
	ctx       context.Context // the fleet's run
	sched     *scheduler
	gws       []string
	stats     *Stats
	start     time.Time
	keepAlive time.Duration
	timeout   time.Duration // dial + CONNACK, and a heartbeat's answer
	topic     string
	seq       int64 // sessions, numbered across the fleet
	devs      []*mqttDevice

	mu      sync.Mutex
	closing bool
	open    map[*mqttc.Conn]struct{} // connections to close at the end
	readers sync.WaitGroup
}

// writeTimeout bounds a write of the scheduler: a gateway that does not
// read for this long loses the connection, the fleet keeps its pace.
const writeTimeout = 100 * time.Millisecond

type linkState uint8

const (
	linkIdle    linkState = iota // connects at retryAt
	linkDialing                  // its goroutine dials
	linkUp
)

// link is one connection of a device, and its truth session.
type link struct {
	gw      int
	state   linkState
	gen     int // the connection's number: events of older ones are stale
	retryAt time.Time
	backoff time.Duration
	// reconnect: lost under the device; counted when up again
	reconnect bool
	visit     bool // a Visit: leaves once its heartbeat is answered
	// onUp runs once it is up (a Roam or Move ends the old link)
	onUp   func(now time.Time)
	sess   *check.Session
	dialAt time.Time
	c      *mqttc.Conn
	// the heartbeat in flight: a PUBLISH's identifier or 0 for a PINGREQ
	inflight bool
	pid      uint16
	sentAt   time.Time
	nextID   uint16
}

// mqttDevice is one device's state; only the scheduler touches it,
// except its truth.
type mqttDevice struct {
	f     *mqttFleet
	id    int32 // in the scheduler
	plan  DevicePlan
	truth *truth
	rng   *rand.Rand
	addr  net.IP
	topic string
	links []*link
	churn bool      // churn still to come
	hbAt  time.Time // next heartbeat
	ping  bool      // the next heartbeat is a PINGREQ, not a PUBLISH
	done  bool
}

var _ actor = (*mqttDevice)(nil)

func (f *mqttFleet) add(i int, p DevicePlan, t *truth) *mqttDevice {
	d := &mqttDevice{f: f, plan: p, truth: t, rng: rand.New(rand.NewPCG(p.Seed, 2)), addr: sourceAddr(i),
		topic: f.topic + "/" + p.ID + "/t", churn: p.Churn != Steady}
	f.devs = append(f.devs, d)
	return d
}

func (d *mqttDevice) first() time.Time { return d.plan.firstAt(d.f.start) }

func (d *mqttDevice) act(_, now time.Time) time.Time {
	if d.done {
		return time.Time{}
	}
	if d.links == nil && d.plan.Churn != Visit && !d.hbAt.IsZero() {
		return time.Time{} // every link ended: nothing more to do
	}
	if d.hbAt.IsZero() && d.plan.Churn != Visit { // the first act, at its phase
		d.links = []*link{{gw: d.plan.Gateway}}
		if d.plan.Churn == Dual {
			d.links = append(d.links, &link{gw: d.plan.To})
		}
		for _, l := range d.links {
			d.dial(l, now)
		}
		d.hbAt = now.Add(jitter(d.rng, d.f.stats.heartbeat))
		return d.next()
	}
	if d.churn && !now.Before(d.f.start.Add(d.plan.At)) {
		d.churn = false
		d.churnNow(now)
		if d.done {
			return time.Time{}
		}
	}
	for _, l := range d.links {
		if l.state == linkIdle && !now.Before(l.retryAt) {
			d.dial(l, now)
		}
	}
	if !d.hbAt.IsZero() && !now.Before(d.hbAt) {
		d.f.stats.late(now.Sub(d.hbAt))
		d.heartbeat(now)
		d.hbAt = now.Add(jitter(d.rng, d.f.stats.heartbeat))
	}
	return d.next()
}

// next is when d must act next: its heartbeat, its churn, a link's
// retry, whichever comes first.
func (d *mqttDevice) next() time.Time {
	if d.done {
		return time.Time{}
	}
	next := d.hbAt
	if d.churn {
		next = minTime(next, d.f.start.Add(d.plan.At))
	}
	for _, l := range d.links {
		if l.state == linkIdle {
			next = minTime(next, l.retryAt)
		}
	}
	return next
}

func minTime(a, b time.Time) time.Time {
	if a.IsZero() || (!b.IsZero() && b.Before(a)) {
		return b
	}
	return a
}

// wake lets d act on what an event changed.
func (d *mqttDevice) wake() {
	if next := d.next(); !next.IsZero() {
		d.f.sched.at(d.id, next)
	}
}

func (d *mqttDevice) churnNow(now time.Time) {
	switch d.plan.Churn {
	case Freeze:
		d.truth.setActive(false)
		for _, l := range d.links {
			d.drop(l, now)
		}
		d.links, d.done = nil, true
	case Leave:
		d.truth.setActive(false)
		for _, l := range d.links {
			d.leave(l, now)
		}
		d.links, d.done = nil, true
	case Roam, Move:
		if len(d.links) == 0 {
			return
		}
		old := d.links[0]
		nl := &link{gw: d.plan.To}
		nl.onUp = func(now time.Time) {
			if d.plan.Churn == Roam {
				d.drop(old, now)
			} else {
				d.leave(old, now)
			}
			d.remove(old)
		}
		d.links = append(d.links, nl)
		d.dial(nl, now)
	case Dual:
		if len(d.links) == 2 {
			d.drop(d.links[0], now)
			d.links = d.links[1:]
		}
	case Storm:
		for _, l := range d.links {
			d.drop(l, now)
			l.retryAt = now.Add(d.plan.Pause)
		}
	case Visit:
		d.truth.setActive(false)
		l := &link{gw: d.plan.Gateway, visit: true}
		d.links = []*link{l}
		d.dial(l, now)
	}
}

func (d *mqttDevice) remove(l *link) {
	for i, x := range d.links {
		if x == l {
			d.links = append(d.links[:i], d.links[i+1:]...)
			return
		}
	}
}

func (d *mqttDevice) nextSession() string {
	d.f.seq++
	return fmt.Sprintf("mqtt#%d", d.f.seq)
}

// dial starts a new connection of l; its evidence is the moment the
// CONNECT goes, once CONNACK comes back.
func (d *mqttDevice) dial(l *link, now time.Time) {
	l.gen++
	l.state = linkDialing
	l.sess = d.truth.session(d.nextSession())
	l.dialAt = now
	d.truth.sent(l.sess, now)
	d.f.stats.sent.Add(1)
	v := mqttc.V311
	if d.plan.Proto == MQTT5 {
		v = mqttc.V5
	}
	gen, addr, local := l.gen, d.f.gws[l.gw], &net.TCPAddr{IP: d.addr}
	d.f.readers.Add(1)
	go func() {
		defer d.f.readers.Done()
		c, err := mqttc.Dial(d.f.ctx, v, local, addr, d.plan.ID, d.f.keepAlive, d.f.timeout)
		if err == nil && !d.f.track(c) {
			return // the run is over
		}
		if !d.f.sched.post(d.f.ctx, func(now time.Time) { d.connected(l, gen, c, err, now) }) || err != nil {
			return
		}
		d.f.serve(c, func(p mqttc.Packet, err error) bool {
			return d.f.sched.post(d.f.ctx, func(now time.Time) { d.packet(l, gen, p, err, now) })
		})
	}()
}

// track registers c to be closed at the end; false (and c closed) when
// the end has come.
func (f *mqttFleet) track(c *mqttc.Conn) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.closing {
		c.Close()
		return false
	}
	f.open[c] = struct{}{}
	return true
}

// serve reads c's packets and hands each (and the error that ends it)
// to got until got returns false or the connection ends; it closes c.
func (f *mqttFleet) serve(c *mqttc.Conn, got func(mqttc.Packet, error) bool) {
	defer func() {
		c.Close()
		f.mu.Lock()
		delete(f.open, c)
		f.mu.Unlock()
	}()
	for {
		p, err := c.Read()
		if !got(p, err) || err != nil {
			return
		}
	}
}

func (d *mqttDevice) connected(l *link, gen int, c *mqttc.Conn, err error, now time.Time) {
	if gen != l.gen || d.done && !l.visit {
		if c != nil {
			c.Close() // given up meanwhile
		}
		return
	}
	if err != nil {
		d.f.stats.connectError(err)
		if l.visit {
			d.done = true
			return
		}
		l.state = linkIdle
		l.backoff = max(l.backoff, time.Second)
		l.retryAt = now.Add(jitter(d.rng, min(l.backoff, d.f.stats.heartbeat)))
		l.backoff *= 2
		d.wake()
		return
	}
	d.f.stats.connects.Add(1)
	d.f.stats.connected.Add(1)
	d.f.stats.answered.Add(1)
	d.truth.acked(l.sess, l.dialAt)
	l.c, l.state, l.backoff, l.inflight = c, linkUp, 0, false
	if l.reconnect {
		l.reconnect = false
		d.f.stats.reconnects.Add(1)
	}
	if l.visit {
		d.send(l, now)
		return
	}
	if l.onUp != nil {
		up := l.onUp
		l.onUp = nil
		up(now)
	}
}

// packet takes what l's connection read: a heartbeat's answer, or the
// end of the connection.
func (d *mqttDevice) packet(l *link, gen int, p mqttc.Packet, err error, now time.Time) {
	if gen != l.gen || l.state != linkUp {
		return
	}
	if err != nil || p.Type == mqttc.DISCONNECT {
		// lost under it (a gateway restart): back within a second
		d.lose(l, now, now.Add(time.Duration(d.rng.Int64N(int64(time.Second)))))
		if l.visit || d.done {
			d.done = true
			return
		}
		d.wake()
		return
	}
	answer := p.Type == mqttc.PUBACK && p.ID == l.pid || p.Type == mqttc.PINGRESP && l.pid == 0
	if !l.inflight || !answer {
		return
	}
	l.inflight = false
	if p.Code >= 0x80 { // refused
		d.f.stats.sendErrors.Add(1)
	} else {
		d.f.stats.answered.Add(1)
		d.truth.acked(l.sess, l.sentAt)
	}
	if l.visit {
		d.leave(l, now)
		d.links, d.done = nil, true
	}
}

// heartbeat sends a heartbeat on every link that is up and has none in
// flight; a link whose last one has gone unanswered for the timeout is
// dropped and connects again.
func (d *mqttDevice) heartbeat(now time.Time) {
	for _, l := range d.links {
		if l.state != linkUp {
			continue
		}
		if l.inflight {
			if now.Sub(l.sentAt) > d.f.timeout {
				d.f.stats.sendErrors.Add(1)
				d.lose(l, now, now)
			}
			continue
		}
		d.send(l, now)
	}
	d.ping = !d.ping
}

// send sends one heartbeat on l: a QoS 1 PUBLISH or a PINGREQ, every
// other one each.
func (d *mqttDevice) send(l *link, now time.Time) {
	var b []byte
	l.pid = 0
	if d.ping && !l.visit {
		b = mqttc.PingPacket()
	} else {
		l.nextID = max(l.nextID+1, 1)
		l.pid = l.nextID
		v := mqttc.V311
		if d.plan.Proto == MQTT5 {
			v = mqttc.V5
		}
		b = mqttc.PublishPacket(v, d.topic, []byte("21.5"), 1, l.pid)
	}
	d.truth.sent(l.sess, now)
	d.f.stats.sent.Add(1)
	if err := l.c.Send(b, writeTimeout); err != nil {
		d.f.stats.sendErrors.Add(1)
		d.lose(l, now, now)
		return
	}
	l.inflight, l.sentAt = true, now
}

// drop ends l without a word (a dialing one is abandoned); it may
// connect again at its retryAt.
func (d *mqttDevice) drop(l *link, now time.Time) {
	l.gen++
	if l.state == linkUp {
		d.truth.sent(l.sess, now)
		l.c.Close()
		d.truth.sent(l.sess, time.Now())
		d.f.stats.connected.Add(-1)
	} else if l.state == linkDialing {
		d.truth.sent(l.sess, now)
	}
	l.state, l.c, l.inflight = linkIdle, nil, false
}

// lose ends l, lost under the device (the connection broke, or a
// heartbeat went unanswered): it connects again at retry, and that
// connect counts as a reconnect, whichever way the loss was seen.
func (d *mqttDevice) lose(l *link, now, retry time.Time) {
	d.drop(l, now)
	l.reconnect, l.retryAt = true, retry
}

// leave ends l with a DISCONNECT; the gateway closes the connection,
// its reader sees that (or its deadline) and closes it too.
func (d *mqttDevice) leave(l *link, now time.Time) {
	if l.state != linkUp {
		d.drop(l, now)
		return
	}
	l.gen++
	d.truth.left(l.sess, now)
	_ = l.c.Send(mqttc.DisconnectPacket(), writeTimeout)
	_ = l.c.SetReadDeadline(now.Add(d.f.timeout))
	d.f.stats.sent.Add(1)
	d.f.stats.connected.Add(-1)
	l.state, l.c, l.inflight = linkIdle, nil, false
}

// stop drops every connection still up once the scheduler has
// returned, and waits (bounded) for the connections' goroutines.
func (f *mqttFleet) stop(limit time.Duration) {
	now := time.Now()
	for _, d := range f.devs {
		for _, l := range d.links {
			if l.state == linkUp || l.state == linkDialing {
				d.truth.sent(l.sess, now)
			}
			if l.state == linkUp {
				f.stats.connected.Add(-1)
			}
		}
	}
	f.mu.Lock()
	f.closing = true
	for c := range f.open {
		c.Close()
	}
	f.mu.Unlock()
	after := time.Now()
	for _, d := range f.devs {
		for _, l := range d.links {
			if l.state == linkUp {
				d.truth.sent(l.sess, after)
			}
		}
	}
	done := make(chan struct{})
	go func() { f.readers.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(limit):
	}
}
