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
	for i := range 10 {
		want := codes.Changed
		if i >= 3 {
			want = codes.ServiceUnavailable
		}
		if r := request(t, anon, message.Confirmable, codes.POST, "/hb", fmt.Sprintf("d=anon-%d", i)); r.code != want {
			t.Fatalf("anonymous device %d: %v %q, want %v", i, r.code, r.payload, want)
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
