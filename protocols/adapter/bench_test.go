package adapter

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/fleetgate/fleetgate/gateway"
	"github.com/fleetgate/fleetgate/internal/buildtest"
	pb "github.com/fleetgate/fleetgate/plugins/proto"
	"github.com/fleetgate/fleetgate/plugins/sdk"
)

// frameItems is the size of a full evidence frame (sdk.MaxFrame).
const frameItems = 1000

// Renewal benchmark shape: an op is opFrames full frames, and warmFrames
// frames go through each path before its clock starts, so that the
// sessions exist (their connects are not renewals) and both ends are warm
// (heap, gRPC flow-control windows) when it is measured.
const (
	opFrames   = 10
	warmFrames = 20
)

// counter is an Observer that counts and signals when it reaches want.
type counter struct {
	n    atomic.Int64
	want int64
	done chan struct{}
}

func (c *counter) Observe(context.Context, gateway.Evidence) error {
	if c.n.Add(1) == c.want {
		close(c.done)
	}
	return nil
}

// discardUplink takes the table's central writes and forgets them: the
// benchmark measures the gateway up to the uplink's queue.
type discardUplink struct{ n atomic.Int64 }

var _ gateway.Uplink = (*discardUplink)(nil)

func (u *discardUplink) Enqueue(context.Context, gateway.Evidence) error {
	u.n.Add(1)
	return nil
}

// tableObserver is the observer `fleetgate run` gives the host, a
// gateway.Table (shipped presence timings), counted: warmed closes after
// warm pieces of evidence, done after want.
type tableObserver struct {
	table        *gateway.Table
	n            atomic.Int64
	warm, want   int64
	warmed, done chan struct{}
}

func newTableObserver(warm, want int64) *tableObserver {
	t := gateway.NewTable(&discardUplink{}, gateway.TableOptions{Lease: 90 * time.Second, RenewEvery: 20 * time.Second})
	return &tableObserver{table: t, warm: warm, want: want, warmed: make(chan struct{}), done: make(chan struct{})}
}

func (o *tableObserver) Observe(ctx context.Context, ev gateway.Evidence) error {
	err := o.table.Observe(ctx, ev)
	switch o.n.Add(1) {
	case o.warm:
		close(o.warmed)
	case o.want:
		close(o.done)
	}
	return err
}

