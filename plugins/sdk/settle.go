package sdk

import (
	"context"
	"fmt"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "github.com/fleetgate/fleetgate/plugins/proto"
)

// settler holds the QoS 1 data items waiting for their settlement, by
// id. Ids are never reused within the process (a Server's streams share
// one settler), so a late settlement of an earlier stream finds nothing.
//
// It also paces the frames that carry QoS 1 items: the host settles each
// such frame in one Settle call before it reads the next frame, so at
// most MaxUnsettledFrames of them are sent ahead of their settlements;
// meanwhile the queue fills the next frame. Without it, every Data
// waiting for its settlement would go out alone in its own frame as soon
// as the previous one was settled, one host round trip per item.
type settler struct {
	mu       sync.Mutex
	next     uint64
	waiting  map[uint64]chan *pb.Settlement
	inFlight int           // frames with QoS 1 items sent and not settled
	settled  chan struct{} // a signal: a Settle call came
}

// Pacing of the frames with QoS 1 items.
const (
	// MaxUnsettledFrames is how many frames with QoS 1 items are sent
	// ahead of their settlements.
	MaxUnsettledFrames = 2
	// SettleWait bounds the wait for a settlement before the next frame
	// goes out all the same (a settlement lost, a host that breaks the
	// contract).
	SettleWait = time.Second
)

func newSettler() settler {
	return settler{waiting: make(map[uint64]chan *pb.Settlement), settled: make(chan struct{}, 1)}
}

// register registers a new id and returns it with the channel its
// settlement arrives on.
func (s *settler) register() (uint64, <-chan *pb.Settlement) {
	ch := make(chan *pb.Settlement, 1)
	s.mu.Lock()
	defer s.mu.Unlock()
	s.next++
	s.waiting[s.next] = ch
	return s.next, ch
}

// forget drops id: its caller stopped waiting.
func (s *settler) forget(id uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.waiting, id)
}

// deliver hands st to the waiter of its id, if any.
func (s *settler) deliver(st *pb.Settlement) {
	s.mu.Lock()
	ch, ok := s.waiting[st.GetId()]
	delete(s.waiting, st.GetId())
	s.mu.Unlock()
	if ok {
		ch <- st
	}
}

// sent records a frame with QoS 1 items sent.
func (s *settler) sent() {
	s.mu.Lock()
	s.inFlight++
	s.mu.Unlock()
}

// restart forgets the frames of an earlier stream.
func (s *settler) restart() {
	s.mu.Lock()
	s.inFlight = 0
	s.mu.Unlock()
}

// room waits until fewer than MaxUnsettledFrames frames wait for their
// settlement, at most SettleWait (then it forgets them), or until ctx
// ends or stop is closed.
func (s *settler) room(ctx context.Context, stop <-chan struct{}) {
	var t *time.Timer
	for {
		s.mu.Lock()
		if s.inFlight < MaxUnsettledFrames {
			s.mu.Unlock()
			break
		}
		s.mu.Unlock()
		if t == nil {
			t = time.NewTimer(SettleWait)
			defer t.Stop()
		}
		select {
		case <-s.settled:
		case <-t.C:
			s.restart()
		case <-ctx.Done():
			return
		case <-stop:
			return
		}
	}
}

// settlementError is Sink.Data's result for st.
func settlementError(st *pb.Settlement) error {
	var kind error
	switch st.GetOutcome() {
	case pb.Outcome_OUTCOME_DURABLE:
		return nil
	case pb.Outcome_OUTCOME_REJECTED, pb.Outcome_OUTCOME_REFUSED:
		kind = ErrRejected
	case pb.Outcome_OUTCOME_DISCARDED:
		kind = ErrNoDataPath
	default: // dropped, failed, and an outcome this SDK does not know
		kind = ErrUnavailable
	}
	return fmt.Errorf("%w: %s: %s", kind, outcomeName(st.GetOutcome()), st.GetReason())
}

// outcomeName is an outcome's name in lower case ("failed").
func outcomeName(o pb.Outcome) string {
	switch o {
	case pb.Outcome_OUTCOME_DURABLE:
		return "durable"
	case pb.Outcome_OUTCOME_REJECTED:
		return "rejected"
	case pb.Outcome_OUTCOME_REFUSED:
		return "refused"
	case pb.Outcome_OUTCOME_DROPPED:
		return "dropped"
	case pb.Outcome_OUTCOME_FAILED:
		return "failed"
	case pb.Outcome_OUTCOME_DISCARDED:
		return "discarded"
	}
	return fmt.Sprintf("outcome %d", int32(o))
}

// Settle implements the contract's Settle: each settlement ends the wait
// of its Sink.Data call; ids nobody waits for are ignored. The call
// settles one frame (the pacing of frames counts it).
func (s *Server) Settle(_ context.Context, req *pb.SettleRequest) (*pb.SettleResponse, error) {
	for _, st := range req.GetSettlements() {
		s.settle.deliver(st)
	}
	s.settle.mu.Lock()
	if s.settle.inFlight > 0 {
		s.settle.inFlight--
	}
	s.settle.mu.Unlock()
	notify(s.settle.settled)
	return &pb.SettleResponse{}, nil
}

// Deliver implements the contract's Deliver: it hands the command to the
// adapter's Commander while the stream is ready. Unimplemented when the
// adapter is no Commander, FailedPrecondition when no stream is ready;
// the Commander's error refuses the command (accepted false, with the
// error as the reason).
func (s *Server) Deliver(ctx context.Context, c *pb.Command) (*pb.DeliverResponse, error) {
	cmd, ok := s.a.(Commander)
	if !ok {
		return nil, status.Error(codes.Unimplemented, "this adapter takes no commands")
	}
	s.mu.Lock()
	run := s.ready
	s.mu.Unlock()
	if run == nil {
		return nil, status.Error(codes.FailedPrecondition, "no evidence stream is ready")
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stop := context.AfterFunc(run, cancel)
	defer stop()
	var props []Property
	for _, p := range c.GetProperties() {
		props = append(props, Property{Key: p.GetKey(), Value: p.GetValue()})
	}
	var expires time.Time
	if ms := c.GetExpiresUnixMs(); ms != 0 {
		expires = time.UnixMilli(ms)
	}
	err := cmd.Command(WithLogger(ctx, s.log), Command{
		ID: c.GetId(), Device: c.GetDevice(), Topic: c.GetTopic(), Payload: c.GetPayload(),
		ContentType: c.GetContentType(), Properties: props, Expires: expires,
	})
	if err != nil {
		return &pb.DeliverResponse{Reason: err.Error()}, nil
	}
	return &pb.DeliverResponse{Accepted: true}, nil
}
