//go:build faults

package faults

import (
	"fmt"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/fleetgate/fleetgate/gateway"
	"github.com/fleetgate/fleetgate/internal/redistest"
)

// warm is how long the fleet runs before a fault: every device is online.
const warm = 2500 * time.Millisecond

// rig is one scenario: gateways, a fleet, a collector and the faults'
// time window.
type rig struct {
	t     *testing.T
	tm    timing
	fleet *fleet
	col   *collector
	x     expectations
}

func newRig(t *testing.T, col *collector, gws ...*gatewayProc) *rig {
	r := &rig{t: t, tm: fast, col: col, fleet: newFleet(t, fast, gws...)}
	r.x.tm = fast
	return r
}

// roles spread over a fleet: when the non-keepers end. Zero skips.
type roles struct {
	stops  []time.Duration // silent stops, one role each
	leaves []time.Duration // clean leaves, one role each
}

// addFleet adds n devices, every third one MQTT, spread over the
// gateways in turn. Devices i%10 take the roles in order (stops, then
// leaves); the others keep sending to the end.
func (r *rig) addFleet(prefix string, n int, ro roles) {
	ngw := len(r.fleet.gws)
	for i := 0; i < n; i++ {
		proto := "coap"
		if i%3 == 2 {
			proto = "mqtt"
		}
		p := plan{gw: i % ngw}
		k := i % 10
		switch {
		case k < len(ro.stops):
			p.end = ro.stops[k]
		case k-len(ro.stops) < len(ro.leaves):
			p.end, p.leave = ro.leaves[k-len(ro.stops)], true
		}
		r.fleet.add(fmt.Sprintf("%s-%s-%03d", prefix, proto, i), proto, p)
	}
}

// stdRoles stops devices one second before the fault, in its middle and
// after it, and makes others leave before it and in its middle.
func stdRoles(faultLen time.Duration) roles {
	return roles{
		stops:  []time.Duration{warm - time.Second, warm + faultLen/2, warm + faultLen + 500*time.Millisecond},
		leaves: []time.Duration{warm - 700*time.Millisecond, warm + faultLen/2 + 100*time.Millisecond},
	}
}

// at lets real time pass until t0+d: the processes under test run on the
// real clock, so the scenario's timeline is real time.
func (r *rig) at(d time.Duration) { r.fleet.wait(d) }

func (r *rig) faultFrom() { r.x.faultStart = time.Now() }
func (r *rig) faultTo()   { r.x.faultEnd = time.Now() }

// heardWithin bounds how long after a store fault ends every gateway is
// heard by the store again: a gateway finds a shard back with its next
// probe, after a backoff that grows while the shard stays down (see
// uplink.DefaultProbeMax), and on a Cluster only once its slot map names
// the promoted master.
const heardWithin = 10 * time.Second

