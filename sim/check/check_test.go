package check_test

import (
	"testing"
	"time"

	"pgregory.net/rapid"

	"github.com/fleetgate/fleetgate/sim/check"
)

var t0 = time.UnixMilli(1_700_000_000_000)

func at(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }

// every returns evidence times from..to (ms) every step ms.
func every(from, to, step int) []time.Time {
	var out []time.Time
	for t := from; t <= to; t += step {
		out = append(out, at(t))
	}
	return out
}

func session(id string, from, to, step int) check.Session {
	ev := every(from, to, step)
	return check.Session{ID: id, Evidence: ev, LastSent: ev[len(ev)-1]}
}

var params = check.Params{Lease: 4 * time.Second, RenewEvery: time.Second, Bound: 5 * time.Second, Tolerance: 200 * time.Millisecond, End: at(60_000)}

func ev(dev, state string, ver uint64, ms int, reason string) check.Event {
	return check.Event{Device: dev, State: state, Ver: ver, At: at(ms), Reason: reason}
}

func TestCompare(t *testing.T) {
	for _, tc := range []struct {
		name   string
		dev    check.Device
		events []check.Event
		want   map[check.Kind]int
		lag    int64 // detection ms, -1 for none
	}{
		{
			name:   "frozen device detected inside the bound",
			dev:    check.Device{ID: "d", Sessions: []check.Session{session("coap/default", 0, 10_000, 1000)}},
			events: []check.Event{ev("d", "online", 1, 20, "connect"), ev("d", "offline", 2, 14_100, "expired")},
			lag:    4100,
		},
		{
			name:   "active device with only an online",
			dev:    check.Device{ID: "d", Active: true, Sessions: []check.Session{session("coap/default", 0, 50_000, 1000)}},
			events: []check.Event{ev("d", "online", 7, 20, "connect")},
			lag:    -1,
		},
		{
			name: "offline while sending is false",
			dev:  check.Device{ID: "d", Active: true, Sessions: []check.Session{session("coap/default", 0, 50_000, 1000)}},
			events: []check.Event{ev("d", "online", 1, 20, "connect"), ev("d", "offline", 2, 20_500, "leave"),
				ev("d", "online", 3, 21_100, "connect")},
			want: map[check.Kind]int{check.FalseOffline: 1},
			lag:  -1,
		},
		{
			name: "offline after the other session left, while this one sends, is false",
			dev: check.Device{ID: "d", Sessions: []check.Session{
				{ID: "a", Evidence: every(0, 10_000, 1000), LastSent: at(10_000), Left: at(10_010)},
				session("b", 9_900, 30_000, 1000),
			}},
			events: []check.Event{ev("d", "online", 1, 20, "connect"), ev("d", "offline", 2, 10_050, "leave"),
				ev("d", "online", 3, 10_100, "connect"), ev("d", "offline", 4, 34_000, "expired")},
			want: map[check.Kind]int{check.FalseOffline: 1},
			lag:  4100, // from its last evidence at 29,900
		},
		{
			name:   "offline after a clean leave is right",
			dev:    check.Device{ID: "d", Sessions: []check.Session{{ID: "a", Evidence: every(0, 10_000, 1000), LastSent: at(10_000), Left: at(10_500)}}},
			events: []check.Event{ev("d", "online", 1, 20, "connect"), ev("d", "offline", 2, 10_700, "leave")},
			lag:    200,
		},
		{
			name:   "no offline after the device stopped is missed",
			dev:    check.Device{ID: "d", Sessions: []check.Session{session("a", 0, 10_000, 1000)}},
			events: []check.Event{ev("d", "online", 1, 20, "connect")},
			want:   map[check.Kind]int{check.MissedOffline: 1},
			lag:    -1,
		},
		{
			name:   "an offline after the bound is late",
			dev:    check.Device{ID: "d", Sessions: []check.Session{session("a", 0, 10_000, 1000)}},
			events: []check.Event{ev("d", "online", 1, 20, "connect"), ev("d", "offline", 2, 16_000, "expired")},
			want:   map[check.Kind]int{check.LateOffline: 1},
			lag:    6000,
		},
		{
			name: "a visit that left no trace misses both events",
			dev:  check.Device{ID: "d", Sessions: []check.Session{{ID: "m", Evidence: []time.Time{at(5000)}, LastSent: at(5010), Left: at(5020)}}},
			want: map[check.Kind]int{check.MissedOffline: 1, check.MissedOnline: 1},
			lag:  -1,
		},
		{
			name:   "a stopped device whose bound has not passed is pending",
			dev:    check.Device{ID: "d", Sessions: []check.Session{session("a", 0, 58_000, 1000)}},
			events: []check.Event{ev("d", "online", 1, 20, "connect")},
			lag:    -1,
		},
		{
			name: "repeated ver, two onlines, a gap while online",
			dev:  check.Device{ID: "d", Active: true, Sessions: []check.Session{session("a", 0, 50_000, 1000)}},
			events: []check.Event{ev("d", "online", 1, 20, "connect"), ev("d", "online", 1, 30, "connect"),
				ev("d", "online", 2, 40, "replay")},
			want: map[check.Kind]int{check.LogViolation: 2},
			lag:  -1,
		},
		{
			name: "a gap from online to offline breaks the log; after an offline it may jump",
			dev:  check.Device{ID: "d", Sessions: []check.Session{{ID: "a", Evidence: every(0, 3000, 1000), LastSent: at(3000), Left: at(3000)}, {ID: "b", Evidence: every(20_000, 30_000, 1000), LastSent: at(30_000)}}},
			events: []check.Event{ev("d", "online", 1, 20, "connect"), ev("d", "offline", 2, 3100, "leave"),
				ev("d", "online", 900, 20_010, "connect"), ev("d", "offline", 902, 34_100, "expired")},
			want: map[check.Kind]int{check.LogViolation: 1},
			lag:  4100,
		},
		{
			// a device that sends every 20 s under a lease of 4 s: the
			// offline between two of its messages is false, whatever the
			// lease (its period is known)
			name: "offline between two messages of a device that keeps its period is false",
			dev: check.Device{ID: "d", Active: true, Period: 22 * time.Second,
				Sessions: []check.Session{session("coap/default", 0, 40_000, 20_000)}},
			events: []check.Event{ev("d", "online", 1, 20, "connect"), ev("d", "offline", 2, 4_500, "expired"),
				ev("d", "online", 3, 20_010, "connect")},
			want: map[check.Kind]int{check.FalseOffline: 1},
			lag:  -1,
		},
		{
			name: "a period within the lease changes nothing",
			dev: check.Device{ID: "d", Period: 1100 * time.Millisecond,
				Sessions: []check.Session{session("coap/default", 0, 10_000, 1000)}},
			events: []check.Event{ev("d", "online", 1, 20, "connect"), ev("d", "offline", 2, 14_100, "expired")},
			lag:    4100,
		},
		{
			name:   "the first event is an offline",
			dev:    check.Device{ID: "d", Sessions: []check.Session{session("a", 0, 10_000, 1000)}},
			events: []check.Event{ev("d", "offline", 1, 14_000, "expired")},
			want:   map[check.Kind]int{check.LogViolation: 1, check.MissedOnline: 1},
			lag:    4000,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// another device's events never count
			evs := append(tc.events, ev("other", "offline", 1, 100, "expired"))
			r := check.Compare([]check.Device{tc.dev}, evs, params)
			for _, k := range []check.Kind{check.FalseOffline, check.MissedOffline, check.LateOffline, check.MissedOnline, check.LogViolation} {
				if r.ByKind[k] != tc.want[k] {
					t.Errorf("%s = %d, want %d (findings %+v)", k, r.ByKind[k], tc.want[k], r.Examples)
				}
			}
			if tc.lag < 0 && r.Detection.N != 0 || tc.lag >= 0 && (r.Detection.N != 1 || r.Detection.Max != tc.lag) {
				t.Errorf("detection %+v, want lag %d", r.Detection, tc.lag)
			}
			if r.Failed() != (len(tc.want) > 0) {
				t.Errorf("Failed() = %v with findings %+v", r.Failed(), r.Examples)
			}
		})
	}
}

