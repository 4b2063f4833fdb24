//go:build faults

package faults

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"time"
)

// The randomized fault soak (TestSoak, build tags faults and soak; `make
// soak`): everything it does is drawn from one seed before it starts, so
// that a failing run's seed replays the same topology, fleet and fault
// schedule. Real timing (when a flush or a reap runs, how long a restart
// takes) is not replayed.

// soakPlan is what a seed decides.
type soakPlan struct {
	seed     uint64
	duration time.Duration
	cluster  bool // a 3-master Cluster with replicas; else a primary with a replica
	gateways int
	devices  []devicePlan
	faults   []plannedFault
}

// soakStreams names the PCG streams drawn from the seed: one for the
// set-up, one for the nemesis, two per device (its plan and its
// heartbeat jitter), one per Modbus device (its plan).
const (
	streamSetup = iota
	streamNemesis
	streamDevices = 1 << 32
	streamJitter  = 2 << 32
	streamModbus  = 3 << 32
)

func soakRand(seed, stream uint64) *rand.Rand { return rand.New(rand.NewPCG(seed, stream)) }

// The soak's timeline: no fault during the warm-up, nor in the tail, so
// that the last faults' consequences show before the fleet stops.
const (
	soakWarm = 8 * time.Second
	soakTail = 20 * time.Second
)

// newSoakPlan draws the plan of seed for a run of duration. topology
// ("standalone", "cluster", "" to draw it) and gateways (2, 3, 0 to
// draw it) override the draw; the draws are made either way, so the
// rest of the plan does not change with an override.
func newSoakPlan(seed uint64, duration time.Duration, topology string, gateways, devices int) (soakPlan, error) {
	rng := soakRand(seed, streamSetup)
	p := soakPlan{seed: seed, duration: duration, cluster: rng.IntN(2) == 1, gateways: 2 + rng.IntN(2)}
	switch topology {
	case "":
	case "standalone", "cluster":
		p.cluster = topology == "cluster"
	default:
		return p, fmt.Errorf("topology %q: want standalone or cluster", topology)
	}
	switch gateways {
	case 0:
	case 2, 3:
		p.gateways = gateways
	default:
		return p, fmt.Errorf("gateways %d: want 2 or 3", gateways)
	}
	if devices < 4 {
		return p, fmt.Errorf("devices %d: want at least 4", devices)
	}
	if duration < soakWarm+soakTail+10*time.Second {
		return p, fmt.Errorf("duration %v: want at least %v", duration, soakWarm+soakTail+10*time.Second)
	}
	for i := range devices {
		p.devices = append(p.devices, planDevice(soakRand(seed, streamDevices+uint64(i)), i, devices, p.gateways, duration))
	}
	for i := range max(2, devices/10) {
		p.devices = append(p.devices, planModbus(soakRand(seed, streamModbus+uint64(i)), i, p.gateways, duration))
	}
	p.faults = planFaults(soakRand(seed, streamNemesis), p.cluster, p.gateways, duration)
	return p, nil
}

func (p soakPlan) topology() string {
	if p.cluster {
		return "cluster"
	}
	return "standalone"
}

// devKind is how a soak device speaks.
type devKind int

const (
	kindCoAP   devKind = iota // CoAP, one instance (session s=main)
	kindCoAP2                 // CoAP, two instances (main and aux), the aux one ending on its own
	kindMQTT                  // MQTT 5, a clean session per connection; reconnect storms drop it
	kindSleepy                // MQTT 5 with a persistent session: connect, publish, disconnect, sleep
	kindModbus                // a Modbus TCP server that one gateway's modbus adapter polls
)

func (k devKind) String() string { return [...]string{"coap", "coap2", "mqtt", "sleepy", "modbus"}[k] }

// slots is how many sessions of its own a device keeps at once.
func (k devKind) slots() int {
	if k == kindCoAP2 {
		return 2
	}
	return 1
}

// instances are the CoAP instances (sessions) of a device, by slot.
var instances = [2]string{"main", "aux"}

// devicePlan is one device's lives over the run.
type devicePlan struct {
	id    string
	kind  devKind
	lives []life
}

// life is one incarnation of a device: it sends from start to end (times
// from the fleet's start), then leaves or goes silent, and may come back
// in a later life. A life whose end is the run's duration is ended by the
// fleet's stop, and is not judged for its offline.
type life struct {
	start, end time.Duration
	gw         int
	leave      bool
	moves      []move
	// auxEnd: when the aux instance of a kindCoAP2 device ends (0: with
	// the main one), with a goodbye when auxLeave.
	auxEnd   time.Duration
	auxLeave bool
}

