package coap

import (
	"context"
	"fmt"
	"testing"

	"github.com/plgd-dev/go-coap/v3/message"
	"github.com/plgd-dev/go-coap/v3/message/codes"

	"github.com/fleetgate/fleetgate/gateway"
)

// The attacks of docs/security.md against the CoAP front end, each with what the
// legitimate device experiences during it.

// Attack: with allow_anonymous and a devices file, plain UDP POST
// /hb?d=alpha got 2.04 for a device listed in the file, and an anonymous
// DELETE /hb?d=alpha&s=meter removed the session alpha had made over
// DTLS. A listed device must use its credentials: anonymous requests
// naming it get 4.01 and make no evidence; alpha's session is untouched.
func TestAnonymousCannotImpersonateListedDevice(t *testing.T) {
	rec := &recorder{}
	s := startDTLS(t, rec, Options{AllowAnonymous: true})
	alpha := dialDTLS(t, s, "id-1", testDevices["id-1"].key)
	if r := request(t, alpha, message.Confirmable, codes.POST, "/hb", "s=meter"); r.code != codes.Changed {
		t.Fatalf("alpha over DTLS: %v", r.code)
	}
	anon := dial(t, s)
	for _, c := range []struct {
		method  codes.Code
		queries []string
	}{
		{codes.POST, []string{"d=dev-1"}},
		{codes.POST, []string{"d=dev-1", "s=meter"}},
		{codes.DELETE, []string{"d=dev-1", "s=meter"}},
	} {
		if r := request(t, anon, message.Confirmable, c.method, "/hb", c.queries...); r.code != codes.Unauthorized {
			t.Fatalf("anonymous %v %v: %v %q, want 4.01", c.method, c.queries, r.code, r.payload)
		}
	}
	evs := rec.Evidence()
	if len(evs) != 1 || evs[0].Device != "dev-1" || evs[0].Session != "coap/meter" || evs[0].Kind != gateway.Renew {
		t.Fatalf("evidence %+v, want alpha's one renewal", evs)
	}
	// A device that is not listed is still served anonymously.
	if r := request(t, anon, message.Confirmable, codes.POST, "/hb", "d=stranger"); r.code != codes.Changed {
		t.Fatalf("unlisted anonymous device: %v", r.code)
	}
	if r := request(t, alpha, message.Confirmable, codes.POST, "/hb", "s=meter"); r.code != codes.Changed {
		t.Fatalf("alpha after the attempts: %v", r.code)
	}
}

// discardUplink accepts every write of a session table.
type discardUplink struct{}

func (discardUplink) Enqueue(context.Context, gateway.Evidence) error { return nil }

// Attack: with one device's PSK (or anonymously), POST /hb?s=<random>
// 2,500 times made one device record of 2,500 sessions whose apply script
// stalled the store. Beyond limits.max_sessions_per_device a new instance
// gets 4.03 and is counted; the device's sessions keep renewing.
func TestSessionsPerDeviceCap(t *testing.T) {
	table := gateway.NewTable(discardUplink{}, gateway.TableOptions{MaxSessionsPerDevice: 3})
	s := startDTLS(t, table, Options{AllowAnonymous: true, RequestsPerSecond: 1000})
	alpha := dialDTLS(t, s, "id-1", testDevices["id-1"].key)
	anon := dial(t, s)
	for i := range 10 {
		want := codes.Changed
		if i >= 3 {
			want = codes.Forbidden
		}
		if r := request(t, alpha, message.Confirmable, codes.POST, "/hb", fmt.Sprintf("s=%d", i)); r.code != want {
			t.Fatalf("alpha's instance %d: %v %q, want %v", i, r.code, r.payload, want)
		}
		if r := request(t, anon, message.NonConfirmable, codes.POST, "/hb", "d=anon-1", fmt.Sprintf("s=%d", i)); r.code != want {
			t.Fatalf("anonymous instance %d: %v %q, want %v", i, r.code, r.payload, want)
		}
	}
	if n := table.SessionLimitRefusals(); n != 14 {
		t.Fatalf("refusals counted %d, want 14", n)
	}
	if r := request(t, alpha, message.Confirmable, codes.POST, "/hb", "s=1"); r.code != codes.Changed {
		t.Fatalf("alpha's known instance at the cap: %v", r.code)
	}
	if r := request(t, alpha, message.Confirmable, codes.DELETE, "/hb", "s=1"); r.code != codes.Changed {
		t.Fatalf("alpha leaves one instance: %v", r.code)
	}
	if r := request(t, alpha, message.Confirmable, codes.POST, "/hb", "s=new"); r.code != codes.Changed {
		t.Fatalf("alpha's new instance after a leave: %v", r.code)
	}
}
