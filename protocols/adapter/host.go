// Package adapter is the gateway's host of adapter plugins (docs/design.md §6.9):
// a protocol front end beside protocols/coap and protocols/mqtt whose
// devices speak through separate processes. Each configured adapter runs
// under hashicorp/go-plugin (gRPC, AutoMTLS, the contract of
// plugins/proto); the host turns its evidence frames into
// gateway.Evidence for a gateway.Observer, with sessions named
// "<adapter>/<instance>", hands the data its devices send to a
// gateway.DataSink (settling each QoS 1 item back to the adapter once the
// sink has answered), and delivers the commands pending in
// gateway.Commands for the devices it speaks for.
//
// The host supervises every adapter: one that exits, or fails its health
// ping, is restarted with jittered exponential backoff (Backoff), and a
// crash ends no session — the adapter's sessions keep their leases, so
// they survive a quick restart and expire normally if it stays down.
// Each adapter speaks only for the devices of its Spec.Devices, and never
// for a device of the devices file (SetCredentials); it is held to its
// limits (evidence per second, sessions, devices, data bytes per second).
// Evidence for another device is refused, evidence beyond the limits
// dropped, evidence with an invalid device or instance rejected, each
// counted, while the stream stays up. No adapter outlives the gateway:
// see launch.
package adapter

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"reflect"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/fleetgate/fleetgate/gateway"
)

// Defaults of Options.
const (
	DefaultStartTimeout   = 10 * time.Second
	DefaultHealthInterval = 10 * time.Second
	DefaultHealthTimeout  = 5 * time.Second
	// stopGrace bounds the Shutdown call when an adapter is stopped.
	stopGrace = 5 * time.Second
)

// Spec is one configured adapter (plugins.adapters[i]).
type Spec struct {
	// Name names the adapter in sessions ("<name>/<instance>"), logs,
	// metrics and status. It must be a valid device-ID-shaped token.
	Name string
	// Path is the adapter executable.
	Path string
	// SHA256 is the executable's expected sha256 in hex, checked on the
	// open file that is then executed; "" checks no sum (the file and its
	// directories are checked all the same: openExecutable).
	SHA256 string
	// StartTimeout bounds the handshake, Info, Configure and the first
	// (ready) frame; 0 means DefaultStartTimeout.
	StartTimeout time.Duration
	// Lease is the lease of the adapter's evidence that carries none of
	// its own (lease_ms 0), granted as an evidence lease is; 0: the
	// table's (presence.lease, or the learned one).
	Lease time.Duration
	// Devices are the device IDs the adapter may speak for: an entry
	// ending in "*" is a prefix ("*" alone: every ID), any other one
	// exact ID. None: no device. A device of the devices file is never
	// the adapter's.
	Devices []string
	// MaxSessions bounds the adapter's live sessions; 0 is unlimited.
	MaxSessions int
	// MaxDevices bounds the devices with a live session of the adapter;
	// 0 is unlimited.
	MaxDevices int
	// MaxAddressSpace (bytes, RLIMIT_AS) and MaxOpenFiles (RLIMIT_NOFILE)
	// are OS limits of the adapter process, soft and hard, set once the
	// plugin handshake is done and before Configure; 0 leaves the limit
	// the process inherited.
	MaxAddressSpace int64
	MaxOpenFiles    int
	// EvidencePerSecond bounds the evidence taken from the adapter, with
	// a burst of as many; 0 is unlimited. An item with data is one piece
	// of evidence.
	EvidencePerSecond int
	// DataBytesPerSecond bounds the data taken from the adapter, in bytes
	// as gateway.Message.Size counts them, with a burst of as many (an
	// item larger than the burst passes when none was spent); 0 is
	// unlimited. Data beyond it is dropped, its evidence still counts.
	DataBytesPerSecond int
	// Config is the adapter's config subtree as JSON, passed to Configure.
	Config []byte
}

