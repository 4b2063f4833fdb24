package main

import (
	"context"
	"fmt"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/fleetgate/fleetgate/admin"
)

// visitTiming flushes rarely, so that a real client's connect, publish
// and disconnect fall within one flush interval.
var visitTiming = e2eTiming{lease: 10 * time.Second, heartbeat: 2 * time.Second, renewEvery: 2 * time.Second, flush: 2 * time.Second, runnerInterval: 200 * time.Millisecond}

// runTool runs a device client (mosquitto_pub, coap-client) to completion
// within 20 s and fails the test if it fails.
func runTool(t *testing.T, name string, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, name, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
	return string(out)
}

// coapClient is libcoap's coap-client (Debian's libcoap3-bin names it
// coap-client-notls; make deps installs it).
func coapClient(t *testing.T) string {
	t.Helper()
	for _, name := range []string{"coap-client", "coap-client-notls", "coap-client-openssl", "coap-client-gnutls"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	t.Fatal("coap-client missing: run 'make deps' (apt-get install -y libcoap3-bin)")
	return ""
}

// adminEvents returns "state reason" of every event of dev the gateway's
// admin API reports (the last hour), in order.
func adminEvents(t *testing.T, g *gatewayProc, dev string) []string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	page, err := admin.NewClient(g.admin).Events(ctx, "", time.Hour, 1000)
	if err != nil {
		t.Fatalf("events: %v", err)
	}
	var out []string
	for _, ev := range page.Events {
		if string(ev.Device) == dev {
			out = append(out, string(ev.State)+" "+string(ev.Reason))
		}
	}
	return out
}

func awaitEvents(t *testing.T, g *gatewayProc, dev string, limit time.Duration, want ...string) {
	t.Helper()
	var got []string
	waitFor(t, limit, fmt.Sprintf("events %v of %s", want, dev), func() bool {
		got = adminEvents(t, g, dev)
		return len(got) >= len(want)
	})
	if strings.Join(got, ", ") != strings.Join(want, ", ") {
		t.Fatalf("events of %s: %v, want %v", dev, got, want)
	}
}

// Real clients, real gateway: a visit within one flush interval (MQTT
// connect, publish, disconnect; CoAP POST then DELETE) gets its online and
// offline events; sleepy MQTT devices (MQTT 5 session expiry, 3.1.1 clean
// session off) stay online across their wake-ups without a new online
// event, until their lease runs out.
func TestE2ERealClientsVisitsAndSleepyDevices(t *testing.T) {
	t.Parallel()
	tm := visitTiming
	gw := newGateway(t, "gw-v", "", tm)
	gw.start()
	host, port, _ := strings.Cut(gw.mqttAddr, ":")
	pub := func(id string, extra ...string) {
		args := append([]string{"-h", host, "-p", port, "-i", id, "-t", "devices/" + id + "/temp", "-m", "21.5", "-q", "1"}, extra...)
		runTool(t, "mosquitto_pub", args...)
	}

	pub("dev-visit")
	runTool(t, coapClient(t), "-m", "post", "coap://"+gw.coapAddr+"/hb?d=dev-coap")
	runTool(t, coapClient(t), "-m", "delete", "coap://"+gw.coapAddr+"/hb?d=dev-coap")
	pub("dev-sleepy5", "-V", "mqttv5", "-x", "3600")
	pub("dev-sleepy3", "-V", "mqttv311", "-c")

	limit := 3*tm.flush + 5*time.Second
	awaitEvents(t, gw, "dev-visit", limit, "online connect", "offline leave")
	awaitEvents(t, gw, "dev-coap", limit, "online connect", "offline leave")
	awaitEvents(t, gw, "dev-sleepy5", limit, "online connect")
	awaitEvents(t, gw, "dev-sleepy3", limit, "online connect")

	// They wake again within the lease: the same presence, no event.
	woke := time.Now()
	pub("dev-sleepy5", "-V", "mqttv5", "-x", "3600")
	pub("dev-sleepy3", "-V", "mqttv311", "-c")
	waitFor(t, limit, "a flush after the second wake-up", func() bool { return time.Since(woke) > 2*tm.flush })
	for _, d := range []string{"dev-sleepy5", "dev-sleepy3"} {
		if got := adminEvents(t, gw, d); len(got) != 1 {
			t.Fatalf("events of %s after a second wake-up: %v, want only the first online", d, got)
		}
	}
	// Then they sleep for longer than the lease: offline, expired.
	for _, d := range []string{"dev-sleepy5", "dev-sleepy3"} {
		awaitEvents(t, gw, d, tm.lease+tm.runnerInterval+10*time.Second, "online connect", "offline expired")
	}
}
