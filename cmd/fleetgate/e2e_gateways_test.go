package main

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/fleetgate/fleetgate/admin"
	"github.com/fleetgate/fleetgate/internal/redistest"
)

// gatewayStatesOf is `fleetgate gateways --json` through g, as id →
// lost.
func gatewayStatesOf(t *testing.T, g *gatewayProc) map[string]bool {
	t.Helper()
	code, out, _ := runCLI(t, "gateways", "--addr", g.admin, "--json")
	var l admin.GatewayList
	if code != 0 || json.Unmarshal([]byte(out), &l) != nil {
		return nil
	}
	m := map[string]bool{}
	for _, gw := range l.Gateways {
		m[gw.ID] = gw.Lost
	}
	return m
}

// Two gateways on one real Redis: each lists both; one is killed, and
// the other's `fleetgate gateways` reports it lost within the lease and
// the runner's interval, then heard again once it is back.
func TestE2EGatewaysLostAndBack(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	tm := fastTiming
	a := newGateway(t, "gw-la", srv.Addr, tm)
	b := newGateway(t, "gw-lb", srv.Addr, tm)
	a.start()
	b.start()
	heard := func(id string, lost bool) func() bool {
		return func() bool {
			m := gatewayStatesOf(t, b)
			l, ok := m[id]
			return ok && l == lost && len(m) == 2
		}
	}
	waitFor(t, 10*time.Second, "both gateways heard", func() bool { return heard("gw-la", false)() && heard("gw-lb", false)() })
	a.kill()
	waitFor(t, 3*tm.lease+5*time.Second, "gw-la lost", heard("gw-la", true))
	code, out, errs := runCLI(t, "gateways", "--addr", b.admin)
	if code != 0 || !regexpMatch(`(?m)^gw-la\s+lost\s+\d+\s+\S+ ago$`, out) || !regexpMatch(`(?m)^gw-lb\s+heard\s`, out) || !regexpMatch(`(?m)^2 gateways: 1 lost$`, out) {
		t.Fatalf("gateways: exit %d %s\n%s", code, errs, out)
	}
	a.start()
	waitFor(t, 3*tm.lease+5*time.Second, "gw-la back", heard("gw-la", false))
}
