package coap

import (
	"fmt"
	"testing"

	"github.com/plgd-dev/go-coap/v3/message"
	"github.com/plgd-dev/go-coap/v3/message/codes"

	"github.com/fleetgate/fleetgate/gateway"
)

// Attack: anonymous requests naming new devices made one device (and one
// store record) each, without bound. Anonymous evidence is marked, and
// the session table admits at most limits.anonymous_max_devices anonymous
// devices at once: beyond, a new anonymous device gets 5.03, while the
// anonymous devices there and the DTLS devices are served.
func TestAnonymousDevicesBounded(t *testing.T) {
	table := gateway.NewTable(discardUplink{}, gateway.TableOptions{MaxAnonymousDevices: 3})
	s := startDTLS(t, table, Options{AllowAnonymous: true, RequestsPerSecond: 1000})
	anon := dial(t, s)
	codeOf := func(i int) codes.Code {
		return request(t, anon, message.Confirmable, codes.POST, "/hb", fmt.Sprintf("d=anon-%d", i)).code
	}
	for i := range 3 {
		if c := codeOf(i); c != codes.Changed {
			t.Fatalf("anonymous device %d: %v", i, c)
		}
	}
	for i := 3; i < 10; i++ {
		if c := codeOf(i); c != codes.ServiceUnavailable {
			t.Fatalf("anonymous device %d beyond the bound: %v, want 5.03", i, c)
		}
	}
	if r := request(t, anon, message.Confirmable, codes.POST, "/hb", "d=anon-0", "s=2"); r.code != codes.Changed {
		t.Fatalf("a known anonymous device's new instance: %v", r.code)
	}
	alpha := dialDTLS(t, s, "id-1", testDevices["id-1"].key)
	if r := request(t, alpha, message.Confirmable, codes.POST, "/hb"); r.code != codes.Changed {
		t.Fatalf("a DTLS device: %v", r.code)
	}
	if n, refused := table.AnonymousDevices(), table.AnonymousLimitRefusals(); n != 3 || refused != 7 {
		t.Fatalf("%d anonymous devices, %d refused; want 3 and 7", n, refused)
	}
}
