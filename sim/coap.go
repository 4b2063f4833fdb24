package sim

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/plgd-dev/go-coap/v3/message"
	"github.com/plgd-dev/go-coap/v3/message/codes"
	"github.com/plgd-dev/go-coap/v3/message/pool"
	"github.com/plgd-dev/go-coap/v3/udp/coder"

	"github.com/fleetgate/fleetgate/sim/check"
)

// coapFleet plays every CoAP device from the scheduler's goroutine over
// a few UDP sockets: a device is a few hundred bytes and an address of
// its own in 127.0.0.0/8 (sourceAddr), not a socket, and its datagrams
// go out in batches from that address (udpPort). go-coap encodes the
// requests and decodes the answers; CON requests are answered with a
// piggybacked ACK and retransmitted by RFC 7252's rules until then, NON
// ones are answered with a NON.
type coapFleet struct {
	ctx     context.Context
	seed    uint64
	gws     []*net.UDPAddr
	dtlsGws []*net.UDPAddr // the same gateways' DTLS listeners
	ports   []*udpPort
	devs    []*coapDevice
	stats   *Stats
	start   time.Time
	timeout time.Duration // a NON request unanswered this long is given up

	mu        sync.Mutex
	pending   map[uint64]*pendingReq
	token     atomic.Uint64
	readers   sync.WaitGroup
	exchanges sync.WaitGroup // DTLS exchanges
	enc       *pool.Message  // the request being encoded; the scheduler's
}

type pendingReq struct {
	dev    *coapDevice
	sess   *check.Session
	sentAt time.Time
	leave  bool // a DELETE: answered, but not evidence of presence
	// a CON request's retransmission: the datagram, its port, when it
	// goes again and how many times it has gone
	b     []byte
	port  int
	gw    int
	again time.Time
	wait  time.Duration
	tries int
}

// RFC 7252 §4.8's transmission parameters.
const (
	ackTimeout     = 2 * time.Second
	maxRetransmit  = 4
	sweepEvery     = 100 * time.Millisecond
	nonTimeout     = 5 * time.Second
	ackRandomShare = 0.5 // ACK_RANDOM_FACTOR 1.5
)

// coapDevice is one device's state; only the scheduler touches it,
// except its truth.
type coapDevice struct {
	f     *coapFleet
	plan  DevicePlan
	truth *truth
	rng   *rand.Rand
	addr  net.IP // its own source address
	gw    int    // current gateway
	port  int    // current socket: a Storm moves to the next
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
	// a DTLS device's exchanges, nil for plain UDP; due is the schedule
	// of the heartbeat it sends now
	dtls *dtlsDevice
	due  time.Time
}

var _ actor = (*coapDevice)(nil)

// newCoAPFleet makes the CoAP fleet of gateways gws (and their DTLS
// listeners dtls, none or one for each); ctx bounds its DTLS exchanges.
func newCoAPFleet(ctx context.Context, gws, dtls []string, sockets int, seed uint64, stats *Stats) (*coapFleet, error) {
	f := &coapFleet{ctx: ctx, seed: seed, stats: stats, pending: map[uint64]*pendingReq{}, timeout: nonTimeout}
	for _, g := range gws {
		a, err := net.ResolveUDPAddr("udp4", g)
		if err != nil {
			return nil, fmt.Errorf("coap gateway %s: %w", g, err)
		}
		f.gws = append(f.gws, a)
	}
	for _, g := range dtls {
		a, err := net.ResolveUDPAddr("udp4", g)
		if err != nil {
			return nil, fmt.Errorf("coap dtls gateway %s: %w", g, err)
		}
		f.dtlsGws = append(f.dtlsGws, a)
	}
	for range sockets {
		u, err := listenLoopbackUDP(ctx)
		if err != nil {
			f.close()
			return nil, fmt.Errorf("coap socket: %w", err)
		}
		f.ports = append(f.ports, u)
	}
	for _, u := range f.ports {
		f.readers.Add(1)
		go func() {
			defer f.readers.Done()
			m := pool.NewMessage(context.Background()) // this reader's, reused
			u.read(func(b []byte, to net.IP) { f.answer(m, b, to) })
		}()
	}
	return f, nil
}

