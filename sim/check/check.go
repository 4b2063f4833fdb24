// Package check compares what a simulated fleet did (the truth) with the
// presence events fleetgate wrote (the log), and counts the differences
// that the invariants of docs/design.md §7 forbid. It is pure: no I/O, no clock; everything it
// judges comes in as arguments.
package check

import (
	"cmp"
	"slices"
	"sort"
	"time"
)

// Session is one attachment of a device as the device saw it: the times
// of the evidence the gateway acknowledged, the last moment the gateway
// may have seen evidence of it (a request sent, a connection closed), and
// the time of its clean leave, if it ended with one.
type Session struct {
	ID string
	// Evidence are the acknowledged evidence times, ascending: a CoAP
	// request answered 2.04, an MQTT CONNACK or PUBACK.
	Evidence []time.Time
	// LastSent is the latest moment the gateway may have taken evidence
	// of the session: the last request sent, or the connection's close.
	// It is never before the last Evidence.
	LastSent time.Time
	// Left is when the session's clean leave (CoAP DELETE, MQTT
	// DISCONNECT) was sent; zero when it had none.
	Left time.Time
}

// Device is one device's truth. Active devices were still sending when
// the run ended, so nothing says when they should go offline.
type Device struct {
	ID       string
	Sessions []Session
	Active   bool
	// Period, when not 0, is the longest gap the device leaves between
	// two messages while it keeps its schedule: evidence newer than it
	// keeps the device online too, whatever the lease, for a device
	// that keeps its period must never be reported offline.
	Period time.Duration `json:",omitempty"`
}

// Event is one presence event as read from the log (docs/design.md §3.4).
type Event struct {
	Device   string
	State    string // "online" or "offline"
	Ver      uint64
	At       time.Time // store clock
	Reason   string
	Gateway  string
	Session  string
	Deadline time.Time
}

// Params are the timings the checker judges against.
type Params struct {
	// Lease and RenewEvery are the gateways' presence.lease and
	// presence.renew_every: evidence newer than Lease − RenewEvery keeps
	// a device online whatever the throttle did.
	Lease, RenewEvery time.Duration
	// Bound is the worst-case detection: an offline event must come no
	// later than Bound after a device's last evidence (or its leave).
	Bound time.Duration
	// Tolerance absorbs the skew between the simulator's clock and the
	// store's and the time a message spends in flight.
	Tolerance time.Duration
	// OnlineBound is how long a device's online event may take after
	// its first acknowledged evidence (the gateways' flush interval and
	// processing): a device without one whose first evidence is younger
	// than OnlineBound at End is pending, not missed online.
	OnlineBound time.Duration
	// End is when the log was last read: a device whose bound ends after
	// it is pending, not missed.
	End time.Time
}

// Result is the comparison. The first three counts must be zero.
type Result struct {
	Devices       int `json:"devices"`
	FalseOffline  int `json:"false_offline"`
	MissedOffline int `json:"missed_offline"`
	LogViolations int `json:"log_violations"`
	// MissedOnline counts devices whose evidence was acknowledged but
	// that never got an online event.
	MissedOnline int `json:"missed_online"`
	// LateOffline counts the missed offline events that did come, but
	// after the bound (they are part of MissedOffline).
	LateOffline int `json:"late_offline"`
	// Pending counts stopped devices whose bound had not passed at End,
	// and devices whose online event may still come.
	Pending   int          `json:"pending"`
	Stopped   int          `json:"stopped"`
	Detection Percentiles  `json:"detection_ms"`
	BoundMS   int64        `json:"bound_ms"`
	Events    int          `json:"events"`
	Examples  []Finding    `json:"examples,omitempty"`
	ByKind    map[Kind]int `json:"-"`
}

// Percentiles of detection lags in milliseconds.
type Percentiles struct {
	N   int   `json:"n"`
	P50 int64 `json:"p50"`
	P99 int64 `json:"p99"`
	Max int64 `json:"max"`
}

// Kind names a finding.
type Kind string

const (
	FalseOffline  Kind = "false_offline"
	MissedOffline Kind = "missed_offline"
	LateOffline   Kind = "late_offline"
	MissedOnline  Kind = "missed_online"
	LogViolation  Kind = "log_violation"
)

