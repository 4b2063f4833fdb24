package adapter

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"runtime"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/fleetgate/fleetgate/gateway"
	"github.com/fleetgate/fleetgate/internal/buildtest"
	pb "github.com/fleetgate/fleetgate/plugins/proto"
)

// frameItems is the size of a full evidence frame (sdk.MaxFrame).
const frameItems = 1000

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

func buildAdapter(b *testing.B, pkg string) string {
	b.Helper()
	var out string
	if err := buildtest.Build(b.TempDir(), map[string]*string{pkg: &out}); err != nil {
		b.Fatal(err)
	}
	return out
}

// BenchmarkRenewalsThroughPlugin measures renewals from one adapter
// process through the plugin boundary (go-plugin, AutoMTLS over a unix
// socket, SDK batching), and as its ceiling the same full frames sent
// over a plain in-process gRPC stream on loopback TCP; both feed the
// host's frame acceptance (validation, limits, Observe). One op is one
// frame of 1000 renewals. Reported: ns/renewal of each and
// plugin/plain, the ratio of their throughputs (goal ≥ 0.7).
func BenchmarkRenewalsThroughPlugin(b *testing.B) {
	path := buildAdapter(b, "github.com/fleetgate/fleetgate/protocols/adapter/testdata/benchadapter")
	items := int64(b.N) * frameItems

	// Ceiling: a plain gRPC stream of prebuilt full frames.
	plainObs := &counter{want: items, done: make(chan struct{})}
	plainHost, _ := New(plainObs, Options{Lease: time.Minute})
	plainProc := newProc(plainHost, Spec{Name: "plain"})
	frame := &pb.EvidenceFrame{}
	for i := range frameItems {
		frame.Evidence = append(frame.Evidence, &pb.Evidence{Kind: pb.Kind_KIND_RENEW, Device: "bench-" + strconv.Itoa(i)})
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	gs := grpc.NewServer()
	pb.RegisterAdapterServer(gs, &frameServer{frame: frame, frames: b.N})
	go func() { _ = gs.Serve(ln) }()
	defer gs.Stop()
	conn, err := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		b.Fatal(err)
	}
	defer conn.Close()

	b.ResetTimer()
	plainStart := time.Now()
	stream, err := pb.NewAdapterClient(conn).Evidence(b.Context(), &pb.EvidenceRequest{})
	if err != nil {
		b.Fatal(err)
	}
	for range b.N {
		f, err := stream.Recv()
		if err != nil {
			b.Fatal(err)
		}
		plainProc.accept(b.Context(), f)
	}
	<-plainObs.done
	plain := time.Since(plainStart)

	// Through the plugin: the adapter sends b.N*1000 renewals at once.
	obs := &counter{want: items, done: make(chan struct{})}
	h, err := New(obs, Options{Lease: time.Minute, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		b.Fatal(err)
	}
	defer h.Close()
	start := time.Now()
	if err := h.Apply(b.Context(), []Spec{{Name: "bench", Path: path, StartTimeout: 30 * time.Second,
		Config: fmt.Appendf(nil, `{"items": %d}`, items)}}); err != nil {
		b.Fatal(err)
	}
	ready := time.Now()
	<-obs.done
	plugin := time.Since(ready)
	b.StopTimer()
	_ = start

	b.ReportMetric(float64(plugin.Nanoseconds())/float64(items), "ns/renewal")
	b.ReportMetric(float64(plain.Nanoseconds())/float64(items), "plain-ns/renewal")
	b.ReportMetric(float64(plain)/float64(plugin), "plugin/plain")
	if st := h.Status(); len(st) == 1 && st[0].Frames > 0 {
		b.ReportMetric(float64(items)/float64(st[0].Frames), "renewals/frame")
	}
}

// frameServer streams the same frame frames times.
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
