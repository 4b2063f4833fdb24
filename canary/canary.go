package canary

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"sync"
	"sync/atomic"
	"time"

	piondtls "github.com/pion/dtls/v3"
	"github.com/plgd-dev/go-coap/v3/message"
	"github.com/plgd-dev/go-coap/v3/message/codes"
	"github.com/plgd-dev/go-coap/v3/message/pool"
	"github.com/plgd-dev/go-coap/v3/udp/coder"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/fleetgate/fleetgate/gateway"
	"github.com/fleetgate/fleetgate/internal/ctxsleep"
)

// Store is what the canary reads of the store: its shard's event log,
// as the watch API reads it, and its device's record.
type Store interface {
	gateway.EventLog
	Device(ctx context.Context, id gateway.DeviceID) (gateway.DeviceInfo, error)
}

// Options configures a Canary.
type Options struct {
	// Device is the canary's device ID.
	Device gateway.DeviceID
	// Addr is the CoAP listener the canary sends to (host:port).
	Addr string
	// PSK, when set, makes the canary speak DTLS to Addr with Device as
	// its PSK identity; else it sends plain UDP naming itself with d=.
	PSK []byte
	// Plan is the schedule; Plan.GiveUp defaults to twice Plan.Bound.
	Plan  Plan
	Store Store
	// Upstream, if set, reports whether a publisher of this process
	// publishes shard: then the canary also waits for its offline there
	// (Published).
	Upstream func(shard int) bool
	// Logger defaults to discarding.
	Logger *slog.Logger
	// Registerer receives the canary's metrics; nil registers none.
	Registerer prometheus.Registerer
}

// Canary runs the presence canary. Create it with New and run it with
// Run.
type Canary struct {
	o     Options
	shard int
	log   *slog.Logger
	m     *metrics
	up    chan gateway.Event
	msgID atomic.Uint32

	mu     sync.Mutex
	status Status
}

// Status is what the canary has seen, for /v1/status (docs/design.md
// §6.11): its phase, and per path the last detection and the counts.
type Status struct {
	// Phase is "live" (heartbeating) or "stopped" (waiting for its
	// offline); "starting" until the first live phase.
	Phase string `json:"phase"`
	// Since is when the phase began.
	Since   time.Time `json:"since,omitzero"`
	BoundNS int64     `json:"bound_ns"`
	// Paths: "log", and "upstream" once the publisher delivered one.
	Paths map[string]PathStatus `json:"paths,omitempty"`
	// FalseOffline counts offline events while the canary heartbeats.
	FalseOffline uint64 `json:"false_offline"`
}

// PathStatus is the canary's record on one path.
type PathStatus struct {
	// LastDetectionNS is the last detection time (from the last
	// acknowledged heartbeat to the offline event), LastAt when it came.
	LastDetectionNS int64     `json:"last_detection_ns"`
	LastAt          time.Time `json:"last_at"`
	Detected        uint64    `json:"detected"`
	// Late counts detections beyond the bound, Missed the cycles whose
	// offline did not come within twice the bound.
	Late   uint64 `json:"late"`
	Missed uint64 `json:"missed"`
}

// Status returns a copy of what the canary has seen.
func (c *Canary) Status() Status {
	c.mu.Lock()
	defer c.mu.Unlock()
	s := c.status
	s.Paths = maps.Clone(s.Paths)
	return s
}

// note updates the status under its lock.
func (c *Canary) note(f func(s *Status)) {
	c.mu.Lock()
	defer c.mu.Unlock()
	f(&c.status)
}

// notePath updates one path's record.
func (c *Canary) notePath(path Path, f func(p *PathStatus)) {
	c.note(func(s *Status) {
		if s.Paths == nil {
			s.Paths = map[string]PathStatus{}
		}
		p := s.Paths[path.String()]
		f(&p)
		s.Paths[path.String()] = p
	})
}

// notePhase records the phase the canary entered at since.
func (c *Canary) notePhase(p Phase, since time.Time) {
	c.note(func(s *Status) {
		s.Phase, s.Since = "live", since
		if p == Stopped {
			s.Phase = "stopped"
		}
	})
}

// Heartbeat exchange timing: a CON is sent again after ackTimeout, then
// twice as long, maxRetransmit times (RFC 7252 §4.8, without the random
// factor: the gateway is on this host).
const (
	ackTimeout    = 2 * time.Second
	maxRetransmit = 2
	// readBlock is how long one read of the log waits for an event.
	readBlock = time.Second
	// retryWait spaces the store reads that failed.
	retryWait = time.Second
)

