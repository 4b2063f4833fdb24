package sim

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/url"
	"sync"
	"sync/atomic"
	"time"

	"github.com/eclipse/paho.golang/paho"
	mqtt3 "github.com/eclipse/paho.mqtt.golang"

	"github.com/fleetgate/fleetgate/sim/check"
)

// mqttConn is one device connection, whichever the client library.
type mqttConn interface {
	// publish sends one QoS 1 message and waits for its PUBACK.
	publish(ctx context.Context, topic string) error
	// disconnect ends the connection with a normal DISCONNECT.
	disconnect()
	// drop closes the connection without a word.
	drop()
	// lost is closed when the connection ends, whoever ended it.
	lost() <-chan struct{}
}

type mqttDialer struct {
	keepAlive time.Duration
	timeout   time.Duration
}

func (m mqttDialer) dial(ctx context.Context, p Proto, addr, id string) (mqttConn, error) {
	if p == MQTT5 {
		return m.dial5(ctx, addr, id)
	}
	return m.dial311(addr, id)
}

type conn5 struct {
	nc net.Conn
	c  *paho.Client
}

func (m mqttDialer) dial5(ctx context.Context, addr, id string) (mqttConn, error) {
	d := net.Dialer{Timeout: m.timeout}
	nc, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	c := paho.NewClient(paho.ClientConfig{Conn: nc, OnClientError: func(error) {}, OnServerDisconnect: func(*paho.Disconnect) {}})
	cctx, cancel := context.WithTimeout(ctx, m.timeout)
	defer cancel()
	ack, err := c.Connect(cctx, &paho.Connect{ClientID: id, KeepAlive: uint16(max(1, m.keepAlive/time.Second)), CleanStart: true})
	if err != nil {
		nc.Close()
		if ack != nil {
			return nil, fmt.Errorf("connack %d %s: %w", ack.ReasonCode, ack.Properties.ReasonString, err)
		}
		return nil, err
	}
	return &conn5{nc: nc, c: c}, nil
}

func (c *conn5) lost() <-chan struct{} { return c.c.Done() }

func (c *conn5) publish(ctx context.Context, topic string) error {
	_, err := c.c.Publish(ctx, &paho.Publish{Topic: topic, QoS: 1, Payload: []byte("21.5")})
	return err
}

func (c *conn5) disconnect() {
	_ = c.c.Disconnect(&paho.Disconnect{ReasonCode: 0})
	c.wait()
}

func (c *conn5) drop() {
	c.nc.Close()
	c.wait()
}

// wait lets the client's goroutines end (bounded).
func (c *conn5) wait() {
	select {
	case <-c.c.Done():
	case <-time.After(5 * time.Second):
	}
}

type conn311 struct {
	mu     sync.Mutex
	nc     net.Conn
	c      mqtt3.Client
	gone   chan struct{}
	goneMu sync.Once
}

func (c *conn311) lost() <-chan struct{} { return c.gone }

func (c *conn311) end() { c.goneMu.Do(func() { close(c.gone) }) }

func (m mqttDialer) dial311(addr, id string) (mqttConn, error) {
	c := &conn311{gone: make(chan struct{})}
	o := mqtt3.NewClientOptions().AddBroker("tcp://" + addr).SetClientID(id).SetCleanSession(true).
		SetProtocolVersion(4).SetKeepAlive(max(time.Second, m.keepAlive)).SetAutoReconnect(false).
		SetConnectRetry(false).SetConnectTimeout(m.timeout).SetWriteTimeout(m.timeout).
		SetConnectionLostHandler(func(mqtt3.Client, error) { c.end() }).
		SetCustomOpenConnectionFn(func(*url.URL, mqtt3.ClientOptions) (net.Conn, error) {
			nc, err := net.DialTimeout("tcp", addr, m.timeout)
			if err == nil {
				c.mu.Lock()
				c.nc = nc
				c.mu.Unlock()
			}
			return nc, err
		})
	c.c = mqtt3.NewClient(o)
	tk := c.c.Connect()
	if !tk.WaitTimeout(m.timeout + time.Second) {
		c.drop()
		return nil, errors.New("connect timed out")
	}
	if err := tk.Error(); err != nil {
		return nil, err
	}
	return c, nil
}

