package queuetest

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fleetgate/fleetgate/gateway"
)

// Bounds of the cases: a queue that holds a few hundred small messages,
// and an age bound the cases cross by moving the clock.
const (
	caseMaxBytes = 64 << 10
	caseMaxAge   = 10 * time.Second
	// fixedSize is the Size of a message of sized with no payload.
	fixedSize = 64 + len("dev-1") + len("t/0000") + len("mqtt")
)

// Run runs the conformance cases against queues made by open.
func Run(t *testing.T, open Opener) {
	for _, c := range []struct {
		name string
		fn   func(*testing.T, Opener)
	}{
		{"PutReadInOrder", testPutReadInOrder},
		{"EveryFieldKept", testEveryFieldKept},
		{"PutCopiesItsMessages", testPutCopies},
		{"EmptyPut", testEmptyPut},
		{"PutWithDoneContextPutsNothing", testPutDoneContext},
		{"IDsIncreaseAcrossRestart", testIDsAcrossRestart},
		{"PutAllOrNothing", testPutAllOrNothing},
		{"TooLarge", testTooLarge},
		{"FullDropsOldest", testFullDropsOldest},
		{"BatchLargerThanTheQueue", testBatchLargerThanQueue},
		{"ExpiredDroppedAtRead", testExpiredAtRead},
		{"ExpiredAmongFresh", testExpiredAmongFresh},
		{"ExpiredDroppedAtPut", testExpiredAtPut},
		{"NoMaxAge", testNoMaxAge},
		{"ReadWaitsForPut", testReadWaitsForPut},
		{"ReadWaitsUntilContextEnds", testReadWaitsForContext},
		{"ReadWithDoneContextReturnsWhatIsThere", testReadDoneContext},
		{"ReadAfter", testReadAfter},
		{"ReadCountMustBePositive", testReadCount},
		{"ReadDoesNotRemove", testReadDoesNotRemove},
		{"AckRemoves", testAckRemoves},
		{"AckedNeverReadAfterRestart", testAckAcrossRestart},
		{"AckUnknownIgnored", testAckUnknown},
		{"Stats", testStats},
		{"CloseUnblocksRead", testCloseUnblocksRead},
		{"CallsAfterClose", testCallsAfterClose},
		{"ConcurrentPutsOneReader", testConcurrent},
	} {
		t.Run(c.name, func(t *testing.T) { c.fn(t, open) })
	}
}

// sized is message i (topic t/<i>) of exactly size bytes (Message.Size),
// received now.
func (e *env) sized(i, size int) gateway.Message {
	e.t.Helper()
	if size < fixedSize || i > 9999 {
		e.t.Fatalf("sized(%d, %d): want i ≤ 9999 and size ≥ %d", i, size, fixedSize)
	}
	p := make([]byte, size-fixedSize)
	for j := range p {
		p[j] = byte(i + j)
	}
	m := gateway.Message{Device: "dev-1", Topic: fmt.Sprintf("t/%04d", i), Payload: p, QoS: 1, Received: e.now(), Source: "mqtt"}
	if m.Size() != size {
		e.t.Fatalf("sized(%d, %d) has size %d", i, size, m.Size())
	}
	return m
}

// msgs are messages from..to-1 of 100 bytes each.
func (e *env) msgs(from, to int) []gateway.Message {
	var out []gateway.Message
	for i := from; i < to; i++ {
		out = append(out, e.sized(i, 100))
	}
	return out
}

func (e *env) expect(got []gateway.QueuedMessage, want []gateway.Message) {
	e.t.Helper()
	if err := sameMessages(got, want); err != nil {
		e.t.Fatal(err)
	}
}

// Put appends in order; Read returns the messages oldest first, byte for
// byte, with IDs strictly increasing: those Put returned for them.
func testPutReadInOrder(t *testing.T, open Opener) {
	e := newEnv(t, open, caseMaxBytes, 0)
	want := e.msgs(0, 10)
	put := e.put(want[:1]...)
	put = append(put, e.put(want[1:4]...)...)
	put = append(put, e.put(want[4:]...)...)
	got := e.read(0, 100)
	e.expect(got, want)
	e.expectIDs(got, put)
	got = e.readAll(0, 3)
	e.expect(got, want)
	e.expectIDs(got, put)
}

