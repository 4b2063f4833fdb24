package queuetest

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"testing"
	"time"

	"pgregory.net/rapid"

	"github.com/fleetgate/fleetgate/gateway"
	"github.com/fleetgate/fleetgate/gateway/clocktest"
)

// Shape of the property runs: a queue small enough that random puts fill
// it, an age bound the clock moves cross, and received times around it.
const (
	propMaxBytes   = 1200
	propMaxAge     = 10 * time.Second
	propMaxPayload = 300
	minSteps       = 10
	maxSteps       = 60
)

var (
	propDevices  = []gateway.DeviceID{"dev-1", "dev-2"}
	propTopics   = []string{"", "a", "a/b"}
	propSources  = []string{"mqtt", "coap"}
	propContent  = []string{"", "text/plain"}
	propAges     = []time.Duration{0, time.Millisecond, propMaxAge / 2, propMaxAge, propMaxAge + time.Millisecond, 3 * propMaxAge}
	propAdvances = []time.Duration{time.Millisecond, time.Second, propMaxAge / 2, propMaxAge, propMaxAge + time.Millisecond}
	// propUnknown are IDs no run hands out.
	propUnknown = []uint64{0, 1 << 62, 1<<64 - 1}
)

// RunProperties checks queues made by open against a model with rapid:
// random sequences of Puts (some too large, some batches larger than
// the queue, with received times around the max age), Reads (after 0 or
// an ID a Put returned, of 1 to 4 messages), Acks (of IDs Puts
// returned, held or gone, read or not, and unknown ones), clock moves
// and, for a durable queue, restarts. After every step the queue's
// answers and Stats must equal the model's: the messages read, byte for
// byte and in order, the messages and bytes held, the oldest's
// Received, and the drops by reason since the last restart. The model
// does not know the IDs the queue hands out: it learns them from each
// Put (one per message; 0 exactly for those the Put itself dropped),
// checks that they increase in the order of the puts, also across
// restarts, and that Read returns each message with the ID its Put
// returned.
//
// The number of runs is rapid's (-rapid.checks, default 100).
func RunProperties(t *testing.T, open Opener) {
	t.Run("Model", func(t *testing.T) {
		rapid.Check(t, func(rt *rapid.T) {
			clock := clocktest.New(time.UnixMilli(startMs).UTC())
			h := open(t, Options{MaxBytes: propMaxBytes, MaxAge: propMaxAge, Clock: clock})
			q, err := h.Open()
			if err != nil {
				rt.Fatalf("Open: %v", err)
			}
			m := &machine{t: rt, clock: clock, h: h, q: q, model: model{dropped: map[gateway.DropReason]uint64{}}}
			defer func() {
				if err := m.q.Close(); err != nil {
					rt.Errorf("Close: %v", err)
				}
			}()
			m.run()
		})
	})
}

// entry is a message the model was given: its place in the order of
// the puts, the ID its Put returned (0 for one the Put dropped), and
// whether the model dropped it.
type entry struct {
	pos     int
	id      uint64
	msg     gateway.Message
	dropped bool
}

// model is what a queue of propMaxBytes and propMaxAge holds.
type model struct {
	held    []*entry
	all     []*entry
	bytes   int64
	dropped map[gateway.DropReason]uint64
}

func expired(e *entry, now time.Time) bool { return now.Sub(e.msg.Received) > propMaxAge }

func (m *model) drop(i int, r gateway.DropReason) {
	m.bytes -= int64(m.held[i].msg.Size())
	m.held[i].dropped = true
	m.held = slices.Delete(m.held, i, i+1)
	m.dropped[r]++
}

// put is Put: all or nothing; the expired messages at the head go, then
// each message is appended and the oldest make room. It returns the
// entries of msgs.
func (m *model) put(msgs []gateway.Message, now time.Time) ([]*entry, error) {
	for _, msg := range msgs {
		if msg.Size() > propMaxBytes {
			return nil, gateway.ErrTooLarge
		}
	}
	for len(m.held) > 0 && expired(m.held[0], now) {
		m.drop(0, gateway.DropExpired)
	}
	added := make([]*entry, len(msgs))
	for i, msg := range msgs {
		msg.Received = ms(msg.Received)
		e := &entry{pos: len(m.all), msg: msg}
		added[i] = e
		m.all = append(m.all, e)
		m.held = append(m.held, e)
		m.bytes += int64(msg.Size())
		for m.bytes > propMaxBytes {
			m.drop(0, gateway.DropFull)
		}
	}
	return added, nil
}

