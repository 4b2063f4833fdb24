//go:build faults

package faults

import (
	"reflect"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"
)

// The soak's plan is a function of the seed, an override of the topology
// changes nothing else, and every schedule keeps the nemesis's rules:
// no fault in the warm-up or the tail, at most two at once, never two on
// one target, a failover alone, no gateway's path faulty longer than
// soakCap in one stretch, no proxy fault on a Cluster, a Cluster master
// stopped no longer than its bound; every kind is drawn.
func TestSoakPlan(t *testing.T) {
	const duration = 30 * time.Minute
	drawn := map[faultKind]bool{}
	for _, topo := range []string{"standalone", "cluster"} {
		for seed := uint64(1); seed <= 8; seed++ {
			a, err := newSoakPlan(seed, duration, topo, 0, 120)
			if err != nil {
				t.Fatal(err)
			}
			b, _ := newSoakPlan(seed, duration, topo, 0, 120)
			if !reflect.DeepEqual(a, b) {
				t.Fatalf("seed %d %s: two plans differ", seed, topo)
			}
			if len(a.faults) < 100 {
				t.Errorf("seed %d %s: %d faults in %v, want more than 100", seed, topo, len(a.faults), duration)
			}
			for _, f := range a.faults {
				drawn[f.kind] = true
			}
			checkSchedule(t, a)
			checkModbusPlan(t, a, 12)
		}
	}
	for k := redisStop; k <= mqttStorm; k++ {
		if !drawn[k] {
			t.Errorf("%v never drawn", k)
		}
	}
	a, _ := newSoakPlan(7, 5*time.Minute, "standalone", 2, 50)
	b, _ := newSoakPlan(7, 5*time.Minute, "cluster", 3, 50)
	c, _ := newSoakPlan(8, 5*time.Minute, "standalone", 2, 50)
	if a.seed != b.seed || len(a.devices) != len(b.devices) || a.devices[0].id != b.devices[0].id || !reflect.DeepEqual(a.devices[0].lives[0].start, b.devices[0].lives[0].start) {
		t.Errorf("the topology and gateway overrides changed the fleet's plan")
	}
	if reflect.DeepEqual(a.faults, c.faults) {
		t.Errorf("seeds 7 and 8 drew the same schedule")
	}
	if _, err := newSoakPlan(1, 10*time.Second, "", 0, 50); err == nil {
		t.Errorf("a run shorter than the warm-up and the tail was accepted")
	}
}

// checkModbusPlan: the plan has want Modbus devices, each polled by one
// gateway in every life, without moves or goodbyes.
func checkModbusPlan(t *testing.T, p soakPlan, want int) {
	t.Helper()
	n := 0
	for _, d := range p.devices {
		if d.kind != kindModbus {
			continue
		}
		n++
		for _, l := range d.lives {
			if l.gw != d.lives[0].gw || l.leave || len(l.moves) > 0 || l.auxEnd != 0 {
				t.Fatalf("seed %d: Modbus device %s life %+v: want no move, goodbye or aux, one gateway", p.seed, d.id, l)
			}
		}
	}
	if n != want {
		t.Errorf("seed %d: %d Modbus devices, want %d", p.seed, n, want)
	}
}