// planDevice draws device i of n: a mix of lives short (2–10 s), common
// (10–90 s) and long (90–400 s), each on a random gateway with 0–3 moves,
// ending with a goodbye (40 %) or silence, then a pause that is short
// (0.3–3 s: back before its offline is due, 40 %) or long (5–60 s).
func planDevice(rng *rand.Rand, i, n, gateways int, duration time.Duration) devicePlan {
	kind := kindCoAP
	switch r := float64(i) / float64(n); {
	case r >= 0.85:
		kind = kindSleepy
	case r >= 0.55:
		kind = kindMQTT
	case r >= 0.45:
		kind = kindCoAP2
	}
	d := devicePlan{id: fmt.Sprintf("soak-%s-%03d", kind, i), kind: kind}
	between := func(lo, hi time.Duration) time.Duration { return lo + time.Duration(rng.Int64N(int64(hi-lo)+1)) }
	t := between(0, 3*time.Second)
	for len(d.lives) < 10000 && t < duration-time.Second {
		var length time.Duration
		switch r := rng.Float64(); {
		case r < 0.25:
			length = between(2*time.Second, 10*time.Second)
		case r < 0.85:
			length = between(10*time.Second, 90*time.Second)
		default:
			length = between(90*time.Second, 400*time.Second)
		}
		l := life{start: t, end: min(t+length, duration), gw: rng.IntN(gateways), leave: rng.Float64() < 0.4}
		if span := l.end - l.start; span > 2*time.Second {
			var ats []time.Duration
			for range rng.IntN(4) {
				ats = append(ats, between(l.start+500*time.Millisecond, l.end-500*time.Millisecond))
			}
			slices.Sort(ats)
			cur := l.gw
			for _, at := range ats {
				to := (cur + 1 + rng.IntN(gateways-1)) % gateways
				l.moves = append(l.moves, move{at: at, to: to})
				cur = to
			}
			if kind == kindCoAP2 && rng.IntN(2) == 0 {
				l.auxEnd, l.auxLeave = between(l.start+time.Second, l.end-500*time.Millisecond), rng.IntN(2) == 0
			}
		}
		d.lives = append(d.lives, l)
		if rng.Float64() < 0.4 {
			t = l.end + between(300*time.Millisecond, 3*time.Second)
		} else {
			t = l.end + between(5*time.Second, 60*time.Second)
		}
	}
	return d
}

// planModbus draws Modbus device i: lives drawn as planDevice draws
// them, each polled by gateway i mod gateways (the adapter's device list
// is its config), without moves or goodbyes (a Modbus device only
// answers, or stops answering).
func planModbus(rng *rand.Rand, i, gateways int, duration time.Duration) devicePlan {
	d := planDevice(rng, 0, 1, gateways, duration)
	d.id, d.kind = fmt.Sprintf("soak-modbus-%03d", i), kindModbus
	for j := range d.lives {
		l := &d.lives[j]
		l.gw, l.leave, l.moves, l.auxEnd = i%gateways, false, nil, 0
	}
	return d
}

// faultKind is one fault the nemesis knows.
type faultKind int

const (
	redisStop     faultKind = iota // SIGSTOP, SIGCONT after the duration
	redisSlow                      // CPU-starved (cgroup quota) for the duration
	redisRestart                   // kill -9 and restart without persistence (after a failover: into the promoted replica's last full sync)
	redisFailover                  // the primary (a Cluster master) killed -9, its replica promoted
	redisFlush                     // FLUSHALL
	gwPartition                    // the gateway's link to Redis cut (proxy)
	gwLatency                      // the gateway's replies from Redis delayed (proxy)
	gwKill                         // kill -9, restarted after the duration
	gwStop                         // SIGSTOP, SIGCONT after the duration
	gwSlow                         // CPU-starved for the duration
	gwReload                       // SIGHUP with a changed configuration
	mqttStorm                      // every MQTT connection of a gateway (or all) dropped and re-made at once
)

// kindInfo describes a fault kind to the planner and the checker.
type kindInfo struct {
	name   string
	weight int
	// lo, hi bound the duration drawn (zero: instant); clusterHi, when
	// set, is the bound on a Cluster (a master stopped or starved longer
	// than cluster-node-timeout is failed over, and continuing it then
	// hits the known limit of docs/reliability.md).
	lo, hi, clusterHi time.Duration
	// extra is what the fault takes beyond its duration (a restart).
	extra time.Duration
	// onRedis: the target is a Redis node and every gateway is affected;
	// else the target is a gateway (or none for a storm).
	onRedis        bool
	standaloneOnly bool // needs the proxies in front of a standalone server
	// outage: the fault may keep a gateway's writes from the store, or
	// the store from running, so it widens the detection bound.
	outage bool
	// readsLate: the gateway process is stopped or starved, so it may
	// read a device's request long after the device sent it.
	readsLate bool
	// cut: the gateway may acknowledge evidence it cannot write (it
	// goes to the outbox, or waits in a stopped process) while the store
	// does not hear it. (A gateway whose replies are delayed is heard:
	// its calls reach Redis in time.)
	cut bool
}

