package admin_test

import (
	"context"
	"fmt"
	"os/exec"
	"path/filepath"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	bolt "go.etcd.io/bbolt"

	"github.com/fleetgate/fleetgate/admin"
	"github.com/fleetgate/fleetgate/gateway"
	"github.com/fleetgate/fleetgate/store/embedded"
)

// countingReader counts the store reads the admin API makes, and the
// devices List hands back.
type countingReader struct {
	gateway.Reader
	device, list, listed, maxListed, events, now, counts, gateways, snapshot, readEvents, waitEvents atomic.Int64
}

var _ gateway.Reader = (*countingReader)(nil)

func (c *countingReader) Device(ctx context.Context, id gateway.DeviceID) (gateway.DeviceInfo, error) {
	c.device.Add(1)
	return c.Reader.Device(ctx, id)
}

func (c *countingReader) List(ctx context.Context, q gateway.ListQuery) (gateway.ListPage, error) {
	c.list.Add(1)
	p, err := c.Reader.List(ctx, q)
	n := int64(len(p.Devices))
	c.listed.Add(n)
	for m := c.maxListed.Load(); n > m && !c.maxListed.CompareAndSwap(m, n); m = c.maxListed.Load() {
	}
	return p, err
}

func (c *countingReader) Events(ctx context.Context, shard int, after string, limit int) ([]gateway.Event, error) {
	c.events.Add(1)
	return c.Reader.Events(ctx, shard, after, limit)
}

func (c *countingReader) Now(ctx context.Context) (time.Time, error) {
	c.now.Add(1)
	return c.Reader.Now(ctx)
}

func (c *countingReader) Counts(ctx context.Context, window time.Duration) (gateway.Counts, error) {
	c.counts.Add(1)
	return c.Reader.Counts(ctx, window)
}

func (c *countingReader) Gateways(ctx context.Context) ([]gateway.GatewayInfo, error) {
	c.gateways.Add(1)
	return c.Reader.Gateways(ctx)
}

func (c *countingReader) SnapshotShard(ctx context.Context, shard int, page string, limit int) (gateway.SnapshotPage, error) {
	c.snapshot.Add(1)
	return c.Reader.SnapshotShard(ctx, shard, page, limit)
}

func (c *countingReader) ReadEvents(ctx context.Context, shard int, after gateway.Position, limit int, block time.Duration) ([]gateway.Event, error) {
	c.readEvents.Add(1)
	return c.Reader.ReadEvents(ctx, shard, after, limit, block)
}

func (c *countingReader) WaitEvents(ctx context.Context, after []gateway.Position, block time.Duration) ([]int, error) {
	c.waitEvents.Add(1)
	return c.Reader.WaitEvents(ctx, after, block)
}