func checkSchedule(t *testing.T, p soakPlan) {
	t.Helper()
	name := func(f plannedFault) string { return f.kind.String() + " " + f.targetName(p.cluster) }
	var spans [][2]time.Duration
	for i, f := range p.faults {
		info := faultKinds[f.kind]
		from, to := f.span()
		if from < soakWarm || to > p.duration-soakTail {
			t.Fatalf("seed %d: #%d %s at %v..%v, outside %v..%v", p.seed, f.n, name(f), from, to, soakWarm, p.duration-soakTail)
		}
		if p.cluster && (info.standaloneOnly || (info.clusterHi > 0 && f.dur > info.clusterHi)) {
			t.Fatalf("seed %d: #%d %s for %v on a Cluster", p.seed, f.n, name(f), f.dur)
		}
		if f.dur < min(info.lo, info.hi) || (info.hi > 0 && f.dur > info.hi) {
			t.Fatalf("seed %d: #%d %s for %v, outside %v..%v", p.seed, f.n, name(f), f.dur, info.lo, info.hi)
		}
		end := to
		if f.kind == redisFailover {
			end = from + f.lag + failoverStandalone
			if p.cluster {
				end = from + failoverCluster
			}
		}
		spans = append(spans, [2]time.Duration{from, end})
		for j := range i {
			g := p.faults[j]
			if spans[j][1] <= from {
				continue
			}
			if f.kind == redisFailover || g.kind == redisFailover || sameTarget(f, g) {
				t.Fatalf("seed %d: #%d %s overlaps #%d %s", p.seed, f.n, name(f), g.n, name(g))
			}
			for k := range j {
				if spans[k][1] > from {
					t.Fatalf("seed %d: #%d, #%d and #%d at once", p.seed, p.faults[k].n, g.n, f.n)
				}
			}
		}
	}
	for g := range p.gateways {
		var s [][2]time.Duration
		for _, f := range p.faults {
			if f.affects(g) {
				s = append(s, spanOf(f))
			}
		}
		sort.Slice(s, func(i, j int) bool { return s[i][0] < s[j][0] })
		for i := 0; i < len(s); {
			from, to := s[i][0], s[i][1]
			for i++; i < len(s) && s[i][0] < to+soakSettle; i++ {
				to = max(to, s[i][1])
			}
			if to-from > soakCap {
				t.Fatalf("seed %d: gw-%c faulty %v..%v (%v), longer than %v", p.seed, 'a'+g, from, to, to-from, soakCap)
			}
		}
	}
}

// spanOf is the span a fault may keep a path faulty, a failover's
// included (its reserved time is not all outage).
func spanOf(f plannedFault) [2]time.Duration {
	from, to := f.span()
	if f.kind == redisFailover {
		to = from + f.lag
	}
	return [2]time.Duration{from, to}
}

