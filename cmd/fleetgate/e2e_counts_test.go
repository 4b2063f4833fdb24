package main

import (
	"encoding/json"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/fleetgate/fleetgate/admin"
	"github.com/fleetgate/fleetgate/internal/redistest"
)

// fleetCountsOf reads the fleet's counts of /v1/status through `fleetgate
// status --json`.
func fleetCountsOf(t *testing.T, g *gatewayProc) (online, offline, suspect int64, ok bool) {
	t.Helper()
	code, out, _ := runCLI(t, "status", "--addr", g.admin, "--json")
	var st struct {
		Fleet *struct {
			Online  *int64 `json:"online"`
			Offline *int64 `json:"offline"`
			Suspect *int64 `json:"suspect"`
			Error   string `json:"error"`
		} `json:"fleet"`
	}
	if code != 0 || json.Unmarshal([]byte(out), &st) != nil || st.Fleet == nil || st.Fleet.Online == nil || st.Fleet.Offline == nil || st.Fleet.Suspect == nil {
		return 0, 0, 0, false
	}
	return *st.Fleet.Online, *st.Fleet.Offline, *st.Fleet.Suspect, true
}

// gatewaySessionsOf is `fleetgate gateways --json` through g, as id →
// the sessions the store holds of it.
func gatewaySessionsOf(t *testing.T, g *gatewayProc) map[string]int64 {
	t.Helper()
	code, out, _ := runCLI(t, "gateways", "--addr", g.admin, "--json")
	var l admin.GatewayList
	if code != 0 || json.Unmarshal([]byte(out), &l) != nil {
		return nil
	}
	m := map[string]int64{}
	for _, gw := range l.Gateways {
		m[gw.ID] = gw.Sessions
	}
	return m
}

// The fleet's counts are the store's, whichever gateway is asked: two
// gateways on one real Redis, an MQTT device (mosquitto_pub, a sleepy
// MQTT 5 session) on one and CoAP devices (coap-client) on the other;
// /v1/status, `fleetgate status` and fleetgate_fleet_devices of both
// count all of them, follow a leave, and count as suspect the CoAP device
// silent for suspect_after (lease/2 here); `fleetgate gateways` of both
// shows the sessions each gateway holds.
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
				on, off, _, ok := fleetCountsOf(t, g)
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
	for _, g := range []*gatewayProc{a, b} {
		waitFor(t, 3*tm.flush+5*time.Second, "the sessions of each gateway through "+g.id, func() bool {
			m := gatewaySessionsOf(t, g)
			return len(m) == 2 && m["gw-ca"] == 1 && m["gw-cb"] == 1
		})
	}
	code, out, errs = runCLI(t, "gateways", "--addr", b.admin)
	if code != 0 || !regexpMatch(`\ngw-ca\s+heard\s+\d+\s+1\s+`, out) || !regexpMatch(`\ngw-cb\s+heard\s+\d+\s+1\s+`, out) {
		t.Fatalf("gateways: exit %d %s\n%s", code, errs, out)
	}

	// dev-cc2 sends once more, then is silent: suspect from suspect_after
	// after that heartbeat until its lease runs out; dev-cm publishes
	// every second meanwhile, never suspect
	stop := make(chan struct{})
	published := make(chan error, 1)
	go func() {
		var err error
		for i := 0; i < 30 && err == nil; i++ {
			select {
			case <-stop:
				published <- nil
				return
			case <-time.After(time.Second):
			}
			err = exec.Command("mosquitto_pub", "-h", host, "-p", port, "-i", "dev-cm", "-t", "devices/dev-cm/temp", "-m", "1", "-q", "1", "-V", "mqttv5", "-x", "3600").Run()
		}
		published <- err
	}()
	defer func() {
		close(stop)
		if err := <-published; err != nil {
			t.Errorf("mosquitto_pub: %v", err)
		}
	}()
	runTool(t, coapClient(t), "-m", "post", "coap://"+b.coapAddr+"/hb?d=dev-cc2")
	sent := time.Now()
	waitFor(t, 2*tm.flush+time.Second, "the heartbeats in the store, none suspect", func() bool {
		on, off, sus, ok := fleetCountsOf(t, b)
		return ok && on == 2 && off == 1 && sus == 0
	})
	for _, g := range []*gatewayProc{a, b} {
		waitFor(t, tm.lease, "dev-cc2 suspect through "+g.id, func() bool {
			on, off, sus, ok := fleetCountsOf(t, g)
			return ok && on == 2 && off == 1 && sus == 1
		})
		m := scrape(t, "http://"+g.admin+"/metrics")
		if sus := metric(m, "fleetgate_fleet_devices", `state="suspect"`); sus != 1 {
			t.Fatalf("%s: fleetgate_fleet_devices suspect %v, want 1", g.id, sus)
		}
	}
	code, out, errs = runCLI(t, "status", "--addr", a.admin)
	if code != 0 || !regexpMatch(`\n  suspect\s+1\n`, out) {
		t.Fatalf("status: exit %d %s\n%s", code, errs, out)
	}
	if since := time.Since(sent); since < tm.lease/2 || since >= tm.lease {
		t.Fatalf("dev-cc2 counted suspect %v after its heartbeat, want from %v to %v", since, tm.lease/2, tm.lease)
	}
}