// Every field of a message comes back as it was put: payload bytes
// (empty, binary, large), topic (the root ""), content type, properties
// in order (repeated keys, empty values), QoS, Received at millisecond
// precision (also the zero time), Source.
func testEveryFieldKept(t *testing.T, open Opener) {
	e := newEnv(t, open, 4<<20, 0)
	big := make([]byte, 256<<10)
	for i := range big {
		big[i] = byte(i * 7)
	}
	want := []gateway.Message{
		{Device: "dev-1", Payload: []byte{0, 1, 2, 0xff}, QoS: 0, Received: e.now().Add(123456 * time.Nanosecond), Source: "coap"},
		{Device: "a.b_c-d", Topic: "telemetry/temp", Payload: []byte(`{"c":21.5}`), ContentType: "application/json",
			Properties: []gateway.Property{{Key: "k", Value: "v"}, {Key: "k", Value: ""}, {Key: "", Value: "x"}, {Key: "ü", Value: "√"}}, QoS: 1,
			Received: e.now().Add(-time.Hour - 999*time.Microsecond), Source: "mqtt"},
		{Device: "dev-2", Topic: "x/y/z", QoS: 1, Received: time.Time{}, Source: ""},
		{Device: "dev-3", Topic: "big", Payload: big, ContentType: "application/octet-stream", QoS: 1,
			Received: time.Date(1969, 12, 31, 23, 59, 59, 500e6, time.UTC), Source: "modbus-line-7"},
		{Device: "dev-4", Topic: "cmd/reboot", Payload: []byte("now"), Received: time.Date(2262, 1, 1, 0, 0, 0, 0, time.UTC), Source: "upstream"},
	}
	put := e.put(want...)
	got := e.read(0, 10)
	e.expect(got, want)
	e.expectIDs(got, put)
	if e.h.Durable {
		e.reopen()
		got = e.read(0, 10)
		e.expect(got, want)
		e.expectIDs(got, put)
	}
}

// Put keeps its own copy: changing a message's payload or properties
// after Put changes nothing in the queue.
func testPutCopies(t *testing.T, open Opener) {
	e := newEnv(t, open, caseMaxBytes, 0)
	m := e.sized(1, 120)
	m.Properties = []gateway.Property{{Key: "a", Value: "b"}}
	want := m
	want.Payload = slices.Clone(m.Payload)
	want.Properties = slices.Clone(m.Properties)
	e.put(m)
	m.Payload[0]++
	m.Properties[0].Value = "changed"
	e.expect(e.read(0, 1), []gateway.Message{want})
}

// Put of no message returns no ID, a nil error, and puts nothing.
func testEmptyPut(t *testing.T, open Opener) {
	e := newEnv(t, open, caseMaxBytes, 0)
	e.put()
	e.readNone(0)
	e.stats(nil, 0, 0)
}

// A Put whose context has ended before the call returns the context's
// error, no IDs, and puts nothing (one whose context ends while it waits
// for its commit may have put its messages: the contract allows both).
func testPutDoneContext(t *testing.T, open Opener) {
	e := newEnv(t, open, caseMaxBytes, 0)
	if got, err := e.q.Put(done(), e.msgs(0, 2)); !errors.Is(err, context.Canceled) || got != nil {
		t.Fatalf("Put with a done context = %v, %v; want nil, context.Canceled", got, err)
	}
	e.readNone(0)
	e.stats(nil, 0, 0)
}

// IDs keep increasing across a restart of a durable queue, also when
// the queue was emptied before it (the next ID is not derived from the
// messages held); a message keeps the ID Put returned for it across a
// restart.
func testIDsAcrossRestart(t *testing.T, open Opener) {
	e := newEnv(t, open, caseMaxBytes, 0)
	if !e.h.Durable {
		t.Skip("not durable")
	}
	first := e.msgs(0, 3)
	put := e.put(first...)
	got := e.read(0, 10)
	e.expect(got, first)
	e.expectIDs(got, put)
	e.reopen()
	got = e.read(0, 10)
	e.expect(got, first)
	e.expectIDs(got, put)
	e.ack(put...)
	e.reopen()
	e.readNone(0)
	second := e.msgs(3, 5)
	put2 := e.put(second...)
	if put2[0] <= put[len(put)-1] {
		t.Fatalf("after a restart of an emptied queue Put returned ID %d first, the last before was %d", put2[0], put[len(put)-1])
	}
	again := e.read(0, 10)
	e.expect(again, second)
	e.expectIDs(again, put2)
}

