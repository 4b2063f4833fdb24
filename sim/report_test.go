package sim

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/fleetgate/fleetgate/sim/check"
)

// The report's JSON carries the fields docs/benchmarks.md and the
// simulator's users read, under those names.
func TestReportJSONFields(t *testing.T) {
	r := Report{Devices: 3, HeartbeatsSent: 40, FalseOffline: 1, MissedOffline: 2, LogViolations: 3,
		Detection: check.Percentiles{N: 2, P50: 10, P99: 20, Max: 30}, BoundMS: 7100, StoreCallsPerHeartbeat: 1.5}
	b, err := json.Marshal(r)
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	for k, want := range map[string]float64{"devices": 3, "heartbeats_sent": 40, "false_offline": 1, "missed_offline": 2,
		"log_violations": 3, "bound_ms": 7100, "store_calls_per_heartbeat": 1.5} {
		if got, ok := m[k].(float64); !ok || got != want {
			t.Errorf("%s = %v, want %v", k, m[k], want)
		}
	}
	det, _ := m["detection_ms"].(map[string]any)
	for k, want := range map[string]float64{"p50": 10, "p99": 20, "max": 30} {
		if got, ok := det[k].(float64); !ok || got != want {
			t.Errorf("detection_ms.%s = %v, want %v", k, det[k], want)
		}
	}
}

// A report fails, and its table says FAIL, when any count that must be
// zero is not; otherwise it says OK.
func TestReportFailedAndTable(t *testing.T) {
	for _, tc := range []struct {
		name string
		r    Report
		fail string // the table row marked FAIL, "" for none
	}{
		{"clean", Report{Devices: 10}, ""},
		{"false offline", Report{Devices: 10, FalseOffline: 1}, "false offline"},
		{"missed offline", Report{Devices: 10, MissedOffline: 2, LateOffline: 1}, "missed offline"},
		{"log violations", Report{Devices: 10, LogViolations: 1}, "log violations"},
		{"missed online", Report{Devices: 10, MissedOnline: 1}, "missed online"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := tc.r.Failed(); got != (tc.fail != "") {
				t.Fatalf("Failed() = %v", got)
			}
			var b bytes.Buffer
			tc.r.WriteTable(&b)
			out := b.String()
			failRow := regexp.MustCompile(`(?m)^(false offline|missed offline|log violations|missed online) .*FAIL`).FindAllStringSubmatch(out, -1)
			if tc.fail == "" {
				if len(failRow) != 0 || !strings.HasSuffix(out, "\nOK\n") {
					t.Fatalf("table:\n%s", out)
				}
				return
			}
			if len(failRow) != 1 || failRow[0][1] != tc.fail || !strings.Contains(out, "\nFAIL: ") {
				t.Fatalf("want the %s row failed, table:\n%s", tc.fail, out)
			}
		})
	}
}

// The live progress line: redrawn with \r for a terminal, one timestamped
// line each second for a log.
func TestProgressLine(t *testing.T) {
	for _, lines := range []bool{false, true} {
		t.Run(map[bool]string{false: "terminal", true: "lines"}[lines], func(t *testing.T) {
			t.Parallel()
			s := newStats(time.Second)
			s.sent.Add(7)
			s.answered.Add(5)
			s.connected.Add(2)
			var b bytes.Buffer
			o := Options{Progress: &b, ProgressLines: lines, Duration: 3 * time.Second}
			ctx, cancel := context.WithTimeout(context.Background(), 2500*time.Millisecond) // ticks at 1 s and 2 s
			defer cancel()
			o.progress(ctx, time.Now(), s)
			out := b.String()
			// a loaded machine may delay the second tick past the end
			n := strings.Count(out, "sent 7  acked 5  mqtt connected 2")
			if n < 1 || n > 2 {
				t.Fatalf("%d progress lines in %q, want 1 or 2", n, out)
			}
			if lines {
				if strings.Contains(out, "\r") || !regexp.MustCompile(`^(\d\d:\d\d:\d\d\.\d{3} .*\n)+$`).MatchString(out) || strings.Count(out, "\n") != n {
					t.Fatalf("lines: %q", out)
				}
			} else if strings.Contains(out, "\n") || strings.Count(out, "\r") != n {
				t.Fatalf("terminal: %q", out)
			}
		})
	}
}

