package adapter

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/fleetgate/fleetgate/gateway"
	pb "github.com/fleetgate/fleetgate/plugins/proto"
)

// proc supervises one adapter: it starts the process, reads its evidence
// stream, delivers its devices' commands, pings it, and restarts it after
// a crash.
type proc struct {
	h    *Host
	spec Spec
	log  *slog.Logger
	hlog *slogLogger

	ctx    context.Context
	cancel context.CancelFunc
	done   chan struct{}

	first    chan struct{} // closed after the first attempt is ready or failed
	firstErr error
	once     sync.Once

	mu       sync.Mutex
	state    string
	since    time.Time
	pid      int
	restarts int
	lastErr  string
	impl     string
	version  string

	lim      *limiter // guarded by mu
	sessions atomic.Int64
	devices  atomic.Int64
	frames   atomic.Uint64
	accepted atomic.Uint64
	rejected atomic.Uint64
	refused  atomic.Uint64
	dropped  atomic.Uint64
	// read is the gateway-clock time (Unix ns) the adapter made its last
	// frame the host has read and handed on, while its stream is open and
	// the adapter ticks (EvidenceFrame.tick_ms); 0 otherwise (Host.Unread).
	read    atomic.Int64
	ticking atomic.Bool
	data    dataCounts
	cmds    commandCounts

	// reach is the devices commands go to; nil when the host delivers
	// none (Options.Commands nil).
	reach *reach
}

func newProc(h *Host, s Spec) *proc {
	ctx, cancel := context.WithCancel(context.Background())
	log := h.log.With("adapter", s.Name)
	h.metrics.start(s.Name)
	p := &proc{
		h: h, spec: s, log: log, hlog: newSlogLogger(log),
		ctx: ctx, cancel: cancel, done: make(chan struct{}), first: make(chan struct{}),
		state: StateStarting, since: h.o.Clock.Now(),
	}
	if h.o.Commands != nil {
		p.reach = newReach(s.Devices)
	}
	return p
}

func (p *proc) setState(state string, pid int, err error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.state, p.pid, p.since = state, pid, p.h.o.Clock.Now()
	if err != nil {
		p.lastErr = err.Error()
	}
	p.h.metrics.setState(p.spec.Name, state)
}

func (p *proc) firstDone(err error) {
	p.once.Do(func() {
		p.firstErr = err
		close(p.first)
	})
}

func (p *proc) status() Status {
	p.mu.Lock()
	defer p.mu.Unlock()
	return Status{
		Name: p.spec.Name, Path: p.spec.Path, State: p.state, PID: p.pid,
		Restarts: p.restarts, LastError: p.lastErr, Since: p.since,
		Implementation: p.impl, Version: p.version,
		Sessions: int(p.sessions.Load()), Devices: int(p.devices.Load()), Frames: p.frames.Load(),
		Accepted: p.accepted.Load(), Rejected: p.rejected.Load(), Refused: p.refused.Load(), Dropped: p.dropped.Load(),
		DataPublished: p.data.published.Load(), DataRejected: p.data.rejected.Load(), DataRefused: p.data.refused.Load(),
		DataDropped: p.data.dropped.Load(), DataFailed: p.data.failed.Load(), DataDiscarded: p.data.discarded.Load(),
		CommandsDelivered: p.cmds.delivered.Load(), CommandsRefused: p.cmds.refused.Load(), CommandsFailed: p.cmds.failed.Load(),
	}
}

// stop ends the supervisor and the process, and waits for both.
func (p *proc) stop() {
	p.cancel()
	<-p.done
}

// run is the supervisor loop: attempt, and after a crash wait out the
// backoff, until stop.
func (p *proc) run() {
	defer close(p.done)
	defer p.setState(StateStopped, 0, nil)
	var crashes crashLog
	b := p.h.o.Backoff
	for {
		started := p.h.o.Clock.Now()
		err := p.attempt()
		if p.ctx.Err() != nil {
			p.firstDone(errors.New("stopped"))
			return
		}
		wait, failed := b.next(&crashes, started, p.h.o.Clock.Now(), p.h.o.Jitter())
		p.mu.Lock()
		p.restarts++
		p.mu.Unlock()
		p.h.metrics.restarts.WithLabelValues(p.spec.Name).Inc()
		if failed {
			p.setState(StateFailed, 0, err)
			p.log.Error("adapter failed: too many crashes; retrying at the longest backoff",
				"crashes", b.FailAfter, "window", b.FailWindow, "retry_in", wait.Round(time.Millisecond), "err", err)
		} else {
			p.setState(StateBackoff, 0, err)
			p.log.Warn("adapter stopped; restarting after backoff", "retry_in", wait.Round(time.Millisecond), "err", err)
		}
		p.firstDone(err) // after the state: Apply's caller sees the backoff
		t := p.h.o.Clock.NewTimer(wait)
		select {
		case <-t.C():
		case <-p.ctx.Done():
			t.Stop()
			return
		}
	}
}

