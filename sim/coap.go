package sim

import (
	"container/heap"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/plgd-dev/go-coap/v3/message"
	"github.com/plgd-dev/go-coap/v3/message/codes"
	"github.com/plgd-dev/go-coap/v3/message/pool"
	"github.com/plgd-dev/go-coap/v3/udp/coder"

	"github.com/fleetgate/fleetgate/sim/check"
)

// coapFleet plays every CoAP device from one scheduling goroutine over a
// small pool of UDP sockets (source ports): a device is a few hundred
// bytes, not a socket, so a fleet of 100,000 fits in the file limit.
// go-coap encodes the requests and decodes the answers; CON requests
// are answered with a piggybacked ACK, NON ones with a NON.
type coapFleet struct {
	gws     []*net.UDPAddr
	conns   []*net.UDPConn
	devs    []*coapDevice
	stats   *Stats
	timeout time.Duration

	mu      sync.Mutex
	pending map[uint64]pendingReq
	token   atomic.Uint64
	readers sync.WaitGroup
}

type pendingReq struct {
	dev    *coapDevice
	sess   *check.Session
	sentAt time.Time
	leave  bool // a DELETE: answered, but not evidence of presence
}

// coapDevice is one device's state; only the scheduler touches it,
// except its truth.
type coapDevice struct {
	plan  DevicePlan
	truth *truth
	rng   *rand.Rand
	gw    int // current gateway
	conn  int // current socket
	done  bool
	churn bool // churn still to come
	// instances are the CoAP instances (s=) it renews, "" for none.
	instances []string
	// a Move waits for its new gateway's answer before its goodbye
	moveFrom  string
	moveSince time.Time
	moveTo    *check.Session
	// sessions by instance
	sessions map[string]*check.Session
}

func newCoAPFleet(gws []string, sockets int, stats *Stats) (*coapFleet, error) {
	f := &coapFleet{stats: stats, pending: map[uint64]pendingReq{}, timeout: 5 * time.Second}
	for _, g := range gws {
		a, err := net.ResolveUDPAddr("udp", g)
		if err != nil {
			return nil, fmt.Errorf("coap gateway %s: %w", g, err)
		}
		f.gws = append(f.gws, a)
	}
	for range sockets {
		c, err := net.ListenUDP("udp", &net.UDPAddr{})
		if err != nil {
			f.close()
			return nil, fmt.Errorf("coap socket: %w", err)
		}
		_ = c.SetReadBuffer(4 << 20)
		f.conns = append(f.conns, c)
	}
	for _, c := range f.conns {
		f.readers.Add(1)
		go func() { defer f.readers.Done(); f.read(c) }()
	}
	return f, nil
}

func (f *coapFleet) add(p DevicePlan, t *truth) {
	d := &coapDevice{plan: p, truth: t, rng: rand.New(rand.NewPCG(p.Seed, 1)), gw: p.Gateway,
		conn: len(f.devs) % len(f.conns), churn: p.Churn != Steady, sessions: map[string]*check.Session{}}
	switch p.Churn {
	case Move:
		d.instances = []string{fmt.Sprintf("g%d", p.Gateway)}
	case Dual:
		d.instances = []string{"a", "b"}
	default:
		d.instances = []string{""}
	}
	f.devs = append(f.devs, d)
}

// run plays the devices until ctx ends.
func (f *coapFleet) run(ctx context.Context, start time.Time) {
	q := make(dueQueue, 0, len(f.devs))
	for i, d := range f.devs {
		first := d.plan.Phase
		if d.plan.Churn == Visit {
			first = d.plan.At
		}
		q = append(q, due{at: start.Add(first), dev: i})
	}
	heap.Init(&q)
	sweep := time.NewTicker(time.Second)
	defer sweep.Stop()
	timer := time.NewTimer(0)
	defer timer.Stop()
	for len(q) > 0 {
		now := time.Now()
		for len(q) > 0 && !q[0].at.After(now) {
			if ctx.Err() != nil {
				return // behind schedule: the run is over all the same
			}
			it := heap.Pop(&q).(due)
			d := f.devs[it.dev]
			if next, ok := f.step(d, start, now); ok {
				heap.Push(&q, due{at: next, dev: it.dev})
			}
		}
		if len(q) == 0 {
			break
		}
		timer.Reset(time.Until(q[0].at))
		select {
		case <-ctx.Done():
			return
		case <-sweep.C:
			f.sweep(now)
		case <-timer.C:
		}
	}
	<-ctx.Done()
}

