package bridge

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/fleetgate/fleetgate/gateway"
	"github.com/fleetgate/fleetgate/queue/memq"
)

// A forwarder whose lanes do not move (the broker away) reads no more
// than windowBytes of big messages ahead (and one message), and reads on
// as the acker releases them, within that bound.
func TestForwarderBoundsBytesHeld(t *testing.T) {
	q, err := memq.New(memq.Options{MaxBytes: 1 << 30})
	if err != nil {
		t.Fatal(err)
	}
	defer q.Close()
	const size = 512 << 10
	for i := range 100 {
		m := gateway.Message{Device: gateway.DeviceID(string(rune('a' + i%26))), Payload: make([]byte, size), QoS: 1, Received: time.Now()}
		if _, err := q.Put(t.Context(), []gateway.Message{m}); err != nil {
			t.Fatal(err)
		}
	}
	f := newForwarder(&Bridge{log: slog.New(slog.DiscardHandler)}, "durable", q, 4, 1024)
	ctx, cancel := context.WithCancel(t.Context())
	readDone := make(chan struct{})
	go func() {
		defer close(readDone)
		f.read(ctx)
	}()
	acked := make(chan struct{})
	go func() {
		defer close(acked)
		f.runAcker()
	}()
	defer func() {
		cancel()
		<-readDone
		close(f.acks)
		<-acked
	}()
	held := func() int {
		n := 0
		for _, l := range f.lanes {
			l.mu.Lock()
			n += len(l.msgs)
			l.mu.Unlock()
		}
		return n
	}
	deadline := time.Now().Add(5 * time.Second)
	for f.held.Load() < windowBytes && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	time.Sleep(50 * time.Millisecond) // it would read on meanwhile
	if n, b := held(), f.held.Load(); n >= 100 || b < windowBytes || b > windowBytes+size+64+1 {
		t.Fatalf("holds %d messages, %d bytes; want %d and at most one message more", n, b, windowBytes)
	}
	deadline = time.Now().Add(5 * time.Second)
	// the lanes forward (the acker releases) what they hold, and the
	// reader goes on to the end of the queue, within the bound
	forwarded := 0
	for forwarded < 100 {
		if b := f.held.Load(); b > windowBytes+size+64+1 {
			t.Fatalf("holds %d bytes", b)
		}
		for _, l := range f.lanes {
			l.mu.Lock()
			empty := len(l.msgs) == 0
			l.mu.Unlock()
			if empty {
				continue
			}
			if m, ok := l.next(ctx); ok {
				f.acks <- done{m.ID, m.Size()}
				forwarded++
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of 100 forwarded after 5s", forwarded)
		}
		time.Sleep(time.Millisecond)
	}
}