// Finding is one difference, for the report's examples.
type Finding struct {
	Kind   Kind   `json:"kind"`
	Device string `json:"device"`
	Detail string `json:"detail"`
}

// maxExamples bounds the findings a Result keeps.
const maxExamples = 20

// Compare judges events against the truth of devices. Events of devices
// not in devices are ignored (another run's, or another fleet's).
func Compare(devices []Device, events []Event, p Params) Result {
	byDev := make(map[string][]Event, len(devices))
	known := make(map[string]bool, len(devices))
	for _, d := range devices {
		known[d.ID] = true
	}
	r := Result{Devices: len(devices), BoundMS: p.Bound.Milliseconds(), ByKind: map[Kind]int{}}
	for _, e := range events {
		if known[e.Device] {
			byDev[e.Device] = append(byDev[e.Device], e)
			r.Events++
		}
	}
	var lags []time.Duration
	for _, d := range devices {
		evs := byDev[d.ID]
		slices.SortStableFunc(evs, func(a, b Event) int {
			if c := cmp.Compare(a.Ver, b.Ver); c != 0 {
				return c
			}
			return a.At.Compare(b.At)
		})
		findings, pending := judge(d, evs, p, &lags)
		for _, f := range findings {
			r.ByKind[f.Kind]++
			if len(r.Examples) < maxExamples {
				r.Examples = append(r.Examples, f)
			}
		}
		if !d.Active {
			r.Stopped++
		}
		if pending {
			r.Pending++
		}
	}
	r.FalseOffline = r.ByKind[FalseOffline]
	r.MissedOffline = r.ByKind[MissedOffline] + r.ByKind[LateOffline]
	r.LateOffline = r.ByKind[LateOffline]
	r.MissedOnline = r.ByKind[MissedOnline]
	r.LogViolations = r.ByKind[LogViolation]
	r.Detection = percentiles(lags)
	return r
}

// Failed reports whether any count that must be zero is not.
func (r Result) Failed() bool {
	return r.FalseOffline > 0 || r.MissedOffline > 0 || r.LogViolations > 0 || r.MissedOnline > 0
}

// judge returns the findings of one device, and whether its online or
// offline event is still to come inside its bound; its events are in
// ver order. It appends the device's detection lag to lags when it has
// one.
func judge(d Device, evs []Event, p Params, lags *[]time.Duration) (_ []Finding, pending bool) {
	var out []Finding
	add := func(k Kind, format string, args ...any) {
		out = append(out, Finding{Kind: k, Device: d.ID, Detail: sprintf(format, args...)})
	}
	out = append(out, logViolations(d.ID, evs)...)

	for _, e := range evs {
		if e.State != "offline" {
			continue
		}
		if s, t, ok := aliveAt(d, e.At, p); ok {
			add(FalseOffline, "offline (%s, ver %d) at %s while session %s had evidence at %s (%s before)",
				e.Reason, e.Ver, ms(e.At), s, ms(t), e.At.Sub(t).Round(time.Millisecond))
		}
	}

	var first time.Time // the first acknowledged evidence
	for _, s := range d.Sessions {
		if len(s.Evidence) > 0 && (first.IsZero() || s.Evidence[0].Before(first)) {
			first = s.Evidence[0]
		}
	}
	acked := !first.IsZero()
	online := false
	for _, e := range evs {
		online = online || e.State == "online"
	}
	if acked && !online {
		if first.Add(p.OnlineBound).After(p.End) {
			return out, true // its online may still be on its way
		}
		add(MissedOnline, "evidence acknowledged at %s but no online event", ms(first))
	}

	if d.Active {
		return out, false
	}
	stop := StopTime(d)
	if stop.IsZero() || !acked && len(evs) == 0 {
		return out, false // never sent anything, or nothing the gateway took
	}
	if stop.Add(p.Bound).After(p.End) && !hasOfflineAfter(evs, stop, p) {
		return out, true // its bound has not passed
	}
	last, ok := lastEvent(evs)
	switch {
	case !ok || last.State != "offline" || last.At.Before(stop.Add(-p.Tolerance)):
		add(MissedOffline, "stopped at %s; no offline event after it (last event: %s)", ms(stop), describe(last, ok))
	default:
		lag := last.At.Sub(stop)
		*lags = append(*lags, max(lag, 0))
		if lag > p.Bound+p.Tolerance {
			add(LateOffline, "stopped at %s; offline (%s) only %s later, bound %s", ms(stop), last.Reason, lag.Round(time.Millisecond), p.Bound)
		}
	}
	return out, false
}

