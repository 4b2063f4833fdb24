package main

import (
	"testing"
	"time"
)

// fleetgate_devices follows a real CoAP device of a running gateway:
// online after its heartbeat, suspect once suspect_after (2 s) has passed
// without another, counted nowhere once its lease (4 s) ran out.
func TestDevicesByStateMetric(t *testing.T) {
	t.Parallel()
	g := newGateway(t, "gw-states", "", fastTiming)
	g.start()
	url := "http://" + g.admin + "/metrics"
	online := func() float64 { return scrapeCounter(t, url, `fleetgate_devices{state="online"}`) }
	suspect := func() float64 { return scrapeCounter(t, url, `fleetgate_devices{state="suspect"}`) }
	if on, sus := online(), suspect(); on != 0 || sus != 0 {
		t.Fatalf("no device yet: online %v suspect %v", on, sus)
	}
	device{t: t, id: "dev-states-1"}.heartbeat(g.coapAddr)
	device{t: t, id: "dev-states-2"}.heartbeat(g.coapAddr)
	if on, sus := online(), suspect(); on != 2 || sus != 0 {
		t.Fatalf("after two heartbeats: online %v suspect %v, want 2 and 0", on, sus)
	}
	waitFor(t, 5*time.Second, "both devices suspect", func() bool { return online() == 0 && suspect() == 2 })
	device{t: t, id: "dev-states-2"}.heartbeat(g.coapAddr)
	if on, sus := online(), suspect(); on != 1 || sus != 1 {
		t.Fatalf("after dev-states-2's second heartbeat: online %v suspect %v, want 1 and 1", on, sus)
	}
	waitFor(t, 10*time.Second, "both leases run out", func() bool { return online() == 0 && suspect() == 0 })
}