// attempt starts the adapter once and runs it until it crashes (the
// error says how) or stop.
func (p *proc) attempt() error {
	p.setState(StateStarting, 0, nil)
	s := p.spec
	exe, err := openExecutable(s.Path, s.SHA256)
	if err != nil {
		p.log.Error("adapter refused", "err", err)
		return err
	}
	begin := time.Now()
	proc, err := launch(s, exe, p.h.o.Env, p.hlog)
	exe.Close() // the process has its own descriptor
	if err != nil {
		p.log.Error("adapter did not start", "err", err)
		return err
	}
	defer proc.release()
	ctx, cancel := context.WithCancel(p.ctx)
	defer cancel()
	defer func() {
		p.ticking.Store(false)
		p.read.Store(0)
	}()
	stream, commands, err := p.handshake(ctx, proc, begin)
	if err != nil {
		p.log.Error("adapter did not start", "pid", proc.pid, "err", err)
		return err
	}
	p.setState(StateRunning, proc.pid, nil)
	p.h.metrics.up.WithLabelValues(s.Name).Set(1)
	defer p.h.metrics.up.WithLabelValues(s.Name).Set(0)
	p.log.Info("adapter ready", "pid", proc.pid, "implementation", p.impl, "version", p.version,
		"commands", commands, "startup", time.Since(begin).Round(time.Millisecond))
	p.firstDone(nil)

	if p.reach != nil && commands {
		delivered := make(chan struct{})
		go func() {
			defer close(delivered)
			p.deliverCommands(ctx, proc.adapter)
		}()
		defer func() {
			cancel()
			<-delivered
		}()
	}
	recvErr := make(chan error, 1)
	go func() { recvErr <- p.receive(ctx, proc.adapter, stream) }()
	for {
		t := p.h.o.Clock.NewTimer(p.h.o.HealthInterval)
		select {
		case err := <-recvErr:
			t.Stop()
			if p.ctx.Err() != nil {
				return nil
			}
			if err == nil {
				err = errors.New("the evidence stream ended")
			}
			return fmt.Errorf("adapter process %d: %w", proc.pid, err)
		case <-p.ctx.Done():
			t.Stop()
			p.shutdown(proc)
			cancel()
			<-recvErr
			return nil
		case <-t.C():
			hctx, hcancel := context.WithTimeout(ctx, p.h.o.HealthTimeout)
			_, err := proc.adapter.Health(hctx, &pb.HealthRequest{})
			hcancel()
			if err != nil && p.ctx.Err() == nil {
				// It does not answer: it will not answer a graceful stop either.
				_ = syscall.Kill(proc.pid, syscall.SIGKILL)
				cancel()
				<-recvErr
				return fmt.Errorf("adapter process %d failed its health ping: %w", proc.pid, err)
			}
		}
	}
}

// handshake runs Info, Configure (telling the adapter the host takes
// data) and opens the Evidence stream, and waits for its first (ready)
// frame, all within the start timeout from begin. commands is what Info
// said.
func (p *proc) handshake(ctx context.Context, proc *process, begin time.Time) (stream pb.Adapter_EvidenceClient, commands bool, err error) {
	s := p.spec
	start, cancelStart := context.WithDeadline(ctx, begin.Add(s.StartTimeout))
	defer cancelStart()
	info, err := proc.adapter.Info(start, &pb.InfoRequest{})
	if err != nil {
		return nil, false, fmt.Errorf("info: %w", err)
	}
	p.mu.Lock()
	p.impl, p.version = info.GetName(), info.GetVersion()
	p.mu.Unlock()
	cfg := s.Config
	if len(cfg) == 0 {
		cfg = []byte("{}")
	}
	if _, err := proc.adapter.Configure(start, &pb.ConfigureRequest{Config: cfg, Data: true}); err != nil {
		return nil, false, fmt.Errorf("configure: %w", err)
	}
	stream, err = proc.adapter.Evidence(ctx, &pb.EvidenceRequest{TickMs: uint32(p.h.o.Tick.Milliseconds())})
	if err != nil {
		return nil, false, fmt.Errorf("evidence stream: %w", err)
	}
	type first struct {
		f   *pb.EvidenceFrame
		err error
	}
	got := make(chan first, 1)
	go func() {
		f, err := stream.Recv()
		got <- first{f, err}
	}()
	select {
	case r := <-got:
		if r.err != nil {
			return nil, false, fmt.Errorf("evidence stream: %w", r.err)
		}
		if !r.f.GetReady() {
			return nil, false, errors.New("the first evidence frame is not marked ready")
		}
		p.ticking.Store(p.h.o.Tick > 0 && r.f.GetTickMs() > 0)
		p.accept(ctx, proc.adapter, r.f)
		return stream, info.GetCommands(), nil
	case <-start.Done():
		return nil, false, fmt.Errorf("no ready frame within start_timeout %s", s.StartTimeout)
	}
}