var faultKinds = map[faultKind]kindInfo{
	redisStop:     {name: "redis-stop", weight: 10, lo: 500 * time.Millisecond, hi: 5 * time.Second, clusterHi: 1200 * time.Millisecond, onRedis: true, outage: true},
	redisSlow:     {name: "redis-slow", weight: 8, lo: time.Second, hi: 5 * time.Second, onRedis: true, outage: true},
	redisRestart:  {name: "redis-restart", weight: 5, extra: time.Second, onRedis: true, outage: true},
	redisFailover: {name: "redis-failover", weight: 4, onRedis: true, outage: true},
	redisFlush:    {name: "redis-flushall", weight: 3, extra: 500 * time.Millisecond, onRedis: true, outage: true},
	gwPartition:   {name: "gw-partition", weight: 10, lo: 500 * time.Millisecond, hi: 5 * time.Second, standaloneOnly: true, outage: true, cut: true},
	gwLatency:     {name: "gw-latency", weight: 7, lo: time.Second, hi: 5 * time.Second, standaloneOnly: true, outage: true},
	gwKill:        {name: "gw-kill", weight: 10, lo: 200 * time.Millisecond, hi: 3 * time.Second, extra: 1500 * time.Millisecond, outage: true},
	gwStop:        {name: "gw-stop", weight: 8, lo: 500 * time.Millisecond, hi: 5 * time.Second, outage: true, readsLate: true, cut: true},
	gwSlow:        {name: "gw-slow", weight: 8, lo: time.Second, hi: 5 * time.Second, outage: true, readsLate: true},
	gwReload:      {name: "gw-reload", weight: 12},
	mqttStorm:     {name: "mqtt-storm", weight: 8},
}

func (k faultKind) String() string { return faultKinds[k].name }

// soakCap bounds the time a gateway's path to the store is faulty in one
// stretch (the union of the faults touching it, faults less than
// soakSettle apart counted as one): 3 s inside lease + grace, the margin
// for a restart's or a reconnect's real time. An outage shorter than
// lease + grace must emit no device event (invariant 9), so every
// offline of a device that kept sending is false.
var soakCap = fast.lease + fast.grace - 3*time.Second

// soakSettle is how long a gateway takes to be back to normal after a
// fault on its path ends (the probe of a store that was down backs off to
// an eighth of the lease, then the outbox replays).
const soakSettle = 2 * time.Second

// Failovers run alone: the time they take is the Cluster's or the new
// replica's, and the planner reserves this much.
const (
	failoverStandalone = 6 * time.Second
	failoverCluster    = 15 * time.Second
)

// plannedFault is one line of the nemesis's schedule.
type plannedFault struct {
	n      int
	at     time.Duration // from the fleet's start
	kind   faultKind
	dur    time.Duration
	target int // gateway, Redis node (standalone: 0 primary, 1 replica) or Cluster master group (0–2); -1: every gateway
	// lo, hi: gwLatency's delay range; lag: a standalone failover's
	// replication cut before the kill (0: none); reload: the variant.
	lo, hi, lag time.Duration
	reload      reloadVariant
}

// reloadVariant is what a SIGHUP changes: keys that take effect at once
// (docs/design.md §6.5) without moving the bounds the checker uses
// (a flush interval no longer than the harness's).
type reloadVariant struct {
	flush    time.Duration
	maxBatch int
	level    string
}

// targetName names the target as the schedule prints it.
func (f plannedFault) targetName(cluster bool) string {
	info := faultKinds[f.kind]
	switch {
	case f.target < 0:
		return "all"
	case info.onRedis && cluster:
		return fmt.Sprintf("master-%d", f.target)
	case info.onRedis && f.target == 1:
		return "replica"
	case info.onRedis:
		return "primary"
	}
	return "gw-" + string(rune('a'+f.target))
}

// detail is the schedule line's tail beyond kind, target and duration.
func (f plannedFault) detail() string {
	switch f.kind {
	case gwLatency:
		return fmt.Sprintf(" delay %v–%v", f.lo, f.hi)
	case redisFailover:
		if f.lag > 0 {
			return fmt.Sprintf(" replica lagging %v", f.lag)
		}
	case gwReload:
		return fmt.Sprintf(" flush_interval %v max_batch %d log.level %s", f.reload.flush, f.reload.maxBatch, f.reload.level)
	}
	return ""
}

// span is the time the fault may keep a path to the store faulty.
func (f plannedFault) span() (from, to time.Duration) {
	return f.at, f.at + f.dur + faultKinds[f.kind].extra
}