// A Put that fails puts none of its messages.
func testPutAllOrNothing(t *testing.T, open Opener) {
	e := newEnv(t, open, 1000, 0)
	held := e.msgs(0, 2)
	e.put(held...)
	got, err := e.q.Put(e.ctx, []gateway.Message{e.sized(2, 100), e.sized(3, 1001), e.sized(4, 100)})
	if !errors.Is(err, gateway.ErrTooLarge) || got != nil {
		t.Fatalf("Put with a message larger than the queue = %v, %v; want nil, ErrTooLarge", got, err)
	}
	e.expect(e.read(0, 10), held)
	e.stats(held, 0, 0)
}

// A message larger than the whole queue fails with ErrTooLarge; one of
// exactly the queue's size is taken (and makes room by dropping
// everything else).
func testTooLarge(t *testing.T, open Opener) {
	e := newEnv(t, open, 1000, 0)
	if got, err := e.q.Put(e.ctx, []gateway.Message{e.sized(0, 1001)}); !errors.Is(err, gateway.ErrTooLarge) || got != nil {
		t.Fatalf("Put of 1001 bytes into 1000 = %v, %v; want nil, ErrTooLarge", got, err)
	}
	e.readNone(0)
	held := e.msgs(1, 4)
	e.put(held...)
	whole := e.sized(4, 1000)
	put := e.put(whole)
	got := e.read(0, 10)
	e.expect(got, []gateway.Message{whole})
	e.expectIDs(got, put)
	e.stats([]gateway.Message{whole}, 3, 0)
}

// A full queue makes room by dropping its oldest messages, as many as
// the new ones need, counted as DropFull; never by waiting for the
// reader. Stats counts what is held.
func testFullDropsOldest(t *testing.T, open Opener) {
	e := newEnv(t, open, 500, 0)
	all := e.msgs(0, 8)
	var put []uint64
	for _, m := range all {
		put = append(put, e.put(m)...)
	}
	got := e.read(0, 10)
	e.expect(got, all[3:])
	e.expectIDs(got, put[3:])
	e.stats(all[3:], 3, 0)
	// One message of 300 bytes needs the room of three.
	big := e.sized(8, 300)
	e.put(big)
	held := append(slices.Clone(all[6:]), big)
	e.expect(e.read(0, 10), held)
	e.stats(held, 6, 0)
	// Messages read and not acknowledged are dropped all the same.
	e.put(e.sized(9, 200))
	held = []gateway.Message{big, e.sized(9, 200)}
	e.expect(e.read(0, 10), held)
	e.stats(held, 8, 0)
}

// A batch larger than the queue (each of its messages fitting) keeps
// its newest messages: it is as if they had been put one by one, and
// its oldest are dropped as DropFull. Put returns 0 for the IDs of those
// it dropped (never there to read: the first of the batch), and for the
// others the IDs Read returns; a message dropped by a later Put keeps
// the ID its own Put returned.
func testBatchLargerThanQueue(t *testing.T, open Opener) {
	e := newEnv(t, open, 500, 0)
	first := e.put(e.sized(0, 100))
	batch := e.msgs(1, 8)
	put := e.putDropping(2, batch...)
	got := e.read(0, 10)
	e.expect(got, batch[2:])
	e.expectIDs(got, put[2:])
	e.stats(batch[2:], 3, 0)
	if first[0] == 0 || first[0] >= put[2] {
		t.Fatalf("the first Put's ID %d, the batch's after it %v", first[0], put)
	}
	// Each message as large as the queue: only the last is kept, and
	// everything held before makes room.
	whole := []gateway.Message{e.sized(8, 500), e.sized(9, 500), e.sized(10, 500)}
	put = e.putDropping(2, whole...)
	got = e.read(0, 10)
	e.expect(got, whole[2:])
	e.expectIDs(got, put[2:])
	e.stats(whole[2:], 3+5+2, 0)
	// The IDs of the dropped are nothing to acknowledge (0 is ignored).
	e.ack(put...)
	e.readNone(0)
	e.stats(nil, 10, 0)
}

