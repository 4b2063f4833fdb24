package refusal

import (
	"bytes"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/fleetgate/fleetgate/gateway"
)

func newReporter(t *testing.T) (*Reporter, *bytes.Buffer, *prometheus.Registry) {
	t.Helper()
	var buf bytes.Buffer
	reg := prometheus.NewRegistry()
	p, err := New(slog.New(slog.NewTextHandler(&buf, nil)), reg)
	if err != nil {
		t.Fatal(err)
	}
	return p, &buf, reg
}

// TestReporterLogsCountsAndRemembers checks the log contract (level
// WARN, "device refused" with protocol, device, reason, remote; the
// summary "device refusals suppressed" with count), the counter, and the
// last refusal per device.
func TestReporterLogsCountsAndRemembers(t *testing.T) {
	p, buf, reg := newReporter(t)
	r := gateway.Refusal{Protocol: "mqtt", Device: "dev-1", Reason: gateway.RefusedBadCredentials,
		Detail: "wrong password", Remote: "127.0.0.1:40000", At: t0}
	for i := range 4 {
		r.At = t0.Add(time.Duration(i) * time.Second)
		p.Refuse(r)
	}
	p.Refuse(gateway.Refusal{Protocol: "coap", Device: "ghost", Reason: gateway.RefusedUnknownDevice, Remote: "127.0.0.1:5", At: t0.Add(5 * time.Second)})
	p.Flush(t0.Add(2 * time.Minute))

	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	want := []string{
		`level=WARN msg="device refused" protocol=mqtt device=dev-1 reason=bad_credentials detail="wrong password" remote=127.0.0.1:40000`,
		`level=WARN msg="device refused" protocol=coap device=ghost reason=unknown_device detail="" remote=127.0.0.1:5`,
		`level=WARN msg="device refusals suppressed" protocol=mqtt device=dev-1 reason=bad_credentials count=3`,
	}
	if len(lines) != len(want) {
		t.Fatalf("log:\n%s\nwant %d lines", buf, len(want))
	}
	for i, w := range want {
		if _, rest, _ := strings.Cut(lines[i], " "); rest != w { // after time=
			t.Errorf("line %d:\n got %s\nwant %s", i, rest, w)
		}
	}
	if got := refusedTotal(t, reg); got["mqtt/bad_credentials"] != 4 || got["coap/unknown_device"] != 1 || len(got) != 2 {
		t.Errorf("fleetgate_refused_total = %v, want mqtt/bad_credentials 4, coap/unknown_device 1", got)
	}
	last, ok := p.Last("dev-1")
	if !ok || last.Detail != "wrong password" || !last.At.Equal(t0.Add(3*time.Second)) {
		t.Errorf("Last(dev-1) = %+v, %v", last, ok)
	}
	if last, ok := p.Last("ghost"); !ok || last.Reason != gateway.RefusedUnknownDevice {
		t.Errorf("Last(ghost) = %+v, %v", last, ok)
	}
	if _, ok := p.Last("dev-2"); ok {
		t.Error("Last(dev-2): a device never refused has a refusal")
	}
}

// TestReporterBoundsMemory refuses 100,000 devices and then a flood of
// random IDs: the tables stay within their bounds, the devices of the
// fleet refused last keep their refusal through the flood, and the log
// stays within the burst per minute.
func TestReporterBoundsMemory(t *testing.T) {
	p, buf, _ := newReporter(t)
	now := t0
	for i := range 100_000 {
		now = now.Add(time.Millisecond)
		p.Refuse(gateway.Refusal{Protocol: "mqtt", Device: fmt.Sprintf("dev-%d", i), Reason: gateway.RefusedBadCredentials, At: now})
	}
	for i := range 200_000 {
		now = now.Add(time.Millisecond)
		p.Refuse(gateway.Refusal{Protocol: "mqtt", Device: fmt.Sprintf("%x\x00\n", uint64(i)*2654435761), Reason: gateway.RefusedUnknownDevice, At: now})
	}
	p.Flush(now.Add(Every))
	if p.last.lru.Len() > MaxLast || len(p.last.byID) > MaxLast || len(p.strangers.byID) > MaxLastStrangers {
		t.Fatalf("last refusals held: %d devices, %d strangers", len(p.last.byID), len(p.strangers.byID))
	}
	if p.lim.Len() > MaxKeys {
		t.Fatalf("limiter holds %d keys", p.lim.Len())
	}
	if _, ok := p.Last("dev-99999"); !ok {
		t.Error("the last device refused lost its refusal to a flood of unknown IDs")
	}
	periods := int(now.Sub(t0)/Every) + 2
	if n := strings.Count(buf.String(), "\n"); n > periods*(Burst+2) {
		t.Fatalf("%d log lines over %d minutes, burst %d", n, periods, Burst)
	}
	if strings.Contains(buf.String(), "\x00") {
		t.Fatal("a NUL of a claimed ID reached the log")
	}
}

func TestSanitize(t *testing.T) {
	for in, want := range map[string]string{
		"dev-1":                  "dev-1",
		"":                       "",
		"a b":                    "a b",
		"bad\nline":              `bad\nline`,
		"\x00\xff":               `\x00\xff`,
		"é":                      `\u00e9`,
		strings.Repeat("x", 200): strings.Repeat("x", gateway.MaxDeviceIDLen) + "...",
		strings.Repeat("x", 128): strings.Repeat("x", 128),
		strings.Repeat("x", 129): strings.Repeat("x", 128) + "...",
		"\"" + "quoted" + "\"":   `\"quoted\"`,
	} {
		if got := Sanitize(in); got != want {
			t.Errorf("Sanitize(%q) = %q, want %q", in, got, want)
		}
	}
}

// FuzzSanitize: whatever a client claims, the result is printable ASCII
// of bounded length, and a valid device ID is kept as it is.
func FuzzSanitize(f *testing.F) {
	f.Fuzz(func(t *testing.T, s string) {
		got := Sanitize(s)
		if len(got) > 4*gateway.MaxDeviceIDLen+3 {
			t.Fatalf("Sanitize(%q) is %d bytes", s, len(got))
		}
		if !utf8.ValidString(got) {
			t.Fatalf("Sanitize(%q) = %q: not UTF-8", s, got)
		}
		for _, c := range []byte(got) {
			if c < 0x20 || c > 0x7e {
				t.Fatalf("Sanitize(%q) = %q: byte %#x", s, got, c)
			}
		}
		if _, err := gateway.ParseDeviceID(s); err == nil && got != s {
			t.Fatalf("Sanitize(%q) = %q: a valid device ID changed", s, got)
		}
	})
}

// refusedTotal is fleetgate_refused_total of reg by "protocol/reason".
func refusedTotal(t *testing.T, reg *prometheus.Registry) map[string]float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, mf := range mfs {
		if mf.GetName() != "fleetgate_refused_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			out[labels["protocol"]+"/"+labels["reason"]] = m.GetCounter().GetValue()
		}
	}
	return out
}

// BenchmarkRefuse is the cost of one refusal on the flood path: the same
// device and reason again and again (suppressed), from all CPUs.
func BenchmarkRefuse(b *testing.B) {
	p, err := New(slog.New(slog.DiscardHandler), prometheus.NewRegistry())
	if err != nil {
		b.Fatal(err)
	}
	r := gateway.Refusal{Protocol: "coap", Device: "dev-1", Reason: gateway.RefusedRate, Remote: "127.0.0.1:5683", At: t0}
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			p.Refuse(r)
		}
	})
}