// cpuTime is the CPU time (user + system) this process used so far.
func cpuTime(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkPageFiveTabs: what the page costs the gateway. An admin
// server on an embedded store of 100,000 devices (16 shards, filled
// through the store API; a writer connects and disconnects devices, 20
// events/s) serves five headless chromium processes showing the page,
// for a minute. It reports the CPU this process (the server and the
// writer) used beyond the same writer without tabs, as a share of one
// core, and the store reads per tab and minute: List calls and the
// devices they returned (the largest page: no call read the fleet; by
// last change, from the store's index), Device, Now, Counts (the fleet's
// counts of /v1/status, with the suspect ones), Gateways (the page's
// gateways list), Events and the watch's event reads.
func BenchmarkPageFiveTabs(b *testing.B) {
	const (
		devices = 100_000
		tabs    = 5
		churn   = 20 // events per second
		window  = time.Minute
		base    = 20 * time.Second
	)
	db, err := bolt.Open(filepath.Join(b.TempDir(), "state.db"), 0o600, &bolt.Options{NoSync: true})
	if err != nil {
		b.Fatal(err)
	}
	defer db.Close()
	store, err := embedded.Open(db, embedded.Options{Shards: 16})
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	all := ids("site-dev", devices)
	for i := 0; i < devices; i += 5000 {
		longConnect(b, store, all[i:min(i+5000, devices)])
	}
	reads := &countingReader{Reader: store}
	srv, err := admin.Listen(admin.Options{Addr: "127.0.0.1:0", Store: reads, Gatherer: prometheus.NewRegistry(),
		Status: func() admin.Status {
			return admin.Status{Gateway: "gw-bench", Version: "bench", StartedAt: time.Now(), Store: "embedded", Shards: 16, Adapters: []any{}}
		},
		Timing: func() (time.Duration, time.Duration) { return lease, suspect }})
	if err != nil {
		b.Fatal(err)
	}
	go srv.Serve()
	defer srv.Shutdown(ctx)

	// The writer: a connect or a leave of one of the first 1,000 devices
	// every 1/churn s.
	stopWriter := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		t := time.NewTicker(time.Second / churn)
		defer t.Stop()
		for i := 0; ; i++ {
			select {
			case <-stopWriter:
				return
			case <-t.C:
			}
			d := all[(i/2)%1000]
			kind := gateway.Connect
			if i%2 == 1 {
				kind = gateway.Leave
			}
			shard := gateway.ShardOf(d, store.Shards())
			if _, err := store.Apply(ctx, shard, gateway.Batch{Gateway: "gw-bench", Epoch: 1, Lease: time.Hour, Writes: []gateway.Write{{Device: d, Session: "s", Kind: kind}}}); err != nil {
				b.Error(err)
				return
			}
		}
	})
	defer func() { close(stopWriter); wg.Wait() }()

	path, err := exec.LookPath("chromium")
	if err != nil {
		b.Fatalf("chromium: %v (make deps installs it)", err)
	}
	url := "http://" + srv.Addr().String() + "/"

	b.ResetTimer()
	for range b.N {
		c0, t0 := cpuTime(b), time.Now()
		time.Sleep(base)
		idle := float64(cpuTime(b)-c0) / float64(time.Since(t0))

		// Each tab is a headless chromium of its own, not driven (no
		// DevTools connection in this process): the process's CPU is the
		// server's and the writer's alone.
		start := snapshotReads(reads)
		for i := range tabs {
			cmd := exec.Command(path, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
				"--disable-background-timer-throttling", "--disable-renderer-backgrounding",
				"--user-data-dir="+filepath.Join(b.TempDir(), fmt.Sprint("tab", i)), url)
			cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL, Setpgid: true}
			if err := cmd.Start(); err != nil {
				b.Fatalf("tab %d: %v", i, err)
			}
			defer func() { _ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL); _ = cmd.Wait() }()
		}
		// Open: each tab read its page of devices and opened its stream
		// (a watch from now reads every shard's position).
		for deadline := time.Now().Add(time.Minute); ; time.Sleep(100 * time.Millisecond) {
			now := snapshotReads(reads)
			if now["list"]-start["list"] >= tabs && now["snapshot"]-start["snapshot"] >= tabs*int64(store.Shards()) {
				break
			}
			if time.Now().After(deadline) {
				b.Fatalf("the tabs did not open within a minute: reads %v -> %v", start, now)
			}
		}
		before := snapshotReads(reads)
		c0, t0 = cpuTime(b), time.Now()
		time.Sleep(window)
		wall := time.Since(t0)
		busy := float64(cpuTime(b)-c0) / float64(wall)
		after := snapshotReads(reads)
		perTabMinute := func(k string) float64 {
			return float64(after[k]-before[k]) / tabs / wall.Minutes()
		}
		b.ReportMetric(100*(busy-idle), "page-%core")
		b.ReportMetric(100*busy, "total-%core")
		b.ReportMetric(perTabMinute("list"), "list/tab/min")
		b.ReportMetric(perTabMinute("listed"), "devices-listed/tab/min")
		b.ReportMetric(float64(reads.maxListed.Load()), "max-devices/list")
		b.ReportMetric(perTabMinute("device"), "device/tab/min")
		b.ReportMetric(perTabMinute("now"), "now/tab/min")
		b.ReportMetric(perTabMinute("events"), "events/tab/min")
		b.ReportMetric(perTabMinute("counts"), "counts/tab/min")
		b.ReportMetric(perTabMinute("gateways"), "gateways/tab/min")
		b.ReportMetric(perTabMinute("readEvents")+perTabMinute("waitEvents"), "watch-reads/tab/min")
		b.Logf("%d devices, %d tabs, %d events/s, %v: process CPU %.2f %% of a core without tabs, %.2f %% with; reads %v -> %v",
			devices, tabs, churn, wall.Round(time.Second), 100*idle, 100*busy, before, after)
	}
}

// snapshotReads is the counters of r by name.
func snapshotReads(r *countingReader) map[string]int64 {
	return map[string]int64{
		"device": r.device.Load(), "list": r.list.Load(), "listed": r.listed.Load(), "events": r.events.Load(),
		"now": r.now.Load(), "counts": r.counts.Load(), "gateways": r.gateways.Load(), "snapshot": r.snapshot.Load(), "readEvents": r.readEvents.Load(), "waitEvents": r.waitEvents.Load(),
	}
}

// longConnect connects devs with a lease of an hour (no reap runs here).
func longConnect(b *testing.B, store gateway.Store, devs []gateway.DeviceID) {
	byShard := map[int][]gateway.Write{}
	for _, d := range devs {
		s := gateway.ShardOf(d, store.Shards())
		byShard[s] = append(byShard[s], gateway.Write{Device: d, Session: "s", Kind: gateway.Connect})
	}
	for s, ws := range byShard {
		if _, err := store.Apply(context.Background(), s, gateway.Batch{Gateway: "gw-bench", Epoch: 1, Lease: time.Hour, Writes: ws}); err != nil {
			b.Fatal(fmt.Errorf("fill shard %d: %w", s, err))
		}
	}
}
