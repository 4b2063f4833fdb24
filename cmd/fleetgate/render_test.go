package main

import (
	"bytes"
	"encoding/json"
	"flag"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/fleetgate/fleetgate/admin"
	"github.com/fleetgate/fleetgate/gateway"
)

var update = flag.Bool("update", false, "rewrite the CLI's golden files in testdata")

// golden compares got with testdata/name.golden (rewritten with -update).
func golden(t *testing.T, name, got string) {
	t.Helper()
	path := filepath.Join("testdata", name+".golden")
	if *update {
		if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run go test -run %s -update)", err, t.Name())
	}
	if got != string(want) {
		t.Fatalf("output differs from %s (go test -update rewrites it):\n--- got\n%s--- want\n%s", path, got, want)
	}
}

var goldenNow = time.Date(2026, 11, 30, 22, 57, 16, 0, time.UTC)

// statusJSON is a /v1/status as a gateway with a Redis store answers it.
const statusJSON = `{
  "adapters": [],
  "bounds": {"earliest_offline": "5s", "heartbeat_margin": "900ms", "suspect": "3s", "worst_case_detection": "6.1s"},
  "epoch": 1796079184,
  "fleet": {"online": 1180, "offline": 64, "suspect": 3},
  "gateway": "gwa",
  "runner": {"cycles": 2839, "last_event": "2026-11-30T22:57:12.714Z", "last_lag_ns": 21000000, "owner": "gwa/1796079184",
    "reap_calls": 5678, "reap_errors": 0, "reaped": 146, "shards": [2, 3], "trimmed": 0},
  "sessions": 12,
  "shards": 4,
  "started_at": "2026-11-30T21:53:04.632810608Z",
  "store": "redis",
  "uplink": {"dropped": {"fenced": 0, "lapsed": 3, "overflow": 0, "rejected": 0}, "outbox_oldest_age_ns": 80000000000,
    "outbox_sessions": 2, "pending": 0, "since": "2026-11-30T22:57:13.702228733Z", "up": false}
}`

func TestStatusGolden(t *testing.T) {
	var st map[string]any
	dec := json.NewDecoder(strings.NewReader(statusJSON))
	dec.UseNumber()
	if err := dec.Decode(&st); err != nil {
		t.Fatal(err)
	}
	var b bytes.Buffer
	if err := renderStatus(&b, st, goldenNow, time.UTC); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	for _, bad := range []string{"e+", "map[", "_ns"} {
		if strings.Contains(out, bad) {
			t.Errorf("status shows %q:\n%s", bad, out)
		}
	}
	golden(t, "status", out)
}

func TestGatewaysGolden(t *testing.T) {
	l := admin.GatewayList{Now: goldenNow, Gateways: []gateway.GatewayInfo{
		{ID: "gwa", Epoch: 1796079184, Contact: goldenNow.Add(-120 * time.Millisecond), Sessions: 48211},
		{ID: "gwb", Epoch: 1796070001, Contact: goldenNow.Add(-3 * time.Second), Behind: true, Sessions: 7},
		{ID: "gwc", Epoch: 1795000000, Contact: goldenNow.Add(-26 * time.Hour), Lost: true},
	}}
	var b bytes.Buffer
	if err := renderGateways(&b, l); err != nil {
		t.Fatal(err)
	}
	golden(t, "gateways", b.String())
}

func testDevice() admin.Device {
	return admin.Device{
		DeviceInfo: gateway.DeviceInfo{
			Device: "dev-1", State: gateway.Online, Deadline: goldenNow.Add(87 * time.Second), Ver: 3,
			Since: goldenNow.Add(-3 * time.Second), Gateway: "gwa", Session: "coap/default",
			Sessions: []gateway.SessionInfo{
				{ID: "coap/default", Deadline: goldenNow.Add(87 * time.Second), Gateway: "gwa", Epoch: 1796079184},
				{ID: "gwb/mqtt", Deadline: goldenNow.Add(12 * time.Second), Gateway: "gwb", Epoch: 7},
			},
		},
		State: gateway.Suspect,
	}
}

