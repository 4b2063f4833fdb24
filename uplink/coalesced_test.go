package uplink

import (
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/fleetgate/fleetgate/gateway"
	"github.com/fleetgate/fleetgate/gateway/clocktest"
	"github.com/fleetgate/fleetgate/internal/redistest"
	"github.com/fleetgate/fleetgate/store/redisstore"
)

// Two renewals of a session queued while the uplink could not send (a
// store call held up by a dead Cluster master, in the fault suite) are
// merged into the newer one, observed after the session's deadline: the
// flush marks that write Coalesced, and the store, as for a replay, takes
// it as the evidence that kept the session alive (no offline, no
// online) rather than as a device that came back after a gap. A device
// of the same shard whose one renewal came after its deadline did come
// back after a gap: its write in the same batch is not marked, and it
// goes offline and online again.
func TestHeldUpRenewalsKeepTheSession(t *testing.T) {
	const lease = 4 * time.Second
	srv := redistest.Start(t)
	var store *redisstore.Store
	e := newEnv(t, Options{Lease: lease, FlushInterval: time.Second, KeepAlive: time.Second}, OutboxOptions{},
		func(_ *bolt.DB, c *clocktest.Clock) gateway.Store {
			s, err := redisstore.Open(t.Context(), redisClient(t, srv.Addr), redisstore.Options{
				Prefix: "up", Shards: testShards, Now: c.Now, Logger: testLogger(t), GatewayGrace: lease})
			if err != nil {
				t.Fatal(err)
			}
			store = s
			return s
		})
	ctx := t.Context()
	devs := devicesIn(0, 2, "held")
	held, back := devs[0], devs[1]
	send := func(dev gateway.DeviceID, k gateway.Kind) {
		t.Helper()
		if err := e.u.Enqueue(ctx, gateway.Evidence{Device: dev, Session: "coap/default", Kind: k, ObservedAt: e.clock.Now()}); err != nil {
			t.Fatal(err)
		}
	}
	send(held, gateway.Connect)
	send(back, gateway.Connect)
	if err := e.u.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	e.clock.Advance(3 * time.Second)
	send(held, gateway.Renew) // inside the lease
	e.clock.Advance(2 * time.Second)
	send(held, gateway.Renew) // after the first deadline (connect + 4 s)
	send(back, gateway.Renew) // after its deadline, alone
	e.clock.Advance(200 * time.Millisecond)
	if err := e.u.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	evs, err := store.Events(ctx, 0, "", 10)
	if err != nil {
		t.Fatal(err)
	}
	var heldEvs, backEvs []gateway.Event
	for _, ev := range evs {
		if ev.Device == held {
			heldEvs = append(heldEvs, ev)
		} else {
			backEvs = append(backEvs, ev)
		}
	}
	if len(heldEvs) != 1 || heldEvs[0].State != gateway.Online {
		t.Fatalf("held-up device: events %+v, want the connect's online only", heldEvs)
	}
	if len(backEvs) != 3 || backEvs[1].Reason != gateway.ReasonExpired || backEvs[2].Reason != gateway.ReasonRenew {
		t.Fatalf("device back after a gap: events %+v, want online, expired, online (renew)", backEvs)
	}
	for _, dev := range devs {
		d, err := store.Device(ctx, dev)
		if err != nil {
			t.Fatal(err)
		}
		if want := t0.Add(5*time.Second + lease); d.State != gateway.Online || !d.Deadline.Equal(want) {
			t.Fatalf("device %+v, want online until %v", d, want)
		}
	}
}