// New checks o and returns a canary.
func New(o Options) (*Canary, error) {
	if _, err := gateway.ParseDeviceID(string(o.Device)); err != nil {
		return nil, fmt.Errorf("canary: device: %w", err)
	}
	if o.Addr == "" || o.Store == nil {
		return nil, errors.New("canary: an address and a store are required")
	}
	if o.Plan.Heartbeat <= 0 || o.Plan.Live <= 0 || o.Plan.Bound <= 0 {
		return nil, fmt.Errorf("canary: plan %+v: heartbeat, live and bound must be > 0", o.Plan)
	}
	if o.Plan.GiveUp <= 0 {
		o.Plan.GiveUp = 2 * o.Plan.Bound
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	c := &Canary{
		o: o, shard: gateway.ShardOf(o.Device, o.Store.Shards()),
		log: o.Logger.With("canary", string(o.Device)),
		m:   newMetrics(o.Registerer, o.Plan.Bound, o.Upstream != nil),
		up:  make(chan gateway.Event, 16),
	}
	c.status = Status{Phase: "starting", BoundNS: int64(o.Plan.Bound)}
	return c, nil
}

// Published takes an event the publisher had acknowledged (the
// publisher's OnPublished); it keeps the canary's own and never blocks.
func (c *Canary) Published(e gateway.Event) {
	if e.Device != c.o.Device {
		return
	}
	select {
	case c.up <- e:
	default:
	}
}

// Run plays the canary until ctx ends; it returns nil then.
func (c *Canary) Run(ctx context.Context) error {
	pos, ok := c.position(ctx)
	if !ok {
		return nil
	}
	logEvents := make(chan gateway.Event, 16)
	go c.readLog(ctx, pos, logEvents)
	base, ok := c.ver(ctx)
	if !ok {
		return nil
	}
	p := c.o.Plan
	s := Started(time.Now(), base)
	c.notePhase(s.Phase, s.Since)
	c.log.Info("canary started", "addr", c.o.Addr, "dtls", c.o.PSK != nil, "live", p.Live, "heartbeat", p.Heartbeat, "bound", p.Bound)
	t := time.NewTimer(0)
	defer t.Stop()
	for {
		now := time.Now()
		act, at := Next(s, p, now)
		switch act {
		case Beat:
			ok := c.beat(ctx)
			if ctx.Err() != nil {
				return nil
			}
			if !ok {
				c.m.beatFailures.Inc()
			}
			s = Beaten(s, now, ok)
			continue
		case Stop:
			var expect [paths]bool
			expect[Log] = true
			expect[Upstream] = c.o.Upstream != nil && c.o.Upstream(c.shard)
			s = Halted(s, now, expect)
			c.notePhase(s.Phase, s.Since)
			c.log.Debug("canary stopped; waiting for its offline", "last_heartbeat", s.LastBeat, "upstream", expect[Upstream])
			continue
		case Restart:
			for _, path := range s.Missed() {
				c.m.missed.WithLabelValues(path.String()).Inc()
				c.notePath(path, func(p *PathStatus) { p.Missed++ })
				c.log.Warn("canary: no offline event within the wait; going live again", "path", path.String(), "waited", now.Sub(s.LastBeat), "bound", p.Bound)
			}
			if base, ok = c.ver(ctx); !ok {
				return nil
			}
			s = Started(time.Now(), base)
			c.notePhase(s.Phase, s.Since)
			continue
		}
		t.Reset(time.Until(at))
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		case e := <-logEvents:
			s = c.observe(s, Log, e)
		case e := <-c.up:
			s = c.observe(s, Upstream, e)
		}
		if !t.Stop() {
			select {
			case <-t.C:
			default:
			}
		}
	}
}

// observe judges one event of the canary's device seen on path.
func (c *Canary) observe(s State, path Path, e gateway.Event) State {
	s, out, d := Observe(s, path, e.State == gateway.Offline, e.Ver, time.Now())
	switch out {
	case FalseOffline:
		c.m.falseOffline.Inc()
		c.note(func(s *Status) { s.FalseOffline++ })
		c.log.Warn("canary: offline event while it heartbeats", "path", path.String(), "ver", e.Ver, "reason", e.Reason, "last_heartbeat", s.LastBeat)
	case Detected:
		c.m.detection.WithLabelValues(path.String()).Observe(d.Seconds())
		c.m.last.WithLabelValues(path.String()).Set(d.Seconds())
		c.notePath(path, func(p *PathStatus) {
			p.LastDetectionNS, p.LastAt = int64(d), time.Now()
			p.Detected++
			if d > c.o.Plan.Bound {
				p.Late++
			}
		})
		if d > c.o.Plan.Bound {
			c.log.Warn("canary: offline detected later than the bound", "path", path.String(), "detection", d, "bound", c.o.Plan.Bound, "reason", e.Reason)
		} else {
			c.log.Info("canary: offline detected", "path", path.String(), "detection", d.Round(time.Millisecond), "bound", c.o.Plan.Bound, "reason", e.Reason)
		}
	}
	return s
}

