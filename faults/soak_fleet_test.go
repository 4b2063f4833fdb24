//go:build faults && soak

package faults

import (
	"context"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/paho"
)

// soakFleet drives the soak's devices through their planned lives and
// records what they did in the truth. It runs on the harness's fleet (its
// start time, stop and wait), without the fleet's devices.
type soakFleet struct {
	*fleet
	truth    *soakTruth
	plans    []devicePlan
	seed     uint64
	duration time.Duration

	// modbus answers for the Modbus devices.
	modbus *modbusFleet

	stormMu sync.Mutex
	// storms holds a channel per gateway that a reconnect storm closes
	// (and replaces): every MQTT connection to it drops and reconnects.
	storms []chan struct{}
}

func newSoakFleet(t testing.TB, plan soakPlan, gws []*gatewayProc, truth *soakTruth) *soakFleet {
	f := &soakFleet{fleet: newFleet(t, fast, gws...), truth: truth, plans: plan.devices, seed: plan.seed, duration: plan.duration}
	for range gws {
		f.storms = append(f.storms, make(chan struct{}))
	}
	return f
}

func (f *soakFleet) start() {
	f.t0 = time.Now()
	for i, p := range f.plans {
		f.wg.Add(1)
		go f.drive(i, p)
	}
}

// storm drops every MQTT connection to gateway g (-1: to every gateway);
// the devices reconnect at once.
func (f *soakFleet) storm(g int) {
	f.stormMu.Lock()
	defer f.stormMu.Unlock()
	for i := range f.storms {
		if g < 0 || g == i {
			close(f.storms[i])
			f.storms[i] = make(chan struct{})
		}
	}
}

func (f *soakFleet) stormOf(g int) <-chan struct{} {
	f.stormMu.Lock()
	defer f.stormMu.Unlock()
	return f.storms[g]
}

func (f *soakFleet) drive(i int, p devicePlan) {
	defer f.wg.Done()
	if p.kind == kindModbus {
		for _, l := range p.lives {
			if !f.wait(l.start) || !f.modbus.live(f, p.id, l) {
				return
			}
		}
		return
	}
	d := &soakDevice{f: f, id: p.id, kind: p.kind, jitter: soakRand(f.seed, streamJitter+uint64(i))}
	for _, l := range p.lives {
		if !f.wait(l.start) || !d.live(l) {
			return
		}
	}
}

// soakDevice is one device while it lives.
type soakDevice struct {
	f      *soakFleet
	id     string
	kind   devKind
	jitter *rand.Rand
	lf     *lifeRecord
	cur    int
	// coap holds a CoAP link per instance, mqtt the MQTT connection.
	coap [2]*coapLink
	mqtt *mqttLink
	// done is, per gateway, when the last attempt to it ended.
	done []time.Time
}

// live runs one life; false when the fleet stopped during it.
func (d *soakDevice) live(l life) bool {
	f := d.f
	d.lf = f.truth.beginLife(d.id, time.Now())
	d.cur, d.done = l.gw, make([]time.Time, len(f.gws))
	active := []bool{true, d.kind == kindCoAP2}
	moves := l.moves
	stopped := false
	// A life that lasts to the end of the run is ended by the fleet's
	// stop, not by its plan.
	planned := l.end < f.duration
	for range 1_000_000 {
		now := time.Since(f.t0)
		if now >= l.end && planned {
			break
		}
		if active[1] && l.auxEnd > 0 && now >= l.auxEnd {
			d.end(1, l.auxLeave)
			active[1] = false
		}
		if len(moves) > 0 && now >= moves[0].at {
			d.move(moves[0].to)
			moves = moves[1:]
		}
		for s := range active {
			if active[s] {
				d.beat(s)
			}
		}
		// CoAP and MQTT send every half heartbeat ± 30 %; a sleepy
		// device wakes every 0.5–0.9 heartbeat.
		wait := time.Duration(float64(f.tm.heartbeat/2) * (0.7 + 0.6*d.jitter.Float64()))
		if d.kind == kindSleepy {
			wait = time.Duration(float64(f.tm.heartbeat) * (0.5 + 0.4*d.jitter.Float64()))
		}
		next := f.duration + time.Hour
		if planned {
			next = l.end
		}
		if len(moves) > 0 {
			next = min(next, moves[0].at)
		}
		if active[1] && l.auxEnd > 0 {
			next = min(next, l.auxEnd)
		}
		wait = min(wait, max(next-time.Since(f.t0), 0))
		var storm <-chan struct{}
		if d.kind == kindMQTT {
			storm = f.stormOf(d.cur)
		}
		select {
		case <-f.quit:
			stopped = true
		case <-storm:
			d.dropMQTT()
		case <-time.After(wait):
		}
		if stopped {
			break
		}
	}
	for s := range active {
		if active[s] {
			d.end(s, l.leave && !stopped)
		}
	}
	f.truth.endLife(d.lf, stopped || !planned)
	return !stopped
}

// attempt records an attempt that began at try.
func (d *soakDevice) attempt(slot, gw int, try time.Time, err error) {
	d.f.truth.attempt(d.id, d.lf, slot, gw, try, err == nil)
	d.done[gw] = time.Now()
}

func (d *soakDevice) ctx() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), time.Second)
}

