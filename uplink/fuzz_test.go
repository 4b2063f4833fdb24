package uplink

import (
	"testing"

	"github.com/fleetgate/fleetgate/gateway"
)

// FuzzDecodeRecord feeds outbox entries as a damaged or older state file
// may hold them: decodeRecord refuses or reads them, never panics, and
// what it reads encodes back to the same writes.
func FuzzDecodeRecord(f *testing.F) {
	var visit, back slot
	visit.add(gateway.Connect, t0, 0)
	visit.add(gateway.Leave, t0, 0)
	back.add(gateway.Leave, t0, 0)
	back.add(gateway.Renew, at(1), 0)
	f.Add([]byte("dev-1\x00coap/default"), encodeRecord(visit, testBoot, 1))
	f.Add([]byte("dev-1\x00gw/7/1"), encodeRecord(back, testBoot, 2))
	f.Add([]byte("dev-1"), []byte{1})
	f.Fuzz(func(t *testing.T, sk, v []byte) {
		r, err := decodeRecord(sk, v)
		if err != nil {
			return
		}
		if r.n() == 0 {
			t.Fatalf("record without writes read from %x", v)
		}
		again, err := decodeRecord(sk, encodeRecord(r.slot, testBoot, r.seq))
		if err != nil {
			t.Fatalf("re-encoded record unreadable: %v", err)
		}
		if a, b := slotWrites(r.slot), slotWrites(again.slot); len(a) != len(b) {
			t.Fatalf("writes %v, after a round trip %v", a, b)
		}
	})
}