// receive feeds frames to the observer and the data sink until the
// stream ends; client is the adapter's, for settlements.
func (p *proc) receive(ctx context.Context, client pb.AdapterClient, stream pb.Adapter_EvidenceClient) error {
	for {
		f, err := stream.Recv()
		if err != nil {
			if errors.Is(err, io.EOF) {
				return nil
			}
			return err
		}
		if f.GetReady() {
			p.log.Warn("adapter sent a second ready frame; ignoring its flag")
		}
		p.accept(ctx, client, f)
	}
}

// shutdown asks the adapter to stop and flush; the caller then releases
// the process.
func (p *proc) shutdown(proc *process) {
	ctx, cancel := context.WithTimeout(context.Background(), stopGrace)
	defer cancel()
	if _, err := proc.adapter.Shutdown(ctx, &pb.ShutdownRequest{}); err != nil {
		p.log.Warn("adapter shutdown", "err", err)
	}
}

// limiter state lives with the receiving goroutine (one per attempt).
type limiter struct {
	devices  namespace
	rate     *rate
	bytes    *byteRate
	sessions *sessions
	// refusedSince counts the refusals since lastWarned, when the last
	// one was logged at warn level (at most once a minute).
	refusedSince uint64
	lastWarned   time.Time
	// ids caches the session ID of each instance name seen (at most
	// maxCachedInstances), so that an item does not build its
	// "<adapter>/<instance>" string again.
	ids map[string]gateway.SessionID
}

// maxCachedInstances bounds limiter.ids; further instances are named
// item by item.
const maxCachedInstances = 1024

// session returns the session ID of instance for adapter name.
func (l *limiter) session(name, instance string) (gateway.SessionID, error) {
	if id, ok := l.ids[instance]; ok {
		return id, nil
	}
	id, err := gateway.InstanceSessionID(name, instance)
	if err == nil && len(l.ids) < maxCachedInstances {
		l.ids[instance] = id
	}
	return id, err
}

// refusalWarnEvery is how often at most an adapter's refused evidence is
// logged at warn level.
const refusalWarnEvery = time.Minute

