package storetest

import (
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/fleetgate/fleetgate/gateway"
)

// collector gathers the events that concurrent calls returned.
type collector struct {
	mu  sync.Mutex
	evs []gateway.Event
}

func (c *collector) add(evs []gateway.Event) {
	c.mu.Lock()
	c.evs = append(c.evs, evs...)
	c.mu.Unlock()
}

// checkReturnedAreLogged checks that the events the calls returned are
// the log of shard, in some interleaving: the same set of IDs, each
// event identical.
func (e *env) checkReturnedAreLogged(shard int, returned []gateway.Event) []gateway.Event {
	e.t.Helper()
	log := e.log(shard)
	byID := map[string]gateway.Event{}
	for _, ev := range returned {
		if _, dup := byID[ev.ID]; dup {
			e.t.Errorf("two calls returned event %s", ev.ID)
		}
		byID[ev.ID] = ev
	}
	for _, ev := range log {
		r, ok := byID[ev.ID]
		switch {
		case !ok:
			e.t.Errorf("logged event %s was returned by no call", describeEvent(ev))
		case !sameEvent(r, ev):
			e.t.Errorf("returned event %s is logged as %s", describeEvent(r), describeEvent(ev))
		}
		delete(byID, ev.ID)
	}
	for _, ev := range byID {
		e.t.Errorf("returned event %s is not in the log", describeEvent(ev))
	}
	return log
}

// checkAlternation checks invariant 5 over a log and returns each
// device's last event.
func checkAlternation(t *testing.T, log []gateway.Event) map[gateway.DeviceID]gateway.Event {
	t.Helper()
	last := map[gateway.DeviceID]gateway.Event{}
	for _, ev := range log {
		prev, seen := last[ev.Device]
		want := gateway.Online
		if seen && prev.State == gateway.Online {
			want = gateway.Offline
		}
		if ev.State != want || ev.Ver != nextVer(prev.Ver, ev.At) {
			t.Errorf("invariant 5: %s's events go from v%d %s to %s", ev.Device, prev.Ver, prev.State, describeEvent(ev))
		}
		last[ev.Device] = ev
	}
	return last
}

// testConcurrentApply: batches applied at once to one shard are each
// atomic: no session write is lost, the events alternate, and the events
// the calls return are exactly the log.
func testConcurrentApply(t *testing.T, open Opener) {
	e := newEnv(t, open, 2)
	devs := devicesIn(t, 2, 0, 2, "conc")
	const writers, rounds = 4, 25
	now := e.now()
	var got collector
	// present[w] is writer w's view of its own sessions after its last
	// batch; each session is written by one writer only.
	present := make([]map[gateway.DeviceID]map[gateway.SessionID]bool, writers)
	var wg sync.WaitGroup
	for w := range writers {
		present[w] = map[gateway.DeviceID]map[gateway.SessionID]bool{}
		for _, d := range devs {
			present[w][d] = map[gateway.SessionID]bool{}
		}
		wg.Go(func() {
			gw := fmt.Sprintf("gw-%d", w)
			for r := range rounds {
				var ws []gateway.Write
				for i := range 1 + (w+r)%3 {
					d := devs[(w+r+i)%len(devs)]
					s := gateway.SessionID(fmt.Sprintf("%s/%d", gw, (r+i)%2))
					kind := []gateway.Kind{gateway.Connect, gateway.Renew, gateway.Leave}[(w*r+i)%3]
					ws = append(ws, wr(d, s, kind, 0))
					present[w][d][s] = kind != gateway.Leave
				}
				res, err := e.store.Apply(e.ctx, 0, batch(gw, 1, ws...))
				if err != nil {
					t.Errorf("writer %d round %d: Apply: %v", w, r, err)
					return
				}
				got.add(res.Events)
			}
		})
	}
	wg.Wait()
	if t.Failed() {
		return
	}
	last := checkAlternation(t, e.checkReturnedAreLogged(0, got.evs))
	for _, d := range devs {
		var want []gateway.SessionInfo
		for w := range writers {
			for s, ok := range present[w][d] {
				if ok {
					want = append(want, sess(s, now.Add(lease)))
				}
			}
		}
		info := e.device(d)
		wantState := gateway.Offline
		if len(want) > 0 {
			wantState = gateway.Online
		}
		if info.State != wantState || info.State != last[d].State || info.Ver != last[d].Ver {
			t.Errorf("%s: store has %s v%d, log ends with %s, want %s (sessions %s)",
				d, info.State, info.Ver, describeEvent(last[d]), wantState, describeSessions(want))
		}
		if diff := diffDevice(info, gateway.DeviceInfo{Device: d, State: info.State, Deadline: info.Deadline, Ver: info.Ver,
			Since: info.Since, Sessions: want}, now); diff != "" {
			t.Errorf("%s after concurrent batches: %s", d, diff)
		}
	}
}