// add adds the device of plan p, the fleet's device i (its address).
func (f *coapFleet) add(i int, p DevicePlan, t *truth) *coapDevice {
	d := &coapDevice{f: f, plan: p, truth: t, rng: rand.New(rand.NewPCG(p.Seed, 1)), gw: p.Gateway, addr: sourceAddr(i),
		port: i % len(f.ports), churn: p.Churn != Steady, sessions: map[string]*check.Session{}}
	if p.DTLS {
		d.dtls = &dtlsDevice{key: dtlsKey(f.seed, p.ID)}
	}
	switch p.Churn {
	case Move:
		d.instances = []string{fmt.Sprintf("g%d", p.Gateway)}
	case Dual:
		d.instances = []string{"a", "b"}
	default:
		d.instances = []string{""}
	}
	f.devs = append(f.devs, d)
	return d
}

// first is when d acts first.
func (d *coapDevice) first() time.Time { return d.plan.firstAt(d.f.start) }

func (d *coapDevice) act(at, now time.Time) time.Time {
	next, ok := d.f.step(d, at, now)
	if !ok {
		return time.Time{}
	}
	return next
}

// flush sends the datagrams queued by a pass.
func (f *coapFleet) flush() {
	for _, u := range f.ports {
		if failed, _ := u.flush(); failed > 0 {
			f.stats.sendErrors.Add(int64(failed))
		}
	}
}

// sweeper retransmits CON requests and gives up unanswered ones.
type sweeper struct{ f *coapFleet }

var _ actor = sweeper{}

func (s sweeper) act(_, now time.Time) time.Time {
	s.f.sweep(now)
	return now.Add(sweepEvery)
}

// step acts for d, due at at, at now and returns when it acts next.
func (f *coapFleet) step(d *coapDevice, at, now time.Time) (time.Time, bool) {
	start := f.start
	if d.moveTo != nil { // a Move waiting to say goodbye to its old gateway
		d.truth.mu.Lock()
		answered := len(d.moveTo.Evidence) > 0
		d.truth.mu.Unlock()
		if !answered && now.Sub(d.moveSince) < 2*time.Second {
			return now.Add(20 * time.Millisecond), true
		}
		f.send(d, d.plan.Gateway, d.moveFrom, codes.DELETE, now)
		d.moveTo = nil
		return now.Add(jitter(d.rng, d.plan.Period)), true
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
			f.beat(d, at, now)
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
			f.beat(d, at, now)
			d.moveTo = f.send(d, d.gw, d.instances[0], codes.POST, now)
			return now.Add(20 * time.Millisecond), true
		case Dual:
			d.instances = d.instances[:1] // "b" is dropped
		case Storm:
			d.port = (d.port + 1) % len(f.ports)
			return now.Add(d.plan.Pause), true
		}
	}
	f.beat(d, at, now)
	for _, inst := range d.instances {
		f.send(d, d.gw, inst, codes.POST, now)
	}
	next := now.Add(jitter(d.rng, d.plan.Period))
	if at := start.Add(d.plan.At); d.churn && at.Before(next) {
		next = at
	}
	return next, true
}

// beat counts a heartbeat of d due at at and sent now; a DTLS device's
// goes after its handshake, and is counted then.
func (f *coapFleet) beat(d *coapDevice, at, now time.Time) {
	if d.dtls != nil {
		d.due = at
		return
	}
	f.stats.late(now.Sub(at))
}

