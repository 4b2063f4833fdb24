//go:build faults

package faults

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/paho"
	"github.com/plgd-dev/go-coap/v3/message"
	"github.com/plgd-dev/go-coap/v3/message/codes"
	"github.com/plgd-dev/go-coap/v3/options"
	"github.com/plgd-dev/go-coap/v3/udp"
	udpClient "github.com/plgd-dev/go-coap/v3/udp/client"
)

// plan is what one device does, in times relative to the fleet's start.
type plan struct {
	gw    int           // index of the gateway it starts on
	start time.Duration // when it starts sending
	// end is when it stops (0: it sends until the fleet stops); leave
	// makes that a clean leave (CoAP DELETE, MQTT DISCONNECT) instead of
	// silence (CoAP: no more requests; MQTT: the socket dropped).
	end   time.Duration
	leave bool
	// moves switch the device to another gateway at the given times; an
	// MQTT device connects to the new gateway first, then DISCONNECTs
	// from the old one (make before break).
	moves []move
}

type move struct {
	at time.Duration
	to int
}

// devTruth is what a device did, as the fleet saw it.
type devTruth struct {
	id, proto string
	// sends are the times at which evidence was sent that the gateway
	// acknowledged (CoAP 2.04, MQTT CONNACK or PUBACK), taken just before
	// sending: the evidence was observed at or after them.
	sends []time.Time
	// lastTry is the last attempt, acknowledged or not (the gateway may
	// have seen it).
	lastTry time.Time
	// leftAt is the device-level clean leave (zero if none): the time its
	// last session was ended with a goodbye.
	leftAt time.Time
	// stoppedAt is when it went silent without a goodbye (zero if none).
	stoppedAt time.Time
	moves     int
}

// ended is when the device stopped or left (zero while it kept sending to
// the end of the scenario).
func (d *devTruth) ended() time.Time {
	if !d.leftAt.IsZero() {
		return d.leftAt
	}
	return d.stoppedAt
}

// lastEvidence is the last acknowledged evidence, the goodbye included.
func (d *devTruth) lastEvidence() time.Time {
	var t time.Time
	if n := len(d.sends); n > 0 {
		t = d.sends[n-1]
	}
	if d.leftAt.After(t) {
		t = d.leftAt
	}
	return t
}

// fleet drives CoAP and MQTT devices against the gateways and records the
// truth.
type fleet struct {
	t    testing.TB
	tm   timing
	gws  []*gatewayProc
	t0   time.Time
	quit chan struct{}
	wg   sync.WaitGroup

	mu    sync.Mutex
	devs  map[string]*devTruth
	plans map[string]plan
	order []string
}

func newFleet(t testing.TB, tm timing, gws ...*gatewayProc) *fleet {
	f := &fleet{t: t, tm: tm, gws: gws, quit: make(chan struct{}), devs: map[string]*devTruth{}, plans: map[string]plan{}}
	t.Cleanup(f.stop)
	return f
}

// add registers a device ("coap" or "mqtt") before start.
func (f *fleet) add(id, proto string, p plan) {
	f.devs[id] = &devTruth{id: id, proto: proto}
	f.plans[id] = p
	f.order = append(f.order, id)
}

// start launches every device; t0 is now.
func (f *fleet) start() {
	f.t0 = time.Now()
	for _, id := range f.order {
		f.wg.Add(1)
		go f.drive(f.devs[id], f.plans[id])
	}
}

// stop ends every device still sending and waits for them; safe twice.
func (f *fleet) stop() {
	select {
	case <-f.quit:
		return
	default:
	}
	close(f.quit)
	f.wg.Wait()
}

// truth returns a copy of what the devices did.
func (f *fleet) truth() map[string]*devTruth {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := make(map[string]*devTruth, len(f.devs))
	for id, d := range f.devs {
		c := *d
		c.sends = append([]time.Time(nil), d.sends...)
		out[id] = &c
	}
	return out
}

// record changes a device's truth under the fleet's lock.
func (f *fleet) record(fn func()) {
	f.mu.Lock()
	defer f.mu.Unlock()
	fn()
}

// wait sleeps until t0+at or the fleet stops; false when it stopped.
func (f *fleet) wait(at time.Duration) bool {
	select {
	case <-f.quit:
		return false
	case <-time.After(time.Until(f.t0.Add(at))):
		return true
	}
}

// link is a device's connection to one gateway.
type link interface {
	send(ctx context.Context) error
	leave(ctx context.Context) error
	drop()
}

func (f *fleet) dial(ctx context.Context, d *devTruth, gw int) (link, error) {
	g := f.gws[gw].cfg
	if d.proto == "coap" {
		c, err := dialCoAP(g.CoAP, d.id, "")
		if err != nil {
			return nil, err
		}
		return c, nil
	}
	m, err := dialMQTT(ctx, g.MQTT, d.id, false)
	if err != nil {
		return nil, err
	}
	return m, nil
}

// dialCoAP opens a CoAP link of instance inst (empty: main) of device id
// to addr.
func dialCoAP(addr, id, inst string) (*coapLink, error) {
	cc, err := udp.Dial(addr, options.WithErrors(func(error) {}))
	if err != nil {
		return nil, err
	}
	return &coapLink{cc: cc, id: id, inst: inst}, nil
}

