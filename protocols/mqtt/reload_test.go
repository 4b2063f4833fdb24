package mqtt

import (
	"context"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/paho"

	"github.com/fleetgate/fleetgate/gateway"
)

// TestReloadKeepsLeaseOfLongKeepAlive: a reload shortens the heartbeat
// interval (30 s to 10 s) and the lease (90 s to 30 s). A client admitted
// before with a keep-alive beyond the new clamp keeps pinging at it, so
// its evidence keeps the lease it was admitted under until it
// reconnects; one whose keep-alive is within the new clamp, and every
// client that connects after the reload, take the lease in force (0 in
// the evidence).
func TestReloadKeepsLeaseOfLongKeepAlive(t *testing.T) {
	rec := &recorder{}
	creds := newCreds(t, map[gateway.DeviceID]string{"dev-long": "p1", "dev-short": "p2", "dev-new": "p3"})
	s := startServer(t, rec, Options{Credentials: creds, HeartbeatInterval: 30 * time.Second, Lease: 90 * time.Second})
	connect := func(device, password string, keepAlive uint16) *v5 {
		t.Helper()
		c, ack, err := connectV5(t, tcpAddr(s), nil, &paho.Connect{
			ClientID: device, KeepAlive: keepAlive, CleanStart: true, Password: []byte(password), PasswordFlag: true,
		})
		if err != nil {
			t.Fatalf("connect %s: %v (%v)", device, err, ack)
		}
		return c
	}
	publish := func(c *v5, device string) {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if _, err := c.Publish(ctx, &paho.Publish{Topic: "devices/" + device + "/temp", QoS: 1, Payload: []byte("21")}); err != nil {
			t.Fatalf("publish %s: %v", device, err)
		}
	}
	// lastLease is the lease of device's newest renewal (false: none yet).
	lastLease := func(device gateway.DeviceID) (time.Duration, bool) {
		var (
			l  time.Duration
			ok bool
		)
		for _, ev := range rec.Evidence() {
			if ev.Device == device && ev.Kind == gateway.Renew {
				l, ok = ev.Lease, true
			}
		}
		return l, ok
	}
	expect := func(device gateway.DeviceID, want time.Duration, why string) {
		t.Helper()
		eventually(t, 5*time.Second, string(device)+" renewal", func() bool { _, ok := lastLease(device); return ok })
		if got, _ := lastLease(device); got != want {
			t.Errorf("%s: renewal lease %v, want %v (%s)", device, got, want, why)
		}
	}

	long := connect("dev-long", "p1", 30)
	short := connect("dev-short", "p2", 5)
	publish(long, "dev-long")
	expect("dev-long", 0, "before the reload")
	rec.Take()

	s.SetTiming(gateway.Timing{Lease: 30 * time.Second, HeartbeatInterval: 10 * time.Second})
	publish(long, "dev-long")
	publish(short, "dev-short")
	expect("dev-long", 90*time.Second, "keep-alive 30 s beyond the new clamp: the lease it was admitted under")
	expect("dev-short", 0, "keep-alive 5 s within the new clamp: the lease in force")

	fresh := connect("dev-new", "p3", 30) // clamped to 10 s
	publish(fresh, "dev-new")
	expect("dev-new", 0, "admitted after the reload")

	// Reconnected, dev-long is clamped to the new interval: the lease in force.
	if err := long.Disconnect(&paho.Disconnect{ReasonCode: 0}); err != nil {
		t.Fatal(err)
	}
	rec.Take()
	again := connect("dev-long", "p1", 30)
	publish(again, "dev-long")
	expect("dev-long", 0, "reconnected after the reload")

	// A reload to a longer lease: the old connection is within the clamp
	// again and takes the lease in force.
	s.SetTiming(gateway.Timing{Lease: 120 * time.Second, HeartbeatInterval: 40 * time.Second})
	rec.Take()
	publish(fresh, "dev-new")
	expect("dev-new", 0, "keep-alive within the clamp")
}