func TestPercentiles(t *testing.T) {
	var devs []check.Device
	var evs []check.Event
	for i := range 100 {
		id := string(rune('A'+i/26)) + string(rune('a'+i%26))
		devs = append(devs, check.Device{ID: id, Sessions: []check.Session{session("s", 0, 1000, 1000)}})
		evs = append(evs, ev(id, "online", 1, 10, "connect"), ev(id, "offline", 2, 1000+3000+i*10, "expired"))
	}
	r := check.Compare(devs, evs, params)
	if r.Detection != (check.Percentiles{N: 100, P50: 3490, P99: 3980, Max: 3990}) {
		t.Fatalf("detection %+v", r.Detection)
	}
	if r.Stopped != 100 || r.Events != 200 || r.Failed() {
		t.Fatalf("result %+v", r)
	}
}

// A model of a correct presence service over random fleets: the checker
// finds nothing in its log; each kind of damage to that log is found.
func TestPropertyCorrectLogPassesDamageIsFound(t *testing.T) {
	rapid.Check(t, func(rt *rapid.T) {
		p := params
		hb := rapid.IntRange(200, 2500).Draw(rt, "heartbeat_ms") // < lease − renew_every − tolerance
		n := rapid.IntRange(1, 8).Draw(rt, "devices")
		var devs []check.Device
		var evs []check.Event
		stopped := -1
		for i := range n {
			id := "dev-" + string(rune('a'+i))
			start := rapid.IntRange(0, 5000).Draw(rt, "start")
			end := rapid.IntRange(start, 40_000).Draw(rt, "end")
			leave := rapid.Bool().Draw(rt, "leave")
			active := !leave && rapid.Bool().Draw(rt, "active")
			if active {
				end = 55_000
			}
			s := session("s", start, end, hb)
			stop := s.LastSent
			if leave {
				s.Left = stop.Add(time.Duration(rapid.IntRange(1, hb).Draw(rt, "leave_after")) * time.Millisecond)
				stop = s.Left
			}
			d := check.Device{ID: id, Sessions: []check.Session{s}, Active: active}
			ver := rapid.Uint64Range(1, 1<<40).Draw(rt, "ver")
			evs = append(evs, check.Event{Device: id, State: "online", Ver: ver, At: s.Evidence[0].Add(5 * time.Millisecond)})
			if !active {
				stopped = len(devs)
				lag := p.Bound
				if !leave {
					// expiry: no earlier than lease − renew_every
					lag = time.Duration(rapid.Int64Range(int64(p.Lease-p.RenewEvery), int64(p.Bound)).Draw(rt, "lag"))
				} else {
					lag = time.Duration(rapid.Int64Range(0, int64(p.Bound)).Draw(rt, "lag"))
				}
				evs = append(evs, check.Event{Device: id, State: "offline", Ver: ver + 1, At: stop.Add(lag)})
			}
			devs = append(devs, d)
		}
		r := check.Compare(devs, evs, p)
		if r.Failed() || r.LateOffline != 0 {
			rt.Fatalf("a correct log was judged wrong: %+v", r.Examples)
		}

		switch rapid.IntRange(0, 2).Draw(rt, "damage") {
		case 0: // an offline in the middle of an active device's evidence
			d := devs[0]
			s := d.Sessions[0]
			if len(s.Evidence) < 3 {
				return
			}
			mid := s.Evidence[len(s.Evidence)/2].Add(10 * time.Millisecond)
			if !s.Left.IsZero() && !mid.Before(s.Left) {
				return
			}
			bad := append(append([]check.Event{}, evs...), check.Event{Device: d.ID, State: "offline", Ver: 1 << 50, At: mid})
			if r := check.Compare(devs, bad, p); r.FalseOffline == 0 {
				rt.Fatalf("an offline at %v while sending was not found", mid)
			}
		case 1: // a stopped device's offline is lost
			if stopped < 0 {
				return
			}
			var bad []check.Event
			for _, e := range evs {
				if !(e.Device == devs[stopped].ID && e.State == "offline") {
					bad = append(bad, e)
				}
			}
			if r := check.Compare(devs, bad, p); r.MissedOffline != 1 {
				rt.Fatalf("missed_offline %d, want 1", r.MissedOffline)
			}
		case 2: // an event written twice under one ver
			bad := append(append([]check.Event{}, evs...), evs[0])
			if r := check.Compare(devs, bad, p); r.LogViolations == 0 {
				rt.Fatal("a repeated (device, ver) was not found")
			}
		}
	})
}

