package main

import (
	"context"
	"net"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/paho"

	"github.com/fleetgate/fleetgate/internal/redistest"
)

// mqttDevice connects to addr with MQTT 5 as client id (anonymous).
func mqttDevice(t *testing.T, addr, id string) *paho.Client {
	t.Helper()
	nc, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	c := paho.NewClient(paho.ClientConfig{Conn: nc, OnClientError: func(error) {}})
	t.Cleanup(func() { nc.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ack, err := c.Connect(ctx, &paho.Connect{ClientID: id, KeepAlive: 5, CleanStart: true})
	if err != nil {
		t.Fatalf("mqtt connect %s: %v (%+v)", id, err, ack)
	}
	return c
}

// A device with a CoAP and an MQTT session: whichever leaves, the other
// keeps it online; the last leave takes it offline (reason leave).
func TestE2ETwoProtocolsOneDevice(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	rc := srv.Client(t)
	tm := fastTiming
	gw := newGateway(t, "gw-2p", srv.Addr, tm)
	gw.start()
	const id = "dev-2p"
	d := device{t: t, id: id}

	m := mqttDevice(t, gw.mqttAddr, id)
	stopTelemetry := telemetry(t, m, "devices/"+id+"/temp", tm.heartbeat/2)
	stop := d.keepSending(func() string { return gw.coapAddr }, tm.heartbeat/2, time.Minute)
	waitFor(t, 10*time.Second, "online", func() bool { return len(eventsOf(events(t, rc, 4), id)) == 1 })
	stop()
	d.leave(gw.coapAddr)             // the CoAP session leaves cleanly ...
	scenario(tm.lease + time.Second) // ... and the MQTT session, pinging, holds the device
	if evs := eventsOf(events(t, rc, 4), id); len(evs) != 1 {
		t.Fatalf("after the CoAP leave: events %+v, want only the online", evs)
	}

	stop = d.keepSending(func() string { return gw.coapAddr }, tm.heartbeat/2, time.Minute)
	scenario(time.Second)
	stopTelemetry()
	if err := m.Disconnect(&paho.Disconnect{ReasonCode: 0}); err != nil {
		t.Fatalf("mqtt disconnect: %v", err)
	}
	scenario(tm.lease + time.Second) // the MQTT leave; CoAP holds the device
	if evs := eventsOf(events(t, rc, 4), id); len(evs) != 1 {
		t.Fatalf("after the MQTT leave: events %+v, want only the online", evs)
	}
	stop()
	d.leave(gw.coapAddr)
	waitFor(t, 10*time.Second, "offline after the last leave", func() bool { return len(eventsOf(events(t, rc, 4), id)) == 2 })
	evs := eventsOf(events(t, rc, 4), id)
	checkAlternates(t, id, evs)
	if evs[1].reason != "leave" {
		t.Fatalf("offline reason %q, want leave", evs[1].reason)
	}
}

// telemetry publishes on topic every interval (each packet is evidence)
// until the returned stop is called; stop waits for the goroutine.
func telemetry(t *testing.T, c *paho.Client, topic string, every time.Duration) (stop func()) {
	quit, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		for i := 0; i < 10000; i++ {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			_, err := c.Publish(ctx, &paho.Publish{Topic: topic, QoS: 0, Payload: []byte("21.5")})
			cancel()
			if err != nil {
				t.Errorf("publish %s: %v", topic, err)
				return
			}
			select {
			case <-quit:
				return
			case <-time.After(every):
			}
		}
	}()
	return func() { close(quit); <-done }
}
