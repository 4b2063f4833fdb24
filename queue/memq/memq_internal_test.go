package memq

import (
	"context"
	"testing"
	"time"

	"github.com/fleetgate/fleetgate/gateway"
)

// The slice of slots stays proportional to what the queue holds: a
// reader that acknowledges every message but the oldest leaves gone
// slots in the middle, which tidy compacts; one that keeps up leaves
// none.
func TestSlotsBounded(t *testing.T) {
	q, err := New(Options{MaxBytes: 1 << 30})
	if err != nil {
		t.Fatal(err)
	}
	defer q.Close()
	ctx := context.Background()
	m := gateway.Message{Device: "dev-1", Payload: make([]byte, 10), Received: time.Now()}
	if _, err := q.Put(ctx, []gateway.Message{m}); err != nil {
		t.Fatal(err)
	}
	for i := range 10_000 {
		if _, err := q.Put(ctx, []gateway.Message{m}); err != nil {
			t.Fatal(err)
		}
		if err := q.Ack([]uint64{uint64(i + 2)}); err != nil {
			t.Fatal(err)
		}
		if held := len(q.items) - q.head; held > 2*q.live+64 {
			t.Fatalf("after %d acks: %d slots for %d messages", i+1, held, q.live)
		}
	}
	if s := q.Stats(); s.Messages != 1 || s.Bytes != int64(m.Size()) {
		t.Fatalf("Stats %+v, want the first message only", s)
	}
	if err := q.Ack([]uint64{1}); err != nil {
		t.Fatal(err)
	}
	for i := range 10_000 {
		if _, err := q.Put(ctx, []gateway.Message{m, m}); err != nil {
			t.Fatal(err)
		}
		got, err := q.Read(ctx, 0, 2)
		if err != nil || len(got) != 2 {
			t.Fatalf("Read: %d messages, %v", len(got), err)
		}
		if err := q.Ack([]uint64{got[0].ID, got[1].ID}); err != nil {
			t.Fatal(err)
		}
		if cap(q.items) > 4096 {
			t.Fatalf("after %d rounds: %d slots kept for an empty queue", i, cap(q.items))
		}
	}
}