func (c *conn311) publish(ctx context.Context, topic string) error {
	tk := c.c.Publish(topic, 1, false, "21.5")
	select {
	case <-tk.Done():
		return tk.Error()
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (c *conn311) disconnect() {
	c.c.Disconnect(100)
	c.end()
}

func (c *conn311) drop() {
	c.mu.Lock()
	if c.nc != nil {
		c.nc.Close()
	}
	c.mu.Unlock()
	// the client notices the closed connection and ends itself; make
	// sure it does not linger
	c.c.Disconnect(0)
	c.end()
}

// mqttDevice plays one MQTT device in its own goroutine.
type mqttDevice struct {
	plan   DevicePlan
	truth  *truth
	gws    []string
	dialer mqttDialer
	stats  *Stats
	topic  string
	seq    *atomic.Int64
}

// link is one live connection and its truth session.
type link struct {
	c    mqttConn
	sess *check.Session
}

func (d *mqttDevice) nextSession() string { return fmt.Sprintf("mqtt#%d", d.seq.Add(1)) }

// connect makes a new connection to gateway gw; the session's evidence
// is the moment the CONNECT went out, once CONNACK came back.
func (d *mqttDevice) connect(ctx context.Context, gw int) (*link, error) {
	s := d.truth.session(d.nextSession())
	at := time.Now()
	d.truth.sent(s, at)
	c, err := d.dialer.dial(ctx, d.plan.Proto, d.gws[gw], d.plan.ID)
	d.stats.sent.Add(1)
	if err != nil {
		d.stats.connectError(err)
		return nil, err
	}
	d.stats.connects.Add(1)
	d.stats.connected.Add(1)
	d.stats.answered.Add(1)
	d.truth.acked(s, at)
	return &link{c: c, sess: s}, nil
}

func (d *mqttDevice) publish(ctx context.Context, l *link) error {
	at := time.Now()
	d.truth.sent(l.sess, at)
	d.stats.sent.Add(1)
	pctx, cancel := context.WithTimeout(ctx, d.dialer.timeout)
	err := l.c.publish(pctx, d.topic)
	cancel()
	if err != nil {
		d.stats.sendErrors.Add(1)
		return err
	}
	d.stats.answered.Add(1)
	d.truth.acked(l.sess, at)
	return nil
}

func (d *mqttDevice) drop(l *link) {
	d.truth.sent(l.sess, time.Now())
	l.c.drop()
	d.truth.sent(l.sess, time.Now())
	d.stats.connected.Add(-1)
}

func (d *mqttDevice) leave(l *link) {
	d.truth.left(l.sess, time.Now())
	l.c.disconnect()
	d.stats.sent.Add(1)
	d.stats.connected.Add(-1)
}

// run plays the device until ctx ends; every connection still open then
// is dropped without a word.
func (d *mqttDevice) run(ctx context.Context, start time.Time) {
	rng := rand.New(rand.NewPCG(d.plan.Seed, 2))
	var links []*link
	// wait waits until at, or until the first link is lost (a gateway
	// restart, a dropped connection); false when the run is over.
	wait := func(at time.Time) bool {
		t := time.NewTimer(time.Until(at))
		defer t.Stop()
		var lost <-chan struct{}
		if len(links) > 0 {
			lost = links[0].c.lost()
		}
		select {
		case <-ctx.Done():
			return false
		case <-t.C:
			return true
		case <-lost:
			return true
		}
	}
	churnAt := start.Add(d.plan.At)
	if d.plan.Churn == Visit {
		if !wait(churnAt) {
			return
		}
		d.truth.setActive(false)
		l, err := d.connect(ctx, d.plan.Gateway)
		if err != nil {
			return
		}
		_ = d.publish(ctx, l)
		d.leave(l)
		return
	}
	if !wait(start.Add(d.plan.Phase)) {
		return
	}
	defer func() {
		for _, l := range links {
			d.drop(l)
		}
	}()
	// (re)connect: a refused or failed connection is counted and tried
	// again after a backoff of 1 s, doubling up to a heartbeat, with jitter
	connect := func(gw int) *link {
		backoff := time.Second
		for ctx.Err() == nil {
			l, err := d.connect(ctx, gw)
			if err == nil {
				return l
			}
			if !sleep(ctx, jitter(rng, min(backoff, d.stats.heartbeat))) {
				return nil
			}
			backoff *= 2
		}
		return nil
	}
	gw := d.plan.Gateway // where the first link goes now
	first := connect(gw)
	if first == nil {
		return
	}
	links = append(links, first)
	if d.plan.Churn == Dual {
		if l := connect(d.plan.To); l != nil {
			links = append(links, l)
		}
	}
	churn := d.plan.Churn != Steady
	for {
		next := time.Now().Add(jitter(rng, d.stats.heartbeat))
		if churn && churnAt.Before(next) {
			next = churnAt
		}
		if !wait(next) {
			return
		}
		if l := links[0]; isClosed(l.c.lost()) && !(churn && !time.Now().Before(churnAt)) {
			// lost under it (a gateway restart): back within a second
			d.drop(l)
			if !sleep(ctx, time.Duration(rng.Int64N(int64(time.Second)))) {
				links = links[1:]
				return
			}
			nl := connect(gw)
			if nl == nil {
				links = links[1:]
				return
			}
			links[0] = nl
			d.stats.reconnects.Add(1)
		}
		if churn && !time.Now().Before(churnAt) {
			churn = false
			switch d.plan.Churn {
			case Freeze:
				d.truth.setActive(false)
				for _, l := range links {
					d.drop(l)
				}
				links = nil
				return
			case Leave:
				d.truth.setActive(false)
				for _, l := range links {
					d.leave(l)
				}
				links = nil
				return
			case Roam, Move:
				l := connect(d.plan.To)
				if l == nil {
					return
				}
				old := links[0]
				links = []*link{l}
				gw = d.plan.To
				if d.plan.Churn == Roam {
					d.drop(old)
				} else {
					d.leave(old)
				}
			case Dual:
				if len(links) == 2 {
					d.drop(links[0])
					links = links[1:]
					gw = d.plan.To
				}
			case Storm:
				for _, l := range links {
					d.drop(l)
				}
				links = nil
				if !sleep(ctx, d.plan.Pause) {
					return
				}
				l := connect(gw)
				if l == nil {
					return
				}
				links = []*link{l}
			}
		}
		for i := 0; i < len(links); i++ {
			if err := d.publish(ctx, links[i]); err != nil && ctx.Err() == nil {
				// the connection broke under it: count on the lease and
				// connect again
				d.drop(links[i])
				to := gw
				if i > 0 {
					to = d.plan.To // a Dual's second link
				}
				if l := connect(to); l != nil {
					links[i] = l
				} else {
					links = append(links[:i], links[i+1:]...)
					i--
				}
			}
		}
	}
}

// sleep waits d unless ctx ends first (false).
func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

func isClosed(c <-chan struct{}) bool {
	select {
	case <-c:
		return true
	default:
		return false
	}
}