// StopTime is when a stopped device's last session ended: the latest of
// its sessions' leaves or last sends. Zero if it never sent anything.
func StopTime(d Device) time.Time {
	var stop time.Time
	for _, s := range d.Sessions {
		end := s.LastSent
		if !s.Left.IsZero() && s.Left.After(end) {
			end = s.Left
		}
		if end.After(stop) {
			stop = end
		}
	}
	return stop
}

// aliveAt reports a session that kept d online at t: d was covered both
// at t and at t − Tolerance, so the event cannot be explained by a new
// session that raced a rightful offline.
func aliveAt(d Device, t time.Time, p Params) (string, time.Time, bool) {
	if _, _, ok := covered(d, t.Add(-p.Tolerance), p); !ok {
		return "", time.Time{}, false
	}
	return covered(d, t, p)
}

// covered reports a session of d that had acknowledged evidence at or
// before x, newer than max(Lease − RenewEvery, d.Period) − Tolerance,
// and no leave between that evidence and x.
func covered(d Device, x time.Time, p Params) (string, time.Time, bool) {
	window := max(p.Lease-p.RenewEvery, d.Period) - p.Tolerance
	for _, s := range d.Sessions {
		i := sort.Search(len(s.Evidence), func(i int) bool { return s.Evidence[i].After(x) })
		if i == 0 {
			continue
		}
		ev := s.Evidence[i-1]
		if x.Sub(ev) >= window {
			continue
		}
		if !s.Left.IsZero() && !s.Left.After(x) {
			continue
		}
		return s.ID, ev, true
	}
	return "", time.Time{}, false
}

func hasOfflineAfter(evs []Event, stop time.Time, p Params) bool {
	last, ok := lastEvent(evs)
	return ok && last.State == "offline" && !last.At.Before(stop.Add(-p.Tolerance))
}

func lastEvent(evs []Event) (Event, bool) {
	if len(evs) == 0 {
		return Event{}, false
	}
	return evs[len(evs)-1], true
}

// logViolations checks one device's events, in ver order: versions
// strictly increase and never repeat, states alternate starting with
// online, and while the device is online its record lives, so the
// offline that ends it has the next version.
func logViolations(dev string, evs []Event) []Finding {
	var out []Finding
	add := func(format string, args ...any) {
		out = append(out, Finding{Kind: LogViolation, Device: dev, Detail: sprintf(format, args...)})
	}
	for i, e := range evs {
		if e.State != "online" && e.State != "offline" {
			add("ver %d: state %q", e.Ver, e.State)
			continue
		}
		if i == 0 {
			if e.State != "online" {
				add("first event is %s (ver %d), want online", e.State, e.Ver)
			}
			continue
		}
		prev := evs[i-1]
		switch {
		case e.Ver == prev.Ver:
			add("ver %d repeated (%s at %s and %s at %s)", e.Ver, prev.State, ms(prev.At), e.State, ms(e.At))
		case e.State == prev.State:
			add("%s twice in a row (ver %d then %d)", e.State, prev.Ver, e.Ver)
		case prev.State == "online" && e.Ver != prev.Ver+1:
			add("ver gap: online ver %d then offline ver %d", prev.Ver, e.Ver)
		}
	}
	return out
}

func percentiles(lags []time.Duration) Percentiles {
	if len(lags) == 0 {
		return Percentiles{}
	}
	slices.Sort(lags)
	at := func(q float64) int64 {
		i := int(q*float64(len(lags))+0.999999) - 1
		return lags[min(max(i, 0), len(lags)-1)].Milliseconds()
	}
	return Percentiles{N: len(lags), P50: at(0.50), P99: at(0.99), Max: lags[len(lags)-1].Milliseconds()}
}
