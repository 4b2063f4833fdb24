package sdk

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "github.com/fleetgate/fleetgate/plugins/proto"
)

// Batching bounds.
const (
	// QueueSize is how many items (evidence and data) wait for a frame
	// before Sink.Send and Sink.Data block.
	QueueSize = 8192
	// QueueBytes bounds the data waiting for a frame (as itemBytes counts
	// it); Sink.Data blocks beyond it, but an empty queue takes any item.
	QueueBytes = 16 << 20
	// MaxFrame is the most items one frame carries.
	MaxFrame = 1000
	// MaxFrameBytes bounds the items of one frame (as itemBytes counts
	// them), far below gRPC's 4 MiB message limit; a frame of a single
	// item may exceed it by that item.
	MaxFrameBytes = 2 << 20
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
	dataPath   bool // Configure said the host takes data
	streaming  bool
	ready      context.Context // Run's context once the open stream is ready; nil otherwise
	runErr     error           // set when Run failed
	shutdown   chan struct{}   // closed by Shutdown
	streamDone chan struct{}   // closed when the open stream ends; nil when none

	settle settler
}

var _ pb.AdapterServer = (*Server)(nil)

// NewServer returns the gRPC service of adapter a; log receives the SDK's
// own messages and is handed to the adapter through its contexts (nil
// discards).
func NewServer(info Info, a Adapter, log hclog.Logger) *Server {
	if log == nil {
		log = hclog.NewNullLogger()
	}
	return &Server{info: info, a: a, log: log, shutdown: make(chan struct{}), settle: newSettler()}
}

// Info implements the contract's Info: commands is true when the adapter
// implements Commander.
func (s *Server) Info(context.Context, *pb.InfoRequest) (*pb.InfoResponse, error) {
	_, commands := s.a.(Commander)
	return &pb.InfoResponse{Name: s.info.Name, Version: s.info.Version, Protocols: s.info.Protocols, Commands: commands}, nil
}

