package adapter_test

import (
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/fleetgate/fleetgate/auth"
	"github.com/fleetgate/fleetgate/gateway"
	"github.com/fleetgate/fleetgate/gateway/gatewaytest"
	"github.com/fleetgate/fleetgate/internal/refusal"
	"github.com/fleetgate/fleetgate/protocols/adapter"
)

// devicesFile parses a devices file listing ids (each with a PSK).
func devicesFile(t *testing.T, ids ...string) *auth.Devices {
	t.Helper()
	var b strings.Builder
	b.WriteString("devices:\n")
	for _, id := range ids {
		fmt.Fprintf(&b, "  - id: %s\n    psk: \"hex:00112233445566778899aabbccddeeff\"\n", id)
	}
	d, err := auth.Parse("devices.yaml", []byte(b.String()))
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// TestAdapterSpeaksOnlyForItsDevices: a datagram to udpline naming a
// device of the devices file, or a device outside the adapter's devices,
// is refused and counted, also after the device leaves the devices file
// (it is still outside the adapter's devices); the adapter's own devices
// get through, and a device of its prefix gets through once the devices
// file no longer lists it.
func TestAdapterSpeaksOnlyForItsDevices(t *testing.T) {
	refusals, err := refusal.New(slog.New(slog.DiscardHandler), nil)
	if err != nil {
		t.Fatal(err)
	}
	e := newHost(t, func(o *adapter.Options) { o.Refusals = refusals })
	creds := gatewaytest.NewCredentials(devicesFile(t, "alpha", "legacy-alpha"))
	e.host.SetCredentials(creds)
	addr := freeUDP(t)
	spec := udpSpec("legacy", addr)
	spec.Devices = []string{"legacy-*", "press-1"}
	if err := e.host.Apply(ctx(t), []adapter.Spec{spec}); err != nil {
		t.Fatal(err)
	}
	sendLine(t, addr, "hb alpha\nhb legacy-alpha\nhb other\nhb press-2\nhb legacy-1\nhb press-1\n")
	waitFor(t, 5*time.Second, "six items", func() bool {
		st := e.status(t, "legacy")
		return st.Accepted+st.Refused == 6
	})
	if st := e.status(t, "legacy"); st.Refused != 4 || st.Accepted != 2 || e.count("legacy-1", gateway.Renew) != 1 || e.count("press-1", gateway.Renew) != 1 {
		t.Fatalf("status = %+v, evidence %v; want alpha, legacy-alpha, other and press-2 refused", st, e.rec.Evidence())
	}
	if !strings.Contains(e.logs.String(), "evidence refused: the adapter may not speak for this device") ||
		!strings.Contains(e.logs.String(), "reason=\"listed in the devices file\"") {
		t.Errorf("no warning for the refused evidence:\n%s", e.logs.String())
	}
	for _, d := range []gateway.DeviceID{"alpha", "press-2"} {
		if r, ok := refusals.Last(d); !ok || r.Protocol != "legacy" || r.Reason != gateway.RefusedNotAuthorized {
			t.Errorf("last refusal of %s: %+v, %v; want legacy not_authorized", d, r, ok)
		}
	}

	// alpha and legacy-alpha leave the devices file (a reload).
	creds.Set(devicesFile(t, "beta"))
	sendLine(t, addr, "hb alpha\nhb legacy-alpha\n")
	waitFor(t, 5*time.Second, "two more items", func() bool {
		st := e.status(t, "legacy")
		return st.Accepted+st.Refused == 8
	})
	if st := e.status(t, "legacy"); st.Refused != 5 || e.count("alpha", gateway.Renew) != 0 || e.count("legacy-alpha", gateway.Renew) != 1 {
		t.Fatalf("status = %+v, evidence %v; want alpha refused, legacy-alpha taken", st, e.rec.Evidence())
	}

	// Without a devices file only the namespace counts; a Spec without
	// Devices speaks for no device.
	e.host.SetCredentials(nil)
	noneAddr := freeUDP(t)
	none := udpSpec("none", noneAddr)
	none.Devices = nil
	if err := e.host.Apply(ctx(t), []adapter.Spec{spec, none}); err != nil {
		t.Fatal(err)
	}
	sendLine(t, addr, "hb legacy-2\n")
	sendLine(t, noneAddr, "hb none-1\nhb x\n")
	waitFor(t, 5*time.Second, "legacy-2 and none's two items", func() bool {
		return e.count("legacy-2", gateway.Renew) == 1 && e.status(t, "none").Refused == 2
	})
}

// TestMaxDevicesBoundsRandomIDs: 500 device IDs from one adapter
// open at most max_devices devices; the rest is dropped and counted, and
// a known device still renews and opens another session at the bound.
func TestMaxDevicesBoundsRandomIDs(t *testing.T) {
	e := newHost(t, nil)
	addr := freeUDP(t)
	spec := udpSpec("legacy", addr)
	spec.MaxDevices = 50
	if err := e.host.Apply(ctx(t), []adapter.Spec{spec}); err != nil {
		t.Fatal(err)
	}
	e.renewMany(t, "legacy", addr, 500)
	if st := e.status(t, "legacy"); st.Accepted != 50 || st.Dropped != 450 || st.Devices != 50 {
		t.Fatalf("status = %+v, want 50 devices accepted, 450 dropped", st)
	}
	first := string(e.rec.Evidence()[0].Device)
	sendLine(t, addr, "hb "+first+"\nhb "+first+" radio2\nhb r-new\n")
	waitFor(t, 5*time.Second, "three more items", func() bool {
		st := e.status(t, "legacy")
		return st.Accepted+st.Dropped == 503
	})
	if st := e.status(t, "legacy"); st.Accepted != 52 || st.Sessions != 51 || st.Devices != 50 {
		t.Fatalf("status = %+v, want the known device's renewal and second session taken, r-new dropped", st)
	}
}
