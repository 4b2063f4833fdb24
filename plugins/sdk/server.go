package sdk

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "github.com/fleetgate/fleetgate/plugins/proto"
)

// Batching bounds.
const (
	// QueueSize is how many pieces of evidence wait for a frame before
	// Sink.Send blocks.
	QueueSize = 8192
	// MaxFrame is the most evidence one frame carries.
	MaxFrame = 1000
)

// Server implements the Adapter gRPC service around an Adapter, as the
// contract in plugins/proto says. Serve uses it; sdktest uses it
// in-process.
type Server struct {
	pb.UnimplementedAdapterServer
	info Info
	a    Adapter
	log  hclog.Logger

	mu         sync.Mutex
	configured bool
	streaming  bool
	runErr     error         // set when Run failed
	shutdown   chan struct{} // closed by Shutdown
	streamDone chan struct{} // closed when the open stream ends; nil when none
}

var _ pb.AdapterServer = (*Server)(nil)

// NewServer returns the gRPC service of adapter a; log receives the SDK's
// own messages and is handed to the adapter through its contexts (nil
// discards).
func NewServer(info Info, a Adapter, log hclog.Logger) *Server {
	if log == nil {
		log = hclog.NewNullLogger()
	}
	return &Server{info: info, a: a, log: log, shutdown: make(chan struct{})}
}

// Info implements the contract's Info.
func (s *Server) Info(context.Context, *pb.InfoRequest) (*pb.InfoResponse, error) {
	return &pb.InfoResponse{Name: s.info.Name, Version: s.info.Version, Protocols: s.info.Protocols}, nil
}

// Configure implements the contract's Configure.
func (s *Server) Configure(ctx context.Context, req *pb.ConfigureRequest) (*pb.ConfigureResponse, error) {
	s.mu.Lock()
	if s.configured {
		s.mu.Unlock()
		return nil, status.Error(codes.FailedPrecondition, "already configured")
	}
	s.configured = true
	s.mu.Unlock()
	cfg := req.GetConfig()
	if len(cfg) == 0 {
		cfg = []byte("{}")
	}
	if err := s.a.Configure(WithLogger(ctx, s.log), cfg); err != nil {
		s.mu.Lock()
		s.configured = false
		s.mu.Unlock()
		return nil, status.Errorf(codes.InvalidArgument, "configure: %v", err)
	}
	return &pb.ConfigureResponse{}, nil
}

// Health implements the contract's Health.
func (s *Server) Health(context.Context, *pb.HealthRequest) (*pb.HealthResponse, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.runErr != nil {
		return nil, status.Errorf(codes.Unavailable, "run failed: %v", s.runErr)
	}
	return &pb.HealthResponse{Status: "ok"}, nil
}

// Shutdown implements the contract's Shutdown: it stops Run and waits
// until the open stream has sent what was pending and ended.
func (s *Server) Shutdown(ctx context.Context, _ *pb.ShutdownRequest) (*pb.ShutdownResponse, error) {
	s.mu.Lock()
	select {
	case <-s.shutdown:
	default:
		close(s.shutdown)
	}
	done := s.streamDone
	s.mu.Unlock()
	if done != nil {
		select {
		case <-done:
		case <-ctx.Done():
			return nil, status.FromContextError(ctx.Err()).Err()
		}
	}
	return &pb.ShutdownResponse{}, nil
}

// item is one queued piece of evidence.
type item struct {
	ev *pb.Evidence
	at time.Time
}

// sink is the Sink of one Evidence stream.
type sink struct {
	queue chan item
	ready chan struct{}
	once  sync.Once
}

func (k *sink) Ready() { k.once.Do(func() { close(k.ready) }) }

func (k *sink) Send(ctx context.Context, ev Evidence) error {
	at := ev.At
	if at.IsZero() {
		at = time.Now()
	}
	it := item{ev: &pb.Evidence{Kind: pb.Kind(ev.Kind), Device: ev.Device, Instance: ev.Instance, Metadata: ev.Metadata}, at: at}
	select {
	case k.queue <- it:
		k.Ready()
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Evidence implements the contract's Evidence stream.
func (s *Server) Evidence(_ *pb.EvidenceRequest, stream pb.Adapter_EvidenceServer) error {
	s.mu.Lock()
	switch {
	case !s.configured:
		s.mu.Unlock()
		return status.Error(codes.FailedPrecondition, "evidence before configure")
	case s.streaming:
		s.mu.Unlock()
		return status.Error(codes.FailedPrecondition, "an evidence stream is already open")
	}
	select {
	case <-s.shutdown:
		s.mu.Unlock()
		return status.Error(codes.FailedPrecondition, "shut down")
	default:
	}
	s.streaming = true
	done := make(chan struct{})
	s.streamDone = done
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		s.streaming = false
		s.streamDone = nil
		s.mu.Unlock()
		close(done)
	}()

	ctx, cancel := context.WithCancel(stream.Context())
	defer cancel()
	k := &sink{queue: make(chan item, QueueSize), ready: make(chan struct{})}
	runDone := make(chan error, 1)
	go func() { runDone <- s.a.Run(WithLogger(ctx, s.log), k) }()

	send := func(ready bool, first *item) error {
		frame := &pb.EvidenceFrame{Ready: ready}
		now := time.Now()
		add := func(it item) {
			it.ev.AgeUs = max(0, now.Sub(it.at).Microseconds())
			frame.Evidence = append(frame.Evidence, it.ev)
		}
		if first != nil {
			add(*first)
		}
	drain:
		for len(frame.Evidence) < MaxFrame {
			select {
			case it := <-k.queue:
				add(it)
			default:
				break drain
			}
		}
		return stream.Send(frame)
	}
	// finish stops Run (if it is still going), then flushes the queue.
	finish := func(runErr error, running bool) error {
		cancel()
		if running {
			runErr = <-runDone
		}
		for len(k.queue) > 0 {
			if err := send(false, nil); err != nil {
				return err
			}
		}
		if runErr != nil && !errors.Is(runErr, context.Canceled) {
			s.mu.Lock()
			s.runErr = runErr
			s.mu.Unlock()
			s.log.Error("run failed", "error", runErr)
			return status.Errorf(codes.Aborted, "run: %v", runErr)
		}
		return nil
	}

	select {
	case <-k.ready:
	case err := <-runDone:
		if err == nil {
			err = errors.New("run returned before ready")
		}
		return finish(err, false)
	case <-s.shutdown:
		return finish(nil, true)
	case <-ctx.Done():
		return finish(nil, true)
	}
	if err := send(true, nil); err != nil {
		cancel()
		<-runDone
		return err
	}
	for {
		select {
		case it := <-k.queue:
			if err := send(false, &it); err != nil {
				cancel()
				<-runDone
				return err
			}
		case err := <-runDone:
			if err == nil && ctx.Err() == nil {
				err = errors.New("run returned while the stream was open")
			}
			return finish(err, false)
		case <-s.shutdown:
			return finish(nil, true)
		case <-ctx.Done():
			return finish(nil, true)
		}
	}
}