// Options configure a Host.
type Options struct {
	// Lease is how long a session counts against MaxSessions after its
	// last evidence when the evidence has no lease of its own
	// (presence.lease), and the bound on an evidence's age. MaxLease is
	// presence.max_lease: an evidence's lease (lease_ms, or its adapter's
	// Spec.Lease) is granted within [Lease, MaxLease]
	// (gateway.Timing.Grant), a longer one cut to MaxLease and counted.
	// SetTiming replaces both.
	Lease, MaxLease time.Duration
	// Clock stamps evidence and drives backoff and health pings; nil
	// means gateway.SystemClock.
	Clock gateway.Clock
	// Logger receives the host's messages and the adapters' logs (under
	// "adapter"); nil discards.
	Logger *slog.Logger
	// Registerer receives the host's metrics; nil registers none.
	Registerer prometheus.Registerer
	// Refusals takes the refusals of devices: evidence for a device the
	// adapter may not speak for, beyond its limits, or refused by the
	// gateway (protocol: the adapter's name); nil discards them.
	Refusals gateway.Refusals
	// HealthInterval and HealthTimeout drive the health ping; 0 means the
	// defaults.
	HealthInterval time.Duration
	HealthTimeout  time.Duration
	// Backoff is the restart policy; the zero value means DefaultBackoff.
	Backoff Backoff
	// Env is the adapters' environment; nil means DefaultEnv.
	Env []string
	// Jitter returns a number in [0, 1) for the backoff's jitter; nil
	// means math/rand.
	Jitter func() float64
	// Data takes the data the adapters' devices send (Source: the
	// adapter's name); nil keeps none: data items are counted discarded
	// (their evidence still counts) and QoS 1 items settled so.
	Data gateway.DataSink
	// Commands holds the commands the host delivers to the adapters that
	// take them; nil delivers none.
	Commands gateway.Commands
	// Tick, when not 0, is how often the host asks each adapter for a
	// frame (EvidenceRequest.tick_ms; an empty one when it has nothing to
	// send), so that Unread knows what it has not read; the gateway asks
	// for half a flush interval. 0 asks for none.
	Tick time.Duration
}

// Unread returns the time before which every adapter that ticks
// (Options.Tick, EvidenceFrame.tick_ms) has had what it observed read and
// handed on: the made time of its last frame read, the oldest over them;
// zero when none ticks. Evidence an adapter observed later may be in its
// stream, unread: the gateway starved of CPU reads its frames late, and
// its coverage (gateway.Batch.Covers) must not pass it. An adapter whose
// stream has stopped (it no longer ticks: stuck, or blocked on its own
// settlements) holds it back as well; the caller bounds how far.
func (h *Host) Unread() time.Time {
	h.mu.Lock()
	defer h.mu.Unlock()
	var oldest int64
	for _, p := range h.procs {
		if !p.ticking.Load() {
			continue
		}
		if at := p.read.Load(); at > 0 && (oldest == 0 || at < oldest) {
			oldest = at
		}
	}
	if oldest == 0 {
		return time.Time{}
	}
	return time.Unix(0, oldest)
}

// Host runs the configured adapters. Create it with New, give it the
// adapter list with Apply (at start and at every reload), and end it with
// Close.
type Host struct {
	obs     gateway.Observer
	o       Options
	log     *slog.Logger
	metrics *metrics

	creds  atomic.Pointer[gateway.Credentials]
	timing atomic.Pointer[gateway.Timing]

	mu     sync.Mutex
	procs  map[string]*proc
	closed bool
}