// beat sends one piece of evidence of instance slot to the current
// gateway: a CoAP POST; an MQTT publish (after a CONNECT when not
// connected, evidence too); a sleepy device's wake-up (CONNECT, publish,
// DISCONNECT, which is a renew).
func (d *soakDevice) beat(slot int) {
	g := d.f.gws[d.cur].cfg
	ctx, cancel := d.ctx()
	defer cancel()
	switch d.kind {
	case kindCoAP, kindCoAP2:
		try := time.Now()
		var err error
		if d.coap[slot] == nil {
			d.coap[slot], err = dialCoAP(g.CoAP, d.id, instances[slot])
		}
		if err == nil {
			err = d.coap[slot].send(ctx)
		}
		d.attempt(slot, d.cur, try, err)
		if err != nil && d.coap[slot] != nil {
			d.coap[slot].drop()
			d.coap[slot] = nil
		}
	case kindMQTT:
		if d.mqtt == nil {
			try := time.Now()
			m, err := dialMQTT(ctx, g.MQTT, d.id, false)
			d.attempt(0, d.cur, try, err)
			if err != nil {
				return
			}
			d.mqtt = m
		}
		try := time.Now()
		err := d.mqtt.send(ctx)
		d.attempt(0, d.cur, try, err)
		if err != nil {
			d.dropMQTT()
		}
	case kindSleepy:
		try := time.Now()
		m, err := dialMQTT(ctx, g.MQTT, d.id, true)
		d.attempt(0, d.cur, try, err)
		if err != nil {
			return
		}
		try = time.Now()
		err = m.send(ctx)
		d.attempt(0, d.cur, try, err)
		if err == nil {
			_ = m.c.Disconnect(&paho.Disconnect{ReasonCode: 0})
			d.done[d.cur] = time.Now()
		}
		m.drop()
	}
}

// dropMQTT drops the MQTT connection without a goodbye: its session
// lasts until its lease runs out.
func (d *soakDevice) dropMQTT() {
	if d.mqtt == nil {
		return
	}
	d.mqtt.drop()
	d.mqtt = nil
	d.f.truth.sessionEnded(d.lf, d.cur, d.done[d.cur], false)
}

// move switches the device to gateway to: CoAP just sends there next (its
// session, named by the device and instance, is the same); MQTT connects
// there, then says goodbye to the old connection (make before break); a
// sleepy device's next wake-up goes there, and its persistent session on
// the old gateway runs out.
func (d *soakDevice) move(to int) {
	from := d.cur
	d.cur = to
	d.f.truth.moved(d.id, time.Now())
	switch d.kind {
	case kindCoAP, kindCoAP2:
		for s, c := range d.coap {
			if c != nil {
				c.drop()
				d.coap[s] = nil
			}
		}
	case kindMQTT:
		if d.mqtt == nil {
			return
		}
		ctx, cancel := d.ctx()
		defer cancel()
		try := time.Now()
		m, err := dialMQTT(ctx, d.f.gws[to].cfg.MQTT, d.id, false)
		d.attempt(0, to, try, err)
		old := d.mqtt
		d.mqtt = m
		if err != nil {
			d.mqtt = nil
			old.drop()
			d.f.truth.sessionEnded(d.lf, from, d.done[from], false)
			return
		}
		bye := time.Now()
		if old.leave(ctx) == nil {
			d.f.truth.sessionEnded(d.lf, from, bye, true)
		} else {
			d.f.truth.sessionEnded(d.lf, from, time.Now(), false)
		}
	case kindSleepy:
		if !d.done[from].IsZero() {
			d.f.truth.sessionEnded(d.lf, from, d.done[from], false)
		}
	}
}

// end ends instance slot: with a goodbye when leave (CoAP DELETE, MQTT
// DISCONNECT, a sleepy device's DISCONNECT that ends its session), or
// silence. A goodbye that fails is silence.
func (d *soakDevice) end(slot int, leave bool) {
	ctx, cancel := d.ctx()
	defer cancel()
	g := d.f.gws[d.cur].cfg
	bye := time.Now()
	var err error
	switch d.kind {
	case kindCoAP, kindCoAP2:
		c := d.coap[slot]
		d.coap[slot] = nil
		if leave {
			if c == nil {
				c, err = dialCoAP(g.CoAP, d.id, instances[slot])
			}
			if err == nil {
				err = c.leave(ctx)
			}
		}
		if c != nil {
			c.drop()
		}
	case kindMQTT:
		m := d.mqtt
		d.mqtt = nil
		if leave {
			if m == nil {
				m, err = dialMQTT(ctx, g.MQTT, d.id, false)
			}
			if err == nil {
				err = m.leave(ctx)
			}
		} else if m != nil {
			m.drop()
		}
	case kindSleepy:
		if leave {
			var m *mqttLink
			if m, err = dialMQTT(ctx, g.MQTT, d.id, true); err == nil {
				zero := uint32(0)
				err = m.c.Disconnect(&paho.Disconnect{ReasonCode: 0, Properties: &paho.DisconnectProperties{SessionExpiryInterval: &zero}})
				m.drop()
			}
		}
	}
	if leave {
		// The goodbye is an attempt, whether it got through or not.
		d.f.truth.attempt(d.id, d.lf, slot, d.cur, bye, false)
		d.done[d.cur] = time.Now()
		if err == nil {
			d.f.truth.left(d.id, slot, bye)
			d.f.truth.sessionEnded(d.lf, d.cur, bye, true)
			return
		}
		d.f.truth.leftUnsure(d.id, slot, bye)
	}
	// Silence: the session lasts a lease from the last attempt (a CoAP
	// session is the device's, whichever gateway carried it).
	var last time.Time
	for _, t := range d.done {
		last = later(last, t)
	}
	d.f.truth.sessionEnded(d.lf, d.cur, last, false)
}