// A stopped device is pending until its bound passes or its offline is
// in; a device the gateway never answered is never waited for.
func TestPending(t *testing.T) {
	stopped := check.Device{ID: "d", Sessions: []check.Session{session("a", 0, 58_000, 1000)}}
	unanswered := check.Device{ID: "u", Sessions: []check.Session{{ID: "a", LastSent: at(58_000)}}}
	online := []check.Event{ev("d", "online", 1, 20, "connect")}
	if r := check.Compare([]check.Device{stopped, unanswered}, online, params); r.Pending != 1 || r.Failed() {
		t.Fatalf("before the bound: %+v", r)
	}
	done := append(online, ev("d", "offline", 2, 62_000, "expired"))
	if r := check.Compare([]check.Device{stopped, unanswered}, done, params); r.Pending != 0 || r.Failed() || r.Detection.N != 1 {
		t.Fatalf("offline in: %+v", r)
	}
	late := params
	late.End = at(70_000)
	if r := check.Compare([]check.Device{stopped, unanswered}, online, late); r.Pending != 0 || r.MissedOffline != 1 {
		t.Fatalf("after the bound: %+v", r)
	}
}

// A device whose online event has not come is pending while its first
// evidence is younger than OnlineBound (a connect in the gateway's last
// flush interval when the log was read), then missed online.
func TestPendingOnline(t *testing.T) {
	fresh := check.Device{ID: "f", Active: true, Sessions: []check.Session{session("mqtt#1", 59_500, 59_500, 1000)}}
	p := params
	p.OnlineBound = time.Second
	if r := check.Compare([]check.Device{fresh}, nil, p); r.Pending != 1 || r.MissedOnline != 0 || r.Failed() {
		t.Fatalf("inside the online bound: %+v", r)
	}
	if r := check.Compare([]check.Device{fresh}, []check.Event{ev("f", "online", 1, 59_900, "connect")}, p); r.Pending != 0 || r.Failed() {
		t.Fatalf("online in: %+v", r)
	}
	p.End = at(60_600)
	if r := check.Compare([]check.Device{fresh}, nil, p); r.Pending != 0 || r.MissedOnline != 1 {
		t.Fatalf("after the online bound: %+v", r)
	}
	p.OnlineBound = 0
	p.End = at(60_000)
	if r := check.Compare([]check.Device{fresh}, nil, p); r.Pending != 0 || r.MissedOnline != 1 {
		t.Fatalf("no online bound: %+v", r)
	}
}