// New returns a Host that feeds obs.
func New(obs gateway.Observer, o Options) (*Host, error) {
	if obs == nil {
		return nil, errors.New("adapter host: no observer")
	}
	if o.Clock == nil {
		o.Clock = gateway.SystemClock{}
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	if o.Refusals == nil {
		o.Refusals = gateway.NoRefusals{}
	}
	if o.HealthInterval <= 0 {
		o.HealthInterval = DefaultHealthInterval
	}
	if o.HealthTimeout <= 0 {
		o.HealthTimeout = DefaultHealthTimeout
	}
	if o.Backoff == (Backoff{}) {
		o.Backoff = DefaultBackoff
	}
	if o.Env == nil {
		o.Env = DefaultEnv
	}
	if o.Jitter == nil {
		o.Jitter = rand.Float64
	}
	m, err := newMetrics(o.Registerer)
	if err != nil {
		return nil, err
	}
	h := &Host{obs: obs, o: o, log: o.Logger, metrics: m, procs: make(map[string]*proc)}
	h.timing.Store(&gateway.Timing{Lease: o.Lease, MaxLease: o.MaxLease})
	return h, nil
}

// Apply makes the running adapters those of specs: new ones start,
// removed ones stop, changed ones restart, the others are untouched. It
// returns once every adapter it started has completed its first attempt
// (ready, or failed and now in backoff), so that their sessions exist
// before the gateway says it is ready; the error joins the failed first
// attempts (they are retried with backoff all the same).
func (h *Host) Apply(ctx context.Context, specs []Spec) error {
	h.mu.Lock()
	if h.closed {
		h.mu.Unlock()
		return errors.New("adapter host: closed")
	}
	want := make(map[string]Spec, len(specs))
	for _, s := range specs {
		if s.StartTimeout <= 0 {
			s.StartTimeout = DefaultStartTimeout
		}
		want[s.Name] = s
	}
	var stop []*proc
	for name, p := range h.procs {
		if s, ok := want[name]; !ok || !reflect.DeepEqual(s, p.spec) {
			stop = append(stop, p)
			delete(h.procs, name)
		}
	}
	var started []*proc
	for _, s := range specs {
		if _, ok := h.procs[s.Name]; ok {
			continue
		}
		s = want[s.Name]
		p := newProc(h, s)
		h.procs[s.Name] = p
		started = append(started, p)
	}
	h.mu.Unlock()

	var wg sync.WaitGroup
	for _, p := range stop {
		wg.Go(func() {
			p.stop()
			if _, again := want[p.spec.Name]; !again {
				h.metrics.forget(p.spec.Name)
			}
			h.log.Info("adapter stopped", "adapter", p.spec.Name)
		})
	}
	wg.Wait()
	var errs []error
	for _, p := range started {
		go p.run()
	}
	for _, p := range started {
		select {
		case <-p.first:
			if err := p.firstErr; err != nil {
				errs = append(errs, fmt.Errorf("adapter %s: %w", p.spec.Name, err))
			}
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return errors.Join(errs...)
}

// Status is one adapter as the admin API and `fleetgate status` show it.
type Status struct {
	Name string `json:"name"`
	Path string `json:"path"`
	// State is starting, running, backoff, failed or stopped.
	State     string    `json:"state"`
	PID       int       `json:"pid,omitempty"`
	Restarts  int       `json:"restarts"`
	LastError string    `json:"last_error,omitempty"`
	Since     time.Time `json:"since"`
	// Implementation and Version are what the adapter's Info said.
	Implementation string `json:"implementation,omitempty"`
	Version        string `json:"version,omitempty"`
	Sessions       int    `json:"sessions"`
	// Devices counts the devices with a live session of the adapter
	// (tracked while MaxSessions or MaxDevices is set).
	Devices int `json:"devices"`
	// Frames counts evidence frames received: the evidence counters'
	// sum over Frames is the adapter's batching.
	Frames   uint64 `json:"frames"`
	Accepted uint64 `json:"evidence_accepted"`
	Rejected uint64 `json:"evidence_rejected"`
	// Refused counts evidence for devices the adapter may not speak for.
	Refused uint64 `json:"evidence_refused"`
	Dropped uint64 `json:"evidence_dropped"`
	// Data counts the data items: published (handed to the data path,
	// durable for QoS 1), rejected (invalid, or refused by the data path
	// as such), refused (a device the adapter may not speak for),
	// dropped (beyond the limits), failed (the data path failed) and
	// discarded (no data path).
	DataPublished uint64 `json:"data_published"`
	DataRejected  uint64 `json:"data_rejected"`
	DataRefused   uint64 `json:"data_refused"`
	DataDropped   uint64 `json:"data_dropped"`
	DataFailed    uint64 `json:"data_failed"`
	DataDiscarded uint64 `json:"data_discarded"`
	// Commands counts deliveries: delivered (the adapter took the
	// command), refused (it said why not), failed (an error, no answer in
	// time); refused and failed commands stay pending.
	CommandsDelivered uint64 `json:"commands_delivered"`
	CommandsRefused   uint64 `json:"commands_refused"`
	CommandsFailed    uint64 `json:"commands_failed"`
}

// States of an adapter.
const (
	StateStarting = "starting"
	StateRunning  = "running"
	StateBackoff  = "backoff"
	StateFailed   = "failed"
	StateStopped  = "stopped"
)

// Status lists the adapters by name.
func (h *Host) Status() []Status {
	h.mu.Lock()
	procs := make([]*proc, 0, len(h.procs))
	for _, p := range h.procs {
		procs = append(procs, p)
	}
	h.mu.Unlock()
	out := make([]Status, 0, len(procs))
	for _, p := range procs {
		out = append(out, p.status())
	}
	slices.SortFunc(out, func(a, b Status) int {
		switch {
		case a.Name < b.Name:
			return -1
		case a.Name > b.Name:
			return 1
		}
		return 0
	})
	return out
}

// Serve returns when ctx ends; the adapters run from Apply to Close. It
// lets the host stand with the other front ends.
func (h *Host) Serve(ctx context.Context) error {
	<-ctx.Done()
	return nil
}

// SetTiming takes the presence timing of a reload: the leases of evidence
// observed after it are granted within its lease and max_lease (adapters
// pace their devices themselves: no heartbeat is asked of them).
func (h *Host) SetTiming(t gateway.Timing) { h.timing.Store(&t) }

// SetCredentials hands over the devices file: evidence from then on for a
// device it lists is refused (such a device authenticates itself over
// CoAP or MQTT). c may be nil: no device is listed. Sessions an adapter
// already holds end at their lease.
func (h *Host) SetCredentials(c gateway.Credentials) {
	if c == nil {
		h.creds.Store(nil)
		return
	}
	h.creds.Store(&c)
}

// credentials is the devices file in use, nil for none.
func (h *Host) credentials() gateway.Credentials {
	if c := h.creds.Load(); c != nil {
		return *c
	}
	return nil
}

// Close stops every adapter (Shutdown, then the process ends) and waits.
// Their sessions are left to their leases.
func (h *Host) Close() error {
	h.mu.Lock()
	h.closed = true
	procs := h.procs
	h.procs = map[string]*proc{}
	h.mu.Unlock()
	var wg sync.WaitGroup
	for _, p := range procs {
		wg.Go(p.stop)
	}
	wg.Wait()
	return nil
}
