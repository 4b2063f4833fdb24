package main

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/fleetgate/fleetgate/internal/redistest"
)

// TestE2EBridgeOutageAndKill is TestE2EDataSurvivesKill at full size:
// 200 MQTT devices publish QoS 1 at 5 msg/s each (one in flight, the
// next after the PUBACK; a device whose connection fails reconnects and
// sends the message not acknowledged again) for 100 s through the
// fleetgate binary to an upstream mosquitto, which is killed (-9) at
// 10 s and started again at 70 s; the gateway is killed (-9) and
// restarted at 40 s, with 30 s of messages waiting in bridge.db, and
// again while it sends the backlog once the broker is back. A
// subscriber on the upstream (QoS 1, a persistent session the broker
// saves every second, so that the kill keeps it) must get every
// acknowledged message, each device's first occurrences in order;
// duplicates are counted and logged. About 2 minutes.
func TestE2EBridgeOutageAndKill(t *testing.T) {
	t.Parallel()
	const (
		devices = 200
		every   = 200 * time.Millisecond
		run     = 100 * time.Second
		downAt  = 10 * time.Second
		killAt  = 40 * time.Second
		upAt    = 70 * time.Second
	)
	up := upstreamBroker(t, 1)
	gw := bridgeGateway(t, "gw-out", up.Addr, "", shippedTiming)
	gw.start()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	counter := countUpstream(t, ctx, up.Addr, "counter", "fleetgate/gw-out/devices/#", 1, devices, true)
	time.Sleep(2500 * time.Millisecond) // the broker has saved the subscriber's session
	f := connectFleet(t, func() string { return gw.mqttAddr }, dpDeviceIDs(devices))

	start := time.Now().Add(100 * time.Millisecond)
	stop := make(chan struct{})
	ran := make(chan struct{})
	go func() {
		defer close(ran)
		f.run(dpLoad{qos: 1, every: every, count: int(run / every), size: dpPayloadB, prefix: "devices",
			start: start, deadline: start.Add(run + 60*time.Second), stop: stop})
	}()
	defer func() {
		close(stop)
		<-ran
	}()
	metrics := func() []promSample { return scrape(t, "http://"+gw.admin+"/metrics") }
	at := func(d time.Duration) { time.Sleep(time.Until(start.Add(d))) }

	at(downAt)
	before := counter.counts()
	up.Kill()
	t.Logf("%v: upstream killed; %d acknowledged, %d arrived", downAt, f.acked(), before.unique)

	at(killAt)
	queued := metric(metrics(), "fleetgate_bridge_queue_messages", `queue="durable"`)
	acked := f.acked()
	gw.kill()
	restart := time.Now()
	gw.start()
	t.Logf("%v: gateway killed with %.0f messages in bridge.db (%d acknowledged in all), ready again in %v",
		killAt, queued, acked, time.Since(restart).Round(time.Millisecond))

	at(upAt)
	up.Start()
	t.Logf("%v: upstream started again", upAt)
	waitFor(t, 30*time.Second, "the bridge connected again", func() bool {
		return metric(metrics(), "fleetgate_bridge_upstream_connected") == 1
	})
	time.Sleep(500 * time.Millisecond)
	m := metrics()
	queued = metric(m, "fleetgate_bridge_queue_messages", `queue="durable"`)
	forwarded := metric(m, "fleetgate_bridge_messages_out_total", `direction="up"`)
	gw.kill()
	restart = time.Now()
	gw.start()
	t.Logf("%v: gateway killed again while sending the backlog: %.0f forwarded since the restart, %.0f still in bridge.db; ready again in %v",
		time.Since(start).Round(time.Second), forwarded, queued, time.Since(restart).Round(time.Millisecond))
	waitFor(t, 60*time.Second, "the backlog sent", func() bool {
		return metric(metrics(), "fleetgate_bridge_queue_messages", `queue="durable"`) < 1000 // 1 s of the load
	})
	t.Logf("%v: the backlog sent, %v after the restart, while taking in 1,000 msg/s",
		time.Since(start).Round(time.Second), time.Since(restart).Round(100*time.Millisecond))

	<-ran
	acks := f.ackedSnapshot()
	var total int64
	for _, n := range acks {
		total += n
	}
	drained := time.Now()
	if !counter.awaitUnique(total, 90*time.Second) {
		t.Errorf("not every acknowledged message arrived within 90s")
	}
	t.Logf("every acknowledged message upstream %v after the load ended", time.Since(drained).Round(time.Millisecond))
	c := counter.counts()
	f.mu.Lock()
	errs := f.errs
	f.mu.Unlock()
	t.Logf("%d devices: %d messages acknowledged (of %d planned), %d arrived upstream (%d distinct, %d duplicates), "+
		"%d reconnects, %d failed publishes sent again (first: %s); subscriber connects %d",
		devices, total, devices*int(run/every), c.arrivals, c.unique, c.dups, f.reconnects.Load(), f.failures.Load(),
		strings.Join(errs[:min(3, len(errs))], "; "), counter.connects)
	if total < int64(devices*int(run/every)) {
		t.Errorf("only %d of %d messages acknowledged: devices were held up", total, devices*int(run/every))
	}
	if f.refused.Load() > 0 {
		t.Errorf("%d messages refused (PUBACK ≥ 0x80)", f.refused.Load())
	}
	if missing := counter.missing(acks); len(missing) > 0 {
		var lines []string
		for i, seqs := range missing {
			lines = append(lines, fmt.Sprintf("dp%04d: %d missing, first %v", i, len(seqs), seqs[:min(5, len(seqs))]))
		}
		sort.Strings(lines)
		t.Errorf("acknowledged messages lost, %d devices:\n%s", len(missing), strings.Join(lines[:min(20, len(lines))], "\n"))
	}
	if c.reordered > 0 {
		counter.mu.Lock()
		t.Errorf("%d first occurrences out of order: %v", c.reordered, counter.reorders)
		counter.mu.Unlock()
	}
	// the duplicates, per device
	counter.mu.Lock()
	withDups, most := 0, int64(0)
	for _, d := range counter.devs {
		if d.dups > 0 {
			withDups++
			most = max(most, d.dups)
		}
	}
	counter.mu.Unlock()
	t.Logf("duplicates: %d in all (%.2f%% of the distinct), on %d devices, at most %d for one device",
		c.dups, 100*float64(c.dups)/float64(max(c.unique, 1)), withDups, most)
}