// send queues one request of d for instance inst to gateway gw and
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
	if f.enc == nil {
		f.enc = pool.NewMessage(context.Background())
	}
	m := f.enc // reused: the datagram is copied out below
	m.Reset()
	con := d.plan.Proto == CoAPCon
	if con {
		m.SetType(message.Confirmable)
	} else {
		m.SetType(message.NonConfirmable)
	}
	m.SetCode(code)
	m.SetMessageID(int32(uint16(tok)))
	token := message.Token{byte(tok >> 56), byte(tok >> 48), byte(tok >> 40), byte(tok >> 32), byte(tok >> 24), byte(tok >> 16), byte(tok >> 8), byte(tok)}
	m.SetToken(token)
	_ = m.SetPath("/hb")
	m.AddQuery("d=" + d.plan.ID)
	if inst != "" {
		m.AddQuery("s=" + inst)
	}
	b, err := m.MarshalWithEncoder(coder.DefaultCoder)
	b = slices.Clone(b) // m's buffer; the datagram waits for its batch
	if code == codes.DELETE {
		d.truth.left(s, now)
	} else {
		d.truth.sent(s, now)
	}
	f.stats.sent.Add(1)
	if err != nil {
		f.stats.sendErrors.Add(1)
		return s
	}
	if d.dtls != nil {
		f.dtlsSend(d, dtlsReq{b: b, tok: token, gw: gw, con: con, sess: s, leave: code == codes.DELETE, due: d.due})
		d.due = time.Time{}
		return s
	}
	p := &pendingReq{dev: d, sess: s, sentAt: now, leave: code == codes.DELETE}
	if con {
		p.b, p.port, p.gw = b, d.port, gw
		p.wait = ackTimeout + time.Duration(d.rng.Float64()*ackRandomShare*float64(ackTimeout))
		p.again = now.Add(p.wait)
	}
	f.mu.Lock()
	f.pending[tok] = p
	f.mu.Unlock()
	f.ports[d.port].queue(b, d.addr, f.gws[gw])
	return s
}

// answer takes a datagram received for the address to, decoding it
// into m.
func (f *coapFleet) answer(m *pool.Message, b []byte, to net.IP) {
	m.Reset()
	if _, err := m.UnmarshalWithDecoder(coder.DefaultCoder, b); err != nil {
		return
	}
	tk := m.Token()
	if len(tk) != 8 {
		return
	}
	var tok uint64
	for _, b := range tk {
		tok = tok<<8 | uint64(b)
	}
	f.mu.Lock()
	p, ok := f.pending[tok]
	if ok && p.dev.addr.Equal(to) {
		delete(f.pending, tok)
	}
	f.mu.Unlock()
	if !ok {
		return
	}
	if !p.dev.addr.Equal(to) {
		f.stats.misrouted.Add(1) // the answer went to another address
		return
	}
	f.stats.code(m.Code().String())
	if m.Code() == codes.Changed {
		f.stats.answered.Add(1)
		if !p.leave {
			p.dev.truth.acked(p.sess, p.sentAt)
		}
	}
}

// sweep retransmits the CON requests due again (RFC 7252 §4.2: the
// wait doubles, MAX_RETRANSMIT times) and gives up those that have
// gone as often, and NON requests unanswered for the timeout.
func (f *coapFleet) sweep(now time.Time) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for tok, p := range f.pending {
		switch {
		case p.b == nil && now.Sub(p.sentAt) > f.timeout,
			p.b != nil && !now.Before(p.again) && p.tries == maxRetransmit:
			delete(f.pending, tok)
			f.stats.unanswered.Add(1)
		case p.b != nil && !now.Before(p.again):
			p.tries++
			p.wait *= 2
			p.again = now.Add(p.wait)
			f.ports[p.port].queue(p.b, p.dev.addr, f.gws[p.gw])
			p.dev.truth.sent(p.sess, now)
			f.stats.retransmits.Add(1)
		}
	}
}

// close stops the readers and waits (bounded by their timeouts: ctx
// has ended) for the DTLS exchanges; the scheduler must have returned.
func (f *coapFleet) close() {
	for _, u := range f.ports {
		u.close()
	}
	f.readers.Wait()
	f.exchanges.Wait()
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