func TestDeviceGolden(t *testing.T) {
	var b bytes.Buffer
	if err := renderDevice(&b, testDevice(), goldenNow, time.UTC); err != nil {
		t.Fatal(err)
	}
	d := admin.Device{DeviceInfo: gateway.DeviceInfo{Device: "dev-2", State: gateway.Offline, Ver: 2, Since: goldenNow.Add(-2 * time.Hour)}, State: gateway.Offline}
	if err := renderDevice(&b, d, goldenNow, time.UTC); err != nil {
		t.Fatal(err)
	}
	golden(t, "device", b.String())
}

func TestDeviceListGolden(t *testing.T) {
	off := admin.Device{DeviceInfo: gateway.DeviceInfo{Device: "dev-2", State: gateway.Offline, Ver: 2, Since: goldenNow.Add(-90 * time.Minute)}, State: gateway.Offline}
	on := testDevice()
	on.State = gateway.Online
	page := admin.DevicePage{Devices: []admin.Device{testDevice(), off, on}, Next: "2:dev-9"}
	var b bytes.Buffer
	if err := renderDeviceList(&b, page, "fleetgate devices list --state online", goldenNow, time.UTC); err != nil {
		t.Fatal(err)
	}
	page = admin.DevicePage{Devices: []admin.Device{off}}
	if err := renderDeviceList(&b, page, "fleetgate devices list", goldenNow, time.UTC); err != nil {
		t.Fatal(err)
	}
	golden(t, "devices_list", b.String())
}

func TestEventsGolden(t *testing.T) {
	evs := []gateway.Event{
		{Device: "dev-1", State: gateway.Online, Ver: 1, At: goldenNow.Add(-5 * time.Second), Reason: gateway.ReasonConnect, Gateway: "gwa", Session: "coap/default"},
		{Device: "dev-1", State: gateway.Offline, Ver: 2, At: goldenNow, Reason: gateway.ReasonExpired, Gateway: "gwa", Session: "coap/default", Deadline: goldenNow.Add(-21 * time.Millisecond)},
		{State: gateway.Lost, Ver: 1796079436000, At: goldenNow, Gateway: "gwb", Contact: goldenNow.Add(-4100 * time.Millisecond)},
		{State: gateway.Back, Ver: 1796079436001, At: goldenNow.Add(time.Second), Gateway: "gwb", Contact: goldenNow.Add(time.Second)},
	}
	var plain, color strings.Builder
	for _, e := range evs {
		plain.WriteString(fmtEvent(e, time.UTC, false) + "\n")
		color.WriteString(fmtEvent(e, time.UTC, true) + "\n")
	}
	if strings.Contains(plain.String(), "\x1b[") {
		t.Fatalf("colour without a terminal: %q", plain.String())
	}
	golden(t, "events", plain.String())
	golden(t, "events_color", color.String())
	// What the command writes to is not a terminal here (a pipe, a
	// buffer): no colour.
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	defer w.Close()
	if colorTerminal(w) || colorTerminal(io.Discard) {
		t.Fatal("colour on a pipe")
	}
}

func TestFmtAge(t *testing.T) {
	for d, want := range map[time.Duration]string{
		21 * time.Millisecond: "21ms", 3 * time.Second: "3s", 2 * time.Minute: "2m", 80 * time.Second: "1m20s",
		90 * time.Minute: "1h30m", 2 * time.Hour: "2h", 2*time.Hour + 29*time.Second: "2h", 26 * time.Hour: "26h",
	} {
		if got := fmtAge(d); got != want {
			t.Errorf("fmtAge(%v) = %q, want %q", d, got, want)
		}
	}
}

// FuzzRenderStatus renders any JSON object /v1/status might answer, as a
// newer or older gateway may: never a panic or an error.
func FuzzRenderStatus(f *testing.F) {
	f.Add(statusJSON)
	f.Add(`{"epoch": 1e300, "uplink": {"outbox_oldest_age_ns": -5, "x_ns": 1.5}, "adapters": [{"name": "lora", "up": true}, 3]}`)
	f.Add(`{"a": [[1, 2], {"b": null}], "t": "2026-11-30T22:57:16Z", "n": 12345678901234567890}`)
	f.Fuzz(func(t *testing.T, body string) {
		var st map[string]any
		dec := json.NewDecoder(strings.NewReader(body))
		dec.UseNumber()
		if dec.Decode(&st) != nil {
			return
		}
		var b bytes.Buffer
		if err := renderStatus(&b, st, goldenNow, time.UTC); err != nil {
			t.Fatal(err)
		}
	})
}