// TestE2EBridgeQueueFull: with bridge.queue.max_bytes 1MiB and no
// upstream broker, 100 MQTT devices publish 12,000 QoS 1 messages of
// 100 bytes (about twice what the queue holds) at 2,000 msg/s: every one
// is acknowledged (PUBACK 0x00; no device refused, disconnected or held
// up), the queue keeps to its bound, the oldest messages are dropped and
// counted (fleetgate_bridge_dropped_total{queue="durable",reason="full"}
// = messages taken − messages held), and presence goes on: every device
// online, no flush failed.
func TestE2EBridgeQueueFull(t *testing.T) {
	t.Parallel()
	const (
		devices = 100
		every   = 50 * time.Millisecond
		count   = 120
	)
	away := fmt.Sprintf("127.0.0.1:%d", redistest.FreePort(t)) // nothing listens
	gw := bridgeGateway(t, "gw-full", away, ", max_bytes: 1MiB", fastTiming)
	gw.start()
	f := connectFleet(t, func() string { return gw.mqttAddr }, dpDeviceIDs(devices))
	url := "http://" + gw.admin + "/metrics"
	m0 := scrape(t, url)
	start := time.Now().Add(50 * time.Millisecond)
	f.run(dpLoad{qos: 1, every: every, count: count, size: dpPayloadB, prefix: "devices",
		start: start, deadline: start.Add(60 * time.Second)})
	took := time.Since(start)
	m := scrape(t, url)
	in := metric(m, "fleetgate_bridge_messages_in_total", `direction="up"`, `source="mqtt"`)
	held := metric(m, "fleetgate_bridge_queue_messages", `queue="durable"`)
	heldBytes := metric(m, "fleetgate_bridge_queue_bytes", `queue="durable"`)
	dropped := metric(m, "fleetgate_bridge_dropped_total", `queue="durable"`, `reason="full"`)
	flush := readHistogram(m, "fleetgate_flush_duration_seconds").minus(readHistogram(m0, "fleetgate_flush_duration_seconds"))
	t.Logf("%d messages in %v: %.0f taken, %.0f held (%.0f bytes), %.0f dropped as full; %.0f flushes, mean %.2f ms, p99 ≈ %.1f ms",
		f.acked(), took.Round(time.Millisecond), in, held, heldBytes, dropped, flush.count, 1000*flush.mean(), 1000*flush.quantile(0.99))

	if f.failures.Load() > 0 || f.refused.Load() > 0 || f.reconnects.Load() > 0 {
		f.mu.Lock()
		t.Errorf("devices refused or cut off: %d refused, %d failures, %d reconnects: %v", f.refused.Load(), f.failures.Load(), f.reconnects.Load(), f.errs)
		f.mu.Unlock()
	}
	if got := f.acked(); got != devices*count {
		t.Errorf("%d of %d messages acknowledged", got, devices*count)
	}
	if in != devices*count {
		t.Errorf("the bridge took %.0f messages, want %d", in, devices*count)
	}
	if dropped == 0 || dropped+held != in {
		t.Errorf("dropped %.0f + held %.0f ≠ taken %.0f: drops not counted", dropped, held, in)
	}
	if heldBytes > 1<<20 {
		t.Errorf("the queue holds %.0f bytes, more than max_bytes 1MiB", heldBytes)
	}
	for _, name := range []string{"fleetgate_mqtt_messages_refused_total", "fleetgate_mqtt_refused_total", "fleetgate_flush_errors_total"} {
		if v := metric(m, name); v != 0 {
			t.Errorf("%s = %.0f, want 0", name, v)
		}
	}
	if online := metric(m, "fleetgate_devices", `state="online"`); online != devices {
		t.Errorf("%.0f devices online, want %d", online, devices)
	}
}