// position reads the current position of the canary's shard, retrying
// until the store answers; false when ctx ended first.
func (c *Canary) position(ctx context.Context) (gateway.Position, bool) {
	for {
		p, err := c.o.Store.SnapshotShard(ctx, c.shard, "", 0)
		if err == nil {
			return p.At, true
		}
		c.log.Debug("canary: read the log position", "err", err)
		if !ctxsleep.Sleep(ctx, retryWait) {
			return gateway.Position{}, false
		}
	}
}

// ver reads the device's ver (0 for a device the store never saw),
// retrying until the store answers; false when ctx ended first.
func (c *Canary) ver(ctx context.Context) (uint64, bool) {
	for {
		d, err := c.o.Store.Device(ctx, c.o.Device)
		switch {
		case err == nil:
			return d.Ver, true
		case errors.Is(err, gateway.ErrNotFound):
			return 0, true
		}
		c.log.Debug("canary: read its device", "err", err)
		if !ctxsleep.Sleep(ctx, retryWait) {
			return 0, false
		}
	}
}

// readLog follows the canary's shard from pos, as the watch API does,
// and sends the canary's events to out. A position the store cannot
// serve any more is replaced by the current one.
func (c *Canary) readLog(ctx context.Context, pos gateway.Position, out chan<- gateway.Event) {
	for ctx.Err() == nil {
		evs, err := c.o.Store.ReadEvents(ctx, c.shard, pos, 100, readBlock)
		if ctx.Err() != nil {
			return
		}
		if err != nil {
			c.log.Warn("canary: read the event log", "err", err)
			if errors.Is(err, gateway.ErrResyncRequired) {
				if pos, _ = c.position(ctx); ctx.Err() != nil {
					return
				}
				continue
			}
			ctxsleep.Sleep(ctx, retryWait)
			continue
		}
		for _, e := range evs {
			pos.ID = e.ID
			if e.Device != c.o.Device {
				continue
			}
			select {
			case out <- e:
			case <-ctx.Done():
				return
			}
		}
	}
}

// beat sends one heartbeat (a CON POST /hb) and reports whether the
// gateway answered it 2.04.
func (c *Canary) beat(ctx context.Context) bool {
	conn, err := c.dial(ctx)
	if err != nil {
		c.log.Warn("canary: heartbeat: connect", "addr", c.o.Addr, "err", err)
		return false
	}
	defer conn.Close()
	id := uint16(c.msgID.Add(1))
	token := make(message.Token, 8)
	_, _ = rand.Read(token)
	m := pool.NewMessage(ctx)
	m.SetType(message.Confirmable)
	m.SetCode(codes.POST)
	m.SetMessageID(int32(id))
	m.SetToken(token)
	_ = m.SetPath("/hb")
	if c.o.PSK == nil {
		m.AddQuery("d=" + string(c.o.Device))
	}
	req, err := m.MarshalWithEncoder(coder.DefaultCoder)
	if err != nil {
		c.log.Warn("canary: heartbeat: encode", "err", err)
		return false
	}
	buf := make([]byte, 1500)
	wait := ackTimeout
	for range maxRetransmit + 1 {
		if _, err := conn.Write(req); err != nil {
			c.log.Warn("canary: heartbeat: send", "err", err)
			return false
		}
		_ = conn.SetReadDeadline(time.Now().Add(wait))
		for {
			n, err := conn.Read(buf)
			if err != nil {
				break // timed out (or a refused port): send again
			}
			a := pool.NewMessage(ctx)
			if _, err := a.UnmarshalWithDecoder(coder.DefaultCoder, buf[:n]); err != nil || string(a.Token()) != string(token) {
				continue
			}
			if a.Code() != codes.Changed {
				c.log.Warn("canary: heartbeat refused", "code", a.Code().String())
				return false
			}
			return true
		}
		if ctx.Err() != nil {
			return false
		}
		wait *= 2
	}
	c.log.Warn("canary: heartbeat unanswered", "addr", c.o.Addr)
	return false
}

// dial opens the canary's connection to its listener: a connected UDP
// socket, or a DTLS session over one.
func (c *Canary) dial(ctx context.Context) (net.Conn, error) {
	raddr, err := net.ResolveUDPAddr("udp", c.o.Addr)
	if err != nil {
		return nil, err
	}
	if c.o.PSK == nil {
		return net.DialUDP("udp", nil, raddr)
	}
	pc, err := net.ListenUDP("udp", nil)
	if err != nil {
		return nil, err
	}
	key := c.o.PSK
	dc, err := piondtls.Client(pc, raddr, &piondtls.Config{
		PSK:             func([]byte) ([]byte, error) { return key, nil },
		PSKIdentityHint: []byte(c.o.Device),
		CipherSuites:    []piondtls.CipherSuiteID{piondtls.TLS_PSK_WITH_AES_128_CCM_8},
	})
	if err != nil {
		pc.Close()
		return nil, err
	}
	hctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := dc.HandshakeContext(hctx); err != nil {
		dc.Close()
		return nil, err
	}
	return dc, nil
}
