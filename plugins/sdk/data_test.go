package sdk_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/fleetgate/fleetgate/gateway"
	pb "github.com/fleetgate/fleetgate/plugins/proto"
	"github.com/fleetgate/fleetgate/plugins/sdk"
	"github.com/fleetgate/fleetgate/plugins/sdk/sdktest"
)

// talker sends the data it is given on in and reports each Data call's
// result on out; as a Commander it takes commands unless refuse is set.
type talker struct {
	in     chan sdk.Data
	out    chan error
	cmds   chan sdk.Command
	refuse atomic.Bool
}

func newTalker() *talker {
	return &talker{in: make(chan sdk.Data), out: make(chan error, 16), cmds: make(chan sdk.Command, 16)}
}

func (a *talker) Configure(context.Context, []byte) error { return nil }

func (a *talker) Run(ctx context.Context, sink sdk.Sink) error {
	sink.Ready()
	for {
		select {
		case <-ctx.Done():
			return nil
		case d := <-a.in:
			go func() { a.out <- sink.Data(ctx, d) }()
		}
	}
}

func (a *talker) Command(_ context.Context, c sdk.Command) error {
	if a.refuse.Load() {
		return fmt.Errorf("device %s unreachable", c.Device)
	}
	a.cmds <- c
	return nil
}

// result waits for the next Data result.
func (a *talker) result(t *testing.T) error {
	t.Helper()
	select {
	case err := <-a.out:
		return err
	case <-time.After(5 * time.Second):
		t.Fatal("Data did not return")
	}
	return nil
}

// noResult checks that no Data call has returned for a while.
func (a *talker) noResult(t *testing.T) {
	t.Helper()
	select {
	case err := <-a.out:
		t.Fatalf("Data returned %v before the settlement", err)
	case <-time.After(200 * time.Millisecond):
	}
}

// TestQoS1DataWaitsForItsSettlement: a QoS 1 Data call returns only once
// the host settled its item, with the error its outcome maps to; ids are
// unique; a QoS 0 item has id 0 and its call returns at once.
func TestQoS1DataWaitsForItsSettlement(t *testing.T) {
	a := newTalker()
	h := sdktest.Start(t, sdk.Info{Name: "talker", Version: "1"}, a)
	st, err := h.Open(t.Context(), nil)
	if err != nil {
		t.Fatal(err)
	}
	ids := map[uint64]bool{}
	for _, tc := range []struct {
		outcome pb.Outcome
		want    error
	}{
		{pb.Outcome_OUTCOME_DURABLE, nil},
		{pb.Outcome_OUTCOME_REJECTED, sdk.ErrRejected},
		{pb.Outcome_OUTCOME_REFUSED, sdk.ErrRejected},
		{pb.Outcome_OUTCOME_DROPPED, sdk.ErrUnavailable},
		{pb.Outcome_OUTCOME_FAILED, sdk.ErrUnavailable},
		{pb.Outcome_OUTCOME_DISCARDED, sdk.ErrNoDataPath},
		{pb.Outcome(42), sdk.ErrUnavailable}, // an outcome of a newer host
	} {
		a.in <- sdk.Data{Device: "d-1", Instance: "i", Topic: "t/1", Payload: []byte("p"), QoS: 1,
			Properties: []sdk.Property{{Key: "k", Value: "v"}}}
		ev, err := st.Next()
		if err != nil {
			t.Fatal(err)
		}
		d := ev.GetData()
		if ev.GetKind() != pb.Kind_KIND_RENEW || ev.GetDevice() != "d-1" || ev.GetInstance() != "i" || d.GetTopic() != "t/1" ||
			string(d.GetPayload()) != "p" || d.GetQos() != 1 || len(d.GetProperties()) != 1 || d.GetProperties()[0].GetKey() != "k" {
			t.Fatalf("item %v", ev)
		}
		if d.GetId() == 0 || ids[d.GetId()] {
			t.Fatalf("id %d: want a new id > 0", d.GetId())
		}
		ids[d.GetId()] = true
		a.noResult(t)
		if err := h.Settle(t.Context(), d.GetId(), tc.outcome, "because"); err != nil {
			t.Fatal(err)
		}
		got := a.result(t)
		if (tc.want == nil) != (got == nil) || (tc.want != nil && (!errors.Is(got, tc.want) || !strings.Contains(got.Error(), "because"))) {
			t.Fatalf("settled %v: Data = %v, want %v with the reason", tc.outcome, got, tc.want)
		}
	}
	// A settlement of an id nobody waits for is ignored.
	if err := h.Settle(t.Context(), 999, pb.Outcome_OUTCOME_DURABLE, ""); err != nil {
		t.Fatal(err)
	}
	a.in <- sdk.Data{Device: "d-2", Payload: []byte("fire and forget")}
	if err := a.result(t); err != nil {
		t.Fatalf("QoS 0 Data = %v", err)
	}
	ev, err := st.Next()
	if err != nil || ev.GetData().GetId() != 0 || string(ev.GetData().GetPayload()) != "fire and forget" {
		t.Fatalf("QoS 0 item %v, %v: want id 0", ev, err)
	}
}