// A message older than max age when read is dropped (DropExpired), not
// returned: age is now minus Received, and a message exactly max age
// old is not older than it.
func testExpiredAtRead(t *testing.T, open Opener) {
	e := newEnv(t, open, caseMaxBytes, caseMaxAge)
	m := e.sized(0, 100)
	e.put(m)
	e.clock.Advance(caseMaxAge)
	e.expect(e.read(0, 10), []gateway.Message{m})
	e.clock.Advance(time.Millisecond)
	e.readNone(0)
	e.stats(nil, 0, 1)
}

// Expiry goes by each message's Received, not by its place: an old
// message between fresh ones is dropped, the fresh ones read.
func testExpiredAmongFresh(t *testing.T, open Opener) {
	e := newEnv(t, open, caseMaxBytes, caseMaxAge)
	a, b, c := e.sized(0, 100), e.sized(1, 100), e.sized(2, 100)
	b.Received = e.now().Add(-caseMaxAge - time.Millisecond)
	e.put(a, b, c)
	e.stats([]gateway.Message{a, b, c}, 0, 0)
	e.expect(e.read(0, 10), []gateway.Message{a, c})
	e.stats([]gateway.Message{a, c}, 0, 1)
}

// A queue nobody reads still keeps to its max age: Put drops the
// expired messages at the head of the queue (DropExpired) before it
// appends.
func testExpiredAtPut(t *testing.T, open Opener) {
	e := newEnv(t, open, caseMaxBytes, caseMaxAge)
	old := e.msgs(0, 3)
	e.put(old...)
	e.clock.Advance(caseMaxAge / 2)
	mid := e.sized(3, 100)
	e.put(mid)
	e.clock.Advance(caseMaxAge/2 + time.Millisecond)
	last := e.sized(4, 100)
	e.put(last)
	e.stats([]gateway.Message{mid, last}, 0, 3)
	e.expect(e.read(0, 10), []gateway.Message{mid, last})
}

// Without a max age nothing expires.
func testNoMaxAge(t *testing.T, open Opener) {
	e := newEnv(t, open, caseMaxBytes, 0)
	m := e.sized(0, 100)
	e.put(m)
	e.clock.Advance(100 * 365 * 24 * time.Hour)
	e.put(e.sized(1, 100))
	e.expect(e.read(0, 10), []gateway.Message{m, e.sized(1, 100)})
	e.stats([]gateway.Message{m, e.sized(1, 100)}, 0, 0)
}

// blockedRead starts Read(ctx, after, n) in a goroutine and checks that
// it is still waiting a while later.
func blockedRead(t *testing.T, ctx context.Context, q gateway.Queue, after uint64) <-chan readResult {
	t.Helper()
	res := make(chan readResult, 1)
	go func() {
		got, err := q.Read(ctx, after, 10)
		res <- readResult{got, err}
	}()
	select {
	case r := <-res:
		t.Fatalf("Read(after %d) returned %s, %v without waiting", after, describeQueued(r.msgs), r.err)
	case <-time.After(50 * time.Millisecond):
	}
	return res
}

type readResult struct {
	msgs []gateway.QueuedMessage
	err  error
}

func await(t *testing.T, res <-chan readResult) readResult {
	t.Helper()
	select {
	case r := <-res:
		return r
	case <-time.After(10 * time.Second):
		t.Fatal("Read still waiting after 10 s")
		return readResult{}
	}
}

// Read waits until there is a message after after, also when the queue
// holds older ones, and returns it once put.
func testReadWaitsForPut(t *testing.T, open Opener) {
	e := newEnv(t, open, caseMaxBytes, 0)
	res := blockedRead(t, e.ctx, e.q, 0)
	m := e.sized(0, 100)
	put := e.put(m)
	r := await(t, res)
	if r.err != nil {
		t.Fatalf("waiting Read: %v", r.err)
	}
	e.expect(r.msgs, []gateway.Message{m})
	e.expectIDs(r.msgs, put)
	res = blockedRead(t, e.ctx, e.q, put[0])
	m2 := e.sized(1, 100)
	put = e.put(m2)
	r = await(t, res)
	if r.err != nil {
		t.Fatalf("waiting Read after the first: %v", r.err)
	}
	e.expect(r.msgs, []gateway.Message{m2})
	e.expectIDs(r.msgs, put)
}