// read is Read after the entry at pos after (-1: from the oldest): in
// order, the expired ones dropped, until n are found.
func (m *model) read(after, n int, now time.Time) []*entry {
	var out []*entry
	for i := 0; i < len(m.held) && len(out) < n; {
		e := m.held[i]
		switch {
		case e.pos <= after:
			i++
		case expired(e, now):
			m.drop(i, gateway.DropExpired)
		default:
			out = append(out, e)
			i++
		}
	}
	return out
}

func (m *model) ack(ids []uint64) {
	m.held = slices.DeleteFunc(m.held, func(e *entry) bool {
		if e.id != 0 && slices.Contains(ids, e.id) {
			m.bytes -= int64(e.msg.Size())
			return true
		}
		return false
	})
}

// machine drives one property run.
type machine struct {
	t     *rapid.T
	clock *clocktest.Clock
	h     Harness
	q     gateway.Queue
	model model
}

func (m *machine) run() {
	actions := []struct {
		name   string
		weight int
		fn     func()
	}{
		{"put", 4, m.put},
		{"read", 3, m.read},
		{"ack", 2, m.ack},
		{"advance", 1, m.advance},
		{"restart", 1, m.restart},
	}
	var names []string
	byName := map[string]func(){}
	for _, a := range actions {
		if a.name == "restart" && !m.h.Durable {
			continue
		}
		byName[a.name] = a.fn
		for range a.weight {
			names = append(names, a.name)
		}
	}
	steps := rapid.IntRange(minSteps, maxSteps).Draw(m.t, "steps")
	for range steps {
		byName[rapid.SampledFrom(names).Draw(m.t, "action")]()
		m.checkStats()
	}
	// Every message held is read in the end.
	m.readAll()
}

func (m *machine) drawMessage() gateway.Message {
	n := rapid.IntRange(0, propMaxPayload).Draw(m.t, "payload")
	switch rapid.IntRange(0, 19).Draw(m.t, "large") {
	case 0: // larger than the queue
		n = propMaxBytes
	case 1, 2: // two of them are more than the queue holds: a batch drops its own
		n = propMaxBytes / 2
	}
	payload := make([]byte, n)
	for i := range payload {
		payload[i] = byte(i)
	}
	if n > 0 {
		payload[0] = rapid.Byte().Draw(m.t, "byte")
	}
	var props []gateway.Property
	for i := range rapid.IntRange(0, 2).Draw(m.t, "properties") {
		props = append(props, gateway.Property{Key: fmt.Sprintf("k%d", i), Value: rapid.SampledFrom([]string{"", "v"}).Draw(m.t, "value")})
	}
	return gateway.Message{
		Device:      rapid.SampledFrom(propDevices).Draw(m.t, "device"),
		Topic:       rapid.SampledFrom(propTopics).Draw(m.t, "topic"),
		Payload:     payload,
		ContentType: rapid.SampledFrom(propContent).Draw(m.t, "content type"),
		Properties:  props,
		QoS:         byte(rapid.IntRange(0, 1).Draw(m.t, "qos")),
		Received:    m.clock.Now().Add(-rapid.SampledFrom(propAges).Draw(m.t, "age")).Add(time.Duration(rapid.IntRange(0, 999_999).Draw(m.t, "ns"))),
		Source:      rapid.SampledFrom(propSources).Draw(m.t, "source"),
	}
}

func (m *machine) put() {
	msgs := make([]gateway.Message, rapid.IntRange(1, 3).Draw(m.t, "messages"))
	for i := range msgs {
		msgs[i] = m.drawMessage()
	}
	ids, err := m.q.Put(context.Background(), msgs)
	added, want := m.model.put(msgs, m.clock.Now())
	m.t.Logf("Put(%s) = %v, %v", describe(msgs), ids, err)
	if !errors.Is(err, want) {
		m.t.Fatalf("Put(%s) = %v, want %v", describe(msgs), err, want)
	}
	if err != nil {
		if ids != nil {
			m.t.Fatalf("Put(%s) failed and returned IDs %v", describe(msgs), ids)
		}
		return
	}
	if len(ids) != len(added) {
		m.t.Fatalf("Put(%s) returned %d IDs, want %d", describe(msgs), len(ids), len(added))
	}
	for i, e := range added {
		if (ids[i] == 0) != e.dropped {
			m.t.Fatalf("Put(%s) returned IDs %v: message %d dropped by the Put: %v; want 0 for exactly those", describe(msgs), ids, i, e.dropped)
		}
		e.id = ids[i]
	}
	m.checkIDOrder()
}

