package main

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/fleetgate/fleetgate/internal/redistest"
)

// fleetCountsOf reads the fleet's counts of /v1/status through `fleetgate
// status --json`.
func fleetCountsOf(t *testing.T, g *gatewayProc) (online, offline int64, ok bool) {
	t.Helper()
	code, out, _ := runCLI(t, "status", "--addr", g.admin, "--json")
	var st struct {
		Fleet *struct {
			Online  *int64 `json:"online"`
			Offline *int64 `json:"offline"`
			Error   string `json:"error"`
		} `json:"fleet"`
	}
	if code != 0 || json.Unmarshal([]byte(out), &st) != nil || st.Fleet == nil || st.Fleet.Online == nil || st.Fleet.Offline == nil {
		return 0, 0, false
	}
	return *st.Fleet.Online, *st.Fleet.Offline, true
}

// The fleet's counts are the store's, whichever gateway is asked: two
// gateways on one real Redis, an MQTT device (mosquitto_pub, a sleepy
// MQTT 5 session) on one and CoAP devices (coap-client) on the other;
// /v1/status, `fleetgate status` and fleetgate_fleet_devices of both
// count all of them, and follow a leave.
func TestE2EFleetCounts(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	tm := visitTiming
	a := newGateway(t, "gw-ca", srv.Addr, tm)
	b := newGateway(t, "gw-cb", srv.Addr, tm)
	a.start()
	b.start()
	host, port, _ := strings.Cut(a.mqttAddr, ":")
	runTool(t, "mosquitto_pub", "-h", host, "-p", port, "-i", "dev-cm", "-t", "devices/dev-cm/temp", "-m", "1", "-q", "1", "-V", "mqttv5", "-x", "3600")
	runTool(t, coapClient(t), "-m", "post", "coap://"+b.coapAddr+"/hb?d=dev-cc1")
	runTool(t, coapClient(t), "-m", "post", "coap://"+b.coapAddr+"/hb?d=dev-cc2")

	want := func(online, offline int64) {
		t.Helper()
		for _, g := range []*gatewayProc{a, b} {
			waitFor(t, 3*tm.flush+5*time.Second, "the fleet's counts through "+g.id, func() bool {
				on, off, ok := fleetCountsOf(t, g)
				return ok && on == online && off == offline
			})
			m := scrape(t, "http://"+g.admin+"/metrics")
			if on, off := metric(m, "fleetgate_fleet_devices", `state="online"`), metric(m, "fleetgate_fleet_devices", `state="offline"`); on != float64(online) || off != float64(offline) {
				t.Fatalf("%s: fleetgate_fleet_devices online %v offline %v, want %d and %d", g.id, on, off, online, offline)
			}
		}
	}
	want(3, 0)
	code, out, errs := runCLI(t, "status", "--addr", a.admin)
	if code != 0 || !strings.Contains(out, "fleet\n") || !regexpMatch(`\n  online\s+3\n`, out) || !regexpMatch(`\n  offline\s+0\n`, out) {
		t.Fatalf("status: exit %d %s\n%s", code, errs, out)
	}
	runTool(t, coapClient(t), "-m", "delete", "coap://"+b.coapAddr+"/hb?d=dev-cc1")
	want(2, 1)
}