// accept turns a frame into evidence for the observer and messages for
// the data sink, item by item: invalid items are rejected, items for
// devices the adapter may not speak for refused, items beyond the limits
// dropped, all counted (once per frame); the stream goes on. The data of
// the accepted items is then published, and the QoS 1 items settled in
// one call to client.
func (p *proc) accept(ctx context.Context, client pb.AdapterClient, f *pb.EvidenceFrame) {
	if f.GetReady() || len(f.GetEvidence()) > 0 {
		p.frames.Add(1) // (not a tick's empty frame)
	}
	l := p.limits()
	creds := p.h.credentials()
	now := p.h.o.Clock.Now()
	// the evidence's ages count from when the frame was made
	sent := now.Add(-frameWait(time.Now(), f.GetSentUnixUs(), p.h.o.Lease))
	var (
		accepted, rejected, refused, dropped, clamped uint64
		out                                           frameData
	)
	tm := p.h.timing.Load()
	for _, e := range f.GetEvidence() {
		ev, msg, err := p.item(l, e, sent, tm)
		if asked := time.Duration(e.GetLeaseMs()) * time.Millisecond; err == nil && ev.Lease < asked {
			clamped++
		}
		if err != nil {
			rejected++
			out.settle(e, pb.Outcome_OUTCOME_REJECTED, err.Error())
			if p.log.Enabled(ctx, slog.LevelDebug) {
				p.log.Debug("evidence rejected", "err", err)
			}
			continue
		}
		if why := l.devices.refusal(ev.Device, creds != nil && creds.Revision(ev.Device) != ""); why != "" {
			refused++
			out.settle(e, pb.Outcome_OUTCOME_REFUSED, "the adapter may not speak for "+string(ev.Device)+": "+why)
			p.warnRefused(l, ev.Device, why, now)
			p.report(ev.Device, gateway.RefusedNotAuthorized, "the adapter may not speak for it (plugins.adapters[].devices): "+why, now)
			continue
		}
		if !l.rate.allow(now) || !l.sessions.admit(sessionKey{ev.Device, ev.Session}, ev.Kind, now, max(ev.Lease, tm.Lease)) {
			dropped++
			out.settle(e, pb.Outcome_OUTCOME_DROPPED, "beyond the adapter's limits (evidence_per_second, max_sessions, max_devices)")
			p.report(ev.Device, gateway.RefusedLimit, "beyond the adapter's limits (evidence_per_second, max_sessions, max_devices)", now)
			continue
		}
		if err := p.h.obs.Observe(ctx, ev); err != nil {
			dropped++
			out.settle(e, pb.Outcome_OUTCOME_DROPPED, "the gateway refused its evidence")
			if ctx.Err() == nil {
				p.log.Debug("evidence refused by the gateway", "device", ev.Device, "session", ev.Session, "err", err)
				p.report(ev.Device, observeRefusal(err), err.Error(), now)
			}
			continue
		}
		accepted++
		if len(e.GetMetadata()) > 0 && p.log.Enabled(ctx, slog.LevelDebug) {
			p.log.Debug("evidence", "device", ev.Device, "session", ev.Session, "metadata", e.GetMetadata())
		}
		switch {
		case e.GetData() == nil:
		case p.h.o.Data == nil:
			out.settle(e, pb.Outcome_OUTCOME_DISCARDED, "the gateway has no data path")
		case !l.bytes.allow(msg.Size(), now):
			out.settle(e, pb.Outcome_OUTCOME_DROPPED, "beyond the adapter's data_bytes_per_second")
		default:
			out.add(msg, e.GetData().GetId())
		}
	}
	if len(out.batches) > 0 {
		p.publish(ctx, &out)
	}
	m := p.h.metrics.of(p.spec.Name)
	if accepted > 0 {
		p.accepted.Add(accepted)
		m.accepted.Add(float64(accepted))
	}
	if rejected > 0 {
		p.rejected.Add(rejected)
		m.rejected.Add(float64(rejected))
	}
	if refused > 0 {
		p.refused.Add(refused)
		m.refused.Add(float64(refused))
	}
	if dropped > 0 {
		p.dropped.Add(dropped)
		m.dropped.Add(float64(dropped))
	}
	if clamped > 0 {
		m.clamped.Add(float64(clamped))
	}
	p.data.add(&out.counts, m)
	p.sessions.Store(int64(l.sessions.len()))
	p.devices.Store(int64(l.sessions.devices()))
	// Every item of the frame is handed on: what the adapter observed
	// before it made the frame has been read (Host.Unread).
	if p.ticking.Load() {
		p.read.Store(sent.UnixNano())
	}
	// Last: what the adapter answers its sources once settled is counted
	// by then.
	if len(out.settled) > 0 {
		p.settle(ctx, client, out.settled)
	}
}

// warnRefused logs a refused item: at warn level at most once every
// refusalWarnEvery (with the count since the last such line), else at
// debug level.
func (p *proc) warnRefused(l *limiter, device gateway.DeviceID, why string, now time.Time) {
	l.refusedSince++
	if !l.lastWarned.IsZero() && now.Sub(l.lastWarned) < refusalWarnEvery {
		p.log.Debug("evidence refused", "device", device, "reason", why)
		return
	}
	p.log.Warn("evidence refused: the adapter may not speak for this device (plugins.adapters[].devices)",
		"device", device, "reason", why, "refused", l.refusedSince, "devices", p.spec.Devices)
	l.lastWarned, l.refusedSince = now, 0
}

// lim holds the limiter of the running supervisor; the limits survive a
// restart of the adapter (so do its sessions).
func (p *proc) limits() *limiter {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.lim == nil {
		var track func(gateway.DeviceID, bool)
		if p.reach != nil {
			track = p.reach.set
		}
		p.lim = &limiter{devices: newNamespace(p.spec.Devices), rate: newRate(p.spec.EvidencePerSecond),
			bytes:    newByteRate(p.spec.DataBytesPerSecond),
			sessions: newSessions(p.spec.MaxSessions, p.spec.MaxDevices, track), ids: make(map[string]gateway.SessionID)}
	}
	return p.lim
}