// checkIDOrder checks that the IDs Puts returned increase in the order
// of the puts (0s aside).
func (m *machine) checkIDOrder() {
	var last uint64
	for _, e := range m.model.all {
		if e.id == 0 {
			continue
		}
		if e.id <= last {
			m.t.Fatalf("message put %d has ID %d, an earlier one %d", e.pos, e.id, last)
		}
		last = e.id
	}
}

// drawAfter is 0 or the ID a Put returned (for a message held or gone),
// with its position in the order of the puts.
func (m *machine) drawAfter() (uint64, int) {
	known := []*entry{nil}
	for _, e := range m.model.all {
		if e.id != 0 {
			known = append(known, e)
		}
	}
	e := rapid.SampledFrom(known).Draw(m.t, "after")
	if e == nil {
		return 0, -1
	}
	return e.id, e.pos
}

func (m *machine) read() {
	after, pos := m.drawAfter()
	n := rapid.IntRange(1, 4).Draw(m.t, "n")
	want := m.model.read(pos, n, m.clock.Now())
	got, err := m.q.Read(done(), after, n)
	m.t.Logf("Read(after %d, %d) = %s, %v", after, n, describeQueued(got), err)
	if len(want) == 0 {
		if !errors.Is(err, context.Canceled) || len(got) != 0 {
			m.t.Fatalf("Read(after %d, %d) = %s, %v; want nothing, context.Canceled", after, n, describeQueued(got), err)
		}
		return
	}
	if err != nil {
		m.t.Fatalf("Read(after %d, %d): %v", after, n, err)
	}
	m.check(got, want)
}

// check checks that got are the model's entries want, each with the ID
// its Put returned.
func (m *machine) check(got []gateway.QueuedMessage, want []*entry) {
	msgs := make([]gateway.Message, len(want))
	for i, e := range want {
		msgs[i] = e.msg
	}
	if err := sameMessages(got, msgs); err != nil {
		m.t.Fatal(err)
	}
	for i, e := range want {
		if e.id != got[i].ID {
			m.t.Fatalf("message put %d read with ID %d, its Put returned ID %d", e.pos, got[i].ID, e.id)
		}
	}
}

func (m *machine) ack() {
	var known []uint64
	for _, e := range m.model.all {
		if e.id != 0 {
			known = append(known, e.id)
		}
	}
	known = append(known, propUnknown...)
	ids := rapid.SliceOfN(rapid.SampledFrom(known), 0, 4).Draw(m.t, "ids")
	m.model.ack(ids)
	err := m.q.Ack(ids)
	m.t.Logf("Ack(%v) = %v", ids, err)
	if err != nil {
		m.t.Fatalf("Ack(%v): %v", ids, err)
	}
}

func (m *machine) advance() {
	d := rapid.SampledFrom(propAdvances).Draw(m.t, "advance")
	m.clock.Advance(d)
	m.t.Logf("advanced %v", d)
}

func (m *machine) restart() {
	if err := m.q.Close(); err != nil {
		m.t.Fatalf("Close: %v", err)
	}
	q, err := m.h.Open()
	if err != nil {
		m.t.Fatalf("Open after Close: %v", err)
	}
	m.q = q
	m.model.dropped = map[gateway.DropReason]uint64{}
	m.t.Logf("restarted")
}

func (m *machine) checkStats() {
	held := make([]gateway.Message, len(m.model.held))
	for i, e := range m.model.held {
		held[i] = e.msg
	}
	if err := checkStats(m.q.Stats(), held, maps.Clone(m.model.dropped)); err != nil {
		m.t.Fatal(err)
	}
}

// readAll reads everything held, in pages, as the model says.
func (m *machine) readAll() {
	after, pos := uint64(0), -1
	for {
		want := m.model.read(pos, 3, m.clock.Now())
		got, err := m.q.Read(done(), after, 3)
		if len(want) == 0 {
			if !errors.Is(err, context.Canceled) || len(got) != 0 {
				m.t.Fatalf("final Read(after %d) = %s, %v; want nothing", after, describeQueued(got), err)
			}
			return
		}
		if err != nil {
			m.t.Fatalf("final Read(after %d): %v", after, err)
		}
		m.check(got, want)
		after, pos = got[len(got)-1].ID, want[len(want)-1].pos
	}
}