// processCPU is the CPU time this process has used.
func processCPU(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// childCPU is the CPU time process pid has used: the sum over its
// threads of the scheduler's run time (nanoseconds, unlike
// /proc/pid/stat's clock ticks).
func childCPU(b *testing.B, pid int) time.Duration {
	tasks, err := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/schedstat", pid))
	if err != nil || len(tasks) == 0 {
		b.Fatalf("threads of %d: %v", pid, err)
	}
	var total time.Duration
	for _, t := range tasks {
		raw, err := os.ReadFile(t)
		if err != nil {
			continue // the thread ended
		}
		ns, err := strconv.ParseInt(strings.Fields(string(raw))[0], 10, 64)
		if err != nil {
			b.Fatalf("%s: %v", t, err)
		}
		total += time.Duration(ns)
	}
	return total
}

func buildAdapter(b *testing.B, pkg string) string {
	b.Helper()
	var out string
	if err := buildtest.Build(b.TempDir(), map[string]*string{pkg: &out}); err != nil {
		b.Fatal(err)
	}
	return out
}

// BenchmarkRenewalsThroughPlugin measures renewals from one adapter
// process through the plugin boundary against the same frames on a plain
// gRPC stream, both into the host as `fleetgate run` wires it: the
// host's receive loop and frame acceptance (decoding, ID checks, limits)
// feeding a gateway.Table (the session table's Observe with the shipped
// lease and renew_every; its central writes go to an uplink queue that
// discards them).
//
//   - Through the plugin: the benchadapter process (plugins/sdk: Send,
//     batching, frame encoding) under go-plugin (gRPC, AutoMTLS over a
//     unix socket), sending renewals of 1000 devices as fast as the SDK
//     takes them.
//   - The ceiling (plain): prebuilt full frames of the same 1000
//     renewals served by an in-process gRPC server over loopback TCP
//     without TLS. It does no adapter-side work per item besides gRPC's
//     marshalling: no clock read, no queue, no batching.
//   - For the analysis (sdk): the SDK's server running the same loop in
//     this process on a plain gRPC stream: the plugin path without
//     go-plugin, TLS and the second process.
//
// An op is opFrames frames of 1000 renewals. The plain stream runs before
// and after the others and the ceiling is their mean, so that load that
// comes or goes during the run weighs on both. Reported per renewal:
// wall time of each path and plugin/plain (the throughput ratio, goal ≥
// 0.7); CPU time of each path (cpu-ns: the plugin's host and adapter
// processes together; adapter-cpu-ns: the adapter's share; plain- and
// sdk-cpu-ns: this process, both ends); the frames' fill.
func BenchmarkRenewalsThroughPlugin(b *testing.B) {
	path := buildAdapter(b, "github.com/fleetgate/fleetgate/protocols/adapter/testdata/benchadapter")
	frames := b.N * opFrames
	warm := int64(warmFrames) * frameItems
	items := int64(frames) * frameItems
	ctx := b.Context()

	// The ceiling's server: the same full frames on a plain stream.
	frame := &pb.EvidenceFrame{}
	for i := range frameItems {
		frame.Evidence = append(frame.Evidence, &pb.Evidence{Kind: pb.Kind_KIND_RENEW, Device: "bench-" + strconv.Itoa(i)})
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	gs := grpc.NewServer()
	pb.RegisterAdapterServer(gs, &frameServer{frame: frame, frames: warmFrames + frames})
	go func() { _ = gs.Serve(ln) }()
	defer gs.Stop()
	conn, err := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		b.Fatal(err)
	}
	defer conn.Close()
	// run measures one stream into a host: from warm pieces of evidence
	// to warm+items, wall and CPU time of this process.
	run := func(open func(context.Context) (pb.AdapterClient, pb.Adapter_EvidenceClient)) (wall, cpu time.Duration) {
		obs := newTableObserver(warm, warm+items)
		host, err := New(obs, Options{Lease: 90 * time.Second})
		if err != nil {
			b.Fatal(err)
		}
		p := newProc(host, Spec{Name: "bench", Devices: []string{"*"}})
		sctx, cancel := context.WithCancel(ctx)
		defer cancel()
		client, stream := open(sctx)
		go func() { _ = p.receive(sctx, client, stream) }()
		<-obs.warmed
		start, cpu0 := time.Now(), processCPU(b)
		<-obs.done
		return time.Since(start), processCPU(b) - cpu0
	}
	plainRun := func() (wall, cpu time.Duration) {
		return run(func(sctx context.Context) (pb.AdapterClient, pb.Adapter_EvidenceClient) {
			c := pb.NewAdapterClient(conn)
			stream, err := c.Evidence(sctx, &pb.EvidenceRequest{})
			if err != nil {
				b.Fatal(err)
			}
			return c, stream
		})
	}
	// sdkRun: the SDK's server and the benchadapter's loop in this process,
	// on a plain gRPC stream over loopback TCP (no go-plugin, no TLS, no
	// second process): what the SDK costs by itself.
	sdkRun := func() (wall, cpu time.Duration) {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			b.Fatal(err)
		}
		gs := grpc.NewServer()
		pb.RegisterAdapterServer(gs, sdk.NewServer(sdk.Info{Name: "renewer", Version: "1"}, &renewer{items: warm + items}, nil))
		go func() { _ = gs.Serve(ln) }()
		defer gs.Stop()
		conn, err := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			b.Fatal(err)
		}
		defer conn.Close()
		return run(func(sctx context.Context) (pb.AdapterClient, pb.Adapter_EvidenceClient) {
			c := pb.NewAdapterClient(conn)
			if _, err := c.Configure(sctx, &pb.ConfigureRequest{Data: true}); err != nil {
				b.Fatal(err)
			}
			stream, err := c.Evidence(sctx, &pb.EvidenceRequest{})
			if err != nil {
				b.Fatal(err)
			}
			return c, stream
		})
	}

	b.ResetTimer()
	plainWall1, plainCPU1 := plainRun()

	// Through the plugin: the adapter sends all its renewals at once.
	obs := newTableObserver(warm, warm+items)
	h, err := New(obs, Options{Lease: 90 * time.Second, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		b.Fatal(err)
	}
	defer h.Close()
	if err := h.Apply(ctx, []Spec{{Name: "bench", Path: path, StartTimeout: 30 * time.Second, Devices: []string{"bench-*"},
		Config: fmt.Appendf(nil, `{"items": %d}`, warm+items)}}); err != nil {
		b.Fatal(err)
	}
	st := h.Status()
	if len(st) != 1 || st[0].PID == 0 {
		b.Fatalf("status %+v, want one running adapter", st)
	}
	pid := st[0].PID
	<-obs.warmed
	start, hostCPU0, adapterCPU0 := time.Now(), processCPU(b), childCPU(b, pid)
	<-obs.done
	plugin := time.Since(start)
	hostCPU, adapterCPU := processCPU(b)-hostCPU0, childCPU(b, pid)-adapterCPU0
	pluginFrames := h.Status()[0].Frames

	sdkWall, sdkCPU := sdkRun()
	plainWall2, plainCPU2 := plainRun()
	b.StopTimer()

	per := func(d time.Duration) float64 { return float64(d.Nanoseconds()) / float64(items) }
	plain := (plainWall1 + plainWall2) / 2
	b.ReportMetric(per(plugin), "ns/renewal")
	b.ReportMetric(per(plain), "plain-ns/renewal")
	b.ReportMetric(float64(plain)/float64(plugin), "plugin/plain")
	b.ReportMetric(per(hostCPU+adapterCPU), "cpu-ns/renewal")
	b.ReportMetric(per(adapterCPU), "adapter-cpu-ns/renewal")
	b.ReportMetric(per((plainCPU1+plainCPU2)/2), "plain-cpu-ns/renewal")
	b.ReportMetric(per(sdkWall), "sdk-ns/renewal")
	b.ReportMetric(per(sdkCPU), "sdk-cpu-ns/renewal")
	if pluginFrames > 0 {
		b.ReportMetric(float64(warm+items)/float64(pluginFrames), "renewals/frame")
	}
}

