//go:build faults && soak

package faults

import (
	"cmp"
	"context"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/fleetgate/fleetgate/internal/redistest"
)

// TestSoak is the randomized fault soak (`make soak DURATION=30m
// SEED=n`; docs/reliability.md): gateways running the runner on a Redis
// primary with a replica or a Cluster, a fleet of CoAP, two-instance
// CoAP, MQTT and sleepy MQTT devices living several lives each (moves,
// goodbyes, silences, reconnect storms), and a nemesis that runs a
// schedule of faults drawn from the seed, one or two at a time. A checker
// holds the event log against the truth every window and at the end.
//
// SOAK_SEED, SOAK_DURATION (3m), SOAK_TOPOLOGY (standalone | cluster),
// SOAK_GATEWAYS (2 | 3), SOAK_DEVICES (120) set the run; the seed draws
// what they leave unset. SOAK_DUMP=dir writes every event judged to
// dir/events.txt and the gateways' logs to dir/gw-*.log; SOAK_LOG_LEVEL
// (debug, info, ...) keeps the gateways at that level throughout (the
// nemesis's reloads draw a level as before, so the plan is the same, and
// leave it as it is); SOAK_MONITOR=regexp taps the Redis servers
// (soakMonitor).
func TestSoak(t *testing.T) {
	env := func(k, def string) string {
		if v := os.Getenv(k); v != "" {
			return v
		}
		return def
	}
	seed, err := strconv.ParseUint(env("SOAK_SEED", strconv.FormatInt(time.Now().UnixNano()%1_000_000, 10)), 10, 64)
	if err != nil {
		t.Fatalf("SOAK_SEED: %v", err)
	}
	duration, err := time.ParseDuration(env("SOAK_DURATION", "3m"))
	if err != nil {
		t.Fatalf("SOAK_DURATION: %v", err)
	}
	gateways, err := strconv.Atoi(env("SOAK_GATEWAYS", "0"))
	if err != nil {
		t.Fatalf("SOAK_GATEWAYS: %v", err)
	}
	devices, err := strconv.Atoi(env("SOAK_DEVICES", "120"))
	if err != nil {
		t.Fatalf("SOAK_DEVICES: %v", err)
	}
	plan, err := newSoakPlan(seed, duration, os.Getenv("SOAK_TOPOLOGY"), gateways, devices)
	if err != nil {
		t.Fatal(err)
	}
	replay := fmt.Sprintf("make soak SEED=%d DURATION=%v TOPOLOGY=%s GATEWAYS=%d DEVICES=%d", seed, duration, plan.topology(), plan.gateways, devices)
	kinds := map[devKind]int{}
	lives := 0
	for _, d := range plan.devices {
		kinds[d.kind]++
		lives += len(d.lives)
	}
	t.Logf("soak: seed %d, %v, %s, %d gateways, %d devices (coap %d, coap2 %d, mqtt %d, sleepy %d, modbus %d; %d lives planned), %d faults planned; replay: %s",
		seed, duration, plan.topology(), plan.gateways, len(plan.devices), kinds[kindCoAP], kinds[kindCoAP2], kinds[kindMQTT], kinds[kindSleepy], kinds[kindModbus],
		lives, len(plan.faults), replay)

	dumpDir := os.Getenv("SOAK_DUMP")
	var tap *soakTap
	if soakMonitor != "" {
		re, err := regexp.Compile(soakMonitor)
		if err != nil || dumpDir == "" {
			t.Fatalf("SOAK_MONITOR=%q: %v (it needs SOAK_DUMP)", soakMonitor, err)
		}
		f, err := os.Create(filepath.Join(dumpDir, "monitor.log"))
		if err != nil {
			t.Fatalf("SOAK_MONITOR: %v", err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		tap = &soakTap{ctx: ctx, re: re, w: f, seen: map[string]bool{}}
		defer func() {
			cancel()
			tap.wg.Wait()
			f.Close()
		}()
	}
	r := newSoakRig(t, plan, tap)
	chk := newSoakChecker(fast, r.truth, r.log, t.Logf)
	if dumpDir != "" {
		f, err := os.Create(filepath.Join(dumpDir, "events.txt"))
		if err != nil {
			t.Fatalf("SOAK_DUMP: %v", err)
		}
		defer f.Close()
		chk.dump = f
	}
	r.fleet.start()
	r.log.t0 = r.fleet.t0
	stopChecks := r.checkInWindows(chk)
	r.nemesis()
	r.fleet.wait(duration)
	r.fleet.stop()
	// Every life the plan ended is past its bound after this (the last
	// fault ended soakTail before the end).
	time.Sleep(fast.lease + fast.grace + chk.after() + 1500*time.Millisecond)
	stopChecks()
	r.col.stop()
	chk.add(r.col.drain())
	chk.window(time.Now().Add(-time.Second))
	r.checkGatewaysAlive()
	if dumpDir != "" {
		for _, g := range r.gws {
			g.log.mu.Lock()
			err := os.WriteFile(filepath.Join(dumpDir, g.cfg.ID+".log"), g.log.b.Bytes(), 0o644)
			g.log.mu.Unlock()
			if err != nil {
				t.Errorf("SOAK_DUMP: %v", err)
			}
		}
	}

	res := chk.res
	res.Devices, res.Lives = len(plan.devices), r.truth.lives
	injected := map[faultKind]int{}
	for _, f := range r.log.runs {
		injected[f.kind]++
	}
	var inj []string
	for k := redisStop; k <= mqttStorm; k++ {
		if injected[k] > 0 {
			inj = append(inj, fmt.Sprintf("%s %d", k, injected[k]))
		}
	}
	t.Logf("soak: seed %d: faults injected %d (%s)", seed, len(r.log.runs), strings.Join(inj, ", "))
	t.Logf("soak: seed %d: %s", seed, res.summary())
	if res.violations() > 0 || res.Heartbeats == 0 || res.Events == 0 {
		t.Errorf("soak FAILED, seed %d (%s): %d violations; first ones:\n  %s\nreplay: %s",
			seed, plan.topology(), res.violations(), strings.Join(res.examples, "\n  "), replay)
	}
}

// soakRig is the soak's processes: Redis, the gateways, the collector,
// the fleet, and what the nemesis acts on.
type soakRig struct {
	t     *testing.T
	plan  soakPlan
	gws   []*gatewayProc
	col   *collector
	fleet *soakFleet
	truth *soakTruth
	log   *faultLog
	tap   *soakTap // SOAK_MONITOR; nil without

	// Standalone: the primary, its replica (replicating through
	// replLink, which a lagging failover cuts first) and a proxy per
	// gateway in front of the primary (partition, latency, failover).
	primary, replica *redistest.Server
	replLink         *redistest.Proxy
	front            []*redistest.Proxy

	// Cluster: the master groups (the slot ranges of the three masters
	// at creation), a key in each, their shards, and the node that was
	// last seen serving each.
	cl        *redistest.Cluster
	groupKey  [3]string
	groupOf   [shards]int
	masters   [3]int
	lastRedis time.Time
}

func newSoakRig(t *testing.T, plan soakPlan, tap *soakTap) *soakRig {
	r := &soakRig{t: t, plan: plan, log: &faultLog{}, tap: tap}
	addrs := make([][]string, plan.gateways)
	// With the wait, a failover loses no acknowledged transition
	// (TestFailoverToLaggingReplica, TestClusterMasterContinued). Every
	// device comes from 127.0.0.1: lift the anonymous connect rate, as
	// the harness lifts the per-source ones.
	extra := map[string]any{"store.redis.wait_replicas": 1, "limits.anonymous_connects_per_second": 100000}
	if plan.cluster {
		r.cl = redistest.StartClusterWithReplicas(t, 3)
		for _, n := range r.cl.Nodes {
			r.fastSync(n)
			tap.watch(n.Addr)
		}
		for i := range addrs {
			addrs[i] = r.cl.Addrs()
		}
		r.mapGroups()
		r.col = newCollector(t, r.cl.Addrs()...)
	} else {
		r.primary = redistest.Start(t)
		r.fastSync(r.primary)
		r.replLink = redistest.NewProxy(t, r.primary.Addr)
		r.replica = redistest.StartReplica(t, r.replLink.Addr())
		r.fastSync(r.replica)
		tap.watch(r.primary.Addr)
		tap.watch(r.replica.Addr)
		for i := range addrs {
			px := redistest.NewProxy(t, r.primary.Addr)
			r.front = append(r.front, px)
			addrs[i] = []string{px.Addr()}
		}
		// The consumer reads the replica: what it saw survives a failover
		// (TestFailoverToLaggingReplica).
		r.col = newCollector(t, r.replica.Addr)
	}
	r.truth = newSoakTruth(plan.gateways, plan.devices)
	mb := newModbusFleet(t, plan, r.truth)
	for i, a := range addrs {
		g := newGateway(t, "gw-"+string(rune('a'+i)), a)
		maps.Copy(g.cfg.Extra, extra)
		maps.Copy(g.cfg.Extra, mb.config(i))
		if soakLogLevel != "" {
			g.cfg.Extra["log.level"] = soakLogLevel
		}
		g.writeConfig()
		g.start()
		r.gws = append(r.gws, g)
	}
	r.fleet = newSoakFleet(t, plan, r.gws, r.truth)
	r.fleet.modbus = mb
	return r
}

// mapGroups finds the three masters' slot ranges, a key in each and the
// group of every shard.
func (r *soakRig) mapGroups() {
	ctx := context.Background()
	rc := redis.NewClient(&redis.Options{Addr: r.cl.Nodes[0].Addr})
	defer rc.Close()
	slots, err := rc.ClusterSlots(ctx).Result()
	if err != nil || len(slots) != 3 {
		r.t.Fatalf("cluster slots: %v (%d ranges, want 3)", err, len(slots))
	}
	sort.Slice(slots, func(i, j int) bool { return slots[i].Start < slots[j].Start })
	group := func(key string) int {
		slot, err := rc.ClusterKeySlot(ctx, key).Result()
		if err != nil {
			r.t.Fatalf("cluster keyslot: %v", err)
		}
		for g, s := range slots {
			if int64(s.Start) <= slot && slot <= int64(s.End) {
				return g
			}
		}
		r.t.Fatalf("slot %d has no range", slot)
		return -1
	}
	for s := range shards {
		r.groupOf[s] = group(fmt.Sprintf("{fleetgate:%d}:exp", s))
	}
	found := 0
	for i := 0; i < 10000 && found < 3; i++ {
		k := fmt.Sprintf("soak-%d", i)
		if g := group(k); r.groupKey[g] == "" {
			r.groupKey[g] = k
			found++
		}
	}
	for g := range r.masters {
		r.masters[g] = r.cl.MasterOfKey(r.t, r.groupKey[g])
	}
}

// shardsOf lists the shards of master group g.
func (r *soakRig) shardsOf(g int) []int {
	var out []int
	for s, sg := range r.groupOf {
		if sg == g {
			out = append(out, s)
		}
	}
	return out
}

// noticeFailovers compares the masters with those last seen: a master
// stopped or starved past cluster-node-timeout is failed over by the
// Cluster; the alternation is then not judged across it.
func (r *soakRig) noticeFailovers() {
	for g := range r.masters {
		if m := r.cl.MasterOfKey(r.t, r.groupKey[g]); m != r.masters[g] {
			r.t.Logf("nemesis %s: master-%d moved from node %d to node %d (a failover the nemesis did not plan)", r.log.rel(time.Now()), g, r.masters[g], m)
			r.log.addBoundary(boundary{from: r.lastRedis, to: time.Now(), shards: r.shardsOf(g)})
			r.masters[g] = m
		}
	}
}

// Quotas of a starved part: a standalone Redis as in the slow-part
// scenarios; a Cluster master more, so that it still answers the
// cluster bus within cluster-node-timeout (else it is failed over).
const clusterRedisQuota, clusterRedisPeriod = 5 * time.Millisecond, 100 * time.Millisecond

// redisNode is the Redis process a Redis fault acts on.
func (r *soakRig) redisNode(f *faultRun) *redistest.Server {
	if r.cl != nil {
		r.masters[f.target] = r.cl.MasterOfKey(r.t, r.groupKey[f.target])
		return r.cl.Nodes[r.masters[f.target]]
	}
	if f.target == 1 {
		return r.replica
	}
	return r.primary
}

// nemesis runs the plan's schedule, printing a line per fault as it
// starts and ends.
func (r *soakRig) nemesis() {
	type due struct {
		at  time.Time
		f   *faultRun
		end func()
	}
	var ends []due
	// Each end runs on its own at its time: a gateway's restart (it waits
	// for the process to be ready, seconds while a master is stopped) must
	// not hold back the end of a Redis fault due meanwhile (a Cluster
	// master stopped past cluster-node-timeout is failed over, and one
	// that then continues loses writes: a limit the plan keeps out). A
	// fault waits for the pending ends of its own target, a gateway's for
	// those of every gateway.
	var running sync.WaitGroup
	type pendingEnd struct {
		done    chan struct{}
		onRedis bool
	}
	pending := map[string]pendingEnd{}
	runEnds := func(until time.Time) {
		for len(ends) > 0 && !ends[0].at.After(until) {
			e := ends[0]
			ends = ends[1:]
			time.Sleep(time.Until(e.at))
			done := make(chan struct{})
			pending[e.f.targetName] = pendingEnd{done, e.f.info.onRedis}
			running.Go(func() {
				defer close(done)
				e.end()
				r.log.finish(e.f)
				r.t.Logf("nemesis %s #%d end %s %s (ran %.1fs)", r.log.rel(e.f.end), e.f.n, e.f.kind, e.f.targetName, e.f.end.Sub(e.f.start).Seconds())
			})
		}
	}
	waitEnds := func(f *faultRun) {
		for name, p := range pending {
			if name == f.targetName || (!f.info.onRedis && !p.onRedis) {
				<-p.done
				delete(pending, name)
			}
		}
	}
	t0 := r.fleet.t0
	for _, pf := range r.plan.faults {
		at := t0.Add(pf.at)
		runEnds(at)
		time.Sleep(time.Until(at))
		f := &faultRun{plannedFault: pf, info: faultKinds[pf.kind], targetName: pf.targetName(r.plan.cluster), gw: pf.target}
		if f.info.onRedis {
			f.gw = -1
		}
		waitEnds(f)
		if r.cl != nil && f.info.onRedis {
			r.noticeFailovers()
			r.lastRedis = time.Now()
		}
		dur := ""
		if pf.dur > 0 {
			dur = fmt.Sprintf(" for %.1fs", pf.dur.Seconds())
		}
		r.log.begin(f)
		r.t.Logf("nemesis %s #%d %s %s%s%s", r.log.rel(f.start), f.n, f.kind, f.targetName, dur, pf.detail())
		if end := r.inject(f); end != nil {
			ends = append(ends, due{at: f.start.Add(pf.dur), f: f, end: end})
			sort.SliceStable(ends, func(i, j int) bool { return ends[i].at.Before(ends[j].at) })
		} else {
			r.log.finish(f)
			r.t.Logf("nemesis %s #%d done %s %s (took %.1fs)", r.log.rel(f.end), f.n, f.kind, f.targetName, f.end.Sub(f.start).Seconds())
		}
	}
	runEnds(time.Now().Add(time.Hour))
	running.Wait()
}

// inject starts fault f and returns what ends it (nil: it is over).
func (r *soakRig) inject(f *faultRun) func() {
	t := r.t
	switch f.kind {
	case redisStop:
		n := r.redisNode(f)
		n.Signal(syscall.SIGSTOP)
		return func() { n.Signal(syscall.SIGCONT) }
	case redisSlow:
		n := r.redisNode(f)
		if r.cl != nil {
			return starve(t, n.Pid(), clusterRedisQuota, clusterRedisPeriod)
		}
		return starve(t, n.Pid(), redisQuota, redisPeriod)
	case redisRestart:
		n := r.redisNode(f)
		n.Restart()
		r.lost(f)
		if r.cl == nil {
			// A promoted replica restarts with its --replicaof: it is the
			// primary again. It is not empty: it loads the dump.rdb of its
			// last full sync as a replica (Redis writes one even with
			// save ""), a state minutes old (docs/reliability.md, item 21).
			redisCLI(t, n.Addr, "REPLICAOF", "NO", "ONE")
		}
		r.fastSync(n)
		r.waitRedisSettled()
	case redisFlush:
		redisCLI(t, r.redisNode(f).Addr, "FLUSHALL")
		r.lost(f)
	case redisFailover:
		r.failover(f)
	case gwPartition:
		r.front[f.target].SetCut(true)
		return func() { r.front[f.target].SetCut(false) }
	case gwLatency:
		r.front[f.target].SetDelay(f.lo, f.hi)
		return func() { r.front[f.target].SetDelay(0, 0) }
	case gwKill:
		g := r.gws[f.target]
		g.kill()
		return g.start
	case gwStop:
		g := r.gws[f.target]
		g.signal(syscall.SIGSTOP)
		return func() { g.signal(syscall.SIGCONT) }
	case gwSlow:
		return starve(t, r.gws[f.target].cmd.Process.Pid, gatewayQuota, gatewayPeriod)
	case gwReload:
		g := r.gws[f.target]
		g.cfg.Extra["uplink.flush_interval"] = f.reload.flush.String()
		g.cfg.Extra["uplink.max_batch"] = f.reload.maxBatch
		g.cfg.Extra["log.level"] = cmp.Or(soakLogLevel, f.reload.level)
		g.writeConfig()
		g.signal(syscall.SIGHUP)
	case mqttStorm:
		r.fleet.storm(f.target)
	}
	return nil
}

// failover kills the primary (a Cluster master) and promotes its replica,
// then starts a new replica (restarts the old master as one), so that
// later failovers find one.
func (r *soakRig) failover(f *faultRun) {
	t := r.t
	if r.cl != nil {
		victim := r.masters[f.target]
		r.redisNode(f).Kill()
		waitClusterOK(t, r.cl, victim, 30*time.Second)
		r.log.addBoundary(boundary{from: f.start, to: time.Now().Add(2 * time.Second), shards: r.shardsOf(f.target)})
		r.cl.Nodes[victim].Restart()
		r.fastSync(r.cl.Nodes[victim])
		r.waitRedisSettled()
		r.masters[f.target] = r.cl.MasterOfKey(t, r.groupKey[f.target])
		return
	}
	if f.lag > 0 {
		r.replLink.SetCut(true)
		time.Sleep(f.lag)
	}
	r.primary.Kill()
	redisCLI(t, r.replica.Addr, "REPLICAOF", "NO", "ONE")
	r.lost(f)
	for _, px := range r.front {
		px.Retarget(r.replica.Addr)
	}
	r.primary = r.replica
	r.col.point(r.primary.Addr)
	r.replLink = redistest.NewProxy(t, r.primary.Addr)
	r.replica = redistest.StartReplica(t, r.replLink.Addr())
	r.fastSync(r.replica)
	r.tap.watch(r.replica.Addr)
	r.col.point(r.replica.Addr)
}

// lost records that fault f, done by now, started a new incarnation of
// the shards of its target (standalone: every shard).
func (r *soakRig) lost(f *faultRun) {
	shards := r.shardsOf(f.target)
	if r.cl == nil {
		shards = r.shardsOf(0)
	}
	r.log.addBoundary(boundary{from: f.start, to: time.Now(), shards: shards})
}

// fastSync makes Redis server n, once a master, start a replica's full
// sync at once: Redis 7 waits 5 s for more replicas by default
// (repl-diskless-sync-delay), and with wait_replicas every gateway's
// event-writing calls would fail for those 5 s after each restart or
// failover, longer than the fast timings' lease + grace allow for the
// fault around them. A restart forgets it: set it again after one.
func (r *soakRig) fastSync(n *redistest.Server) {
	redisCLI(r.t, n.Addr, "CONFIG", "SET", "repl-diskless-sync-delay", "0")
}

// waitRedisSettled waits (bounded) until every replica's link is up and,
// on a Cluster, every node reports cluster_state:ok.
func (r *soakRig) waitRedisSettled() {
	if r.cl == nil {
		r.replica.WaitReplicaLinkUp(r.t, 30*time.Second)
		return
	}
	deadline := time.Now().Add(30 * time.Second)
	for i := range r.cl.Nodes {
		rc := redis.NewClient(&redis.Options{Addr: r.cl.Nodes[i].Addr, MaxRetries: -1})
		for {
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			info, err := rc.ClusterInfo(ctx).Result()
			ok := err == nil && strings.Contains(info, "cluster_state:ok")
			if ok {
				repl, err := rc.Info(ctx, "replication").Result()
				ok = err == nil && (strings.Contains(repl, "role:master") || strings.Contains(repl, "master_link_status:up"))
			}
			cancel()
			if ok {
				break
			}
			if time.Now().After(deadline) {
				rc.Close()
				r.t.Fatalf("cluster node %s not settled after 30s: %v", r.cl.Nodes[i].Addr, err)
			}
			time.Sleep(50 * time.Millisecond)
		}
		rc.Close()
	}
}

// checkInWindows runs the checker every soakWindow on what the collector
// has read, up to a cutoff 3 s before a complete read of every shard (an
// acknowledgement takes at most 2 s to be recorded); it returns what
// stops it.
func (r *soakRig) checkInWindows(chk *soakChecker) (stop func()) {
	quit, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		lastStatus := time.Now()
		for i := 0; i < 1_000_000; i++ {
			select {
			case <-quit:
				return
			case <-time.After(soakWindow):
			}
			from := time.Now()
			if !r.col.poll() {
				continue
			}
			chk.add(r.col.drain())
			chk.window(from.Add(-3 * time.Second))
			if time.Since(lastStatus) >= time.Minute {
				lastStatus = time.Now()
				var ms runtime.MemStats
				runtime.ReadMemStats(&ms)
				r.t.Logf("soak %s: events %d, lives judged %d, heartbeats %d, violations %d, faults %d, heap %d MB",
					r.log.rel(time.Now()), chk.res.Events, chk.res.Judged, chk.res.Heartbeats, chk.res.violations(), r.faultsRun(), ms.HeapInuse>>20)
			}
		}
	}()
	return func() { close(quit); <-done }
}

// soakLogLevel is SOAK_LOG_LEVEL: the gateways' log level throughout the
// soak, "" for the nemesis's draws.
var soakLogLevel = os.Getenv("SOAK_LOG_LEVEL")

const soakWindow = 10 * time.Second

func (r *soakRig) faultsRun() int {
	r.log.mu.Lock()
	defer r.log.mu.Unlock()
	return len(r.log.runs)
}

// checkGatewaysAlive fails the run for a gateway that exited on its own.
func (r *soakRig) checkGatewaysAlive() {
	for _, g := range r.gws {
		if g.cmd == nil {
			continue
		}
		select {
		case err := <-g.done:
			g.cmd = nil
			r.t.Errorf("gateway %s exited on its own: %v\n%s", g.cfg.ID, err, g.log.tail(6000))
		default:
		}
	}
}

// drain takes the events read so far out of the collector.
func (c *collector) drain() []event {
	c.mu.Lock()
	defer c.mu.Unlock()
	evs := slices.Clone(c.events)
	c.events = c.events[:0]
	return evs
}
