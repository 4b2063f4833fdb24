package coap

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/plgd-dev/go-coap/v3/message"
	"github.com/plgd-dev/go-coap/v3/message/codes"

	"github.com/fleetgate/fleetgate/gateway"
	"github.com/fleetgate/fleetgate/gateway/clocktest"
)

// uplinkLog is the test's gateway.Uplink: it records what the session
// table decided to send centrally.
type uplinkLog struct {
	mu  sync.Mutex
	evs []gateway.Evidence
}

var _ gateway.Uplink = (*uplinkLog)(nil)

func (u *uplinkLog) Enqueue(_ context.Context, ev gateway.Evidence) error {
	u.mu.Lock()
	defer u.mu.Unlock()
	u.evs = append(u.evs, ev)
	return nil
}

func (u *uplinkLog) kinds() []gateway.Kind {
	u.mu.Lock()
	defer u.mu.Unlock()
	var ks []gateway.Kind
	for _, ev := range u.evs {
		ks = append(ks, ev.Kind)
	}
	return ks
}

// TestLifecycleThroughTable drives the real session table through the
// front end with go-coap clients over UDP and DTLS: connect, heartbeats,
// a clean leave, and a device that freezes until its lease runs out.
func TestLifecycleThroughTable(t *testing.T) {
	clock := clocktest.New(start)
	up := &uplinkLog{}
	table := gateway.NewTable(up, gateway.TableOptions{Lease: 90 * time.Second, RenewEvery: 20 * time.Second, Clock: clock})
	s := startDTLS(t, table, Options{AllowAnonymous: true, HeartbeatInterval: 30 * time.Second, Clock: clock})
	udpDevice := dial(t, s)
	dtlsDevice := dialDTLS(t, s, "id-1", testDevices["id-1"].key)

	// The UDP device is udp-1 (d=), with CON; the DTLS one is dev-1 (its
	// PSK identity), with NON.
	beat := func(overDTLS bool, code codes.Code) {
		t.Helper()
		var r reply
		if overDTLS {
			r = request(t, dtlsDevice, message.NonConfirmable, code, "/hb")
		} else {
			r = request(t, udpDevice, message.Confirmable, code, "/hb", "d=udp-1")
		}
		if r.code != codes.Changed {
			t.Fatalf("%v: %v %q", code, r.code, r.payload)
		}
	}
	sessions := func(d gateway.DeviceID) int { return len(table.Sessions(d)) }

	// Connect: the first heartbeat of each device opens its session.
	beat(false, codes.POST)
	beat(true, codes.POST)
	if sessions("udp-1") != 1 || sessions("dev-1") != 1 {
		t.Fatalf("sessions after connect: udp-1 %d, dev-1 %d", sessions("udp-1"), sessions("dev-1"))
	}
	// Heartbeats every 30 s (Max-Age) keep both alive past the lease.
	for range 4 {
		clock.Advance(30 * time.Second)
		beat(false, codes.POST)
		beat(true, codes.POST)
	}
	clock.Advance(time.Second)
	if n := table.Sweep(clock.Now()); n != 0 {
		t.Fatalf("sweep dropped %d live sessions", n)
	}
	// A clean leave ends the UDP device's session at once.
	beat(false, codes.DELETE)
	if sessions("udp-1") != 0 {
		t.Fatal("session left after a clean leave")
	}
	// The DTLS device freezes: its session lives until the lease runs out.
	clock.Advance(88 * time.Second)
	if table.Sweep(clock.Now()); sessions("dev-1") != 1 {
		t.Fatal("frozen session dropped before its lease ran out")
	}
	clock.Advance(2 * time.Second)
	if table.Sweep(clock.Now()); sessions("dev-1") != 0 {
		t.Fatal("frozen session outlived its lease")
	}
	// Centrally: two connects, renewals, and one leave; a freeze sends
	// nothing (the central lease ends on its own).
	var connects, leaves int
	for _, k := range up.kinds() {
		switch k {
		case gateway.Connect:
			connects++
		case gateway.Leave:
			leaves++
		}
	}
	if connects != 2 || leaves != 1 {
		t.Fatalf("uplink saw %v: want 2 connects and 1 leave", up.kinds())
	}
}