// affects reports whether the fault touches gateway g's path to the store.
func (f plannedFault) affects(g int) bool {
	info := faultKinds[f.kind]
	return info.outage && (info.onRedis || f.target == g)
}

// planFaults draws the nemesis's schedule: from the end of the warm-up
// to the tail, a fault or (35 %) two overlapping ones, then a quiet gap
// of 2.5–12 s. Two faults at once never share a target (Redis counts as
// one), a failover runs alone, and no gateway's path is faulty longer
// than soakCap in one stretch.
func planFaults(rng *rand.Rand, cluster bool, gateways int, duration time.Duration) []plannedFault {
	var kinds []faultKind
	total := 0
	for k := redisStop; k <= mqttStorm; k++ {
		if info := faultKinds[k]; !(cluster && info.standaloneOnly) {
			kinds = append(kinds, k)
			total += info.weight
		}
	}
	between := func(lo, hi time.Duration) time.Duration {
		return (lo + time.Duration(rng.Int64N(int64(hi-lo)+1))).Round(time.Millisecond)
	}
	draw := func(at time.Duration) plannedFault {
		w := rng.IntN(total)
		k := kinds[0]
		for _, k = range kinds {
			if w -= faultKinds[k].weight; w < 0 {
				break
			}
		}
		info := faultKinds[k]
		f := plannedFault{at: at, kind: k}
		if hi := info.hi; hi > 0 {
			if cluster && info.clusterHi > 0 {
				hi = info.clusterHi
			}
			f.dur = between(min(info.lo, hi), hi)
		}
		switch {
		case info.onRedis && cluster:
			f.target = rng.IntN(3)
		case info.onRedis && (k == redisStop || k == redisSlow):
			f.target = 0
			if rng.IntN(4) == 0 {
				f.target = 1
			}
		case info.onRedis:
			f.target = 0
		case k == mqttStorm && rng.IntN(3) == 0:
			f.target = -1
		default:
			f.target = rng.IntN(gateways)
		}
		switch k {
		case gwLatency:
			f.lo = between(100*time.Millisecond, time.Second)
			f.hi = f.lo + between(200*time.Millisecond, 2*time.Second)
		case redisFailover:
			if !cluster && rng.IntN(2) == 0 {
				f.lag = between(300*time.Millisecond, 1500*time.Millisecond)
			}
		case gwReload:
			f.reload = reloadVariant{
				flush:    []time.Duration{100 * time.Millisecond, fast.flush}[rng.IntN(2)],
				maxBatch: []int{200, 1000}[rng.IntN(2)],
				level:    []string{"info", "warn"}[rng.IntN(2)],
			}
		}
		return f
	}
	var out []plannedFault
	add := func(f plannedFault) {
		f.n = len(out) + 1
		out = append(out, f)
	}
	t := soakWarm
	for len(out) < 100000 {
		f := draw(t)
		if _, to := f.span(); to > duration-soakTail {
			break
		}
		end := f.at + f.dur + faultKinds[f.kind].extra
		if f.kind == redisFailover {
			end = f.at + f.lag + failoverStandalone
			if cluster {
				end = f.at + failoverCluster
			}
			add(f)
		} else {
			add(f)
			if rng.Float64() < 0.35 {
				for range 5 {
					g := draw(f.at + between(0, max(f.dur, time.Second)))
					if g.kind == redisFailover || sameTarget(f, g) {
						continue
					}
					if !capped(f, &g, gateways) {
						continue
					}
					if _, to := g.span(); to > duration-soakTail {
						break
					}
					add(g)
					end = max(end, g.at+g.dur+faultKinds[g.kind].extra)
					break
				}
			}
		}
		t = end + between(2500*time.Millisecond, 12*time.Second)
	}
	return out
}

// sameTarget: the two faults would act on the same process or link.
func sameTarget(a, b plannedFault) bool {
	ia, ib := faultKinds[a.kind], faultKinds[b.kind]
	if ia.onRedis || ib.onRedis {
		return ia.onRedis && ib.onRedis
	}
	return a.target == b.target || a.target < 0 || b.target < 0
}

// capped shortens b, which starts during a, so that no gateway touched by
// both is faulty longer than soakCap; false when b would then be shorter
// than its kind allows.
func capped(a plannedFault, b *plannedFault, gateways int) bool {
	for g := range gateways {
		if !a.affects(g) || !b.affects(g) {
			continue
		}
		from, _ := a.span()
		_, ato := a.span()
		if ato-from > soakCap {
			return false
		}
		if _, bto := b.span(); bto-from > soakCap {
			info := faultKinds[b.kind]
			if info.hi == 0 {
				return false
			}
			b.dur = from + soakCap - info.extra - b.at
			if b.dur < info.lo {
				return false
			}
		}
	}
	return true
}
