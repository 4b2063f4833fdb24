package sdktest

import (
	"bytes"
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

// ExpectData is the data a data trigger should produce.
type ExpectData struct {
	// Kind is the item's kind: KIND_RENEW for data sent with Sink.Data.
	Kind        pb.Kind
	Device      string
	Instance    string
	Topic       string
	Payload     []byte
	ContentType string
	QoS         uint32
}

// DataTrigger makes the running adapter send one data item (for example
// by posting an uplink to it) and returns what must arrive. For an item
// of QoS 1 whose source gets an answer (an HTTP request), answer receives
// that answer once the adapter gave it: nil when the source was told the
// item is taken (a 2xx), an error otherwise; answer is nil when the
// source gets none (a datagram, a poll).
type DataTrigger func(ctx context.Context) (want ExpectData, answer <-chan error, err error)

// CommandCase is how Conformance checks an adapter's commands.
type CommandCase struct {
	// Prepare, when set, readies the device once the stream is open (for
	// example: it sends a datagram, so that the adapter knows where the
	// device is).
	Prepare func(ctx context.Context) error
	// Accept is a command the adapter must take.
	Accept *pb.Command
	// Received waits until the device (or its network server) has got
	// Accept and checks what it got.
	Received func(ctx context.Context) error
	// Refuse is a command the adapter must refuse (a topic or payload it
	// cannot carry).
	Refuse *pb.Command
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
	// SetupData, for an adapter that sends data, returns a valid config
	// for a fresh adapter and a trigger that makes it send one data item;
	// each call must produce a new item. Nil: the adapter sends none.
	SetupData func(t *testing.T) (config []byte, trigger DataTrigger)
	// SetupCommands, for an adapter that takes commands (a
	// sdk.Commander), returns a valid config for a fresh adapter and the
	// commands to try. Nil: the adapter takes none.
	SetupCommands func(t *testing.T) (config []byte, c CommandCase)
}

// answerWait is how long Conformance waits for an answer that must not
// come before the settlement.
const answerWait = 300 * time.Millisecond

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
	t.Run("TicksWhenAsked", func(t *testing.T) {
		// A host that asks for a frame every 50 ms gets the promise on the
		// ready frame and then frames, empty ones while the adapter has
		// nothing to send, each made after the one before. (How often is
		// not timed here: only that they keep coming, within a bound far
		// above the tick.)
		const tick = 50 * time.Millisecond
		h := Start(t, s.Info, s.New(t))
		cfg, _ := s.Setup(t)
		c := ctx(t)
		st, promised, err := h.OpenTicking(c, cfg, tick)
		if err != nil {
			t.Fatal(err)
		}
		if promised != tick {
			t.Fatalf("the ready frame promises a tick of %v, want %v", promised, tick)
		}
		var last time.Time
		for i := range 10 {
			fc, cancel := context.WithTimeout(c, 5*time.Second)
			made, err := recvFrame(fc, st)
			cancel()
			if err != nil {
				t.Fatalf("frame %d: %v", i, err)
			}
			if made.IsZero() || made.Before(last) {
				t.Fatalf("frame %d made at %v, after one made at %v", i, made, last)
			}
			last = made
		}
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
	t.Run("Data", func(t *testing.T) {
		if s.SetupData == nil {
			t.Skip("the adapter sends no data")
		}
		h := Start(t, s.Info, s.New(t))
		cfg, trigger := s.SetupData(t)
		c := ctx(t)
		st, err := h.Open(c, cfg)
		if err != nil {
			t.Fatal(err)
		}
		seen := map[uint64]bool{}
		for _, outcome := range []pb.Outcome{pb.Outcome_OUTCOME_DURABLE, pb.Outcome_OUTCOME_FAILED, pb.Outcome_OUTCOME_REJECTED} {
			want, answer, err := trigger(c)
			if err != nil {
				t.Fatal(err)
			}
			ev, err := st.Next()
			if err != nil {
				t.Fatal(err)
			}
			d := ev.GetData()
			if d == nil || ev.GetKind() != want.Kind || ev.GetDevice() != want.Device || ev.GetInstance() != want.Instance || ev.GetAgeUs() < 0 ||
				d.GetTopic() != want.Topic || !bytes.Equal(d.GetPayload(), want.Payload) || d.GetContentType() != want.ContentType || d.GetQos() != want.QoS {
				t.Fatalf("item = %v, want %+v with age >= 0", ev, want)
			}
			if want.QoS == 0 {
				if d.GetId() != 0 {
					t.Fatalf("a QoS 0 item has id %d, want 0 (never settled)", d.GetId())
				}
				return // nothing to settle
			}
			if d.GetId() == 0 || seen[d.GetId()] {
				t.Fatalf("QoS 1 item with id %d, want a new id > 0 (seen %v)", d.GetId(), seen)
			}
			seen[d.GetId()] = true
			if answer != nil {
				select {
				case err := <-answer:
					t.Fatalf("the source was answered (%v) before the item was settled", err)
				case <-time.After(answerWait):
				}
			}
			if err := h.Settle(c, d.GetId(), outcome, "conformance"); err != nil {
				t.Fatal(err)
			}
			if answer == nil {
				continue
			}
			select {
			case err := <-answer:
				if (err == nil) != (outcome == pb.Outcome_OUTCOME_DURABLE) {
					t.Fatalf("settled %v: the source got %v", outcome, err)
				}
			case <-c.Done():
				t.Fatalf("settled %v: the source got no answer", outcome)
			}
		}
	})
	t.Run("DataToAHostWithoutData", func(t *testing.T) {
		if s.SetupData == nil {
			t.Skip("the adapter sends no data")
		}
		h := Start(t, s.Info, s.New(t))
		cfg, trigger := s.SetupData(t)
		c := ctx(t)
		st, err := h.OpenWith(c, &pb.ConfigureRequest{Config: cfg})
		if err != nil {
			t.Fatal(err)
		}
		want, answer, err := trigger(c)
		if err != nil {
			t.Fatal(err)
		}
		ev, err := st.Next()
		if err != nil {
			t.Fatal(err)
		}
		if ev.GetData() != nil || ev.GetKind() != want.Kind || ev.GetDevice() != want.Device {
			t.Fatalf("item = %v, want plain evidence %v of %s (the host takes no data)", ev, want.Kind, want.Device)
		}
		if answer != nil {
			select {
			case <-answer: // whatever the adapter answers, it does not wait
			case <-c.Done():
				t.Fatal("the source got no answer: the adapter waits for a settlement a host without data never sends")
			}
		}
	})
	t.Run("Commands", func(t *testing.T) {
		h := Start(t, s.Info, s.New(t))
		c := ctx(t)
		info, err := h.Client.Info(c, &pb.InfoRequest{})
		if err != nil {
			t.Fatal(err)
		}
		if s.SetupCommands == nil {
			if info.GetCommands() {
				t.Fatal("Info says commands, but the suite has no SetupCommands")
			}
			_, err := h.Client.Deliver(c, &pb.Command{Id: 1, Device: "x", Topic: "cmd"})
			wantCode(t, err, codes.Unimplemented, "Deliver to an adapter without commands")
			return
		}
		if !info.GetCommands() {
			t.Fatal("Info does not say commands, but the suite has SetupCommands")
		}
		cfg, cc := s.SetupCommands(t)
		_, err = h.Client.Deliver(c, cc.Accept)
		wantCode(t, err, codes.FailedPrecondition, "Deliver before the stream is ready")
		if _, err := h.Open(c, cfg); err != nil {
			t.Fatal(err)
		}
		if cc.Prepare != nil {
			if err := cc.Prepare(c); err != nil {
				t.Fatal(err)
			}
		}
		// The host tries a refused command again: the adapter must take it
		// within a few seconds of Prepare (it may still be reading what
		// Prepare made the device send).
		deadline := time.Now().Add(5 * time.Second)
		for {
			res, err := h.Client.Deliver(c, cc.Accept)
			if err == nil && res.GetAccepted() {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("Deliver(%v) = %v, %v; want accepted", cc.Accept, res, err)
			}
			time.Sleep(50 * time.Millisecond)
		}
		if err := cc.Received(c); err != nil {
			t.Fatalf("the device did not get the command: %v", err)
		}
		res, err := h.Client.Deliver(c, cc.Refuse)
		if err != nil || res.GetAccepted() || res.GetReason() == "" {
			t.Fatalf("Deliver(%v) = %v, %v; want refused with a reason", cc.Refuse, res, err)
		}
	})
}

// recvFrame waits for st's next frame until ctx ends.
func recvFrame(ctx context.Context, st *Stream) (time.Time, error) {
	type got struct {
		at  time.Time
		err error
	}
	ch := make(chan got, 1)
	go func() {
		at, err := st.Frame()
		ch <- got{at, err}
	}()
	select {
	case g := <-ch:
		return g.at, g.err
	case <-ctx.Done():
		return time.Time{}, ctx.Err()
	}
}