// TestDataEndsWithTheStream: a QoS 1 Data call waiting for its
// settlement returns ErrUnavailable when the stream ends.
func TestDataEndsWithTheStream(t *testing.T) {
	a := newTalker()
	h := sdktest.Start(t, sdk.Info{Name: "talker", Version: "1"}, a)
	ctx, cancel := context.WithCancel(t.Context())
	st, err := h.Open(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	a.in <- sdk.Data{Device: "d-1", QoS: 1}
	if _, err := st.Next(); err != nil {
		t.Fatal(err)
	}
	cancel()
	if err := a.result(t); !errors.Is(err, sdk.ErrUnavailable) {
		t.Fatalf("Data after the stream ended = %v, want ErrUnavailable", err)
	}
}

// TestDataToAHostWithoutData: a host that did not say data (one older
// than the data path) gets the evidence alone, and Data says so at once.
func TestDataToAHostWithoutData(t *testing.T) {
	a := newTalker()
	h := sdktest.Start(t, sdk.Info{Name: "talker", Version: "1"}, a)
	st, err := h.OpenWith(t.Context(), &pb.ConfigureRequest{})
	if err != nil {
		t.Fatal(err)
	}
	a.in <- sdk.Data{Device: "d-1", Instance: "i", Payload: []byte("x"), QoS: 1}
	if err := a.result(t); !errors.Is(err, sdk.ErrNoDataPath) {
		t.Fatalf("Data = %v, want ErrNoDataPath", err)
	}
	ev, err := st.Next()
	if err != nil || ev.GetData() != nil || ev.GetKind() != pb.Kind_KIND_RENEW || ev.GetDevice() != "d-1" || ev.GetInstance() != "i" {
		t.Fatalf("item %v, %v: want a renewal without data", ev, err)
	}
}

// TestInvalidDataRefusedBeforeSending: QoS above 1 and items beyond
// MaxDataBytes are refused without a frame.
func TestInvalidDataRefusedBeforeSending(t *testing.T) {
	a := newTalker()
	h := sdktest.Start(t, sdk.Info{Name: "talker", Version: "1"}, a)
	st, err := h.Open(t.Context(), nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range []sdk.Data{
		{Device: "d-1", QoS: 2},
		{Device: "d-1", Payload: make([]byte, sdk.MaxDataBytes)},
	} {
		a.in <- d
		if err := a.result(t); !errors.Is(err, sdk.ErrRejected) {
			t.Fatalf("Data(qos %d, %d bytes) = %v, want ErrRejected", d.QoS, len(d.Payload), err)
		}
	}
	a.in <- sdk.Data{Device: "d-ok"}
	if ev, err := st.Next(); err != nil || ev.GetDevice() != "d-ok" {
		t.Fatalf("first item %v, %v: want d-ok (nothing of the refused ones)", ev, err)
	}
}

// The SDK's bound is the gateway's.
func TestMaxDataBytesIsTheGateways(t *testing.T) {
	if sdk.MaxDataBytes != gateway.MaxMessageBytes {
		t.Fatalf("sdk.MaxDataBytes %d, gateway.MaxMessageBytes %d", sdk.MaxDataBytes, gateway.MaxMessageBytes)
	}
}

// TestDeliver: Info says commands for a Commander; a command is handed
// to it only while the stream is ready; its error refuses the command
// with the error as the reason. An adapter without Commander answers
// Unimplemented.
func TestDeliver(t *testing.T) {
	a := newTalker()
	h := sdktest.Start(t, sdk.Info{Name: "talker", Version: "1"}, a)
	info, err := h.Client.Info(t.Context(), &pb.InfoRequest{})
	if err != nil || !info.GetCommands() {
		t.Fatalf("Info = %v, %v; want commands", info, err)
	}
	cmd := &pb.Command{Id: 7, Device: "d-1", Topic: "cmd/reboot", Payload: []byte("now"), ContentType: "text/plain",
		Properties: []*pb.Property{{Key: "k", Value: "v"}}, ExpiresUnixMs: 1_700_000_000_123}
	if _, err := h.Client.Deliver(t.Context(), cmd); status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("Deliver before the stream = %v, want FailedPrecondition", err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	if _, err := h.Open(ctx, nil); err != nil {
		t.Fatal(err)
	}
	res, err := h.Client.Deliver(t.Context(), cmd)
	if err != nil || !res.GetAccepted() {
		t.Fatalf("Deliver = %v, %v; want accepted", res, err)
	}
	got := <-a.cmds
	if got.ID != 7 || got.Device != "d-1" || got.Topic != "cmd/reboot" || string(got.Payload) != "now" || got.ContentType != "text/plain" ||
		len(got.Properties) != 1 || got.Properties[0] != (sdk.Property{Key: "k", Value: "v"}) || !got.Expires.Equal(time.UnixMilli(1_700_000_000_123)) {
		t.Fatalf("the adapter got %+v", got)
	}
	a.refuse.Store(true)
	res, err = h.Client.Deliver(t.Context(), cmd)
	if err != nil || res.GetAccepted() || res.GetReason() != "device d-1 unreachable" {
		t.Fatalf("Deliver = %v, %v; want refused with the adapter's reason", res, err)
	}
	cancel()
	deadline := time.Now().Add(5 * time.Second)
	for {
		_, err := h.Client.Deliver(t.Context(), cmd)
		if status.Code(err) == codes.FailedPrecondition {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("Deliver after the stream ended = %v, want FailedPrecondition", err)
		}
		time.Sleep(10 * time.Millisecond)
	}

	plain := sdktest.Start(t, sdk.Info{Name: "burst", Version: "1"}, &burst{n: 1, sent: make(chan struct{})})
	info, err = plain.Client.Info(t.Context(), &pb.InfoRequest{})
	if err != nil || info.GetCommands() {
		t.Fatalf("Info of an adapter without Commander = %v, %v; want no commands", info, err)
	}
	if _, err := plain.Client.Deliver(t.Context(), cmd); status.Code(err) != codes.Unimplemented {
		t.Fatalf("Deliver to an adapter without Commander = %v, want Unimplemented", err)
	}
}

// crowd sends n QoS 1 items from each of senders goroutines, each waiting
// for its settlement before the next, as the requests of a network
// server in flight do.
type crowd struct{ senders, n int }

func (c *crowd) Configure(context.Context, []byte) error { return nil }

func (c *crowd) Run(ctx context.Context, sink sdk.Sink) error {
	sink.Ready()
	for range c.senders {
		go func() {
			for range c.n {
				if err := sink.Data(ctx, sdk.Data{Device: "d", QoS: 1}); err != nil {
					return
				}
			}
		}()
	}
	<-ctx.Done()
	return nil
}

// TestQoS1FramesBatched: while the host has not settled the frames it
// got, the items of senders that wait for their settlements gather into
// the next frame, instead of going out one per frame as each settlement
// frees its sender (one host round trip per item).
func TestQoS1FramesBatched(t *testing.T) {
	const senders, each = 100, 20
	h := sdktest.Start(t, sdk.Info{Name: "crowd", Version: "1"}, &crowd{senders: senders, n: each})
	if _, err := h.Client.Configure(t.Context(), &pb.ConfigureRequest{Data: true}); err != nil {
		t.Fatal(err)
	}
	st, err := h.Client.Evidence(t.Context(), &pb.EvidenceRequest{})
	if err != nil {
		t.Fatal(err)
	}
	got, frames := 0, 0
	for got < senders*each {
		f, err := st.Recv()
		if err != nil {
			t.Fatal(err)
		}
		frames++
		var settled []*pb.Settlement
		for _, e := range f.GetEvidence() {
			settled = append(settled, &pb.Settlement{Id: e.GetData().GetId(), Outcome: pb.Outcome_OUTCOME_DURABLE})
		}
		got += len(settled)
		if len(settled) > 0 {
			if _, err := h.Client.Settle(t.Context(), &pb.SettleRequest{Settlements: settled}); err != nil {
				t.Fatal(err)
			}
		}
	}
	if frames > senders*each/10 {
		t.Fatalf("%d items came in %d frames: want at least 10 a frame on average", got, frames)
	}
	t.Logf("%d items in %d frames", got, frames)
}