// testConcurrentReapAndRenew: devices whose lease ran out are renewed
// while a runner reaps the shard; whichever comes first, each device gets
// exactly one offline (expired) and one online (renew) event.
func testConcurrentReapAndRenew(t *testing.T, open Opener) {
	e := newEnv(t, open, 1)
	const n, renewers = 12, 3
	var devs []gateway.DeviceID
	var ws []gateway.Write
	for i := range n {
		d := gateway.DeviceID(fmt.Sprintf("late-%d", i))
		devs = append(devs, d)
		ws = append(ws, wr(d, "s1", gateway.Connect, 0))
	}
	t0 := e.now()
	var got collector
	got.add(e.apply(batch(gwA, 1, ws...)).Events)
	e.clock.Advance(lease + time.Second)
	now := e.now()

	done := make(chan struct{})
	var reaper sync.WaitGroup
	reaper.Go(func() {
		for i := 0; i < 10*n; i++ {
			select {
			case <-done:
				return
			default:
			}
			r, err := e.store.Reap(e.ctx, 0, 1)
			if err != nil {
				t.Errorf("Reap: %v", err)
				return
			}
			got.add(r.Offline)
		}
	})
	var wg sync.WaitGroup
	for g := range renewers {
		wg.Go(func() {
			for i := g; i < n; i += renewers {
				res, err := e.store.Apply(e.ctx, 0, batch(gwB, 1, wr(devs[i], "s2", gateway.Renew, 0)))
				if err != nil {
					t.Errorf("Apply: %v", err)
					return
				}
				got.add(res.Events)
			}
		})
	}
	wg.Wait()
	close(done)
	reaper.Wait()
	if t.Failed() {
		return
	}
	r := e.reap(0, n)
	got.add(r.Offline)
	if len(r.Offline) != 0 || r.More || !r.Next.Equal(now.Add(lease)) {
		t.Errorf("final Reap = %s, More %v, Next %v; want nothing due, Next %v", describeEvents(r.Offline), r.More, r.Next, now.Add(lease))
	}
	log := e.checkReturnedAreLogged(0, got.evs)
	checkAlternation(t, log)
	for _, d := range devs {
		var mine []gateway.Event
		for _, ev := range log {
			if ev.Device == d {
				mine = append(mine, ev)
			}
		}
		e.checkEvents(string(d)+"'s events", mine, 0,
			online(d, 1, gateway.ReasonConnect, t0, gwA, "s1"),
			expired(d, 2, now, t0.Add(lease)),
			online(d, 3, gateway.ReasonRenew, now, gwB, "s2"))
		e.checkDevice(d, onlineInfo(d, 3, now, sess("s2", now.Add(lease))))
		if info := e.device(d); slices.ContainsFunc(info.Sessions, func(s gateway.SessionInfo) bool { return s.ID == "s1" }) {
			t.Errorf("%s still holds its expired session s1 after a renewal: %s", d, describeSessions(info.Sessions))
		}
	}
}
