// Package sdktest runs an adapter in-process, without a gateway: its
// sdk.Server is served over gRPC on loopback and the test talks to it as
// the host would. Conformance is the contract suite (plugins/proto) that
// every adapter passes.
package sdktest

import (
	"context"
	"errors"
	"io"
	"net"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	pb "github.com/fleetgate/fleetgate/plugins/proto"
	"github.com/fleetgate/fleetgate/plugins/sdk"
)

// Harness is one adapter served in-process.
type Harness struct {
	// Client calls the adapter as the host does.
	Client pb.AdapterClient
	Server *sdk.Server
}

// Start serves a on a loopback gRPC server until the test ends.
func Start(t testing.TB, info sdk.Info, a sdk.Adapter) *Harness {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	log := hclog.New(&hclog.LoggerOptions{Name: info.Name, Level: hclog.Debug, Output: testWriter{t}})
	srv := sdk.NewServer(info, a, log)
	gs := grpc.NewServer()
	pb.RegisterAdapterServer(gs, srv)
	go func() { _ = gs.Serve(ln) }()
	conn, err := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_, _ = srv.Shutdown(ctx, &pb.ShutdownRequest{})
		conn.Close()
		gs.Stop()
	})
	return &Harness{Client: pb.NewAdapterClient(conn), Server: srv}
}

type testWriter struct{ t testing.TB }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(string(p))
	return len(p), nil
}

// Stream is an open Evidence stream with the evidence (data included)
// received but not yet taken.
type Stream struct {
	s       pb.Adapter_EvidenceClient
	pending []*pb.Evidence
	frames  int
}

// Open configures the adapter with config, as a host that takes data
// does, and opens the Evidence stream; it returns once the first (ready)
// frame has arrived.
func (h *Harness) Open(ctx context.Context, config []byte) (*Stream, error) {
	return h.OpenWith(ctx, &pb.ConfigureRequest{Config: config, Data: true})
}

// OpenWith is Open with the whole Configure request (Data false: a host
// that takes no data).
func (h *Harness) OpenWith(ctx context.Context, req *pb.ConfigureRequest) (*Stream, error) {
	st, _, err := h.open(ctx, req, &pb.EvidenceRequest{})
	return st, err
}

// OpenTicking is Open for a host that asks for a frame at least every
// tick (EvidenceRequest.tick_ms); it also returns the tick the ready frame
// promised (EvidenceFrame.tick_ms; 0: none).
func (h *Harness) OpenTicking(ctx context.Context, config []byte, tick time.Duration) (*Stream, time.Duration, error) {
	st, f, err := h.open(ctx, &pb.ConfigureRequest{Config: config, Data: true}, &pb.EvidenceRequest{TickMs: uint32(tick.Milliseconds())})
	if err != nil {
		return nil, 0, err
	}
	return st, time.Duration(f.GetTickMs()) * time.Millisecond, nil
}

func (h *Harness) open(ctx context.Context, req *pb.ConfigureRequest, evreq *pb.EvidenceRequest) (*Stream, *pb.EvidenceFrame, error) {
	if _, err := h.Client.Configure(ctx, req); err != nil {
		return nil, nil, err
	}
	s, err := h.Client.Evidence(ctx, evreq)
	if err != nil {
		return nil, nil, err
	}
	f, err := s.Recv()
	if err != nil {
		return nil, nil, err
	}
	if !f.GetReady() {
		return nil, nil, errors.New("first frame is not ready")
	}
	return &Stream{s: s, pending: f.GetEvidence(), frames: 1}, f, nil
}

// Frame waits for the next frame, empty or not (a tick), keeps its
// evidence for Next, and returns when the adapter made it
// (sent_unix_us).
func (st *Stream) Frame() (time.Time, error) {
	f, err := st.s.Recv()
	if err != nil {
		return time.Time{}, err
	}
	st.frames++
	if f.GetReady() {
		return time.Time{}, errors.New("a frame after the first says ready")
	}
	st.pending = append(st.pending, f.GetEvidence()...)
	return time.UnixMicro(f.GetSentUnixUs()), nil
}

// Next returns the next piece of evidence, waiting for a frame if none
// is pending; it fails when a frame after the first says ready.
func (st *Stream) Next() (*pb.Evidence, error) {
	for len(st.pending) == 0 {
		f, err := st.s.Recv()
		if err != nil {
			return nil, err
		}
		st.frames++
		if f.GetReady() {
			return nil, errors.New("a frame after the first says ready")
		}
		st.pending = f.GetEvidence()
	}
	ev := st.pending[0]
	st.pending = st.pending[1:]
	return ev, nil
}

// Settle settles the QoS 1 data item id with outcome, as the host does
// once its data path has answered.
func (h *Harness) Settle(ctx context.Context, id uint64, outcome pb.Outcome, reason string) error {
	_, err := h.Client.Settle(ctx, &pb.SettleRequest{Settlements: []*pb.Settlement{{Id: id, Outcome: outcome, Reason: reason}}})
	return err
}

// Frames is the number of frames received so far.
func (st *Stream) Frames() int { return st.frames }

// End reads the stream until it ends and returns its error (nil after a
// clean end).
func (st *Stream) End() error {
	for {
		_, err := st.s.Recv()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
	}
}