// Read of an empty queue waits until its context ends and returns the
// context's error; expired messages do not end the wait.
func testReadWaitsForContext(t *testing.T, open Opener) {
	e := newEnv(t, open, caseMaxBytes, caseMaxAge)
	ctx, cancel := context.WithTimeout(e.ctx, 100*time.Millisecond)
	defer cancel()
	got, err := e.q.Read(ctx, 0, 10)
	if !errors.Is(err, context.DeadlineExceeded) || len(got) != 0 {
		t.Fatalf("Read of an empty queue = %s, %v; want context.DeadlineExceeded", describeQueued(got), err)
	}
	e.put(e.sized(0, 100))
	e.clock.Advance(caseMaxAge + time.Millisecond)
	ctx, cancel2 := context.WithCancel(e.ctx)
	res := blockedRead(t, ctx, e.q, 0)
	cancel2()
	if r := await(t, res); !errors.Is(r.err, context.Canceled) || len(r.msgs) != 0 {
		t.Fatalf("Read of an expired message = %s, %v; want context.Canceled", describeQueued(r.msgs), r.err)
	}
	e.stats(nil, 0, 1)
}

// Read with a context that has ended returns the messages there are
// without waiting (the context only bounds the wait): the bridge may
// poll.
func testReadDoneContext(t *testing.T, open Opener) {
	e := newEnv(t, open, caseMaxBytes, 0)
	want := e.msgs(0, 2)
	e.put(want...)
	got, err := e.q.Read(done(), 0, 10)
	if err != nil {
		t.Fatalf("Read with a done context of a queue with messages: %v", err)
	}
	e.expect(got, want)
}

// Read returns up to n messages with IDs above after: after 0 from the
// oldest, after an ID from the next one, also when after's message is
// gone (acknowledged or dropped).
func testReadAfter(t *testing.T, open Opener) {
	e := newEnv(t, open, caseMaxBytes, 0)
	all := e.msgs(0, 6)
	e.put(all...)
	got := e.read(0, 2)
	e.expect(got, all[:2])
	rest := e.read(got[1].ID, 10)
	e.expect(rest, all[2:])
	e.expect(e.read(rest[0].ID, 2), all[3:5])
	e.ack(rest[0].ID, rest[1].ID)
	e.expect(e.read(rest[0].ID, 10), all[4:])
	e.expect(e.read(rest[1].ID-1, 10), all[4:])
	e.readNone(rest[len(rest)-1].ID)
	e.readNone(rest[len(rest)-1].ID + 1000)
	e.expect(e.read(0, 1), all[:1])
}

// Read refuses n < 1 at once, whatever its context.
func testReadCount(t *testing.T, open Opener) {
	e := newEnv(t, open, caseMaxBytes, 0)
	e.put(e.sized(0, 100))
	for _, n := range []int{0, -1} {
		got, err := e.q.Read(e.ctx, 0, n)
		if err == nil || errors.Is(err, gateway.ErrQueueClosed) || len(got) != 0 {
			t.Fatalf("Read(n=%d) = %s, %v; want an error", n, describeQueued(got), err)
		}
	}
}

// Reading removes nothing: the same messages are read again until they
// are acknowledged.
func testReadDoesNotRemove(t *testing.T, open Opener) {
	e := newEnv(t, open, caseMaxBytes, 0)
	want := e.msgs(0, 3)
	e.put(want...)
	first := e.read(0, 10)
	second := e.read(0, 10)
	e.expect(second, want)
	if !slices.Equal(ids(first), ids(second)) {
		t.Fatalf("IDs read %v, then %v", ids(first), ids(second))
	}
	e.stats(want, 0, 0)
}

// Ack removes the messages with those IDs (as Put returned them, read
// or not), in any order, leaving the others; they are never read again.
func testAckRemoves(t *testing.T, open Opener) {
	e := newEnv(t, open, caseMaxBytes, 0)
	all := e.msgs(0, 6)
	put := e.put(all...)
	e.ack(put[4], put[1])
	want := []gateway.Message{all[0], all[2], all[3], all[5]}
	got := e.read(0, 10)
	e.expect(got, want)
	e.expectIDs(got, []uint64{put[0], put[2], put[3], put[5]})
	e.stats(want, 0, 0)
	e.ack(put[0])
	e.expect(e.read(0, 10), want[1:])
	e.stats(want[1:], 0, 0)
	e.ack(put[2], put[3], put[5])
	e.readNone(0)
	e.stats(nil, 0, 0)
}

