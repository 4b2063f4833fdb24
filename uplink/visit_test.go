package uplink

import (
	"context"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/fleetgate/fleetgate/gateway"
	"github.com/fleetgate/fleetgate/gateway/clocktest"
	"github.com/fleetgate/fleetgate/internal/redistest"
)

// TestVisitWithinOneFlush checks, through both stores, that a session
// that connects and leaves between two flushes (directly, and through the
// outbox) gets its online and then its offline event, and that a leave
// followed by a reconnect of a live session gets its offline and online
// events: coalescing never erases a visit (docs/design.md §6.8).
func TestVisitWithinOneFlush(t *testing.T) {
	stores := map[string]func(t *testing.T) func(*bolt.DB, *clocktest.Clock) gateway.Store{
		"embedded": embeddedStore,
		"redis": func(t *testing.T) func(*bolt.DB, *clocktest.Clock) gateway.Store {
			return redisStore(t, redistest.Start(t))
		},
	}
	for name, open := range stores {
		t.Run(name, func(t *testing.T) {
			e := newEnv(t, Options{Lease: 90 * time.Second, MaxBatch: 50}, OutboxOptions{}, open(t))
			u, ctx := e.u, context.Background()
			// The Redis store dates writes with its own clock and the
			// uplink ages them with the test's: the evidence of the second
			// flush is observed after the first flush's (ages shrink) so
			// that the leave is newer than the connect on both clocks.
			ms := func(n int) time.Time { return e.clock.Now().Add(time.Duration(n-100) * time.Millisecond) }
			mustEnqueue(t, u, evidence("back", gateway.Connect, ms(0)), evidence("steady", gateway.Connect, ms(0)))
			if err := u.Flush(ctx); err != nil {
				t.Fatal(err)
			}
			mustEnqueue(t, u,
				evidence("visit", gateway.Connect, ms(10)),
				evidence("back", gateway.Renew, ms(10)),
				evidence("visit", gateway.Renew, ms(11)),
				evidence("back", gateway.Leave, ms(11)),
				evidence("visit", gateway.Leave, ms(12)),
				evidence("back", gateway.Connect, ms(13)),
				// a renewal the Redis store may take as believed (steady
				// since the first flush), then the leave
				evidence("steady", gateway.Renew, ms(10)),
				evidence("steady", gateway.Leave, ms(12)),
				// a visit observed within one instant
				evidence("blink", gateway.Connect, ms(14)),
				evidence("blink", gateway.Leave, ms(14)),
			)
			if got := u.Status().Pending; got != 8 {
				t.Fatalf("pending %d, want 8 (two writes per session)", got)
			}
			if err := u.Flush(ctx); err != nil {
				t.Fatal(err)
			}
			want := map[gateway.DeviceID][]string{
				"visit":  {"online connect", "offline leave"},
				"blink":  {"online connect", "offline leave"},
				"back":   {"online connect", "offline leave", "online connect"},
				"steady": {"online connect", "offline leave"},
			}
			checkEvents(t, e.store, want)

			// The same through the outbox: an entry holding a visit (as a
			// gateway that could not reach the store wrote it) is replayed
			// as a visit.
			var visit slot
			visit.add(gateway.Connect, ms(20), 0)
			visit.add(gateway.Renew, ms(21), 0)
			visit.add(gateway.Leave, ms(21), 0)
			if _, _, err := e.ob.put([]item{{key{"later", "coap/default"}, visit}}); err != nil {
				t.Fatal(err)
			}
			e.run()
			waitFor(t, "outbox replayed", 20*time.Second, func() { e.clock.Advance(100 * time.Millisecond) }, func() bool {
				return u.Status().OutboxSessions == 0
			})
			want["later"] = []string{"online replay", "offline leave"}
			checkEvents(t, e.store, want)
			for d := range want {
				info, err := e.store.Device(ctx, d)
				if err != nil {
					t.Fatal(err)
				}
				if wantOnline := d == "back"; (info.State == gateway.Online) != wantOnline {
					t.Fatalf("device %s: state %s after %v", d, info.State, want[d])
				}
			}
		})
	}
}

// checkEvents compares the events of s per device ("state reason", in
// order, the first ver the store time of the first event, then one more
// each) with want.
func checkEvents(t *testing.T, s gateway.Store, want map[gateway.DeviceID][]string) {
	t.Helper()
	got := map[gateway.DeviceID][]string{}
	first := map[gateway.DeviceID]uint64{}
	for _, ev := range allEvents(t, s) {
		if _, ok := first[ev.Device]; !ok {
			first[ev.Device] = uint64(ev.At.UnixMilli())
		}
		if want := first[ev.Device] + uint64(len(got[ev.Device])); ev.Ver != want {
			t.Fatalf("event %+v: ver %d, want %d", ev, ev.Ver, want)
		}
		got[ev.Device] = append(got[ev.Device], string(ev.State)+" "+string(ev.Reason))
	}
	for d, w := range want {
		if len(got[d]) != len(w) {
			t.Fatalf("events of %s: %v, want %v", d, got[d], w)
		}
		for i := range w {
			if got[d][i] != w[i] {
				t.Fatalf("events of %s: %v, want %v", d, got[d], w)
			}
		}
	}
}

// TestOutboxRecordFormats checks that records written before visits were
// kept (leave byte 1: the leave is sent first) still read the same, and
// that a visit's order survives times that tie once rounded to ms.
func TestOutboxRecordFormats(t *testing.T) {
	ms := t0.UnixMilli()
	old := []byte{1, 0, 0, 0, 0, 0, 0, 0, 7, byte(gateway.Connect)}
	old = append(old, be64(ms+5)...)
	old = append(old, 1)
	old = append(old, be64(ms+3)...)
	s1, seq, ok := decodeV1(old)
	if !ok {
		t.Fatal("format-1 record not read")
	}
	if got := slotWrites(s1); len(got) != 2 || got[0].k != gateway.Leave || got[1].k != gateway.Connect || seq != 7 {
		t.Fatalf("old record reads as %v (seq %d), want leave then connect (seq 7)", got, seq)
	}
	if _, err := decodeRecord([]byte("d\x00s"), old); err == nil {
		t.Fatal("a format-1 record read as a format-2 one")
	}

	var v slot
	v.add(gateway.Connect, t0.Add(100*time.Microsecond), 0)
	v.add(gateway.Leave, t0.Add(200*time.Microsecond), 0)
	b := encodeRecord(v, testBoot, 8)
	if b[18] != leaveAfter {
		t.Fatalf("visit encoded with leave byte %d, want %d", b[18], leaveAfter)
	}
	r, err := decodeRecord([]byte("d\x00s"), b)
	if err != nil {
		t.Fatal(err)
	}
	if got := slotWrites(r.slot); len(got) != 2 || got[0].k != gateway.Connect || got[1].k != gateway.Leave {
		t.Fatalf("visit reads back as %v, want connect then leave", got)
	}
	b[18] = 3
	if _, err := decodeRecord([]byte("d\x00s"), b); err == nil {
		t.Fatal("leave byte 3 accepted")
	}
}

func be64(v int64) []byte {
	b := make([]byte, 8)
	for i := range b {
		b[7-i] = byte(v >> (8 * i))
	}
	return b
}