// Configure implements the contract's Configure.
func (s *Server) Configure(ctx context.Context, req *pb.ConfigureRequest) (*pb.ConfigureResponse, error) {
	s.mu.Lock()
	if s.configured {
		s.mu.Unlock()
		return nil, status.Error(codes.FailedPrecondition, "already configured")
	}
	s.configured = true
	s.dataPath = req.GetData()
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

// item is one queued piece of evidence, with the data it carries (nil:
// none).
type item struct {
	Evidence
	data *dataItem
}

// dataItem is an item's data: the message and, for QoS 1, its settlement
// id.
type dataItem struct {
	id uint64
	d  Data
}

// itemBytes is what an item counts against QueueBytes and MaxFrameBytes:
// its encoded size, about.
func itemBytes(it *item) int {
	n := 16 + len(it.Device) + len(it.Instance)
	if it.data != nil {
		n += dataBytes(&it.data.d)
	}
	return n
}

// dataBytes is a data item's size as the gateway counts a message
// (gateway.Message.Size without the adapter's name).
func dataBytes(d *Data) int {
	n := 64 + len(d.Payload) + len(d.Device) + len(d.Topic) + len(d.ContentType)
	for _, p := range d.Properties {
		n += len(p.Key) + len(p.Value) + 4
	}
	return n
}

// sink is the Sink of one Evidence stream: a bounded queue of items
// under a mutex (no allocation per item, cheaper than a channel), with
// wake-ups for the sender. The queue is a list of chunks of at most
// MaxFrame items and MaxFrameBytes, each the content of one frame: the
// sender takes the oldest chunk whole and encodes it outside the lock
// (encodeFrame), so nothing is copied or shifted per item, and emptied
// chunks are reused.
type sink struct {
	mu     sync.Mutex
	chunks [][]item      // oldest first; only the last may be partly filled; At is set
	sizes  []int         // itemBytes of each chunk
	queued int           // items in chunks
	bytes  int           // itemBytes of the items in chunks
	free   [][]item      // emptied chunks (length 0)
	wake   chan struct{} // a signal: the queue is not empty
	space  chan struct{} // a signal: the queue is below its bounds
	ready  chan struct{}
	once   sync.Once

	// run is Run's context: a QoS 1 Data stops waiting when it ends.
	run context.Context
	// dataPath: the host takes data (Configure said so).
	dataPath bool
	settle   *settler
}

func newSink(run context.Context, dataPath bool, settle *settler) *sink {
	return &sink{wake: make(chan struct{}, 1), space: make(chan struct{}, 1), ready: make(chan struct{}),
		run: run, dataPath: dataPath, settle: settle}
}

func (k *sink) Ready() { k.once.Do(func() { close(k.ready) }) }

func notify(c chan struct{}) {
	select {
	case c <- struct{}{}:
	default:
	}
}

func (k *sink) Send(ctx context.Context, ev Evidence) error {
	return k.enqueue(ctx, item{Evidence: ev})
}

// full reports whether the queue cannot take an item of n bytes now.
func (k *sink) full(n int) bool {
	return k.queued >= QueueSize || (k.queued > 0 && k.bytes+n > QueueBytes)
}

// enqueue appends it, waiting while the queue is full until ctx ends.
func (k *sink) enqueue(ctx context.Context, it item) error {
	if it.At.IsZero() {
		it.At = time.Now()
	}
	n := itemBytes(&it)
	k.mu.Lock()
	waited := false
	for k.full(n) {
		k.mu.Unlock()
		select {
		case <-k.space:
		case <-ctx.Done():
			return ctx.Err()
		}
		waited = true
		k.mu.Lock()
	}
	last := len(k.chunks) - 1
	if last < 0 || len(k.chunks[last]) == MaxFrame || (len(k.chunks[last]) > 0 && k.sizes[last]+n > MaxFrameBytes) {
		var c []item
		if f := len(k.free); f > 0 {
			c, k.free = k.free[f-1], k.free[:f-1]
		}
		k.chunks = append(k.chunks, c)
		k.sizes = append(k.sizes, 0)
		last++
	}
	k.chunks[last] = append(k.chunks[last], it)
	k.sizes[last] += n
	k.queued++
	k.bytes += n
	wasEmpty, room := k.queued == 1, !k.full(0)
	k.mu.Unlock()
	// The sender needs a signal only when it may have found the queue
	// empty; it signals itself while it leaves items behind (take).
	if wasEmpty {
		notify(k.wake)
	}
	if waited && room {
		notify(k.space) // pass the space on to the next blocked Send
	}
	k.Ready()
	return nil
}

// Data implements Sink.Data.
func (k *sink) Data(ctx context.Context, d Data) error {
	if d.QoS > 1 {
		return fmt.Errorf("%w: qos %d (want 0 or 1)", ErrRejected, d.QoS)
	}
	if n := dataBytes(&d); n > MaxDataBytes {
		return fmt.Errorf("%w: %d bytes, more than %d", ErrRejected, n, MaxDataBytes)
	}
	ev := Evidence{Kind: Renew, Device: d.Device, Instance: d.Instance, At: d.At, Lease: d.Lease}
	if !k.dataPath {
		if err := k.Send(ctx, ev); err != nil {
			return err
		}
		return fmt.Errorf("%w: the gateway takes no data", ErrNoDataPath)
	}
	if d.QoS == 0 {
		return k.enqueue(ctx, item{Evidence: ev, data: &dataItem{d: d}})
	}
	id, settled := k.settle.register()
	if err := k.enqueue(ctx, item{Evidence: ev, data: &dataItem{id: id, d: d}}); err != nil {
		k.settle.forget(id)
		return err
	}
	select {
	case st := <-settled:
		return settlementError(st)
	case <-ctx.Done():
	case <-k.run.Done():
	}
	k.settle.forget(id)
	if k.run.Err() != nil {
		return fmt.Errorf("%w: the stream ended before the gateway settled it", ErrUnavailable)
	}
	return ctx.Err()
}

// settles reports whether items hold a QoS 1 item (the host settles the
// frame).
func settles(items []item) bool {
	for i := range items {
		if items[i].data != nil && items[i].data.id != 0 {
			return true
		}
	}
	return false
}

// take returns the oldest chunk (at most MaxFrame items, oldest first;
// empty when nothing is queued), which the caller owns until its next
// call, when it hands back done, the chunk it got the last time.
func (k *sink) take(done []item) []item {
	clear(done)
	k.mu.Lock()
	if done != nil {
		k.free = append(k.free, done[:0])
	}
	var c []item
	if len(k.chunks) > 0 {
		c = k.chunks[0]
		k.chunks[0] = nil
		k.chunks = k.chunks[:copy(k.chunks, k.chunks[1:])]
		k.queued -= len(c)
		k.bytes -= k.sizes[0]
		k.sizes = k.sizes[:copy(k.sizes, k.sizes[1:])]
	}
	more := k.queued > 0
	k.mu.Unlock()
	if len(c) > 0 {
		notify(k.space)
	}
	if more {
		notify(k.wake)
	}
	return c
}

func (k *sink) len() int {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.queued
}

// Evidence implements the contract's Evidence stream.
func (s *Server) Evidence(req *pb.EvidenceRequest, stream pb.Adapter_EvidenceServer) error {
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
		s.ready = nil
		s.streamDone = nil
		s.mu.Unlock()
		close(done)
	}()

	ctx, cancel := context.WithCancel(stream.Context())
	defer cancel()
	s.mu.Lock()
	k := newSink(ctx, s.dataPath, &s.settle)
	s.mu.Unlock()
	s.settle.restart()
	runDone := make(chan error, 1)
	go func() { runDone <- s.a.Run(WithLogger(ctx, s.log), k) }()

	var (
		batch    []item
		scratch  []int64
		frame    *pb.EvidenceFrame
		lastSent time.Time
	)
	// The host's tick (EvidenceRequest.tick_ms): a frame at least that
	// often, an empty one when nothing waits, promised on the ready frame.
	tick := time.Duration(req.GetTickMs()) * time.Millisecond
	var ticks <-chan time.Time
	if tick > 0 {
		t := time.NewTicker(tick / 2)
		defer t.Stop()
		ticks = t.C
	}
	send := func(ready bool) error {
		s.settle.room(ctx, s.shutdown)
		batch = k.take(batch)
		lastSent = time.Now()
		frame, scratch = encodeFrame(ready, batch, lastSent, scratch)
		if ready {
			frame.TickMs = req.GetTickMs()
		}
		if settles(batch) {
			s.settle.sent()
		}
		err := stream.Send(frame)
		if ready && err == nil {
			s.mu.Lock()
			s.ready = ctx
			s.mu.Unlock()
		}
		return err
	}
	// finish stops Run (if it is still going), then flushes the queue.
	finish := func(runErr error, running bool) error {
		cancel()
		if running {
			runErr = <-runDone
		}
		for k.len() > 0 {
			if err := send(false); err != nil {
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
		// Run may have said ready (or sent) just before it returned: both
		// cases were ready and select chose this one. The first frame
		// still says ready then.
		select {
		case <-k.ready:
			if serr := send(true); serr != nil {
				return serr
			}
			if err == nil && ctx.Err() == nil {
				err = errors.New("run returned while the stream was open")
			}
		default:
			if err == nil {
				err = errors.New("run returned before ready")
			}
		}
		return finish(err, false)
	case <-s.shutdown:
		return finish(nil, true)
	case <-ctx.Done():
		return finish(nil, true)
	}
	if err := send(true); err != nil {
		cancel()
		<-runDone
		return err
	}
	for {
		select {
		case <-k.wake:
			if k.len() == 0 {
				continue
			}
			if err := send(false); err != nil {
				cancel()
				<-runDone
				return err
			}
		case now := <-ticks:
			if now.Sub(lastSent) < tick/2 {
				continue
			}
			if err := send(false); err != nil {
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