// A message acknowledged is never read again after a restart; one not
// acknowledged is.
func testAckAcrossRestart(t *testing.T, open Opener) {
	e := newEnv(t, open, caseMaxBytes, 0)
	if !e.h.Durable {
		t.Skip("not durable")
	}
	all := e.msgs(0, 5)
	e.put(all...)
	got := e.read(0, 10)
	e.ack(got[0].ID, got[3].ID)
	e.reopen()
	want := []gateway.Message{all[1], all[2], all[4]}
	again := e.read(0, 10)
	e.expect(again, want)
	if !slices.Equal(ids(again), []uint64{got[1].ID, got[2].ID, got[4].ID}) {
		t.Fatalf("IDs after a restart %v, before %v", ids(again), ids(got))
	}
	e.stats(want, 0, 0)
}

// IDs not in the queue are ignored: 0, acknowledged already, dropped,
// repeated in one call, not handed out yet (an Ack is not remembered
// for an ID handed out later).
func testAckUnknown(t *testing.T, open Opener) {
	e := newEnv(t, open, 300, 0)
	all := e.msgs(0, 3)
	e.put(all...)
	got := e.read(0, 10)
	e.ack(got[0].ID)
	e.put(e.msgs(3, 5)...) // drops all[1]
	e.ack()
	unknown := []uint64{got[0].ID, got[0].ID, 0, got[1].ID, 1 << 63}
	for id := got[2].ID + 3; id < got[2].ID+40; id++ {
		unknown = append(unknown, id)
	}
	e.ack(unknown...)
	want := append([]gateway.Message{all[2]}, e.msgs(3, 5)...)
	e.expect(e.read(0, 10), want)
	e.stats(want, 1, 0)
	later := e.msgs(5, 21)
	put := e.putDropping(len(later)-3, later...)
	got = e.readAll(0, 100)
	e.expect(got, later[len(later)-3:])
	e.expectIDs(got, put[len(later)-3:])
}

// Stats reports the messages and bytes held (Message.Size), the oldest
// message's Received, and the drops since the queue was opened.
func testStats(t *testing.T, open Opener) {
	e := newEnv(t, open, 1000, caseMaxAge)
	e.stats(nil, 0, 0)
	a := e.sized(0, 200)
	a.Received = e.now().Add(-time.Second)
	b := e.sized(1, 300)
	e.put(a, b)
	e.stats([]gateway.Message{a, b}, 0, 0)
	c := e.sized(2, 600)
	e.put(c)
	e.stats([]gateway.Message{b, c}, 1, 0)
	got := e.read(0, 10)
	e.ack(got[1].ID)
	e.stats([]gateway.Message{b}, 1, 0)
	e.clock.Advance(caseMaxAge + time.Millisecond)
	e.readNone(0)
	e.stats(nil, 1, 1)
	if e.h.Durable {
		// Drops count since the queue was opened.
		d := e.sized(3, 100)
		e.put(d)
		e.reopen()
		e.stats([]gateway.Message{d}, 0, 0)
	}
}

// Close ends a waiting Read with ErrQueueClosed.
func testCloseUnblocksRead(t *testing.T, open Opener) {
	e := newEnv(t, open, caseMaxBytes, 0)
	res := blockedRead(t, e.ctx, e.q, 0)
	if err := e.q.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	e.closed = true
	if r := await(t, res); !errors.Is(r.err, gateway.ErrQueueClosed) || len(r.msgs) != 0 {
		t.Fatalf("Read waiting at Close = %s, %v; want ErrQueueClosed", describeQueued(r.msgs), r.err)
	}
}