// Connect errors are counted by message, at most maxErrorKinds of them
// (the rest as "other"), and listed under the summary's MQTT connects.
func TestConnectErrorKinds(t *testing.T) {
	s := newStats(time.Second)
	s.connectError(errors.New("connack 137 Server busy"))
	s.connectError(errors.New("connack 137 Server busy"))
	for i := range maxErrorKinds + 2 {
		s.connectError(fmt.Errorf("dial tcp 127.0.0.1:%d: connect: connection refused", 1000+i))
	}
	n := s.snapshot()
	if n.ConnectErrors != maxErrorKinds+4 || len(n.ConnectErrorKinds) != maxErrorKinds+1 ||
		n.ConnectErrorKinds["connack 137 Server busy"] != 2 || n.ConnectErrorKinds["other"] != 3 {
		t.Fatalf("snapshot %d errors, kinds %v", n.ConnectErrors, n.ConnectErrorKinds)
	}
	var b bytes.Buffer
	Report{Devices: 1, Fleet: n}.WriteTable(&b)
	if !regexp.MustCompile(`(?m)^mqtt connects +0 +\(12 failed\)\n +2 +connack 137 Server busy$`).MatchString(b.String()) ||
		!regexp.MustCompile(`(?m)^ +3 +other$`).MatchString(b.String()) {
		t.Fatalf("table:\n%s", b.String())
	}
}

// A fleet of mixed periods is judged per period too: a device's
// detection is that of its lease, which its period decides when leases
// are learned.
func TestReportByPeriod(t *testing.T) {
	t0 := time.UnixMilli(1_700_000_000_000)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	plans := []DevicePlan{{ID: "fast", Period: time.Second}, {ID: "slow", Period: 20 * time.Second}, {ID: "slow2", Period: 20 * time.Second}}
	sess := func(times ...int) []check.Session {
		s := check.Session{ID: "coap/default"}
		for _, ms := range times {
			s.Evidence = append(s.Evidence, at(ms))
		}
		s.LastSent = s.Evidence[len(s.Evidence)-1]
		return []check.Session{s}
	}
	devices := []check.Device{
		{ID: "fast", Period: 1100 * time.Millisecond, Sessions: sess(0, 1000, 2000)},
		{ID: "slow", Period: 22 * time.Second, Sessions: sess(0, 20_000)},
		{ID: "slow2", Period: 22 * time.Second, Active: true, Sessions: sess(0, 20_000, 40_000)},
	}
	events := []check.Event{
		{Device: "fast", State: "online", Ver: 1, At: at(10)}, {Device: "fast", State: "offline", Ver: 2, At: at(6000), Reason: "expired"},
		{Device: "slow", State: "online", Ver: 1, At: at(10)}, {Device: "slow", State: "offline", Ver: 2, At: at(81_000), Reason: "expired"},
		{Device: "slow2", State: "online", Ver: 1, At: at(10)}, {Device: "slow2", State: "offline", Ver: 2, At: at(30_000), Reason: "expired"},
		{Device: "slow2", State: "online", Ver: 3, At: at(40_010)},
	}
	p := check.Params{Lease: 4 * time.Second, RenewEvery: time.Second, Bound: 70 * time.Second, Tolerance: 200 * time.Millisecond, End: at(200_000)}
	o := Options{Periods: []time.Duration{time.Second, 20 * time.Second}, Lease: 4 * time.Second, MaxLease: 66 * time.Second}
	r := newReport(o, plans, devices, events, p, check.Compare(devices, events, p), Snapshot{}, time.Minute)
	want := []PeriodResult{
		{Period: "1s", Devices: 1, Stopped: 1, Detection: check.Percentiles{N: 1, P50: 4000, P99: 4000, Max: 4000}},
		{Period: "20s", Devices: 2, Stopped: 1, FalseOffline: 1, Detection: check.Percentiles{N: 1, P50: 61_000, P99: 61_000, Max: 61_000}},
	}
	if fmt.Sprint(r.ByPeriod) != fmt.Sprint(want) {
		t.Fatalf("by period:\n%+v\nwant\n%+v", r.ByPeriod, want)
	}
	if r.Params.MaxLease != "1m6s" || fmt.Sprint(r.Params.Periods) != "[1s 20s]" {
		t.Fatalf("params %+v", r.Params)
	}
	var b bytes.Buffer
	r.WriteTable(&b)
	if !regexp.MustCompile(`(?m)^\s*20s\s+2\s+1\s+1\s+0\s+0\s+0\s+61000\s+61000\s+61000\s*$`).MatchString(b.String()) {
		t.Fatalf("table has no row for 20s:\n%s", b.String())
	}
}