// renewer is the benchadapter's loop (testdata/benchadapter) as an
// sdk.Adapter in this process: once its stream opens it sends items
// renewals of 1000 devices as fast as the SDK takes them, then idles.
type renewer struct{ items int64 }

var _ sdk.Adapter = (*renewer)(nil)

func (r *renewer) Configure(context.Context, []byte) error { return nil }

func (r *renewer) Run(ctx context.Context, sink sdk.Sink) error {
	sink.Ready()
	ids := make([]string, frameItems)
	for i := range ids {
		ids[i] = "bench-" + strconv.Itoa(i)
	}
	for i := range r.items {
		if err := sink.Send(ctx, sdk.Evidence{Kind: sdk.Renew, Device: ids[i%frameItems]}); err != nil {
			return nil
		}
	}
	<-ctx.Done()
	return nil
}

// frameServer streams the same frame frames times on each stream.
type frameServer struct {
	pb.UnimplementedAdapterServer
	frame  *pb.EvidenceFrame
	frames int
}

func (s *frameServer) Evidence(_ *pb.EvidenceRequest, st pb.Adapter_EvidenceServer) error {
	for range s.frames {
		if err := st.Send(s.frame); err != nil {
			return err
		}
	}
	<-st.Context().Done()
	return nil
}

// BenchmarkAdapterStartToReady measures one adapter from Apply (fork,
// handshake with AutoMTLS, Info, Configure) to its ready frame. Ceiling:
// 200 ms; reported as ms/start and start/ceiling.
func BenchmarkAdapterStartToReady(b *testing.B) {
	path := buildAdapter(b, "github.com/fleetgate/fleetgate/plugins/udpline")
	h, err := New(&counter{done: make(chan struct{})}, Options{Lease: time.Minute, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		b.Fatal(err)
	}
	defer h.Close()
	var total time.Duration
	b.ResetTimer()
	for i := range b.N {
		spec := Spec{Name: "start-" + strconv.Itoa(i), Path: path, StartTimeout: 30 * time.Second, Config: []byte(`{"listen": "127.0.0.1:0"}`)}
		start := time.Now()
		if err := h.Apply(b.Context(), []Spec{spec}); err != nil {
			b.Fatal(err)
		}
		total += time.Since(start)
		b.StopTimer()
		if err := h.Apply(b.Context(), nil); err != nil { // stop it, untimed
			b.Fatal(err)
		}
		b.StartTimer()
	}
	per := total / time.Duration(b.N)
	b.ReportMetric(float64(per.Microseconds())/1000, "ms/start")
	b.ReportMetric(float64(per)/float64(200*time.Millisecond), "start/ceiling")
}

// BenchmarkIdleAdapterMemory measures the gateway's memory (Go heap and
// stacks in use, after GC) per idle adapter, over 8 adapters. Ceiling:
// 1 MB; reported as bytes/adapter and bytes/ceiling.
func BenchmarkIdleAdapterMemory(b *testing.B) {
	path := buildAdapter(b, "github.com/fleetgate/fleetgate/plugins/udpline")
	const n = 8
	inUse := func() uint64 {
		runtime.GC()
		runtime.GC()
		var m runtime.MemStats
		runtime.ReadMemStats(&m)
		return m.HeapInuse + m.StackInuse
	}
	var perAdapter float64
	for range b.N {
		h, err := New(&counter{done: make(chan struct{})}, Options{Lease: time.Minute, Logger: slog.New(slog.DiscardHandler)})
		if err != nil {
			b.Fatal(err)
		}
		// One adapter first, so that one-off costs (TLS, gRPC, go-plugin
		// package state) are not charged to the measured ones.
		specs := []Spec{{Name: "warm", Path: path, StartTimeout: 30 * time.Second, Config: []byte(`{"listen": "127.0.0.1:0"}`)}}
		if err := h.Apply(b.Context(), specs); err != nil {
			b.Fatal(err)
		}
		before := inUse()
		for i := range n {
			specs = append(specs, Spec{Name: "idle-" + strconv.Itoa(i), Path: path, StartTimeout: 30 * time.Second, Config: []byte(`{"listen": "127.0.0.1:0"}`)})
		}
		if err := h.Apply(b.Context(), specs); err != nil {
			b.Fatal(err)
		}
		after := inUse()
		perAdapter = float64(int64(after)-int64(before)) / n
		h.Close()
	}
	b.ReportMetric(perAdapter, "bytes/adapter")
	b.ReportMetric(perAdapter/(1<<20), "bytes/ceiling")
}

var _ gateway.DataSink = (*countingSink)(nil)

// countingSink is the data sink of BenchmarkDataThroughPlugin: it counts
// the messages and closes done at want. It keeps nothing and writes no
// disk: the benchmark measures the plugin path up to the data path.
type countingSink struct {
	n    atomic.Int64
	want int64
	done chan struct{}
}

func (s *countingSink) Publish(_ context.Context, msgs []gateway.Message) error {
	n := s.n.Add(int64(len(msgs)))
	if n >= s.want && n-int64(len(msgs)) < s.want {
		close(s.done)
	}
	return nil
}

// BenchmarkDataThroughPlugin measures data items of 64 bytes from one
// adapter process (benchadapter: Sink.Data from 1000 goroutines, as many
// requests of a network server in flight) through the plugin into the
// host's data path, a sink that only counts (no queue, no disk): QoS 0,
// and QoS 1, whose every item waits for its settlement (the host's Settle
// call after each frame). Reported per item: wall time, CPU of both
// processes, and the frames' fill.
func BenchmarkDataThroughPlugin(b *testing.B) {
	path := buildAdapter(b, "github.com/fleetgate/fleetgate/protocols/adapter/testdata/benchadapter")
	for _, qos := range []int{0, 1} {
		b.Run(fmt.Sprintf("qos%d", qos), func(b *testing.B) {
			items := int64(b.N) * frameItems
			sink := &countingSink{want: items, done: make(chan struct{})}
			h, err := New(&counter{done: make(chan struct{})}, Options{Lease: 90 * time.Second, Logger: slog.New(slog.DiscardHandler), Data: sink})
			if err != nil {
				b.Fatal(err)
			}
			defer h.Close()
			b.ResetTimer()
			start, hostCPU0 := time.Now(), processCPU(b)
			if err := h.Apply(b.Context(), []Spec{{Name: "bench", Path: path, StartTimeout: 30 * time.Second, Devices: []string{"bench-*"},
				Config: fmt.Appendf(nil, `{"items": %d, "data": true, "qos": %d, "bytes": 64, "senders": 1000}`, items, qos)}}); err != nil {
				b.Fatal(err)
			}
			pid := h.Status()[0].PID
			adapterCPU0 := childCPU(b, pid)
			<-sink.done
			wall := time.Since(start)
			hostCPU, adapterCPU := processCPU(b)-hostCPU0, childCPU(b, pid)-adapterCPU0
			b.StopTimer()
			st := h.Status()[0]
			per := func(d time.Duration) float64 { return float64(d.Nanoseconds()) / float64(items) }
			b.ReportMetric(per(wall), "ns/item")
			b.ReportMetric(per(hostCPU+adapterCPU), "cpu-ns/item")
			b.ReportMetric(per(adapterCPU), "adapter-cpu-ns/item")
			b.ReportMetric(float64(items)/float64(st.Frames), "items/frame")
			if st.DataPublished != uint64(items) {
				b.Fatalf("published %d of %d", st.DataPublished, items)
			}
		})
	}
}
