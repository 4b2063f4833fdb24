package gateway_test

import (
	"context"
	"fmt"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fleetgate/fleetgate/gateway"
	"github.com/fleetgate/fleetgate/gateway/clocktest"
)

// sink is the benchmarks' Uplink: it counts what it is given.
type sink struct{ n atomic.Int64 }

func (s *sink) Enqueue(context.Context, gateway.Evidence) error {
	s.n.Add(1)
	return nil
}

// fleet returns evidence for n sessions of n devices: half are CoAP
// ("coap/default"), half MQTT connections ("site-a-1/7/<n>").
func fleet(n int) []gateway.Evidence {
	evs := make([]gateway.Evidence, n)
	for i := range evs {
		ev := gateway.Evidence{Device: gateway.DeviceID(fmt.Sprintf("dev-%07d", i)), Kind: gateway.Renew, ObservedAt: t0, Protocol: "coap"}
		ev.Session = "coap/default"
		if i%2 == 1 {
			ev.Session, ev.Protocol = gateway.SessionID(fmt.Sprintf("site-a-1/7/%d", i)), "mqtt"
		}
		evs[i] = ev
	}
	return evs
}

// plainEntry is the ceiling's value: two times, nothing else.
type plainEntry struct{ a, b int64 }

// liveHeap is the heap in use after a full collection.
func liveHeap() int64 {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return int64(m.HeapAlloc)
}

// BenchmarkTableMemory fills a table with 1,000,000 sessions and reports
// its heap per session (HeapAlloc delta / sessions) next to the ceiling
// measured in the same run: a plain map[string]struct{a, b int64} of the
// same keys (device "\x00" session). ratio = table / ceiling.
func BenchmarkTableMemory(b *testing.B) { benchmarkTableMemory(b, false) }

// BenchmarkTableMemoryLearned is BenchmarkTableMemory with learned leases
// on (presence.learn_lease): each device's Period costs one more map
// entry.
func BenchmarkTableMemoryLearned(b *testing.B) { benchmarkTableMemory(b, true) }

func benchmarkTableMemory(b *testing.B, learn bool) {
	const n = 1_000_000
	evs := fleet(n)
	ctx := context.Background()
	var table, ceiling float64
	for range b.N {
		h0 := liveHeap()
		tbl := gateway.NewTable(&sink{}, gateway.TableOptions{MaxSessions: n, Clock: clocktest.New(t0), LearnLease: learn, MaxLease: 2 * time.Hour})
		for _, ev := range evs {
			if err := tbl.Observe(ctx, ev); err != nil {
				b.Fatal(err)
			}
		}
		table = float64(liveHeap()-h0) / n
		if tbl.Len() != n {
			b.Fatalf("Len = %d", tbl.Len())
		}
		runtime.KeepAlive(tbl)

		h0 = liveHeap()
		m := make(map[string]plainEntry)
		for i, ev := range evs {
			m[string(ev.Device)+"\x00"+string(ev.Session)] = plainEntry{int64(i), int64(i)}
		}
		ceiling = float64(liveHeap()-h0) / n
		runtime.KeepAlive(m)
		runtime.KeepAlive(evs) // live through both measurements
	}
	b.ReportMetric(table, "B/session")
	b.ReportMetric(ceiling, "ceiling-B/session")
	b.ReportMetric(table/ceiling, "ratio")
}

// TestTableMemoryBudget keeps the table within the goal of 200 B
// per session (the benchmark above gives the figure at 1,000,000).
func TestTableMemoryBudget(t *testing.T) {
	const n = 100_000
	evs := fleet(n)
	h0 := liveHeap()
	tbl := gateway.NewTable(&sink{}, gateway.TableOptions{Clock: clocktest.New(t0)})
	for _, ev := range evs {
		if err := tbl.Observe(context.Background(), ev); err != nil {
			t.Fatal(err)
		}
	}
	perSession := float64(liveHeap()-h0) / n
	runtime.KeepAlive(tbl)
	runtime.KeepAlive(evs)
	if perSession > 200 {
		t.Fatalf("%.1f B per session at %d sessions, goal ≤ 200", perSession, n)
	}
	t.Logf("%.1f B per session at %d sessions", perSession, n)
}

