// Package queuetest is the conformance suite every gateway.Queue passes:
// Run checks the contract (the doc comment of gateway.Queue) case by
// case, and RunProperties checks random sequences of Put, Read, Ack,
// clock moves and, for a durable queue, restarts against a small model.
//
// An implementation wires it from its own test package:
//
//	func TestConformance(t *testing.T) {
//		queuetest.Run(t, open)
//		queuetest.RunProperties(t, open)
//	}
//
// Every queue runs on a manual clock (gateway/clocktest) that the suite
// moves by hand, so no age test sleeps.
//
// Put's IDs are checked against Read's: each case compares the IDs a
// Put returned with those Read returns for its messages (the same, in
// order), and every Put's IDs with all those returned before (higher,
// also across a restart of a durable queue).
//
// Where the contract is silent the suite pins what fleetgate's queues
// do, so that the bridge may use either:
//   - a batch larger than the queue keeps its newest messages, as if
//     they had been put one by one; Put returns 0 for the IDs of those
//     it dropped;
//   - a message's age is now minus its Received: one exactly max age old
//     is kept; a Put first drops the expired messages at the head;
//   - Read with a context that has ended returns the messages there are
//     (only its wait ends with the context's error); n < 1 is an error;
//   - a Put whose context ended before the call puts nothing;
//   - Received comes back at millisecond precision; Stats.Oldest is the
//     Received of the message with the lowest ID; Stats.Dropped counts
//     since the queue was opened;
//   - Close again returns nil.
package queuetest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/fleetgate/fleetgate/gateway"
	"github.com/fleetgate/fleetgate/gateway/clocktest"
)

// Options are the bounds a case opens its queue with.
type Options struct {
	// MaxBytes bounds what the queue holds (Message.Size summed); > 0.
	MaxBytes int64
	// MaxAge is the queue's max age; 0 for none.
	MaxAge time.Duration
	// Clock is the queue's clock: a manual one (clocktest) the case moves.
	Clock gateway.Clock
}

// Harness is one queue under test. The case opens it, closes it, and
// may open it again.
type Harness struct {
	// Open opens the queue with the case's Options. Open after a Close
	// is a restart: a durable queue opens what the last one held (the
	// same file), a memory queue starts empty. At most one queue of a
	// harness is open at a time.
	Open func() (gateway.Queue, error)
	// Durable says whether a queue opened again keeps what the last
	// one held.
	Durable bool
}

// Opener makes the harness of one case. Each call must be independent
// of the others (its own file); the Opener releases what it made with
// t.Cleanup, after the case has closed its queues.
type Opener func(t *testing.T, o Options) Harness

// startMs is where every test clock starts (2030-01-01T00:00:00Z), a
// whole millisecond.
const startMs = 1_893_456_000_000

// env is one case's queue with its clock and harness.
type env struct {
	t     *testing.T
	ctx   context.Context
	clock *clocktest.Clock
	h     Harness
	q     gateway.Queue
	// closed says the case closed q itself (the cleanup does not).
	closed bool
	// last is the highest ID a Put returned (since the last restart of
	// a queue that is not durable).
	last uint64
}

// newEnv opens a queue with bounds maxBytes and maxAge on a new manual
// clock, and closes it when the case ends.
func newEnv(t *testing.T, open Opener, maxBytes int64, maxAge time.Duration) *env {
	t.Helper()
	clock := clocktest.New(time.UnixMilli(startMs).UTC())
	e := &env{t: t, ctx: t.Context(), clock: clock}
	e.h = open(t, Options{MaxBytes: maxBytes, MaxAge: maxAge, Clock: clock})
	if e.h.Open == nil {
		t.Fatal("opener returned a harness without Open")
	}
	e.open()
	// Registered after the Opener's cleanups, so it runs before them.
	t.Cleanup(func() {
		if !e.closed {
			if err := e.q.Close(); err != nil {
				t.Errorf("Close: %v", err)
			}
		}
	})
	return e
}

func (e *env) open() {
	e.t.Helper()
	q, err := e.h.Open()
	if err != nil {
		e.t.Fatalf("Open: %v", err)
	}
	if q == nil {
		e.t.Fatal("Open returned a nil queue")
	}
	e.q, e.closed = q, false
	if !e.h.Durable {
		e.last = 0
	}
}

// reopen closes the queue and opens it again (a restart).
func (e *env) reopen() {
	e.t.Helper()
	if err := e.q.Close(); err != nil {
		e.t.Fatalf("Close: %v", err)
	}
	e.closed = true
	e.open()
}

