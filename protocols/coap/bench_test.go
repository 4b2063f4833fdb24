package coap

import (
	"context"
	"errors"
	"fmt"
	"net"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/plgd-dev/go-coap/v3/message"
	"github.com/plgd-dev/go-coap/v3/message/codes"
	"github.com/plgd-dev/go-coap/v3/mux"
	coapNet "github.com/plgd-dev/go-coap/v3/net"
	"github.com/plgd-dev/go-coap/v3/options"
	"github.com/plgd-dev/go-coap/v3/pkg/runner/periodic"
	"github.com/plgd-dev/go-coap/v3/udp"

	"github.com/fleetgate/fleetgate/gateway"
)

// countingObserver accepts everything at the cost of one atomic add.
type countingObserver struct{ n atomic.Int64 }

func (c *countingObserver) Observe(context.Context, gateway.Evidence) error {
	c.n.Add(1)
	return nil
}

// benchBatch heartbeats make one benchmark op (ns/op is per batch), so
// that even -benchtime 1x measures a meaningful rate.
const benchBatch = 2000

// benchClients is the number of devices (UDP sockets) sending at once,
// each with one request outstanding.
const benchClients = 16

// rawEcho is the ceiling: a plain Go UDP loop that answers every datagram
// with its first 12 bytes (about the size of a 2.04 answer).
func rawEcho(tb testing.TB) net.Addr {
	tb.Helper()
	c, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		tb.Fatal(err)
	}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		buf := make([]byte, 2048)
		for {
			n, from, err := c.ReadFromUDPAddrPort(buf)
			if err != nil {
				return
			}
			if _, err := c.WriteToUDPAddrPort(buf[:min(n, 12)], from); err != nil && errors.Is(err, net.ErrClosed) {
				return
			}
		}
	}()
	tb.Cleanup(func() {
		_ = c.Close()
		wg.Wait()
	})
	return c.LocalAddr()
}