// BenchmarkTableObserve measures Observe of renewals on 100,000 known
// sessions. One iteration is a round that renews every session once, a
// second after the previous round; with renew_every 20s and the sessions'
// connects spread over 20 seconds, one in twenty renewals passes the
// throttle in every round. The ceiling, timed in the same run, makes the
// same decisions on a plain map[string]struct{a, b int64} with prebuilt
// keys, no validation and no locks. Figures are per renewal; ratio =
// table / ceiling.
func BenchmarkTableObserve(b *testing.B) {
	const (
		n     = 100_000
		renew = 20 * time.Second
	)
	evs := fleet(n)
	ctx := context.Background()
	up := &sink{}
	tbl := gateway.NewTable(up, gateway.TableOptions{Lease: 90 * time.Second, RenewEvery: renew, Clock: clocktest.New(t0)})
	keys := make([]string, n)
	m := make(map[string]plainEntry, n)
	for i := range evs {
		evs[i].ObservedAt = t0.Add(-time.Duration(i%20) * time.Second)
		if err := tbl.Observe(ctx, evs[i]); err != nil {
			b.Fatal(err)
		}
		keys[i] = string(evs[i].Device) + "\x00" + string(evs[i].Session)
		m[keys[i]] = plainEntry{evs[i].ObservedAt.UnixNano(), evs[i].ObservedAt.UnixNano()}
	}

	// The ceiling's round and the table's alternate, so that both see the
	// same load on a noisy machine.
	var ceilingTime time.Duration
	sent := 0
	up.n.Store(0) // count renewals only
	b.ReportAllocs()
	b.ResetTimer()
	for r := range b.N {
		at := t0.Add(time.Duration(r+1) * time.Second)

		b.StopTimer()
		start := time.Now()
		for _, k := range keys {
			v := m[k]
			v.b = at.UnixNano()
			if v.b-v.a >= renew.Nanoseconds() {
				v.a = v.b
				sent++
			}
			m[k] = v
		}
		ceilingTime += time.Since(start)
		b.StartTimer()

		for _, ev := range evs {
			ev.ObservedAt = at
			if err := tbl.Observe(ctx, ev); err != nil {
				b.Fatal(err)
			}
		}
	}
	b.StopTimer()
	if got := int(up.n.Load()); got != sent || sent < b.N*n/20 {
		b.Fatalf("table sent %d renewals, the ceiling %d, in %d rounds of %d", got, sent, b.N, n)
	}
	perObserve := float64(b.Elapsed().Nanoseconds()) / float64(b.N*n)
	ceiling := float64(ceilingTime.Nanoseconds()) / float64(b.N*n)
	b.ReportMetric(perObserve, "ns/renewal")
	b.ReportMetric(ceiling, "ceiling-ns/renewal")
	b.ReportMetric(perObserve/ceiling, "ratio")
}

// BenchmarkTableDevices counts the devices of a table of 1,000,000
// devices by state (one scrape of fleetgate_devices, or one STATUS=
// line), each with one session, or every tenth with a second one (looked
// up by device), next to the ceiling measured in the same run: one pass
// over a plain map of as many entries. ratio = Devices / ceiling.
func BenchmarkTableDevices(b *testing.B) {
	const n = 1_000_000
	for _, every := range []int{0, 10} {
		name := "one-session"
		if every > 0 {
			name = fmt.Sprintf("every-%dth-two", every)
		}
		b.Run(name, func(b *testing.B) {
			evs := fleet(n)
			for i := 0; every > 0 && i < n; i += every {
				second := evs[i]
				second.Session = "coap/second"
				evs = append(evs, second)
			}
			ctx := context.Background()
			tbl := gateway.NewTable(&sink{}, gateway.TableOptions{MaxSessions: 2 * n, Clock: clocktest.New(t0)})
			plain := make(map[string]*plainEntry, len(evs))
			for _, ev := range evs {
				if err := tbl.Observe(ctx, ev); err != nil {
					b.Fatal(err)
				}
				plain[string(ev.Device)+"\x00"+string(ev.Session)] = &plainEntry{}
			}
			now := t0.Add(10 * time.Second)
			b.ResetTimer()
			var table, ceiling time.Duration
			for range b.N {
				start := time.Now()
				c := tbl.Devices(now, 45*time.Second)
				table += time.Since(start)
				if c.Online != n {
					b.Fatalf("counts %+v, want %d online", c, n)
				}
				start = time.Now()
				var sum int64
				for _, e := range plain {
					sum += e.a
				}
				ceiling += time.Since(start)
				if sum != 0 {
					b.Fatal(sum)
				}
			}
			b.ReportMetric(float64(table.Microseconds())/1e3/float64(b.N), "ms/count")
			b.ReportMetric(float64(ceiling.Microseconds())/1e3/float64(b.N), "ceiling-ms")
			b.ReportMetric(float64(table)/float64(ceiling), "ratio")
		})
	}
}