func (e *env) now() time.Time { return e.clock.Now() }

// put puts msgs, none of which the Put may drop, and returns their IDs.
func (e *env) put(msgs ...gateway.Message) []uint64 {
	e.t.Helper()
	return e.putDropping(0, msgs...)
}

// putDropping puts msgs and returns their IDs, checking them: one per
// message, 0 for the first dropped (the messages the Put itself drops
// to make room), the others above every ID returned before, increasing.
func (e *env) putDropping(dropped int, msgs ...gateway.Message) []uint64 {
	e.t.Helper()
	got, err := e.q.Put(e.ctx, msgs)
	if err != nil {
		e.t.Fatalf("Put(%s): %v", describe(msgs), err)
	}
	if len(got) != len(msgs) {
		e.t.Fatalf("Put(%s) returned %d IDs %v, want %d", describe(msgs), len(got), got, len(msgs))
	}
	for i, id := range got {
		switch {
		case i < dropped && id != 0, i >= dropped && id <= e.last:
			e.t.Fatalf("Put(%s) returned IDs %v: want 0 for the first %d (dropped by the Put), then IDs above %d (returned before), increasing", describe(msgs), got, dropped, e.last)
		case i >= dropped:
			e.last = id
		}
	}
	return got
}

// expectIDs checks that got (read) have the IDs want (returned by Put).
func (e *env) expectIDs(got []gateway.QueuedMessage, want []uint64) {
	e.t.Helper()
	if !slices.Equal(ids(got), want) {
		e.t.Fatalf("Read returned IDs %v, Put returned %v for those messages", ids(got), want)
	}
}

// read reads up to n messages after after, failing the case unless some
// are there now (a done context: Read only looks).
func (e *env) read(after uint64, n int) []gateway.QueuedMessage {
	e.t.Helper()
	got, err := e.q.Read(done(), after, n)
	if err != nil {
		e.t.Fatalf("Read(after %d, %d): %v", after, n, err)
	}
	if len(got) == 0 || len(got) > n {
		e.t.Fatalf("Read(after %d, %d) returned %d messages", after, n, len(got))
	}
	return got
}

// readNone checks that nothing is there to read after after: Read with
// a done context returns its error and no message.
func (e *env) readNone(after uint64) {
	e.t.Helper()
	got, err := e.q.Read(done(), after, 100)
	if !errors.Is(err, context.Canceled) || len(got) != 0 {
		e.t.Fatalf("Read(after %d) of nothing = %s, %v; want no message, context.Canceled", after, describeQueued(got), err)
	}
}

// readAll reads every message after after, in pages of page.
func (e *env) readAll(after uint64, page int) []gateway.QueuedMessage {
	e.t.Helper()
	var all []gateway.QueuedMessage
	for {
		got, err := e.q.Read(done(), after, page)
		if errors.Is(err, context.Canceled) && len(got) == 0 {
			return all
		}
		if err != nil {
			e.t.Fatalf("Read(after %d, %d): %v", after, page, err)
		}
		if len(got) > page {
			e.t.Fatalf("Read(after %d, %d) returned %d messages", after, page, len(got))
		}
		for _, m := range got {
			if m.ID <= after {
				e.t.Fatalf("Read(after %d) returned ID %d", after, m.ID)
			}
			after = m.ID
		}
		all = append(all, got...)
	}
}

func (e *env) ack(ids ...uint64) {
	e.t.Helper()
	if err := e.q.Ack(ids); err != nil {
		e.t.Fatalf("Ack(%v): %v", ids, err)
	}
}

// stats checks the queue's Stats against what the case expects: the
// messages held (in order), and the drops by reason.
func (e *env) stats(held []gateway.Message, full, expired uint64) {
	e.t.Helper()
	if err := checkStats(e.q.Stats(), held, map[gateway.DropReason]uint64{gateway.DropFull: full, gateway.DropExpired: expired}); err != nil {
		e.t.Fatal(err)
	}
}