// After Close, Put, Read and Ack fail with ErrQueueClosed (Read also
// with a message there), and Close again returns nil.
func testCallsAfterClose(t *testing.T, open Opener) {
	e := newEnv(t, open, caseMaxBytes, 0)
	e.put(e.sized(0, 100))
	got := e.read(0, 1)
	if err := e.q.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	e.closed = true
	if ids, err := e.q.Put(e.ctx, e.msgs(1, 2)); !errors.Is(err, gateway.ErrQueueClosed) || ids != nil {
		t.Errorf("Put after Close = %v, %v; want nil, ErrQueueClosed", ids, err)
	}
	if got, err := e.q.Read(e.ctx, 0, 1); !errors.Is(err, gateway.ErrQueueClosed) || len(got) != 0 {
		t.Errorf("Read after Close = %s, %v, want ErrQueueClosed", describeQueued(got), err)
	}
	if err := e.q.Ack(ids(got)); !errors.Is(err, gateway.ErrQueueClosed) {
		t.Errorf("Ack after Close = %v, want ErrQueueClosed", err)
	}
	if err := e.q.Close(); err != nil {
		t.Errorf("second Close = %v, want nil", err)
	}
	if e.h.Durable {
		// Nothing of the failed calls reached the file.
		e.open()
		e.expect(e.read(0, 10), []gateway.Message{e.sized(0, 100)})
	}
}

// Shape of the concurrency case: putters × puts × messages per put.
const (
	concPutters = 8
	concPuts    = 40
	concBatch   = 3
)

// Many goroutines put while one reads and acknowledges: every message
// is read exactly once, in ID order, each putter's in the order it put
// them, with the ID its Put returned (Puts sharing a commit get
// distinct IDs), and the queue ends empty. Run it with -race.
func testConcurrent(t *testing.T, open Opener) {
	e := newEnv(t, open, 16<<20, 0)
	var wg sync.WaitGroup
	errs := make(chan error, concPutters)
	// putIDs[p] are the IDs putter p's Puts returned, readIDs[p] those
	// its messages were read with.
	var putIDs, readIDs [concPutters][]uint64
	for p := range concPutters {
		wg.Go(func() {
			for i := range concPuts {
				batch := make([]gateway.Message, concBatch)
				for j := range batch {
					batch[j] = gateway.Message{Device: gateway.DeviceID(fmt.Sprintf("dev-%d", p)), Topic: fmt.Sprintf("seq/%d", i*concBatch+j),
						Payload: []byte(strings.Repeat("x", 10+j)), QoS: 1, Received: e.now(), Source: "mqtt"}
				}
				got, err := e.q.Put(e.ctx, batch)
				if err != nil {
					errs <- fmt.Errorf("putter %d, put %d: %w", p, i, err)
					return
				}
				if len(got) != len(batch) {
					errs <- fmt.Errorf("putter %d, put %d: %d IDs for %d messages", p, i, len(got), len(batch))
					return
				}
				putIDs[p] = append(putIDs[p], got...)
			}
		})
	}
	total := concPutters * concPuts * concBatch
	next := make([]int, concPutters)
	var after uint64
	ctx, cancel := context.WithTimeout(e.ctx, time.Minute)
	defer cancel()
	for read := 0; read < total; {
		got, err := e.q.Read(ctx, after, 1+read%50)
		if err != nil {
			t.Fatalf("Read after %d messages: %v", read, err)
		}
		for _, m := range got {
			if m.ID <= after {
				t.Fatalf("ID %d read after %d", m.ID, after)
			}
			after = m.ID
			var p, seq int
			if _, err := fmt.Sscanf(string(m.Device)+" "+m.Topic, "dev-%d seq/%d", &p, &seq); err != nil || p < 0 || p >= concPutters {
				t.Fatalf("read a message not put: %s/%s", m.Device, m.Topic)
			}
			if seq != next[p] {
				t.Fatalf("putter %d: read its message %d, want %d", p, seq, next[p])
			}
			next[p]++
			readIDs[p] = append(readIDs[p], m.ID)
		}
		read += len(got)
		if err := e.q.Ack(ids(got)); err != nil {
			t.Fatalf("Ack: %v", err)
		}
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	for p := range concPutters {
		if !slices.Equal(putIDs[p], readIDs[p]) {
			t.Errorf("putter %d: Put returned IDs %v, its messages were read with %v", p, putIDs[p], readIDs[p])
		}
	}
	e.readNone(0)
	e.stats(nil, 0, 0)
}
