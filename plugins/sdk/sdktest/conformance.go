package sdktest

import (
	"context"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "github.com/fleetgate/fleetgate/plugins/proto"
	"github.com/fleetgate/fleetgate/plugins/sdk"
)

// Expect is the evidence a trigger should produce.
type Expect struct {
	Kind     pb.Kind
	Device   string
	Instance string
}

// Suite describes one adapter implementation for Conformance.
type Suite struct {
	Info sdk.Info
	// New returns a fresh adapter.
	New func(t *testing.T) sdk.Adapter
	// Setup returns a valid config for a fresh adapter and a trigger that
	// makes the running adapter produce one piece of evidence (for example
	// by sending it a datagram), with what that evidence must be. The
	// trigger may be called several times; each call must produce evidence
	// again.
	Setup func(t *testing.T) (config []byte, trigger func(ctx context.Context) (Expect, error))
	// BadConfig is a config the adapter must refuse with
	// codes.InvalidArgument.
	BadConfig []byte
}

// Conformance checks the contract of plugins/proto against an adapter,
// in-process. Every adapter's tests call it.
func Conformance(t *testing.T, s Suite) {
	ctx := func(t *testing.T) context.Context {
		c, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		t.Cleanup(cancel)
		return c
	}
	wantCode := func(t *testing.T, err error, code codes.Code, what string) {
		t.Helper()
		if status.Code(err) != code {
			t.Fatalf("%s: err = %v, want code %v", what, err, code)
		}
	}
	t.Run("Info", func(t *testing.T) {
		h := Start(t, s.Info, s.New(t))
		info, err := h.Client.Info(ctx(t), &pb.InfoRequest{})
		if err != nil {
			t.Fatal(err)
		}
		if info.GetName() == "" || info.GetVersion() == "" {
			t.Fatalf("Info = %v, want a name and a version", info)
		}
	})
	t.Run("BadConfigRefused", func(t *testing.T) {
		h := Start(t, s.Info, s.New(t))
		_, err := h.Client.Configure(ctx(t), &pb.ConfigureRequest{Config: s.BadConfig})
		wantCode(t, err, codes.InvalidArgument, "Configure(bad)")
		_, err = h.Client.Configure(ctx(t), &pb.ConfigureRequest{Config: []byte("{not json")})
		wantCode(t, err, codes.InvalidArgument, "Configure(not JSON)")
	})
	t.Run("EvidenceBeforeConfigureRefused", func(t *testing.T) {
		h := Start(t, s.Info, s.New(t))
		st, err := h.Client.Evidence(ctx(t), &pb.EvidenceRequest{})
		if err == nil {
			_, err = st.Recv()
		}
		wantCode(t, err, codes.FailedPrecondition, "Evidence before Configure")
	})
	t.Run("ReadyThenEvidence", func(t *testing.T) {
		h := Start(t, s.Info, s.New(t))
		cfg, trigger := s.Setup(t)
		c := ctx(t)
		st, err := h.Open(c, cfg)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := h.Client.Health(c, &pb.HealthRequest{}); err != nil {
			t.Fatalf("Health while running: %v", err)
		}
		for range 3 {
			want, err := trigger(c)
			if err != nil {
				t.Fatal(err)
			}
			ev, err := st.Next()
			if err != nil {
				t.Fatal(err)
			}
			if ev.GetKind() != want.Kind || ev.GetDevice() != want.Device || ev.GetInstance() != want.Instance || ev.GetAgeUs() < 0 {
				t.Fatalf("evidence = %v, want %+v with age >= 0", ev, want)
			}
		}
		_, err = h.Client.Configure(c, &pb.ConfigureRequest{Config: cfg})
		wantCode(t, err, codes.FailedPrecondition, "second Configure")
		second, err := h.Client.Evidence(c, &pb.EvidenceRequest{})
		if err == nil {
			_, err = second.Recv()
		}
		wantCode(t, err, codes.FailedPrecondition, "second Evidence stream")
	})
	t.Run("ShutdownEndsStream", func(t *testing.T) {
		h := Start(t, s.Info, s.New(t))
		cfg, trigger := s.Setup(t)
		c := ctx(t)
		st, err := h.Open(c, cfg)
		if err != nil {
			t.Fatal(err)
		}
		want, err := trigger(c)
		if err != nil {
			t.Fatal(err)
		}
		if ev, err := st.Next(); err != nil || ev.GetDevice() != want.Device {
			t.Fatalf("evidence %v, %v; want %q", ev, err, want.Device)
		}
		if _, err := h.Client.Shutdown(c, &pb.ShutdownRequest{}); err != nil {
			t.Fatalf("Shutdown: %v", err)
		}
		if err := st.End(); err != nil {
			t.Fatalf("stream after Shutdown: %v, want a clean end", err)
		}
		if _, err := h.Client.Shutdown(c, &pb.ShutdownRequest{}); err != nil {
			t.Fatalf("second Shutdown: %v", err)
		}
		again, err := h.Client.Evidence(c, &pb.EvidenceRequest{})
		if err == nil {
			_, err = again.Recv()
		}
		wantCode(t, err, codes.FailedPrecondition, "Evidence after Shutdown")
	})
	t.Run("CancelStopsRun", func(t *testing.T) {
		h := Start(t, s.Info, s.New(t))
		cfg, trigger := s.Setup(t)
		c := ctx(t)
		first, cancel := context.WithCancel(c)
		if _, err := h.Open(first, cfg); err != nil {
			t.Fatal(err)
		}
		cancel()
		// Run ended and released what it held: a new stream works.
		deadline := time.Now().Add(5 * time.Second)
		for {
			st, err := h.Client.Evidence(c, &pb.EvidenceRequest{})
			var f *pb.EvidenceFrame
			if err == nil {
				f, err = st.Recv()
			}
			if err == nil {
				if !f.GetReady() {
					t.Fatal("first frame of the new stream is not ready")
				}
				want, err := trigger(c)
				if err != nil {
					t.Fatal(err)
				}
				s2 := &Stream{s: st, pending: f.GetEvidence(), frames: 1}
				ev, err := s2.Next()
				if err != nil || ev.GetDevice() != want.Device {
					t.Fatalf("new stream: %v, %v; want %q", ev, err, want.Device)
				}
				return
			}
			if status.Code(err) != codes.FailedPrecondition || time.Now().After(deadline) {
				t.Fatalf("new stream after cancel: %v", err)
			}
			time.Sleep(20 * time.Millisecond)
		}
	})
}