// The soak's checker counts what it must, on a made-up truth and log:
// a clean device, a false offline, an expiry after the device's gateway
// was down past its deadline, one after its gateway acknowledged a
// request only after it, one of a session left behind that ran out after
// the device's goodbye (none of them false), an offline held by a cut
// gateway, the offline of a goodbye after the device came back, a missed
// offline, a repeated version, a resurrection after a goodbye, unseen
// evidence, and two onlines across a Cluster failover.
func TestSoakChecker(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	at := func(d time.Duration) time.Time { return t0.Add(d) }
	ids := []string{"clean", "false", "late", "acklate", "dangling", "held", "back", "missed", "repeat", "revived", "unseen", "across", "resynced", "back2", "prompt", "never", "heldbye"}
	var plans []devicePlan
	for _, id := range ids {
		kind := kindCoAP
		if id == "back2" {
			kind = kindCoAP2
		}
		plans = append(plans, devicePlan{id: id, kind: kind})
	}
	tr := newSoakTruth(2, plans)
	// sends every 500 ms from..to through gateway gw
	send := func(id string, from, to time.Duration, gw int) {
		s := &tr.devs[id].slots[0]
		for d := from; d <= to; d += 500 * time.Millisecond {
			s.sends, s.acks, s.gws = append(s.sends, at(d)), append(s.acks, at(d+5*time.Millisecond)), append(s.gws, gw)
		}
	}
	// a life from..to (to 0: running) ending with silence or a goodbye
	live := func(id string, from, to time.Duration, bye bool) {
		lf := &lifeRecord{start: at(from), lastTry: make([]time.Time, 2)}
		if to > 0 {
			lf.end, lf.lastTry[0], lf.lastAck = at(to), at(to), at(to)
			lf.ends = []sessionEnd{{at: at(to), leave: bye}}
			if bye {
				tr.devs[id].slots[0].leaves = append(tr.devs[id].slots[0].leaves, at(to))
			}
		}
		tr.devs[id].lives = append(tr.devs[id].lives, lf)
	}
	send("clean", 0, 5*time.Second, 0)
	live("clean", 0, 5*time.Second, false)
	send("false", 0, 30*time.Second, 0)
	live("false", 0, 0, false)
	// late: its gateway down from 3 to 7.2 s; its session expires at its
	// deadline, 7 s, and the offline comes after its next evidence
	send("late", 0, 3*time.Second, 0)
	send("late", 7200*time.Millisecond, 30*time.Second, 0)
	live("late", 0, 0, false)
	// acklate: its gateway stopped from 3 to 7.25 s; a request sent at
	// 6.9 s is acknowledged at 7.3 s, after the deadline (7 s)
	send("acklate", 0, 3*time.Second, 0)
	sl := &tr.devs["acklate"].slots[0]
	sl.sends, sl.acks, sl.gws = append(sl.sends, at(6900*time.Millisecond)), append(sl.acks, at(7300*time.Millisecond)), append(sl.gws, 0)
	live("acklate", 0, 0, false)
	// dangling: a session it left behind (deadline 9.25 s, held by a
	// fault) expires at 13.3 s, after its goodbye at 11.8 s ended the
	// other one
	send("dangling", 0, 11500*time.Millisecond, 0)
	live("dangling", 0, 11800*time.Millisecond, true)
	// held: moves to gw-b at 11 s, which is cut from 10 to 16 s; its
	// session on gw-a expires at 14 s
	send("held", 0, 10500*time.Millisecond, 0)
	send("held", 11*time.Second, 30*time.Second, 1)
	tr.devs["held"].moves = []time.Time{at(11 * time.Second)}
	live("held", 0, 0, false)
	// back: says goodbye at 20 s and comes back at 20.2 s
	send("back", 0, 19500*time.Millisecond, 0)
	live("back", 0, 20*time.Second, true)
	send("back", 20200*time.Millisecond, 30*time.Second, 0)
	live("back", 20200*time.Millisecond, 0, false)
	send("missed", 0, 2*time.Second, 0)
	live("missed", 0, 2*time.Second, false)
	send("repeat", 0, 30*time.Second, 0)
	live("repeat", 0, 0, false)
	send("revived", 0, 3*time.Second, 0)
	live("revived", 0, 3500*time.Millisecond, true)
	// unseen: a first life, its offline, a second life with no online
	send("unseen", 0, time.Second, 0)
	live("unseen", 0, time.Second, false)
	send("unseen", 10*time.Second, 20*time.Second, 0)
	live("unseen", 10*time.Second, 0, false)
	send("across", 0, 30*time.Second, 1)
	live("across", 0, 0, false)
	// resynced: as unseen, but its shard's state is replaced at 5 s
	// (a restart from an older snapshot that has it online): its second
	// life renews that record with no event
	send("resynced", 0, time.Second, 1)
	live("resynced", 0, time.Second, false)
	send("resynced", 10*time.Second, 20*time.Second, 1)
	live("resynced", 10*time.Second, 0, false)
	// back2: two instances; the second goes silent at 3 s, the first
	// says goodbye at 20 s, and both come back at 20.2 s: the goodbye's
	// offline at 20.4 s is the first life's
	send("back2", 0, 19500*time.Millisecond, 0)
	sl2 := &tr.devs["back2"].slots[1]
	for d := time.Duration(0); d <= 3*time.Second; d += 500 * time.Millisecond {
		sl2.sends, sl2.acks, sl2.gws = append(sl2.sends, at(d)), append(sl2.acks, at(d+5*time.Millisecond)), append(sl2.gws, 0)
	}
	live("back2", 0, 20*time.Second, true)
	tr.devs["back2"].lives[0].ends = append(tr.devs["back2"].lives[0].ends, sessionEnd{at: at(3 * time.Second)})
	send("back2", 20200*time.Millisecond, 30*time.Second, 0)
	sl2.sends, sl2.acks, sl2.gws = append(sl2.sends, at(20200*time.Millisecond)), append(sl2.acks, at(20205*time.Millisecond)), append(sl2.gws, 0)
	live("back2", 20200*time.Millisecond, 0, false)
	// prompt: a second life begun 10.4 ms after 10 s, 9 s after the first
	// one's last attempt; its online, written at once, is timed 10.010 s
	send("prompt", 0, time.Second, 0)
	live("prompt", 0, time.Second, false)
	send("prompt", 10*time.Second+10400*time.Microsecond, 20*time.Second, 0)
	live("prompt", 10*time.Second+10400*time.Microsecond, 0, false)

	// never: a second life none of whose attempts reached a gateway (every
	// gateway it tried was down throughout): it owes no offline
	send("never", 0, time.Second, 0)
	live("never", 0, time.Second, false)
	tr.devs["never"].lives = append(tr.devs["never"].lives, &lifeRecord{start: at(6 * time.Second), end: at(8 * time.Second), lastTry: make([]time.Time, 2)})

	// heldbye: on shard 2, says goodbye at 5.6 s, within the grace after
	// the new incarnation that begins at 5 s, and comes back at 8.4 s:
	// the goodbye's offline, held through the grace, comes at 8.5 s
	send("heldbye", 0, 5500*time.Millisecond, 1)
	live("heldbye", 0, 5600*time.Millisecond, true)
	send("heldbye", 8400*time.Millisecond, 30*time.Second, 0)
	live("heldbye", 8400*time.Millisecond, 0, false)

	fl := &faultLog{t0: t0}
	fl.runs = []*faultRun{{plannedFault: plannedFault{n: 1, kind: gwPartition, target: 1}, info: faultKinds[gwPartition], targetName: "gw-b", gw: 1,
		start: at(10 * time.Second), end: at(16 * time.Second)}}
	fl.boundaries = []boundary{{from: at(5 * time.Second), to: at(6 * time.Second), shards: []int{2}}}
	ev := func(dev, state string, ver int64, d time.Duration, reason, gw string) event {
		e := event{device: dev, state: state, ver: ver, at: at(d), reason: reason, gw: gw}
		if reason == "expired" {
			e.deadline = e.at
		}
		return e
	}
	var logged []string
	chk := newSoakChecker(fast, tr, fl, func(f string, a ...any) { logged = append(logged, f) })
	chk.add([]event{
		ev("clean", "online", 1, 100*time.Millisecond, "connect", "gw-a"),
		ev("clean", "offline", 2, 9*time.Second, "expired", "gw-a"),
		ev("false", "online", 1, 100*time.Millisecond, "connect", "gw-a"),
		ev("false", "offline", 2, 10*time.Second, "expired", "gw-a"),
		ev("false", "online", 3, 10500*time.Millisecond, "replay", "gw-a"),
		ev("late", "online", 1, 100*time.Millisecond, "connect", "gw-a"),
		{device: "late", state: "offline", ver: 2, at: at(7300 * time.Millisecond), deadline: at(7 * time.Second), reason: "expired", gw: "gw-a"},
		ev("late", "online", 3, 7400*time.Millisecond, "connect", "gw-a"),
		ev("acklate", "online", 1, 100*time.Millisecond, "connect", "gw-a"),
		{device: "acklate", state: "offline", ver: 2, at: at(7400 * time.Millisecond), deadline: at(7 * time.Second), reason: "expired", gw: "gw-a"},
		ev("acklate", "online", 3, 7500*time.Millisecond, "connect", "gw-a"),
		ev("dangling", "online", 1, 100*time.Millisecond, "connect", "gw-a"),
		{device: "dangling", state: "offline", ver: 2, at: at(13300 * time.Millisecond), deadline: at(9250 * time.Millisecond), reason: "expired", gw: "gw-a"},
		ev("held", "online", 1, 100*time.Millisecond, "connect", "gw-a"),
		ev("held", "offline", 2, 14*time.Second, "expired", "gw-a"),
		ev("held", "online", 3, 16500*time.Millisecond, "replay", "gw-b"),
		ev("back", "online", 1, 100*time.Millisecond, "connect", "gw-a"),
		ev("back", "offline", 2, 20400*time.Millisecond, "leave", "gw-a"),
		ev("back", "online", 3, 20600*time.Millisecond, "connect", "gw-a"),
		ev("back2", "online", 1, 100*time.Millisecond, "connect", "gw-a"),
		ev("back2", "offline", 2, 20400*time.Millisecond, "leave", "gw-a"),
		ev("back2", "online", 3, 20600*time.Millisecond, "connect", "gw-a"),
		ev("prompt", "online", 1, 100*time.Millisecond, "connect", "gw-a"),
		ev("prompt", "offline", 2, 5*time.Second, "expired", "gw-a"),
		ev("prompt", "online", 3, 10010*time.Millisecond, "connect", "gw-a"),
		ev("missed", "online", 1, 100*time.Millisecond, "connect", "gw-a"),
		ev("repeat", "online", 1, 100*time.Millisecond, "connect", "gw-a"),
		ev("repeat", "online", 1, 12*time.Second, "renew", "gw-a"),
		ev("revived", "online", 1, 100*time.Millisecond, "connect", "gw-a"),
		ev("revived", "offline", 2, 3600*time.Millisecond, "leave", "gw-a"),
		ev("revived", "online", 3, 5*time.Second, "replay", "gw-a"),
		ev("never", "online", 1, 100*time.Millisecond, "connect", "gw-a"),
		ev("never", "offline", 2, 5*time.Second, "expired", "gw-a"),
		ev("unseen", "online", 1, 100*time.Millisecond, "connect", "gw-a"),
		ev("unseen", "offline", 2, 5*time.Second, "expired", "gw-a"),
		{shard: 2, device: "across", state: "online", ver: 1, at: at(100 * time.Millisecond), reason: "connect", gw: "gw-b"},
		{shard: 2, device: "across", state: "online", ver: 7000, at: at(7 * time.Second), reason: "renew", gw: "gw-b"},
		{shard: 2, device: "heldbye", state: "online", ver: 1, at: at(100 * time.Millisecond), reason: "connect", gw: "gw-b"},
		{shard: 2, device: "heldbye", state: "offline", ver: 6000, at: at(8500 * time.Millisecond), deadline: at(5600 * time.Millisecond), reason: "leave", gw: "gw-b"},
		{shard: 2, device: "heldbye", state: "online", ver: 6001, at: at(8600 * time.Millisecond), reason: "connect", gw: "gw-a"},
		{shard: 2, device: "resynced", state: "online", ver: 1, at: at(100 * time.Millisecond), reason: "connect", gw: "gw-b"},
		{shard: 2, device: "resynced", state: "offline", ver: 2, at: at(4 * time.Second), deadline: at(4 * time.Second), reason: "expired", gw: "gw-b"},
	})
	chk.window(at(40 * time.Second))
	r := chk.res
	got := []int{r.FalseOffline, r.MissedOffline, r.Repeated, r.BrokenAlternation, r.Resurrected, r.Unseen, r.HeldByCut, r.AcrossLoss, r.VerBackwards}
	// revived is missed too: its resurrection left it online past its bound
	want := []int{1, 2, 1, 1, 1, 1, 1, 2, 0}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("false, missed, repeated, broken alternation, resurrected, unseen, held by a cut gateway, across a loss, backwards = %v, want %v; examples:\n%s",
			got, want, strings.Join(r.examples, "\n"))
	}
	for i, want := range []string{"false offline false ", "held by a cut gateway ", "missed offline missed:", "repeated repeat ", "broken alternation repeat ",
		"resurrected revived ", "missed offline revived:", "unseen unseen:"} {
		if i >= len(r.examples) || !strings.HasPrefix(r.examples[i], want) {
			t.Fatalf("violations:\n%s\nwant them in this order: %s ...", strings.Join(r.examples, "\n"), want)
		}
	}
	lags := slices.Sorted(slices.Values(r.Lags))
	if !slices.Equal(lags, []time.Duration{3 * time.Second, 4 * time.Second, 4 * time.Second, 4 * time.Second}) {
		t.Fatalf("lags %v, want 3s, 4s, 4s, 4s (clean: offline at 9 s, last evidence at 5 s; unseen's and prompt's first lives: 5 s and 1 s; resynced's: 4 s and 1 s)", r.Lags)
	}
	if len(logged) != r.violations() {
		t.Fatalf("%d violations printed, want %d", len(logged), r.violations())
	}
}
