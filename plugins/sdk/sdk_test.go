package sdk_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "github.com/fleetgate/fleetgate/plugins/proto"
	"github.com/fleetgate/fleetgate/plugins/sdk"
	"github.com/fleetgate/fleetgate/plugins/sdk/sdktest"
)

// burst sends n renewals at once, says so on sent, then waits.
type burst struct {
	n    int
	sent chan struct{}
	fail error // returned by Run after the burst when set
}

func (b *burst) Configure(_ context.Context, raw []byte) error {
	if string(raw) != "{}" {
		return errors.New("want no settings")
	}
	return nil
}

func (b *burst) Run(ctx context.Context, sink sdk.Sink) error {
	for i := range b.n {
		if err := sink.Send(ctx, sdk.Evidence{Kind: sdk.Renew, Device: fmt.Sprintf("d-%d", i), At: time.Now().Add(-time.Second)}); err != nil {
			return nil
		}
	}
	sink.Ready()
	close(b.sent)
	if b.fail != nil {
		return b.fail
	}
	<-ctx.Done()
	return nil
}

func open(t *testing.T, b *burst) (*sdktest.Harness, *sdktest.Stream) {
	t.Helper()
	h := sdktest.Start(t, sdk.Info{Name: "burst", Version: "1"}, b)
	st, err := h.Open(t.Context(), nil)
	if err != nil {
		t.Fatal(err)
	}
	return h, st
}

// TestManyItemsInOrder sends 2,500 renewals at once: they arrive in
// order, with their age.
func TestManyItemsInOrder(t *testing.T) {
	b := &burst{n: 2500, sent: make(chan struct{})}
	_, st := open(t, b)
	for i := range b.n {
		ev, err := st.Next()
		if err != nil {
			t.Fatal(err)
		}
		if ev.GetDevice() != fmt.Sprintf("d-%d", i) || ev.GetAgeUs() < 1_000_000 {
			t.Fatalf("item %d = %v, want d-%d aged at least 1 s", i, ev, i)
		}
	}
}

// TestShutdownFlushesPending: evidence queued before Shutdown is sent
// before the stream ends.
func TestShutdownFlushesPending(t *testing.T) {
	b := &burst{n: 10, sent: make(chan struct{})}
	h, st := open(t, b)
	<-b.sent
	if _, err := h.Client.Shutdown(t.Context(), &pb.ShutdownRequest{}); err != nil {
		t.Fatal(err)
	}
	for i := range b.n {
		if _, err := st.Next(); err != nil {
			t.Fatalf("item %d after Shutdown: %v", i, err)
		}
	}
	if err := st.End(); err != nil {
		t.Fatalf("end: %v", err)
	}
}

// TestRunErrorEndsStreamAndHealth: Run failing ends the stream with an
// error and Health answers Unavailable.
func TestRunErrorEndsStreamAndHealth(t *testing.T) {
	b := &burst{n: 1, sent: make(chan struct{}), fail: errors.New("serial port gone")}
	h, st := open(t, b)
	if _, err := st.Next(); err != nil {
		t.Fatal(err)
	}
	if err := st.End(); status.Code(err) != codes.Aborted {
		t.Fatalf("stream end = %v, want Aborted", err)
	}
	if _, err := h.Client.Health(t.Context(), &pb.HealthRequest{}); status.Code(err) != codes.Unavailable {
		t.Fatalf("Health = %v, want Unavailable", err)
	}
}

func TestConfigureErrorIsInvalidArgument(t *testing.T) {
	h := sdktest.Start(t, sdk.Info{Name: "burst", Version: "1"}, &burst{})
	_, err := h.Client.Configure(t.Context(), &pb.ConfigureRequest{Config: []byte(`{"x":1}`)})
	if status.Code(err) != codes.InvalidArgument {
		t.Fatalf("Configure = %v, want InvalidArgument", err)
	}
}
