//go:build faults

package faults

import (
	"fmt"
	"testing"
	"time"

	"github.com/fleetgate/fleetgate/internal/redistest"
)

// The slow parts: a part that still runs, late, is the commoner fault on
// a site and in a shared Redis. Under a CPU quota some calls run, late: a
// gateway's flush times out at the client and goes to its outbox while
// the runner's reap gets through and the store's clock moves on; the
// store must then wait for the gateway's coverage (invariant 11) instead
// of expiring senders.

// starvedFor is how long a part stays slow: twice the lease, so that a
// store that expired sessions for want of renewals would; and slowGrace
// the gateway grace of these scenarios, longer than the fault, so that no
// device event is allowed at all (invariant 9: a fault shorter than lease
// + grace emits none).
var starvedFor = 2 * fast.lease

const slowGrace = 12 * time.Second

// Quotas: Redis gets 1 ms of CPU a second (it answers a few calls a
// second), a gateway 2 ms per 100 ms.
const (
	redisQuota, redisPeriod     = time.Millisecond, time.Second
	gatewayQuota, gatewayPeriod = 2 * time.Millisecond, 100 * time.Millisecond
)

// slowFleet is the fleet of the slow scenarios: 230 CoAP and MQTT devices
// on both gateways with the standard roles, and 10 CoAP devices that move
// between the gateways while the part is slow (their session, named by
// the device, changes gateway: the store must wait for the gateway they
// moved to as well).
func slowFleet(r *rig) {
	r.addFleet("d", 230, stdRoles(starvedFor))
	for i := range 10 {
		from := i % 2
		r.fleet.add(fmt.Sprintf("mover-coap-%02d", i), "coap", plan{gw: from,
			moves: []move{{at: warm + starvedFor/3, to: 1 - from}, {at: warm + 2*starvedFor/3, to: from}}})
	}
}

// slowScenario runs the slow fleet over two gateways on one Redis (each
// also running the runner), through a proxy when delayed; slow makes the
// parts slow at the start of the fault and returns what ends it.
func slowScenario(t *testing.T, slow func(srv *redistest.Server, px *redistest.Proxy, gws []*gatewayProc) (end func())) {
	t.Parallel()
	srv := redistest.Start(t)
	px := redistest.NewProxy(t, srv.Addr)
	gws := startGatewaysWith(t, map[string]any{"presence.gateway_grace": slowGrace.String()}, []string{px.Addr()}, []string{px.Addr()})
	r := newRig(t, newCollector(t, srv.Addr), gws...)
	r.tm.grace, r.x.tm.grace = slowGrace, slowGrace
	slowFleet(r)
	r.fleet.start()
	r.at(warm)
	r.faultFrom()
	end := slow(srv, px, gws)
	r.at(warm + starvedFor)
	end()
	r.faultTo()
	r.finish()
}

// Redis CPU-starved for longer than the lease, every device sending: no
// false offline, no missed one.
func TestRedisCPUStarved(t *testing.T) {
	slowScenario(t, func(srv *redistest.Server, _ *redistest.Proxy, _ []*gatewayProc) func() {
		return starve(t, srv.Pid(), redisQuota, redisPeriod)
	})
}

// One gateway CPU-starved: its devices' evidence reaches the store late.
func TestGatewayCPUStarved(t *testing.T) {
	slowScenario(t, func(_ *redistest.Server, _ *redistest.Proxy, gws []*gatewayProc) func() {
		return starve(t, gws[0].cmd.Process.Pid, gatewayQuota, gatewayPeriod)
	})
}

// Redis and one gateway CPU-starved at once.
func TestRedisAndGatewayCPUStarved(t *testing.T) {
	slowScenario(t, func(srv *redistest.Server, _ *redistest.Proxy, gws []*gatewayProc) func() {
		a := starve(t, srv.Pid(), redisQuota, redisPeriod)
		b := starve(t, gws[0].cmd.Process.Pid, gatewayQuota, gatewayPeriod)
		return func() { a(); b() }
	})
}

// Redis's replies delayed by 1 to 3 s (jittered, in order) on the way to
// both gateways: calls run in time but their callers hear of them late,
// or give up on them.
func TestRedisRepliesDelayed(t *testing.T) {
	slowScenario(t, func(_ *redistest.Server, px *redistest.Proxy, _ []*gatewayProc) func() {
		px.SetDelay(time.Second, 3*time.Second)
		return func() { px.SetDelay(0, 0) }
	})
}
