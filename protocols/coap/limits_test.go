package coap

import (
	"testing"
	"time"

	"github.com/plgd-dev/go-coap/v3/message"
	"github.com/plgd-dev/go-coap/v3/message/codes"
	"github.com/plgd-dev/go-coap/v3/udp/coder"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/fleetgate/fleetgate/gateway/clocktest"
)

func TestRateLimit(t *testing.T) {
	clock := clocktest.New(start)
	rec := &recorder{}
	reg := prometheus.NewRegistry()
	s := startServer(t, rec, Options{AllowAnonymous: true, RequestsPerSecond: 3, Clock: clock, Registerer: reg})
	c := rawConn(t, s)
	beat := func(mid uint16) *message.Message {
		t.Helper()
		b, ok := exchange(t, c, datagram(t, message.Confirmable, codes.POST, mid, "/hb", "d=dev-1"), 5*time.Second)
		if !ok {
			t.Fatalf("request %d: no answer", mid)
		}
		m := decode(t, b)
		if m.MessageID() != int32(mid) || m.Type() != message.Acknowledgement {
			t.Fatalf("request %d: answer %v", mid, m)
		}
		return &message.Message{Code: m.Code(), Options: m.Options()}
	}
	silent := func(mid uint16) {
		t.Helper()
		if b, ok := exchange(t, c, datagram(t, message.Confirmable, codes.POST, mid, "/hb", "d=dev-1"), 300*time.Millisecond); ok {
			t.Fatalf("request %d beyond the rate answered: %v", mid, decode(t, b))
		}
	}
	// A burst of 3, then no answer (plain UDP sources are unproven).
	for mid := range uint16(3) {
		if m := beat(mid); m.Code != codes.Changed {
			t.Fatalf("request %d within the rate: %v", mid, m.Code)
		}
	}
	silent(3)
	// Datagrams that are not requests take tokens too, and are dropped.
	if b, ok := exchange(t, c, datagram(t, message.Acknowledgement, codes.Empty, 9, ""), 300*time.Millisecond); ok {
		t.Fatalf("ACK beyond the rate answered: %v", decode(t, b))
	}
	if n := len(rec.Evidence()); n != 3 {
		t.Fatalf("%d pieces of evidence, want 3", n)
	}
	// A third of a second gives one token back.
	clock.Advance(time.Second/3 + time.Millisecond)
	if m := beat(10); m.Code != codes.Changed {
		t.Fatalf("after a third of a second: %v", m.Code)
	}
	silent(11)
	got := gather(t, reg)
	if got[`fleetgate_coap_requests_total{code="4.29"}`] != 0 || got[`fleetgate_coap_dropped_total{reason="rate_limited"}`] != 3 {
		t.Fatalf("metrics %v", got)
	}
}

func TestMessageSizeLimit(t *testing.T) {
	rec := &recorder{}
	reg := prometheus.NewRegistry()
	s := startServer(t, rec, Options{AllowAnonymous: true, MaxMessageSize: 64, Registerer: reg})
	c := rawConn(t, s)

	big := decode(t, datagram(t, message.Confirmable, codes.POST, 0x40, "/hb", "d=dev-1"))
	big.SetBody(nil)
	b, err := big.MarshalWithEncoder(coder.DefaultCoder)
	if err != nil {
		t.Fatal(err)
	}
	b = append(b, 0xff)
	b = append(b, make([]byte, 100)...)
	answer, ok := exchange(t, c, b, 5*time.Second)
	if !ok {
		t.Fatal("oversized CON request not answered")
	}
	m := decode(t, answer)
	if size, err := m.GetOptionUint32(message.Size1); m.Code() != codes.RequestEntityTooLarge || m.MessageID() != 0x40 || err != nil || size != 64 {
		t.Fatalf("answer %v Size1 %d (%v), want 4.13 with Size1 64", m, size, err)
	}
	// Beyond the read buffer, and not a request: dropped, and counted.
	huge := make([]byte, 9000)
	huge[0] = 0x60 // version 1, ACK
	if b, ok := exchange(t, c, huge, 300*time.Millisecond); ok {
		t.Fatalf("oversized ACK answered: %v", decode(t, b))
	}
	// Exactly at the limit is fine.
	at := datagram(t, message.NonConfirmable, codes.POST, 0x41, "/hb", "d=dev-1")
	at = append(at, 0xff)
	at = append(at, make([]byte, 64-len(at))...)
	if b, ok := exchange(t, c, at, 5*time.Second); !ok || decode(t, b).Code() != codes.Changed {
		t.Fatalf("request of 64 bytes: answered %v", ok)
	}
	if evs := rec.Evidence(); len(evs) != 1 {
		t.Fatalf("evidence %+v, want the 64-byte request's only", evs)
	}
	eventually(t, 5*time.Second, "the drop counted", func() bool {
		return gather(t, reg)[`fleetgate_coap_dropped_total{reason="oversized"}`] == 1
	})
}

func TestSocketDropsCounted(t *testing.T) {
	reg := prometheus.NewRegistry()
	// Every reader waits a second in the Observer, so the socket's
	// receive buffer fills and the kernel drops: counted, not silent.
	s := startServer(t, backpressureObserver{}, Options{AllowAnonymous: true, Registerer: reg})
	key := `fleetgate_coap_socket_drops_total{addr="` + s.Addr().String() + `"}`
	if got, ok := gather(t, reg)[key]; !ok || got != 0 {
		t.Fatalf("%s = %v (listed %v) before any load", key, got, ok)
	}
	if rcvbuf := gather(t, reg)["fleetgate_coap_receive_buffer_bytes{}"]; rcvbuf < receiveBuffer {
		t.Fatalf("receive buffer %v, want at least %d", rcvbuf, receiveBuffer)
	}
	c := rawConn(t, s)
	b := datagram(t, message.NonConfirmable, codes.POST, 1, "/hb", "d=dev-1")
	for range 30_000 {
		if _, err := c.Write(b); err != nil {
			t.Fatal(err)
		}
	}
	eventually(t, 5*time.Second, "kernel drops counted", func() bool { return gather(t, reg)[key] > 0 })
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if _, ok := gather(t, reg)[key]; ok {
		t.Fatalf("%s still registered after Close", key)
	}
}
