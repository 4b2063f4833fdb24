package sim

import (
	"context"
	"io"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/fleetgate/fleetgate/sim/mqttc"
)

// mutedBroker accepts MQTT connections on a real socket, answers each
// CONNECT with a CONNACK (MQTT 5 or 3.1.1, as asked) and then reads and
// ignores everything: no heartbeat is ever answered. It returns its
// address and the count of connections it accepted.
func mutedBroker(t *testing.T) (string, func() int) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var (
		mu       sync.Mutex
		accepted int
		wg       sync.WaitGroup
	)
	t.Cleanup(func() { ln.Close(); wg.Wait() })
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			accepted++
			mu.Unlock()
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer c.Close()
				_ = c.SetDeadline(time.Now().Add(10 * time.Second))
				// CONNECT: fixed header, then the protocol name and level
				b := make([]byte, 512)
				n, err := c.Read(b)
				if err != nil || n < 9 {
					return
				}
				connack := []byte{0x20, 0x02, 0x00, 0x00}
				if b[8] == 5 {
					connack = []byte{0x20, 0x03, 0x00, 0x00, 0x00}
				}
				if _, err := c.Write(connack); err != nil {
					return
				}
				_, _ = io.Copy(io.Discard, c)
			}()
		}
	}()
	return ln.Addr().String(), func() int { mu.Lock(); defer mu.Unlock(); return accepted }
}

// A device whose heartbeat goes unanswered for the fleet's timeout drops
// its connection and connects again, and that connect counts as a
// reconnect, as one after a broken connection does.
func TestMQTTUnansweredHeartbeatReconnects(t *testing.T) {
	addr, accepted := mutedBroker(t)
	const hb = 200 * time.Millisecond
	stats := newStats(hb)
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Second)
	defer cancel()
	start := time.Now()
	f := &mqttFleet{gws: []string{addr}, stats: stats, keepAlive: 10, timeout: 300 * time.Millisecond, topic: "t",
		open: map[*mqttc.Conn]struct{}{}, ctx: ctx, start: start}
	f.sched = newScheduler(start, time.Second)
	plans := Plan(PlanOptions{Devices: 1, MQTTShare: 1, Duration: time.Minute, Heartbeat: hb, MQTTGateways: 1, Seed: 1, Prefix: "u-"})
	d := f.add(0, plans[0], &truth{id: plans[0].ID, active: true})
	d.id = f.sched.add(d, d.first())
	f.sched.run(ctx)
	f.stop(time.Second)
	if got := stats.reconnects.Load(); got < 1 || stats.sendErrors.Load() < 1 {
		t.Fatalf("reconnects %d, send errors %d, connections accepted %d: an unanswered heartbeat's reconnect is not counted",
			got, stats.sendErrors.Load(), accepted())
	}
}