// item validates one item: its evidence, and its data when it carries
// some (then msg is the data's message); tm grants its lease.
func (p *proc) item(l *limiter, e *pb.Evidence, now time.Time, tm *gateway.Timing) (ev gateway.Evidence, msg gateway.Message, err error) {
	ev, err = p.evidence(l, e, now, tm)
	if err != nil || e.GetData() == nil {
		return ev, msg, err
	}
	msg, err = p.message(ev, e.GetData())
	return ev, msg, err
}

// evidence validates one item's evidence and grants its lease: its own
// (lease_ms), else the adapter's (Spec.Lease), within tm (Grant); 0 when
// it has neither (the table's).
func (p *proc) evidence(l *limiter, e *pb.Evidence, now time.Time, tm *gateway.Timing) (gateway.Evidence, error) {
	dev, err := gateway.ParseDeviceID(e.GetDevice())
	if err != nil {
		return gateway.Evidence{}, err
	}
	sess, err := l.session(p.spec.Name, e.GetInstance())
	if err != nil {
		return gateway.Evidence{}, err
	}
	var kind gateway.Kind
	switch e.GetKind() {
	case pb.Kind_KIND_CONNECT:
		kind = gateway.Connect
	case pb.Kind_KIND_RENEW:
		kind = gateway.Renew
	case pb.Kind_KIND_LEAVE:
		kind = gateway.Leave
	default:
		return gateway.Evidence{}, fmt.Errorf("unknown evidence kind %v", e.GetKind())
	}
	lease := cmp.Or(time.Duration(e.GetLeaseMs())*time.Millisecond, p.spec.Lease)
	if lease > 0 {
		lease = tm.Grant(lease)
	}
	at, err := observedAt(now, e.GetAgeUs(), max(lease, p.h.o.Lease))
	if err != nil {
		return gateway.Evidence{}, err
	}
	return gateway.Evidence{Device: dev, Session: sess, Kind: kind, ObservedAt: at, Protocol: p.spec.Name, Lease: lease}, nil
}

// frameWait is how long a frame made at sentUs (the adapter's wall clock,
// Unix µs; 0: unknown) waited on its way to the host, which read it at
// wall: the adapter runs on this machine, on the same clock. A wait
// outside [0, lease] (a clock stepped between the two readings) counts as
// none.
func frameWait(wall time.Time, sentUs int64, lease time.Duration) time.Duration {
	if sentUs <= 0 {
		return 0
	}
	w := wall.Sub(time.UnixMicro(sentUs))
	if w < 0 || w > lease {
		return 0
	}
	return w
}

// observedAt is when evidence received at now, ageUs microseconds old,
// was observed: never after now (a negative age counts as 0). An age
// beyond maxAge (the lease) is an error: such evidence says nothing about
// the device now, and it bounds the age far below what a time.Duration
// holds, so that the conversion cannot wrap around into the future.
func observedAt(now time.Time, ageUs int64, maxAge time.Duration) (time.Time, error) {
	if ageUs <= 0 {
		return now, nil
	}
	if ageUs > maxAge.Microseconds() {
		return time.Time{}, fmt.Errorf("age_us %d is beyond the lease (%s)", ageUs, maxAge)
	}
	return now.Add(-time.Duration(ageUs) * time.Microsecond), nil
}

// report reports a refusal of device's evidence from this adapter.
func (p *proc) report(device gateway.DeviceID, reason, detail string, now time.Time) {
	p.h.o.Refusals.Refuse(gateway.Refusal{Protocol: p.spec.Name, Device: string(device), Reason: reason, Detail: detail, At: now})
}

// observeRefusal is the gateway's reason for evidence the Observer
// refused with err.
func observeRefusal(err error) string {
	switch {
	case errors.Is(err, gateway.ErrOverloaded):
		return gateway.RefusedOverloaded
	case errors.Is(err, gateway.ErrSessionLimit), errors.Is(err, gateway.ErrAnonymousLimit):
		return gateway.RefusedLimit
	case errors.Is(err, gateway.ErrInvalidDeviceID), errors.Is(err, gateway.ErrInvalidSessionID):
		return gateway.RefusedBadRequest
	}
	return gateway.RefusedError
}