// drive sends n heartbeats of type typ to addr from benchClients sockets,
// each waiting for its answer before the next (a lost datagram is sent
// again after a second), and returns how long that took.
func drive(b *testing.B, addr net.Addr, typ message.Type, n int) time.Duration {
	b.Helper()
	conns := make([]*net.UDPConn, benchClients)
	reqs := make([][]byte, benchClients)
	for i := range conns {
		c, err := net.DialUDP("udp", nil, addr.(*net.UDPAddr))
		if err != nil {
			b.Fatal(err)
		}
		defer c.Close()
		conns[i] = c
		reqs[i] = datagram(b, typ, codes.POST, 0, "/hb", fmt.Sprintf("d=bench-%d", i))
	}
	var wg sync.WaitGroup
	errs := make(chan error, benchClients)
	begin := time.Now()
	for i, c := range conns {
		share := n / benchClients
		if i < n%benchClients {
			share++
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			req := append([]byte(nil), reqs[i]...)
			buf := make([]byte, 2048)
			var mid uint16
			for sent := 0; sent < share; {
				mid++
				req[2], req[3] = byte(mid>>8), byte(mid)
				if _, err := c.Write(req); err != nil {
					errs <- err
					return
				}
				if err := c.SetReadDeadline(time.Now().Add(time.Second)); err != nil {
					errs <- err
					return
				}
				if _, err := c.Read(buf); err != nil {
					var ne net.Error
					if errors.As(err, &ne) && ne.Timeout() && time.Since(begin) < time.Minute {
						continue // lost: send again with a new MID
					}
					errs <- err
					return
				}
				sent++
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(begin)
	close(errs)
	for err := range errs {
		b.Fatal(err)
	}
	return elapsed
}

func benchHeartbeats(b *testing.B, typ message.Type) {
	obs := &countingObserver{}
	s := startServer(b, obs, Options{AllowAnonymous: true})
	ceiling := rawEcho(b)
	n := b.N * benchBatch

	// Warm both paths (peer state, pools) outside the measurement.
	drive(b, s.Addr(), typ, benchClients*4)
	drive(b, ceiling, typ, benchClients*4)
	warm := obs.n.Load()

	// The machine is shared and noisy: alternate the two in rounds of one
	// batch so that both see the same background load.
	var coapTime, rawTime time.Duration
	b.ResetTimer()
	for range b.N {
		coapTime += drive(b, s.Addr(), typ, benchBatch)
		b.StopTimer()
		rawTime += drive(b, ceiling, typ, benchBatch)
		b.StartTimer()
	}
	b.StopTimer()

	if got := obs.n.Load() - warm; got < int64(n) {
		b.Fatalf("observer saw %d heartbeats, want at least %d", got, n)
	}
	coapRate := float64(n) / coapTime.Seconds()
	rawRate := float64(n) / rawTime.Seconds()
	b.ReportMetric(coapRate, "hb/s")
	b.ReportMetric(rawRate, "raw-udp-replies/s")
	b.ReportMetric(coapRate/rawRate, "ratio-to-raw")
}

// BenchmarkHeartbeatNON measures NON POST /hb answered with NON 2.04,
// against a raw UDP receive-and-reply loop driven the same way.
func BenchmarkHeartbeatNON(b *testing.B) { benchHeartbeats(b, message.NonConfirmable) }

// BenchmarkHeartbeatCON measures CON POST /hb answered with a
// piggybacked ACK 2.04, against the same ceiling.
func BenchmarkHeartbeatCON(b *testing.B) { benchHeartbeats(b, message.Confirmable) }

// defaultServer is go-coap's UDP server with its default options and the
// same answer through go-coap's default request path: the per-peer state
// a naive front end would keep.
func defaultServer(tb testing.TB) net.Addr {
	tb.Helper()
	l, err := coapNet.NewListenUDP("udp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	stop := make(chan struct{})
	srv := udp.NewServer(
		options.WithMux(mux.HandlerFunc(func(w mux.ResponseWriter, _ *mux.Message) {
			_ = w.SetResponse(codes.Changed, message.TextPlain, nil)
			w.Message().SetOptionUint32(message.MaxAge, 30)
		})),
		options.WithPeriodicRunner(periodic.New(stop, time.Second)),
		options.WithErrors(func(error) {}),
	)
	served := make(chan error, 1)
	go func() { served <- srv.Serve(l) }()
	tb.Cleanup(func() {
		srv.Stop()
		<-served
		close(stop)
		_ = l.Close()
	})
	return l.LocalAddr()
}

// retained is the heap and stack that stay in use, per peer, after
// peers devices have each sent one CON heartbeat to addr and been
// answered (client sockets included).
func retained(b *testing.B, addr net.Addr, peers int) float64 {
	b.Helper()
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	conns := make([]*net.UDPConn, peers)
	for i := range conns {
		c, err := net.DialUDP("udp", nil, addr.(*net.UDPAddr))
		if err != nil {
			b.Fatal(err)
		}
		conns[i] = c
		if _, ok := exchange(b, c, datagram(b, message.Confirmable, codes.POST, uint16(i), "/hb", fmt.Sprintf("d=peer-%d", i)), 5*time.Second); !ok {
			b.Fatalf("peer %d: no answer", i)
		}
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	for _, c := range conns {
		_ = c.Close()
	}
	used := func(m *runtime.MemStats) int64 { return int64(m.HeapAlloc + m.StackInuse) }
	return float64(used(&after)-used(&before)) / float64(peers)
}

// BenchmarkPeerState measures the memory the server keeps per recently
// seen peer, with this package's options against go-coap's defaults; the
// client sockets' own cost (measured against the raw UDP loop, which
// keeps nothing per peer) is subtracted from both.
func BenchmarkPeerState(b *testing.B) {
	const peers = 500
	var ours, defaults float64
	for range b.N {
		b.StopTimer()
		s := startServer(b, &countingObserver{}, Options{AllowAnonymous: true})
		def := defaultServer(b)
		floor := retained(b, rawEcho(b), peers)
		b.StartTimer()
		ours += retained(b, s.Addr(), peers) - floor
		defaults += retained(b, def, peers) - floor
	}
	ours /= float64(b.N)
	defaults /= float64(b.N)
	b.ReportMetric(ours, "B/peer")
	b.ReportMetric(defaults, "default-B/peer")
	b.ReportMetric(ours/defaults, "ratio-to-default")
}