// faultToHeard ends the fault when every gateway's uplink is up again, as
// the bound after a store outage counts from when the store answers every
// gateway again (docs/design.md §6.6); it fails the scenario when that
// takes longer than heardWithin. A Cluster failover needs it: a gateway's
// probe routed by the slot map it held when the master stopped waits for
// the probe's timeout, and the map's reload can first try the stopped
// node, for the call timeout; measured up to 5.3 s after the Cluster
// reported itself whole.
func (r *rig) faultToHeard(gws []*gatewayProc) {
	back := time.Now()
	for _, g := range gws {
		for !g.uplinkUp() {
			if time.Since(back) > heardWithin {
				r.t.Fatalf("gateway %s not heard by the store %v after the fault ended", g.cfg.ID, heardWithin)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	r.x.faultEnd = time.Now()
	r.t.Logf("every gateway heard by the store %v after the fault ended", r.x.faultEnd.Sub(back).Round(time.Millisecond))
}

// lost records that the store has just lost its state (expectations
// losses): called when the loss is done, so that every event of the old
// state came before it.
func (r *rig) lost() { r.x.losses = append(r.x.losses, time.Now()) }

// kill kills g -9 and records when (expectations.kills).
func (r *rig) kill(g *gatewayProc) {
	r.x.kills = append(r.x.kills, time.Now())
	g.kill()
}

// finish lets the scenario run until every device that ended is past its
// bound and any late consequence of the fault would have shown (fault
// end + lease + grace + runner), then stops the fleet and checks.
func (r *rig) finish() result {
	r.t.Helper()
	var last time.Duration
	for _, p := range r.fleet.plans {
		last = max(last, p.end)
	}
	r.at(last + 200*time.Millisecond)
	tm := r.tm
	until := time.Now().Add(tm.lease + gateway.CoverageWait(tm.flush) + tm.runnerInterval + tm.processing)
	if !r.x.faultEnd.IsZero() {
		if u := r.x.faultEnd.Add(tm.lease + tm.grace + gateway.CoverageWait(tm.flush) + tm.runnerInterval + tm.lockTTL + tm.processing); u.After(until) {
			until = u
		}
	}
	for _, d := range r.fleet.truth() {
		if !d.ended().IsZero() {
			if b := r.x.bound(d); b.After(until) {
				until = b
			}
		}
	}
	time.Sleep(time.Until(until.Add(300 * time.Millisecond)))
	r.fleet.stop()
	r.x.end = time.Now()
	r.col.stop()
	truth, log := r.fleet.truth(), r.col.log()
	res := check(truth, log, r.x)
	assertClean(r.t, r.t.Name(), res, truth, log)
	return res
}

// startGateways starts gateways gw-a, gw-b, ... on the given Redis
// addresses (one list per gateway).
func startGateways(t *testing.T, addrs ...[]string) []*gatewayProc {
	return startGatewaysWith(t, nil, addrs...)
}

// startGatewaysWith is startGateways with configuration keys set on every
// gateway.
func startGatewaysWith(t *testing.T, extra map[string]any, addrs ...[]string) []*gatewayProc {
	var gws []*gatewayProc
	for i, a := range addrs {
		g := newGateway(t, "gw-"+string(rune('a'+i)), a)
		if len(extra) > 0 {
			for k, v := range extra {
				g.cfg.Extra[k] = v
			}
			g.writeConfig()
		}
		g.start()
		gws = append(gws, g)
	}
	return gws
}

// pauseScenario: Redis hangs (SIGSTOP) for pause while devices keep
// sending, then resumes (SIGCONT).
func pauseScenario(t *testing.T, pause time.Duration) {
	t.Parallel()
	srv := redistest.Start(t)
	gws := startGateways(t, []string{srv.Addr}, []string{srv.Addr})
	r := newRig(t, newCollector(t, srv.Addr), gws...)
	r.addFleet("d", 40, stdRoles(pause))
	r.fleet.start()
	r.at(warm)
	r.faultFrom()
	srv.Signal(syscall.SIGSTOP)
	r.at(warm + pause)
	srv.Signal(syscall.SIGCONT)
	r.faultTo()
	r.finish()
}

// Redis paused for half the lease: nothing may happen.
func TestRedisPauseShorterThanLease(t *testing.T) { pauseScenario(t, fast.lease/2) }

// Redis paused for longer than the lease but shorter than lease + grace,
// devices sending throughout: no device event at all (invariant 9).
func TestRedisPauseLongerThanLease(t *testing.T) { pauseScenario(t, fast.lease+time.Second) }

// The whole site frozen at once (a host or VM paused: Redis and both
// gateways, runners included, SIGSTOP together) for longer than lease +
// grace, devices sending throughout, then resumed together. Nothing ran,
// so nothing can be concluded of the silence: the store's clock jumps,
// and the first reap after it must not judge the gateways before they
// are heard again (the reap's gap, docs/design.md §6.6). No device that
// kept sending goes offline; none is reported gateway_lost.
func TestSiteFrozen(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	gws := startGateways(t, []string{srv.Addr}, []string{srv.Addr})
	r := newRig(t, newCollector(t, srv.Addr), gws...)
	freeze := fast.lease + fast.grace + 2*time.Second
	r.addFleet("d", 40, stdRoles(freeze))
	r.fleet.start()
	r.at(warm)
	r.faultFrom()
	srv.Signal(syscall.SIGSTOP)
	for _, g := range gws {
		g.signal(syscall.SIGSTOP)
	}
	r.at(warm + freeze)
	srv.Signal(syscall.SIGCONT)
	for _, g := range gws {
		g.signal(syscall.SIGCONT)
	}
	r.faultTo()
	if res := r.finish(); res.GatewayLost > 0 {
		t.Errorf("%d offlines with reason gateway_lost after a freeze of every part: no gateway was lost", res.GatewayLost)
	}
}

// Redis restarted without persistence: every key is gone, the scripts
// too. Devices that keep sending stay online; those that stopped still
// go offline (invariant 7); versions never repeat (invariant 10).
func TestRedisRestartWithoutPersistence(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	gws := startGateways(t, []string{srv.Addr}, []string{srv.Addr})
	r := newRig(t, newCollector(t, srv.Addr), gws...)
	r.addFleet("d", 40, stdRoles(time.Second))
	r.fleet.start()
	r.at(warm)
	r.faultFrom()
	srv.Restart()
	r.lost()
	r.faultTo()
	r.finish()
}

// FLUSHALL: the same loss with the server up.
func TestRedisFlushAll(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	gws := startGateways(t, []string{srv.Addr}, []string{srv.Addr})
	r := newRig(t, newCollector(t, srv.Addr), gws...)
	r.addFleet("d", 40, stdRoles(time.Second))
	r.fleet.start()
	r.at(warm)
	r.faultFrom()
	redisCLI(t, srv.Addr, "FLUSHALL")
	r.lost()
	r.faultTo()
	r.finish()
}

// Failover to a real replica that lags: its replication link is cut for
// a second and a half (while offline and leave events are written), then
// the primary is killed -9, the replica promoted (REPLICAOF NO ONE) and
// the gateways' address (a proxy) pointed at it. The gateways run with
// store.redis.wait_replicas: 1, and the consumer reads the replica: with
// asynchronous replication, events read from a primary that dies before
// its replica has them are lost with it (a consumer that reads the
// primary sees them twice, before and after the replay); with the wait,
// no acknowledged transition is lost, and the replica's log is the one
// history.
func TestFailoverToLaggingReplica(t *testing.T) {
	t.Parallel()
	primary := redistest.Start(t)
	replLink := redistest.NewProxy(t, primary.Addr)
	replica := redistest.StartReplica(t, replLink.Addr())
	front := redistest.NewProxy(t, primary.Addr)
	gws := startGatewaysWith(t, map[string]any{"store.redis.wait_replicas": 1}, []string{front.Addr()}, []string{front.Addr()})
	r := newRig(t, newCollector(t, replica.Addr), gws...)
	lag := 1500 * time.Millisecond
	// Silent stops whose offline falls inside the lag, leaves inside it,
	// and stops after the failover.
	r.addFleet("d", 40, roles{
		stops:  []time.Duration{warm - r.tm.lease + 300*time.Millisecond, warm - r.tm.lease + 800*time.Millisecond, warm + lag + time.Second},
		leaves: []time.Duration{warm + 300*time.Millisecond, warm + 900*time.Millisecond},
	})
	r.fleet.start()
	r.at(warm)
	r.faultFrom()
	replLink.SetCut(true)
	r.at(warm + lag)
	primary.Kill()
	redisCLI(t, replica.Addr, "REPLICAOF", "NO", "ONE")
	front.Retarget(replica.Addr)
	r.col.point(replica.Addr)
	r.faultTo()
	r.finish()
}

// A Redis Cluster of 3 masters with a replica each: the master holding
// the most shards is killed -9 and the cluster promotes its replica.
// Gateways and runners follow the new topology, the outbox loses
// nothing, and no device that kept sending goes offline.
func TestClusterMasterKilled(t *testing.T) {
	clusterMasterLost(t, clusterLoss{how: "killed", lose: (*redistest.Server).Kill})
}

// The same with the master stopped (SIGSTOP) instead, for good: it
// refuses nothing, so every call to it waits for its timeout, as with a
// host that drops packets.
func TestClusterMasterStopped(t *testing.T) {
	clusterMasterLost(t, clusterLoss{how: "stopped", lose: func(s *redistest.Server) { s.Signal(syscall.SIGSTOP) }})
}

// The stopped master continued (SIGCONT) as soon as its replica is
// promoted, with store.redis.wait_replicas: 1 on the gateways. Until it
// learns it was demoted it may run the calls of clients whose slot map
// is not yet refreshed, and what it writes then is gone when it resyncs
// as a replica of the promoted one; the wait keeps the gateways from
// taking such a call for done when it wrote events or a replay (the
// demoted master has no replica to acknowledge it): it stays in the
// outbox. The promoted master has no replica either until the old one
// has resynced, so its shards' event-writing batches wait in the outbox
// meanwhile. The fault ends when the old master replicates the new one.
func TestClusterMasterContinued(t *testing.T) {
	clusterMasterLost(t, clusterLoss{
		how:      "stopped, continued after the promotion,",
		settings: map[string]any{"store.redis.wait_replicas": 1},
		lose:     func(s *redistest.Server) { s.Signal(syscall.SIGSTOP) },
		back: func(t *testing.T, s *redistest.Server) {
			s.Signal(syscall.SIGCONT)
			s.WaitReplicaLinkUp(t, 30*time.Second)
		},
	})
}

// clusterLoss is how a Cluster scenario takes a master away: lose it,
// and once its replica is promoted, back (nil: leave it lost); the
// gateways run with settings.
type clusterLoss struct {
	how      string
	settings map[string]any
	lose     func(*redistest.Server)
	back     func(*testing.T, *redistest.Server)
}

// clusterMasterLost runs the Cluster scenario on the master holding the
// most shards.
func clusterMasterLost(t *testing.T, l clusterLoss) {
	t.Parallel()
	cl := redistest.StartClusterWithReplicas(t, 3)
	addrs := cl.Addrs()
	gws := startGatewaysWith(t, l.settings, addrs, addrs)
	r := newRig(t, newCollector(t, addrs...), gws...)
	owned := map[int]int{}
	victim := -1
	for s := 0; s < shards; s++ {
		m := cl.MasterOfKey(t, fmt.Sprintf("{fleetgate:%d}:exp", s))
		owned[m]++
		if victim < 0 || owned[m] > owned[victim] {
			victim = m
		}
	}
	failover := 5 * time.Second // a guess for the roles; the fault ends when the cluster is ok
	r.addFleet("d", 40, stdRoles(failover))
	r.fleet.start()
	r.at(warm)
	r.faultFrom()
	l.lose(cl.Nodes[victim])
	waitClusterOK(t, cl, victim, 30*time.Second)
	promoted := time.Since(r.x.faultStart)
	if l.back != nil {
		l.back(t, cl.Nodes[victim])
	}
	r.faultToHeard(gws)
	t.Logf("cluster: %s master %s (%d of %d shards); promoted after %v, fault over after %v",
		l.how, cl.Nodes[victim].Addr, owned[victim], shards, promoted.Round(time.Millisecond),
		r.x.faultEnd.Sub(r.x.faultStart).Round(time.Millisecond))
	r.finish()
}

// waitClusterOK waits until a surviving node reports cluster_state:ok with
// every slot served by a live master.
func waitClusterOK(t *testing.T, cl *redistest.Cluster, dead int, limit time.Duration) {
	t.Helper()
	deadline := time.Now().Add(limit)
	alive := (dead + 1) % len(cl.Nodes)
	rc := redis.NewClient(&redis.Options{Addr: cl.Nodes[alive].Addr})
	defer rc.Close()
	for time.Now().Before(deadline) {
		info, err := rc.ClusterInfo(t.Context()).Result()
		if err == nil && strings.Contains(info, "cluster_state:ok") && strings.Contains(info, "cluster_slots_fail:0") &&
			strings.Contains(info, "cluster_slots_pfail:0") && clusterServesAll(t, rc, cl.Nodes[dead].Addr) {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Fatalf("cluster did not promote a replica within %v", limit)
}

// clusterServesAll: no slot range names the dead node as its master.
func clusterServesAll(t *testing.T, rc *redis.Client, dead string) bool {
	slots, err := rc.ClusterSlots(t.Context()).Result()
	if err != nil {
		return false
	}
	for _, s := range slots {
		if len(s.Nodes) == 0 || s.Nodes[0].Addr == dead {
			return false
		}
	}
	return true
}

// Gateway A's link to Redis is cut; devices (newcomers among them) send
// to A, which buffers in its outbox; A is killed -9 and restarted during
// the outage; the link comes back. Nothing buffered is lost (invariant
// 8), nothing that kept sending goes offline.
func TestGatewayKilledDuringOutage(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	px := redistest.NewProxy(t, srv.Addr)
	gws := startGateways(t, []string{px.Addr()}, []string{srv.Addr})
	a := gws[0]
	r := newRig(t, newCollector(t, srv.Addr), gws...)
	outage := 3 * time.Second
	r.addFleet("d", 40, stdRoles(outage))
	for i := 0; i < 6; i++ {
		proto := []string{"coap", "mqtt"}[i%2]
		r.fleet.add(fmt.Sprintf("new-%s-%d", proto, i), proto, plan{gw: 0, start: warm + 300*time.Millisecond, end: warm + outage - 300*time.Millisecond})
	}
	r.fleet.start()
	r.at(warm)
	r.faultFrom()
	px.SetCut(true)
	r.at(warm + 1800*time.Millisecond)
	r.kill(a)
	a.start()
	r.at(warm + outage)
	px.SetCut(false)
	r.faultTo()
	r.finish()
}

// Gateway A is killed -9 and restarted, then the store loses its state
// (FLUSHALL) a second later, before the runner reaped the devices that
// stopped on A a second before the kill: A's new process restores what
// its predecessor held (the session ledger), so those devices still get
// their offline (invariant 7), and nothing that kept sending goes
// offline. An MQTT device whose reconnect to A is still queued at the
// loss comes online with an event in the new incarnation (counted
// apart).
func TestGatewayKilledThenStoreLost(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	gws := startGateways(t, []string{srv.Addr}, []string{srv.Addr})
	a := gws[0]
	r := newRig(t, newCollector(t, srv.Addr), gws...)
	r.addFleet("d", 40, stdRoles(2*time.Second))
	r.fleet.start()
	r.at(warm)
	r.faultFrom()
	r.kill(a)
	a.start()
	r.at(warm + time.Second)
	redisCLI(t, srv.Addr, "FLUSHALL")
	r.lost()
	r.at(warm + 2*time.Second)
	r.faultTo()
	r.finish()
}

// partitionScenario cuts gateway A's Redis link (a TCP proxy) for cut
// while every device keeps sending; gateway B stays connected.
func partitionScenario(t *testing.T, cut time.Duration, lostOK bool) {
	t.Parallel()
	srv := redistest.Start(t)
	px := redistest.NewProxy(t, srv.Addr)
	gws := startGateways(t, []string{px.Addr()}, []string{srv.Addr})
	r := newRig(t, newCollector(t, srv.Addr), gws...)
	r.x.lostOK = lostOK
	r.addFleet("d", 40, stdRoles(cut))
	r.fleet.start()
	r.at(warm)
	r.faultFrom()
	px.SetCut(true)
	r.at(warm + cut)
	px.SetCut(false)
	r.faultTo()
	res := r.finish()
	if lostOK && res.GatewayLost == 0 {
		t.Errorf("a partition of %v (longer than lease + grace) emitted no offline with reason gateway_lost", cut)
	}
	if lostOK {
		checkGatewayLost(t, srv.Client(t), "gw-a", r.col.log())
	}
}

// gatewaysStream is the Redis key of the gateways event stream (`lost`
// and `back`, docs/design.md §3.4) with the harness's key prefix.
const gatewaysStream = "{fleetgate:0}:gateways"

// checkGatewayLost: the gateways stream holds exactly one `lost` event for
// gw (an entry with a value "lost" and a value gw), written before the
// first device offline with reason gateway_lost.
func checkGatewayLost(t *testing.T, rc *redis.Client, gw string, log []event) {
	t.Helper()
	msgs, err := rc.XRange(t.Context(), gatewaysStream, "-", "+").Result()
	if err != nil {
		t.Fatalf("read %s: %v", gatewaysStream, err)
	}
	var lost []redis.XMessage
	for _, m := range msgs {
		has := map[string]bool{}
		for _, v := range m.Values {
			if s, ok := v.(string); ok {
				has[s] = true
			}
		}
		if has["lost"] && has[gw] {
			lost = append(lost, m)
		}
	}
	if len(lost) != 1 {
		t.Fatalf("gateways stream %s: %d lost events for %s, want 1 (%v)", gatewaysStream, len(lost), gw, msgs)
	}
	ms, _ := strconv.ParseInt(strings.SplitN(lost[0].ID, "-", 2)[0], 10, 64)
	for _, e := range log {
		if e.reason == "gateway_lost" && e.at.Before(time.UnixMilli(ms)) {
			t.Errorf("device offline %v before the gateway's lost event at %v", e, time.UnixMilli(ms))
			return
		}
	}
}

// A site partition shorter than lease + grace: no device event at all
// (invariant 9).
func TestPartitionShorterThanLeasePlusGrace(t *testing.T) {
	partitionScenario(t, fast.lease+time.Second, false)
}

// A site partition longer than lease + grace: the devices of the lost
// gateway go offline with reason gateway_lost (invariant 9), and come
// back when it does.
func TestPartitionLongerThanLeasePlusGrace(t *testing.T) {
	partitionScenario(t, fast.lease+fast.grace+3*time.Second, true)
}

// CoAP devices of gateway B renew through gateway A while A's link is cut
// (their renewals wait in A's outbox), move back to B and leave there. When
// A's link comes back, A replays renewals observed before the leave: they
// must not bring the session back (the leave tombstone, docs/design.md §3.2).
func TestLeaveThroughBThenStaleRenewThroughA(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	px := redistest.NewProxy(t, srv.Addr)
	gws := startGateways(t, []string{px.Addr()}, []string{srv.Addr})
	r := newRig(t, newCollector(t, srv.Addr), gws...)
	// A short cut, so that the gateway grace (item 2) plays no part.
	cut := 1200 * time.Millisecond
	r.addFleet("d", 30, stdRoles(cut))
	for i := 0; i < 10; i++ {
		// New on A during the cut, so that A's table forwards (and
		// buffers) a connect rather than throttling a renewal.
		r.fleet.add(fmt.Sprintf("stale-coap-%d", i), "coap", plan{gw: 1,
			moves: []move{{at: warm + 50*time.Millisecond, to: 0}, {at: warm + 500*time.Millisecond, to: 1}}, end: warm + 800*time.Millisecond, leave: true})
	}
	r.fleet.start()
	r.at(warm)
	r.faultFrom()
	px.SetCut(true)
	r.at(warm + cut)
	px.SetCut(false)
	r.faultTo()
	r.finish()
}

// MQTT devices move from gateway A to gateway B and some back: each
// connects to the new gateway, then ends its old connection with a
// normal DISCONNECT (make before break). No event may come of it: the
// leave grace lets the new connection's renewal overtake the leave.
func TestMQTTMoversMakeBeforeBreak(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	gws := startGateways(t, []string{srv.Addr}, []string{srv.Addr})
	r := newRig(t, newCollector(t, srv.Addr), gws...)
	r.addFleet("d", 20, stdRoles(3*time.Second))
	for i := 0; i < 20; i++ {
		p := plan{gw: 0, moves: []move{{at: warm + time.Duration(i)*50*time.Millisecond, to: 1}}}
		if i%2 == 0 {
			p.moves = append(p.moves, move{at: warm + 2*time.Second + time.Duration(i)*50*time.Millisecond, to: 0})
		}
		r.fleet.add(fmt.Sprintf("mover-mqtt-%02d", i), "mqtt", p)
	}
	r.fleet.start()
	r.at(warm + 3500*time.Millisecond)
	r.finish()
}

// Gateway A buffers in its outbox during a cut, is killed -9 and
// "rebooted": restarted in a new time namespace whose CLOCK_BOOTTIME (and
// CLOCK_MONOTONIC) is a day behind the first boot's, with another boot ID
// (FLEETGATE_TEST_BOOT_ID). Entries
// from before the reboot have an unknown age and must never be replayed
// as fresh: newcomers that sent only before the reboot,
// whose evidence lapses before the link returns, get no event at all
// (an online would be resurrected); devices that keep sending stay
// online; those that stop are not missed. No device stops between the
// cut and the kill: its last evidence would be in the dropped entries,
// and an early offline is what dropping them means.
func TestOutboxReplayAfterReboot(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	px := redistest.NewProxy(t, srv.Addr)
	a := newGateway(t, "gw-a", []string{px.Addr()})
	a.Wrap = timeNamespace(86400)
	a.Env = []string{bootIDEnv + "=" + bootID(1)}
	a.start()
	b := newGateway(t, "gw-b", []string{srv.Addr})
	b.start()
	r := newRig(t, newCollector(t, srv.Addr), a, b)
	kill, outage := 1800*time.Millisecond, 5500*time.Millisecond
	r.addFleet("d", 40, roles{
		stops:  []time.Duration{warm - time.Second, warm + kill + 700*time.Millisecond, warm + outage + 500*time.Millisecond},
		leaves: []time.Duration{warm - 700*time.Millisecond, warm + kill + 800*time.Millisecond},
	})
	for i := 0; i < 6; i++ {
		proto := []string{"coap", "mqtt"}[i%2]
		r.fleet.add(fmt.Sprintf("new-%s-%d", proto, i), proto, plan{gw: 0, start: warm + 200*time.Millisecond, end: warm + 800*time.Millisecond})
	}
	r.fleet.start()
	r.at(warm)
	r.faultFrom()
	px.SetCut(true)
	r.at(warm + kill)
	r.kill(a)
	a.Wrap = timeNamespace(0)
	a.Env = []string{bootIDEnv + "=" + bootID(2)}
	a.start()
	r.at(warm + outage)
	px.SetCut(false)
	r.faultTo()
	r.finish()
}

// timeNamespace runs a command in a new time namespace whose boot-time
// and monotonic clocks are offset by off seconds (unshare(1), as root).
func timeNamespace(off int) []string {
	o := strconv.Itoa(off)
	return []string{"unshare", "--kill-child", "--time", "--boottime", o, "--monotonic", o, "--"}
}
