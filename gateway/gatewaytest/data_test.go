package gatewaytest_test

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/fleetgate/fleetgate/gateway"
	"github.com/fleetgate/fleetgate/gateway/gatewaytest"
)

// TestDataSink pins what the front ends' tests rely on: invalid messages
// refused and kept apart, a hold of one device or of all, a failure, the
// messages taken with their payloads copied.
func TestDataSink(t *testing.T) {
	ctx := context.Background()
	k := &gatewaytest.DataSink{}
	payload := []byte("21.5")
	if err := k.Publish(ctx, []gateway.Message{{Device: "dev-1", Topic: "t", Payload: payload}}); err != nil {
		t.Fatal(err)
	}
	payload[0] = 'x'
	bad := gateway.Message{Device: "dev-1", Topic: "a//b"}
	if err := k.Publish(ctx, []gateway.Message{bad}); !errors.Is(err, gateway.ErrInvalidMessage) {
		t.Fatalf("invalid topic: %v", err)
	}
	if got := k.TakeInvalid(); len(got) != 1 || got[0].Topic != "a//b" || len(k.TakeInvalid()) != 0 {
		t.Fatalf("invalid %+v", got)
	}
	if got := k.Take(); len(got) != 1 || string(got[0].Payload) != "21.5" || len(k.Messages()) != 0 {
		t.Fatalf("took %+v", got)
	}
	if m1, m2 := <-k.Began(), <-k.Began(); m1.Topic != "t" || m2.Topic != "a//b" {
		t.Fatalf("began with %+v, %+v", m1, m2)
	}

	release := k.Hold("dev-1")
	done := make(chan error, 1)
	go func() { done <- k.Publish(ctx, []gateway.Message{{Device: "dev-1", Topic: "held"}}) }()
	if err := k.Publish(ctx, []gateway.Message{{Device: "dev-2"}}); err != nil {
		t.Fatal(err)
	}
	<-k.Began()
	<-k.Began()
	select {
	case err := <-done:
		t.Fatalf("Publish of a held device returned %v", err)
	case <-time.After(50 * time.Millisecond):
	}
	release()
	release()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	k.Hold()
	short, cancel := context.WithTimeout(ctx, 10*time.Millisecond)
	defer cancel()
	if err := k.Publish(short, []gateway.Message{{Device: "dev-2"}}); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("held for every device: %v", err)
	}

	k = &gatewaytest.DataSink{}
	k.Fail(gateway.ErrQueueClosed)
	if err := k.Publish(ctx, []gateway.Message{{Device: "dev-1"}}); err != gateway.ErrQueueClosed {
		t.Fatalf("failing: %v", err)
	}
	k.Fail(nil)
	if err := k.Publish(ctx, []gateway.Message{{Device: "dev-1"}, {Device: "dev-1", QoS: 1}}); err != nil || len(k.Messages()) != 2 {
		t.Fatalf("after the failure: %v, %+v", err, k.Messages())
	}
	defer func() {
		if recover() == nil {
			t.Fatal("two devices' messages in one call taken")
		}
	}()
	_ = k.Publish(ctx, []gateway.Message{{Device: "dev-1"}, {Device: "dev-2"}})
}

// TestCommands pins the contract of gateway.Commands as the recorder
// keeps it, and what it records.
func TestCommands(t *testing.T) {
	ctx := context.Background()
	now := time.Unix(1_000_000, 0)
	c := &gatewaytest.Commands{TTL: time.Minute}
	for _, topic := range []string{"reboot", "cmdx", "cmd//x", ""} {
		if _, err := c.Submit(ctx, gateway.Message{Device: "dev-1", Topic: topic}); !errors.Is(err, gateway.ErrInvalidMessage) {
			t.Errorf("topic %q: %v", topic, err)
		}
	}
	wait1, wait2 := c.Wait("dev-1"), c.Wait("dev-2")
	a, err := c.Submit(ctx, gateway.Message{Device: "dev-1", Topic: "cmd", Received: now})
	if err != nil {
		t.Fatal(err)
	}
	select {
	case <-wait1:
	default:
		t.Fatal("dev-1's Wait not closed by its Submit")
	}
	select {
	case <-wait2:
		t.Fatal("dev-2's Wait closed by dev-1's Submit")
	default:
	}
	if n := c.Waiters(); n != 1 {
		t.Fatalf("%d waiters, want dev-2's", n)
	}
	b := c.Add(gateway.Message{Device: "dev-1", Topic: "cmd/b"}, time.Time{})
	other := c.Add(gateway.Message{Device: "dev-2", Topic: "cmd/x"}, now.Add(time.Second))
	<-wait2
	if a.ID == 0 || b.ID <= a.ID || other.ID <= b.ID || !a.Expires.Equal(now.Add(time.Minute)) || !b.Expires.IsZero() {
		t.Fatalf("commands %+v %+v %+v", a, b, other)
	}
	if got := c.Pending("dev-1", now, 5); len(got) != 2 || got[0].ID != a.ID || got[1].ID != b.ID {
		t.Fatalf("pending %+v", got)
	}
	if got := c.Pending("dev-1", now.Add(time.Minute), 5); len(got) != 1 || got[0].ID != b.ID {
		t.Fatalf("pending once a expired %+v", got)
	}
	if got := c.Pending("dev-1", now, 1); len(got) != 1 || got[0].ID != a.ID {
		t.Fatalf("pending, one %+v", got)
	}
	if err := c.Ack("dev-1", other.ID); err != nil {
		t.Fatal(err)
	}
	if err := c.Ack("dev-1", 999); err != nil {
		t.Fatal(err)
	}
	if err := c.Ack("dev-1", a.ID); err != nil {
		t.Fatal(err)
	}
	want := []gatewaytest.AckCall{{Device: "dev-1", ID: other.ID}, {Device: "dev-1", ID: 999}, {Device: "dev-1", ID: a.ID}}
	if !slices.Equal(c.Acks(), want) || len(c.Held("dev-1")) != 1 || len(c.Held("dev-2")) != 1 {
		t.Fatalf("acks %v, held %+v %+v", c.Acks(), c.Held("dev-1"), c.Held("dev-2"))
	}
	if got := c.Submitted(); len(got) != 1 || got[0].Topic != "cmd" {
		t.Fatalf("submitted %+v", got)
	}

	c.FailSubmit(gateway.ErrQueueClosed)
	c.FailAck(gateway.ErrQueueClosed)
	if _, err := c.Submit(ctx, gateway.Message{Device: "dev-1", Topic: "cmd"}); err != gateway.ErrQueueClosed {
		t.Fatalf("failing Submit: %v", err)
	}
	if err := c.Ack("dev-1", b.ID); err != gateway.ErrQueueClosed || len(c.Held("dev-1")) != 1 || len(c.Acks()) != 3 {
		t.Fatalf("failing Ack: %v", err)
	}

	c.Reset([]gateway.Command{{ID: 40, Message: gateway.Message{Device: "dev-3", Topic: "cmd"}}})
	if len(c.Acks()) != 0 || len(c.Submitted()) != 0 || len(c.Held("dev-1")) != 0 || len(c.Pending("dev-3", now, 5)) != 1 {
		t.Fatalf("after Reset: acks %v, submitted %v, held %+v", c.Acks(), c.Submitted(), c.Held("dev-1"))
	}
	if next := c.Add(gateway.Message{Device: "dev-3", Topic: "cmd"}, time.Time{}); next.ID <= 40 {
		t.Fatalf("ID %d after Reset with 40", next.ID)
	}
}
