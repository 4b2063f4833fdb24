package coap

import (
	"testing"
	"time"

	"github.com/plgd-dev/go-coap/v3/message"
	"github.com/plgd-dev/go-coap/v3/message/codes"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/fleetgate/fleetgate/gateway/clocktest"
)

// Attack (reflection): a plain UDP source address can be spoofed, so the
// answers to requests "from" a victim go to the victim. A 4-byte request
// was answered with 31 bytes (4.04 with its diagnostic), and beyond the
// rate limit with a 46-byte 4.29 (11.5 times the request). Now an answer
// over plain UDP is never larger than its request (what does not fit is
// left out: the diagnostic first, then the option), and beyond a rate
// limit there is no answer, only the count.
func TestNoAmplification(t *testing.T) {
	cases := []struct {
		name string
		req  []byte
		want codes.Code
	}{
		{"4-byte CON POST", []byte{0x40, byte(codes.POST), 0, 1}, codes.NotFound},
		{"4-byte CON GET", []byte{0x40, byte(codes.GET), 0, 2}, codes.NotFound},
		{"4-byte NON DELETE", []byte{0x50, byte(codes.DELETE), 0, 3}, codes.NotFound},
		{"CoAP ping", []byte{0x40, 0, 0, 4}, codes.Empty},
		{"8-byte token only", []byte{0x48, byte(codes.POST), 0, 5, 1, 2, 3, 4, 5, 6, 7, 8}, codes.NotFound},
		{"unknown critical option 9", []byte{0x40, byte(codes.POST), 0, 6, 0x90}, codes.BadOption},
		{"POST /hb without d=", datagram(t, message.Confirmable, codes.POST, 7, "/hb"), codes.BadRequest},
		{"GET /hb", datagram(t, message.Confirmable, codes.GET, 8, "/hb", "d=x"), codes.MethodNotAllowed},
		{"listed device", datagram(t, message.Confirmable, codes.POST, 9, "/hb", "d=dev-1"), codes.Unauthorized},
		{"invalid device", datagram(t, message.Confirmable, codes.POST, 10, "/hb", "d=a b"), codes.BadRequest},
		// The smallest heartbeat still gets its Max-Age: 11 bytes in, 7 out.
		{"POST /hb?d=x, no token", []byte{0x40, byte(codes.POST), 0, 11, 0xb2, 'h', 'b', 0x43, 'd', '=', 'x'}, codes.Changed},
	}
	clock := clocktest.New(start)
	reg := prometheus.NewRegistry()
	s := startServer(t, &recorder{}, Options{AllowAnonymous: true, Credentials: testDevices,
		RequestsPerSecond: len(cases), Clock: clock, Registerer: reg})
	c := rawConn(t, s)
	for _, tc := range cases {
		b, ok := exchange(t, c, tc.req, 5*time.Second)
		if !ok {
			t.Fatalf("%s: no answer", tc.name)
		}
		m := decode(t, b)
		t.Logf("%s: %d bytes in, %d out (%v), ratio %.2f", tc.name, len(tc.req), len(b), m.Code(), float64(len(b))/float64(len(tc.req)))
		if len(b) > len(tc.req) || m.Code() != tc.want {
			t.Errorf("%s: %d bytes in, %d bytes out (%v), want %v in at most %d", tc.name, len(tc.req), len(b), m.Code(), tc.want, len(tc.req))
		}
		if _, err := m.GetOptionUint32(message.MaxAge); tc.want == codes.Changed && err != nil {
			t.Errorf("%s: 2.04 without Max-Age", tc.name)
		}
	}
	// The endpoint's tokens are spent: beyond the limit, silence.
	for _, req := range [][]byte{cases[0].req, cases[len(cases)-1].req} {
		if b, ok := exchange(t, c, req, 300*time.Millisecond); ok {
			t.Errorf("beyond the rate limit: %d bytes in, %d bytes out (%v), ratio %.2f, want no answer",
				len(req), len(b), decode(t, b).Code(), float64(len(b))/float64(len(req)))
		}
	}
	eventually(t, 5*time.Second, "the silent refusals counted", func() bool {
		return gather(t, reg)[`fleetgate_coap_dropped_total{reason="rate_limited"}`] == 2
	})
	if n := gather(t, reg)[`fleetgate_coap_requests_total{code="4.29"}`]; n != 0 {
		t.Errorf("%v answers 4.29 over plain UDP", n)
	}
}
