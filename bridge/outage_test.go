package bridge_test

import (
	"errors"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/goleak"

	"github.com/fleetgate/fleetgate/bridge"
	"github.com/fleetgate/fleetgate/gateway"
	"github.com/fleetgate/fleetgate/gateway/clocktest"
	"github.com/fleetgate/fleetgate/queue/memq"
)

// The upstream broker is killed (SIGKILL) while 20 devices publish at
// QoS 1 and comes back 2 s later: every message arrives, each device's
// first occurrences in order; the duplicates (messages in flight at the
// kill, sent again) are counted.
func TestBrokerKilled(t *testing.T) {
	br := startBroker(t)
	sub := subscribe(t, br, "fg/#")
	// a clean stop saves the subscriber's session: the killed broker
	// restarts from that save and queues for it until it is back
	br.Stop()
	br.Start()
	await(t, 10*time.Second, "the subscriber back", func() bool { return sub.subs.Load() == 2 })

	// the bridge reaches it through a proxy, which keeps it from the
	// restarted broker until the subscriber is back: mosquitto 2.0.11
	// queues nothing for a session saved while its client was connected
	// until the client returns (checked with mosquitto_sub -c)
	link := startProxy(t, br.Addr)
	durable := diskQueue(t, t.TempDir(), "durable")
	reg := prometheus.NewRegistry()
	b := startBridge(t, bridge.Options{URL: link.url(), ClientID: "c", TopicPrefix: "fg", Registerer: reg,
		Durable: durable, Memory: memQueue(t, nil), Commands: memQueue(t, nil)})
	const devices, per = 20, 200
	wg := publishSeqs(t, b, devices, per, 5*time.Millisecond)
	sub.await(t, 10*time.Second, "a fifth forwarded", func(m []upMsg) bool { return len(m) > devices*per/5 })
	br.Kill()
	link.cut()
	killedAt := len(sub.snapshot())
	time.Sleep(2 * time.Second)
	if b.Status().Upstream.Connected {
		t.Errorf("connected while the broker is down")
	}
	br.Start()
	await(t, 10*time.Second, "the subscriber back", func() bool { return sub.subs.Load() == 3 })
	link.open()
	wg.Wait()
	sub.await(t, 30*time.Second, "every message", func(m []upMsg) bool { return firsts(m) == devices*per })
	dups := checkOrder(t, sub.snapshot(), devices, per, false)
	t.Logf("%d messages read before the kill, %d read in all, %d duplicates", killedAt, len(sub.snapshot()), dups)
	await(t, 5*time.Second, "the durable queue empty", func() bool { return durable.Stats().Messages == 0 })
	if c := metric(t, reg, "fleetgate_bridge_upstream_connects_total"); c != 2 {
		t.Errorf("connects = %v, want 2", c)
	}
}

// firsts counts the distinct messages in msgs.
func firsts(msgs []upMsg) int {
	seen := map[string]bool{}
	for _, m := range msgs {
		seen[m.topic+"#"+m.payload] = true
	}
	return len(seen)
}

// Close returns at once while the broker is away and messages wait in
// the lanes, leaves them in the durable queue (they are sent after a
// restart), and leaves no goroutine behind.
func TestCloseWhileBrokerDown(t *testing.T) {
	br := startBroker(t)
	durable := diskQueue(t, t.TempDir(), "durable")
	ignore := goleak.IgnoreCurrent()
	b, err := bridge.New(t.Context(), bridge.Options{URL: brokerURL(br), ClientID: "c", TopicPrefix: "fg", Down: true,
		Durable: durable, Memory: memQueue(t, nil), Commands: memQueue(t, nil), Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	await(t, 10*time.Second, "connected", func() bool { return b.Status().Upstream.Connected })
	br.Kill()
	for i := range 100 {
		if err := b.Publish(t.Context(), []gateway.Message{msg(fmt.Sprintf("d%d", i%10), "seq", strconv.Itoa(i), 1, "coap")}); err != nil {
			t.Fatal(err)
		}
	}
	t0 := time.Now()
	b.Close()
	if d := time.Since(t0); d > 3*time.Second {
		t.Errorf("Close took %v", d)
	}
	if n := durable.Stats().Messages; n != 100 {
		t.Errorf("durable queue holds %d after Close, want the 100 not forwarded", n)
	}
	if err := b.Publish(t.Context(), []gateway.Message{msg("d1", "", "late", 1, "coap")}); !errors.Is(err, gateway.ErrQueueClosed) {
		t.Errorf("Publish after Close = %v, want ErrQueueClosed", err)
	}
	goleak.VerifyNone(t, ignore)
}

// While the broker is away the queues hold what waits, and report it:
// depth, bytes and the oldest's age per queue; the memory queue, full,
// drops its oldest, counted by queue and reason.
func TestQueueMetricsWhileBrokerDown(t *testing.T) {
	br := startBroker(t)
	br.Kill()
	clock := clocktest.New(start)
	durable := diskQueue(t, t.TempDir(), "durable")
	memory, err := memq.New(memq.Options{MaxBytes: 400, Clock: clock})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { memory.Close() })
	reg := prometheus.NewRegistry()
	b := startBridge(t, bridge.Options{URL: brokerURL(br), ClientID: "c", TopicPrefix: "fg", Registerer: reg, Clock: clock,
		Durable: durable, Memory: memory, Commands: memQueue(t, clock)})
	durableBytes := 0
	for i := range 20 {
		m := msg("d1", "t", strconv.Itoa(i), byte(i%2), "coap")
		m.Received = clock.Now()
		if err := b.Publish(t.Context(), []gateway.Message{m}); err != nil {
			t.Fatal(err)
		}
		if m.QoS == 1 {
			durableBytes += m.Size()
		}
	}
	clock.Advance(90 * time.Second)
	for _, tc := range []struct {
		name  string
		queue string
		want  float64
	}{
		{"fleetgate_bridge_queue_messages", "durable", 10},
		{"fleetgate_bridge_queue_bytes", "durable", float64(durableBytes)},
		{"fleetgate_bridge_queue_oldest_age_seconds", "durable", 90},
		{"fleetgate_bridge_queue_messages", "commands", 0},
		{"fleetgate_bridge_queue_oldest_age_seconds", "commands", 0},
	} {
		if v := metric(t, reg, tc.name, "queue", tc.queue); v != tc.want {
			t.Errorf("%s{queue=%s} = %v, want %v", tc.name, tc.queue, v, tc.want)
		}
	}
	mem := metric(t, reg, "fleetgate_bridge_queue_messages", "queue", "memory")
	full := metric(t, reg, "fleetgate_bridge_dropped_total", "queue", "memory", "reason", "full")
	if mem == 0 || full == 0 || mem+full != 10 {
		t.Errorf("memory queue holds %v and dropped %v (full), want both and 10 in all", mem, full)
	}
	if v := metric(t, reg, "fleetgate_bridge_upstream_connected"); v != 0 {
		t.Errorf("connected = %v", v)
	}
	s := b.Status()
	if s.Upstream.Connected || s.Upstream.Connects != 0 || s.Queues[1].Name != "durable" || s.Queues[1].Messages != 10 ||
		s.Queues[2].Dropped["full"] != uint64(full) {
		t.Errorf("Status = %+v", s)
	}
}