// checkStats compares s with the messages held, oldest first, and the
// drops by reason (a reason not in dropped must count none).
func checkStats(s gateway.QueueStats, held []gateway.Message, dropped map[gateway.DropReason]uint64) error {
	var bytes int64
	for _, m := range held {
		bytes += int64(m.Size())
	}
	var oldest time.Time
	if len(held) > 0 {
		oldest = ms(held[0].Received)
	}
	var errs []error
	if s.Messages != len(held) || s.Bytes != bytes {
		errs = append(errs, fmt.Errorf("Stats holds %d messages, %d bytes; want %d, %d", s.Messages, s.Bytes, len(held), bytes))
	}
	if !s.Oldest.Equal(oldest) {
		errs = append(errs, fmt.Errorf("Stats.Oldest = %v, want %v", s.Oldest, oldest))
	}
	for r, n := range s.Dropped {
		if n != dropped[r] {
			errs = append(errs, fmt.Errorf("Stats.Dropped[%s] = %d, want %d", r, n, dropped[r]))
		}
	}
	for r, n := range dropped {
		if _, ok := s.Dropped[r]; !ok && n != 0 {
			errs = append(errs, fmt.Errorf("Stats.Dropped[%s] missing, want %d", r, n))
		}
	}
	return errors.Join(errs...)
}

// done returns a context that has ended: Read then returns what is
// there without waiting, or the context's error.
func done() context.Context {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	return ctx
}

// ms is t as a queue keeps it: millisecond precision.
func ms(t time.Time) time.Time { return time.UnixMilli(t.UnixMilli()) }

// sameMessage reports how got differs from want (nil when it does not):
// every field byte for byte, Received at millisecond precision.
func sameMessage(got, want gateway.Message) error {
	var diffs []string
	if got.Device != want.Device {
		diffs = append(diffs, fmt.Sprintf("device %q, want %q", got.Device, want.Device))
	}
	if got.Topic != want.Topic {
		diffs = append(diffs, fmt.Sprintf("topic %q, want %q", got.Topic, want.Topic))
	}
	if !bytes.Equal(got.Payload, want.Payload) {
		diffs = append(diffs, fmt.Sprintf("payload %s, want %s", short(got.Payload), short(want.Payload)))
	}
	if got.ContentType != want.ContentType {
		diffs = append(diffs, fmt.Sprintf("content type %q, want %q", got.ContentType, want.ContentType))
	}
	if !slices.Equal(got.Properties, want.Properties) {
		diffs = append(diffs, fmt.Sprintf("properties %v, want %v", got.Properties, want.Properties))
	}
	if got.QoS != want.QoS {
		diffs = append(diffs, fmt.Sprintf("qos %d, want %d", got.QoS, want.QoS))
	}
	if !got.Received.Equal(ms(want.Received)) {
		diffs = append(diffs, fmt.Sprintf("received %v, want %v", got.Received, ms(want.Received)))
	}
	if got.Source != want.Source {
		diffs = append(diffs, fmt.Sprintf("source %q, want %q", got.Source, want.Source))
	}
	if len(diffs) == 0 {
		return nil
	}
	return errors.New(strings.Join(diffs, "; "))
}

// sameMessages checks that got are want in order, byte for byte, with
// IDs strictly increasing.
func sameMessages(got []gateway.QueuedMessage, want []gateway.Message) error {
	if len(got) != len(want) {
		return fmt.Errorf("read %d messages %s, want %d %s", len(got), describeQueued(got), len(want), describe(want))
	}
	for i := range got {
		if i > 0 && got[i].ID <= got[i-1].ID {
			return fmt.Errorf("message %d has ID %d after ID %d", i, got[i].ID, got[i-1].ID)
		}
		if err := sameMessage(got[i].Message, want[i]); err != nil {
			return fmt.Errorf("message %d (ID %d): %w", i, got[i].ID, err)
		}
	}
	return nil
}

func ids(ms []gateway.QueuedMessage) []uint64 {
	out := make([]uint64, len(ms))
	for i, m := range ms {
		out[i] = m.ID
	}
	return out
}

func short(b []byte) string {
	if len(b) > 16 {
		return fmt.Sprintf("%x…(%d bytes)", b[:16], len(b))
	}
	return fmt.Sprintf("%x", b)
}

func describe(msgs []gateway.Message) string {
	parts := make([]string, len(msgs))
	for i, m := range msgs {
		parts[i] = fmt.Sprintf("%s/%s(%dB)", m.Device, m.Topic, m.Size())
	}
	return "[" + strings.Join(parts, " ") + "]"
}

func describeQueued(msgs []gateway.QueuedMessage) string {
	parts := make([]string, len(msgs))
	for i, m := range msgs {
		parts[i] = fmt.Sprintf("%d:%s/%s(%dB)", m.ID, m.Device, m.Topic, m.Size())
	}
	return "[" + strings.Join(parts, " ") + "]"
}
