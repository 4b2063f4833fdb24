package refusal

import (
	"container/list"
	"context"
	"log/slog"
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/fleetgate/fleetgate/gateway"
	"github.com/fleetgate/fleetgate/internal/promshare"
)

// The log limit and the memory bounds of a Reporter.
const (
	// Every is how often at most a device's refusals for one reason are
	// logged, and how often the summaries of those suppressed are.
	Every = time.Minute
	// MaxKeys bounds the keys (protocol, device, reason) the log limit
	// holds.
	MaxKeys = 4096
	// Burst bounds the lines logged in all every Every, beyond which
	// refusals are summarised per protocol and reason.
	Burst = 100
	// MaxLast bounds the devices whose last refusal is kept, and
	// MaxLastStrangers those among them refused as unknown or for a bad
	// request (claimed IDs that may be junk, kept apart so that a flood
	// of random IDs cannot push out the refusals of real devices).
	MaxLast          = 16384
	MaxLastStrangers = 4096
)

// Reporter is the gateway's gateway.Refusals: it logs a refused device
// at warn level (message "device refused", keys protocol, device,
// reason, detail, remote) as the Limiter allows, and the suppressed ones
// as "device refusals suppressed" (keys protocol, device, reason,
// count; device "*" for many devices); it counts every refusal in
// fleetgate_refused_total{protocol,reason}; and it keeps the last
// refusal of each device for the admin API.
type Reporter struct {
	log     *slog.Logger
	counter *prometheus.CounterVec

	mu        sync.Mutex
	lim       *Limiter
	last      *lastTable // known devices
	strangers *lastTable // unknown_device, bad_request
}

var _ gateway.Refusals = (*Reporter)(nil)

// New returns a Reporter logging to log and registering its counter with
// reg (nil: not registered).
func New(log *slog.Logger, reg prometheus.Registerer) (*Reporter, error) {
	counter, err := promshare.Register(reg, prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "fleetgate_refused_total",
		Help: "Devices refused by a front end (protocol: coap, mqtt or an adapter's name), by reason: unknown_device, bad_credentials, not_authorized, limit, rate, bad_request, revoked, overloaded, error.",
	}, []string{"protocol", "reason"}))
	if err != nil {
		return nil, err
	}
	return &Reporter{
		log: log, counter: counter,
		lim:       NewLimiter(Every, MaxKeys, Burst),
		last:      newLastTable(MaxLast),
		strangers: newLastTable(MaxLastStrangers),
	}, nil
}

// Refuse reports refusal r: counted always, remembered as its device's
// last, logged as the limit allows.
func (p *Reporter) Refuse(r gateway.Refusal) {
	r.Device = Sanitize(r.Device)
	p.counter.WithLabelValues(r.Protocol, r.Reason).Inc()
	p.mu.Lock()
	if r.Reason == gateway.RefusedUnknownDevice || r.Reason == gateway.RefusedBadRequest {
		p.strangers.put(r)
	} else {
		p.last.put(r)
	}
	d := p.lim.Allow(Key{Protocol: r.Protocol, Device: r.Device, Reason: r.Reason}, r.At)
	p.mu.Unlock()
	if d.Suppressed > 0 {
		p.summary(Summary{Key: Key{Protocol: r.Protocol, Device: r.Device, Reason: r.Reason}, Count: d.Suppressed})
	}
	if d.Log {
		p.log.Warn("device refused", "protocol", r.Protocol, "device", r.Device, "reason", r.Reason,
			"detail", r.Detail, "remote", r.Remote)
	}
}

// Last is the last refusal of device (a valid device ID), if one is kept.
func (p *Reporter) Last(device gateway.DeviceID) (gateway.Refusal, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	a, okA := p.last.get(string(device))
	b, okB := p.strangers.get(string(device))
	switch {
	case okA && okB:
		if b.At.After(a.At) {
			return b, true
		}
		return a, true
	case okB:
		return b, true
	}
	return a, okA
}

// Flush logs the summaries due at now.
func (p *Reporter) Flush(now time.Time) {
	p.mu.Lock()
	due := p.lim.Flush(now)
	p.mu.Unlock()
	for _, s := range due {
		p.summary(s)
	}
}

// Run flushes every Every until ctx ends, and once more then.
func (p *Reporter) Run(ctx context.Context) {
	t := time.NewTicker(Every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			p.Flush(time.Now().Add(Every))
			return
		case now := <-t.C:
			p.Flush(now)
		}
	}
}

func (p *Reporter) summary(s Summary) {
	device := s.Key.Device
	if device == "" {
		device = "*"
	}
	p.log.Warn("device refusals suppressed", "protocol", s.Key.Protocol, "device", device, "reason", s.Key.Reason,
		"count", s.Count)
}

// Sanitize makes a claimed device ID fit for a log line: a valid device
// ID as it is; anything else quoted in ASCII (control bytes and
// non-ASCII escaped) and cut to gateway.MaxDeviceIDLen bytes before
// quoting, with "..." after a cut.
func Sanitize(s string) string {
	if _, err := gateway.ParseDeviceID(s); err == nil || s == "" {
		return s
	}
	cut := len(s) > gateway.MaxDeviceIDLen
	if cut {
		s = s[:gateway.MaxDeviceIDLen]
	}
	q := strconv.QuoteToASCII(s)
	q = q[1 : len(q)-1]
	if cut {
		q += "..."
	}
	return q
}

// lastTable keeps the last refusal of at most max devices, dropping the
// least recently refused.
type lastTable struct {
	max  int
	byID map[string]*list.Element // of gateway.Refusal
	lru  list.List
}

func newLastTable(max int) *lastTable {
	return &lastTable{max: max, byID: make(map[string]*list.Element)}
}

func (t *lastTable) put(r gateway.Refusal) {
	if el, ok := t.byID[r.Device]; ok {
		el.Value = r
		t.lru.MoveToFront(el)
		return
	}
	if len(t.byID) >= t.max {
		old := t.lru.Back()
		delete(t.byID, old.Value.(gateway.Refusal).Device)
		t.lru.Remove(old)
	}
	t.byID[r.Device] = t.lru.PushFront(r)
}

func (t *lastTable) get(device string) (gateway.Refusal, bool) {
	if el, ok := t.byID[device]; ok {
		return el.Value.(gateway.Refusal), true
	}
	return gateway.Refusal{}, false
}