// step acts for d at now and returns when it acts next.
func (f *coapFleet) step(d *coapDevice, start, now time.Time) (time.Time, bool) {
	if d.moveTo != nil { // a Move waiting to say goodbye to its old gateway
		d.truth.mu.Lock()
		answered := len(d.moveTo.Evidence) > 0
		d.truth.mu.Unlock()
		if !answered && now.Sub(d.moveSince) < 2*time.Second {
			return now.Add(20 * time.Millisecond), true
		}
		f.send(d, d.plan.Gateway, d.moveFrom, codes.DELETE, now)
		d.moveTo = nil
		return now.Add(jitter(d.rng, f.stats.heartbeat)), true
	}
	if d.churn && !now.Before(start.Add(d.plan.At)) {
		d.churn = false
		switch d.plan.Churn {
		case Freeze, Leave, Visit:
			d.truth.setActive(false)
		}
		switch d.plan.Churn {
		case Freeze:
			return time.Time{}, false
		case Leave:
			f.send(d, d.gw, d.instances[0], codes.DELETE, now)
			return time.Time{}, false
		case Visit:
			f.send(d, d.gw, "", codes.POST, now)
			f.send(d, d.gw, "", codes.DELETE, time.Now())
			return time.Time{}, false
		case Roam:
			d.gw = d.plan.To
		case Move:
			d.moveFrom = d.instances[0]
			d.instances = []string{fmt.Sprintf("g%d", d.plan.To)}
			d.gw = d.plan.To
			d.moveSince = now
			d.moveTo = f.send(d, d.gw, d.instances[0], codes.POST, now)
			return now.Add(20 * time.Millisecond), true
		case Dual:
			d.instances = d.instances[:1] // "b" is dropped
		case Storm:
			d.conn = (d.conn + 1) % len(f.conns)
			return now.Add(d.plan.Pause), true
		}
	}
	for _, inst := range d.instances {
		f.send(d, d.gw, inst, codes.POST, now)
	}
	next := now.Add(jitter(d.rng, f.stats.heartbeat))
	if at := start.Add(d.plan.At); d.churn && at.Before(next) {
		next = at
	}
	return next, true
}

// send sends one request of d for instance inst to gateway gw and
// records it in the truth; it returns the session.
func (f *coapFleet) send(d *coapDevice, gw int, inst string, code codes.Code, now time.Time) *check.Session {
	name := "coap/default"
	if inst != "" {
		name = "coap/" + inst
	}
	s, ok := d.sessions[name]
	if !ok {
		s = d.truth.session(name)
		d.sessions[name] = s
	}
	tok := f.token.Add(1)
	m := pool.NewMessage(context.Background())
	if d.plan.Proto == CoAPCon {
		m.SetType(message.Confirmable)
	} else {
		m.SetType(message.NonConfirmable)
	}
	m.SetCode(code)
	m.SetMessageID(int32(uint16(tok)))
	m.SetToken(message.Token{byte(tok >> 56), byte(tok >> 48), byte(tok >> 40), byte(tok >> 32), byte(tok >> 24), byte(tok >> 16), byte(tok >> 8), byte(tok)})
	_ = m.SetPath("/hb")
	m.AddQuery("d=" + d.plan.ID)
	if inst != "" {
		m.AddQuery("s=" + inst)
	}
	b, err := m.MarshalWithEncoder(coder.DefaultCoder)
	if err == nil {
		f.mu.Lock()
		f.pending[tok] = pendingReq{dev: d, sess: s, sentAt: now, leave: code == codes.DELETE}
		f.mu.Unlock()
		_, err = f.conns[d.conn].WriteToUDP(b, f.gws[gw])
	}
	if code == codes.DELETE {
		d.truth.left(s, now)
	} else {
		d.truth.sent(s, now)
	}
	f.stats.sent.Add(1)
	if err != nil {
		f.stats.sendErrors.Add(1)
		f.mu.Lock()
		delete(f.pending, tok)
		f.mu.Unlock()
	}
	return s
}

func (f *coapFleet) read(c *net.UDPConn) {
	buf := make([]byte, 1500)
	for {
		n, _, err := c.ReadFromUDP(buf)
		if errors.Is(err, net.ErrClosed) {
			return
		}
		if err != nil {
			continue
		}
		m := pool.NewMessage(context.Background())
		if _, err := m.UnmarshalWithDecoder(coder.DefaultCoder, buf[:n]); err != nil {
			continue
		}
		tk := m.Token()
		if len(tk) != 8 {
			continue
		}
		var tok uint64
		for _, b := range tk {
			tok = tok<<8 | uint64(b)
		}
		f.mu.Lock()
		p, ok := f.pending[tok]
		delete(f.pending, tok)
		f.mu.Unlock()
		if !ok {
			continue
		}
		f.stats.code(m.Code().String())
		if m.Code() == codes.Changed {
			f.stats.answered.Add(1)
			if !p.leave {
				p.dev.truth.acked(p.sess, p.sentAt)
			}
		}
	}
}

// sweep forgets requests unanswered for longer than the timeout.
func (f *coapFleet) sweep(now time.Time) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for tok, p := range f.pending {
		if now.Sub(p.sentAt) > f.timeout {
			delete(f.pending, tok)
			f.stats.unanswered.Add(1)
		}
	}
}

// close stops the readers; run must have returned.
func (f *coapFleet) close() {
	for _, c := range f.conns {
		c.Close()
	}
	f.readers.Wait()
}

// drain waits (bounded) for the answers still in flight.
func (f *coapFleet) drain(limit time.Duration) {
	end := time.Now().Add(limit)
	for time.Now().Before(end) {
		f.mu.Lock()
		n := len(f.pending)
		f.mu.Unlock()
		if n == 0 {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
}

type due struct {
	at  time.Time
	dev int
}

type dueQueue []due

func (q dueQueue) Len() int           { return len(q) }
func (q dueQueue) Less(i, j int) bool { return q[i].at.Before(q[j].at) }
func (q dueQueue) Swap(i, j int)      { q[i], q[j] = q[j], q[i] }
func (q *dueQueue) Push(x any)        { *q = append(*q, x.(due)) }
func (q *dueQueue) Pop() any {
	old := *q
	it := old[len(old)-1]
	*q = old[:len(old)-1]
	return it
}