// dialMQTT connects MQTT 5 client id to addr, asking the broker to keep
// its session when persistent (a sleepy device, docs/design.md §6.8).
func dialMQTT(ctx context.Context, addr, id string, persistent bool) (*mqttLink, error) {
	nc, err := (&net.Dialer{}).DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	c := paho.NewClient(paho.ClientConfig{Conn: nc, OnClientError: func(error) {}, OnServerDisconnect: func(*paho.Disconnect) {}})
	cp := &paho.Connect{ClientID: id, KeepAlive: 5, CleanStart: !persistent}
	if persistent {
		expiry := uint32(60)
		cp.Properties = &paho.ConnectProperties{SessionExpiryInterval: &expiry}
	}
	if _, err := c.Connect(ctx, cp); err != nil {
		nc.Close()
		return nil, err
	}
	return &mqttLink{c: c, nc: nc, topic: "devices/" + id + "/hb"}, nil
}

// drive runs one device's plan until it ends or the fleet stops.
func (f *fleet) drive(d *devTruth, p plan) {
	defer f.wg.Done()
	if !f.wait(p.start) {
		return
	}
	cur := p.gw
	var l link
	defer func() {
		if l != nil {
			l.drop()
		}
	}()
	moves := p.moves
	for i := 0; i < 100000; i++ {
		now := time.Since(f.t0)
		if p.end > 0 && now >= p.end {
			f.finish(d, l, p.leave, cur)
			l = nil
			return
		}
		if len(moves) > 0 && now >= moves[0].at {
			l = f.moveTo(d, l, moves[0].to)
			cur = moves[0].to
			moves = moves[1:]
		}
		try := time.Now()
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		var err error
		if l == nil {
			// A new MQTT connection is evidence by itself (CONNECT).
			if l, err = f.dial(ctx, d, cur); err == nil && d.proto == "mqtt" {
				f.record(func() { d.sends = append(d.sends, try); d.lastTry = time.Now() })
				try = time.Now()
			}
		}
		if err == nil {
			err = l.send(ctx)
		}
		cancel()
		f.record(func() {
			d.lastTry = time.Now()
			if err == nil {
				d.sends = append(d.sends, try)
			}
		})
		if err != nil && l != nil {
			l.drop()
			l = nil
		}
		// Heartbeats every heartbeat/2 with ±30 % jitter, or sooner when
		// the plan's next move or end comes first.
		wait := time.Duration(float64(f.tm.heartbeat/2) * (0.7 + 0.6*rand.Float64()))
		if len(moves) > 0 {
			wait = min(wait, time.Until(f.t0.Add(moves[0].at)))
		}
		if p.end > 0 {
			wait = min(wait, time.Until(f.t0.Add(p.end)))
		}
		select {
		case <-f.quit:
			return
		case <-time.After(max(wait, 0)):
		}
	}
}

// moveTo connects d to gateway to (an MQTT device first connects there,
// then DISCONNECTs its old connection: make before break; a CoAP device
// just sends there next, its session coap/main is the same).
func (f *fleet) moveTo(d *devTruth, old link, to int) link {
	f.record(func() { d.moves++ })
	if d.proto == "coap" {
		if old != nil {
			old.drop()
		}
		return nil
	}
	try := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	l, err := f.dial(ctx, d, to)
	if err != nil {
		// Could not make: break the old one all the same (dropped).
		if old != nil {
			old.drop()
		}
		return nil
	}
	f.record(func() { d.sends = append(d.sends, try); d.lastTry = time.Now() })
	if old != nil {
		_ = old.leave(ctx)
	}
	return l
}

// finish ends the device: a clean leave or silence.
func (f *fleet) finish(d *devTruth, l link, leave bool, cur int) {
	try := time.Now()
	if leave {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		var err error
		if l == nil {
			l, err = f.dial(ctx, d, cur)
		}
		if err == nil {
			err = l.leave(ctx)
		}
		if err == nil {
			f.record(func() { d.leftAt, d.lastTry = try, time.Now() })
			return
		}
	}
	if l != nil {
		l.drop()
	}
	f.record(func() { d.stoppedAt = try })
}

type coapLink struct {
	cc *udpClient.Conn
	id string
	// inst is the device's instance, its session (empty: main).
	inst string
}

func (c *coapLink) do(ctx context.Context, code codes.Code) error {
	inst := c.inst
	if inst == "" {
		inst = "main"
	}
	q := []message.Option{
		{ID: message.URIQuery, Value: []byte("d=" + c.id)},
		{ID: message.URIQuery, Value: []byte("s=" + inst)},
	}
	var resp interface{ Code() codes.Code }
	var err error
	if code == codes.POST {
		resp, err = c.cc.Post(ctx, "/hb", message.TextPlain, nil, q...)
	} else {
		resp, err = c.cc.Delete(ctx, "/hb", q...)
	}
	if err != nil {
		return err
	}
	if resp.Code() != codes.Changed {
		return fmt.Errorf("coap %v: %v", code, resp.Code())
	}
	return nil
}

func (c *coapLink) send(ctx context.Context) error  { return c.do(ctx, codes.POST) }
func (c *coapLink) leave(ctx context.Context) error { return c.do(ctx, codes.DELETE) }
func (c *coapLink) drop()                           { _ = c.cc.Close() }

type mqttLink struct {
	c     *paho.Client
	nc    net.Conn
	topic string
}

func (m *mqttLink) send(ctx context.Context) error {
	_, err := m.c.Publish(ctx, &paho.Publish{Topic: m.topic, QoS: 1, Payload: []byte("hb")})
	return err
}

func (m *mqttLink) leave(context.Context) error {
	err := m.c.Disconnect(&paho.Disconnect{ReasonCode: 0})
	m.nc.Close()
	return err
}

func (m *mqttLink) drop() { m.nc.Close() }
