package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/plgd-dev/go-coap/v3/message"
	"github.com/plgd-dev/go-coap/v3/message/codes"
	"github.com/plgd-dev/go-coap/v3/message/pool"
	"github.com/plgd-dev/go-coap/v3/udp/coder"
)

// cmdSimulate plays a fleet of CoAP devices against a gateway: each device
// sends POST /hb?d=<prefix><n> every --interval (with ±10 % jitter) over
// a shared pool of UDP sockets, and optionally DELETE /hb at the end. It
// is how to try a gateway by hand and how the load figures are produced.
func cmdSimulate(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs, _ := newFlags("simulate", "simulate --coap HOST:PORT [--devices N] [--interval D] [--duration D]", stderr)
	addr := fs.String("coap", "127.0.0.1:5683", "gateway CoAP UDP address")
	devices := fs.Int("devices", 10, "number of simulated devices")
	interval := fs.Duration("interval", 10*time.Second, "heartbeat interval of each device")
	duration := fs.Duration("duration", 30*time.Second, "how long to run")
	prefix := fs.String("prefix", "sim-", "device ID prefix")
	sockets := fs.Int("sockets", 16, "UDP sockets (source ports) shared by the devices")
	con := fs.Bool("con", false, "send confirmable (CON) instead of non-confirmable (NON) requests")
	leave := fs.Bool("leave", false, "send DELETE /hb for every device at the end")
	if err := parse(fs, args); err != nil {
		return err
	}
	if err := noArgs(fs); err != nil {
		return err
	}
	if *devices < 1 || *sockets < 1 || *interval <= 0 || *duration <= 0 {
		return fmt.Errorf("%w: --devices, --sockets, --interval and --duration must be > 0", errUsage)
	}
	raddr, err := net.ResolveUDPAddr("udp", *addr)
	if err != nil {
		return fmt.Errorf("--coap %s: %w", *addr, err)
	}
	sim := &simulator{typ: message.NonConfirmable, codes: map[codes.Code]int{}}
	if *con {
		sim.typ = message.Confirmable
	}
	conns := make([]*net.UDPConn, *sockets)
	for i := range conns {
		if conns[i], err = net.DialUDP("udp", nil, raddr); err != nil {
			return fmt.Errorf("dial %s: %w", raddr, err)
		}
		defer conns[i].Close()
	}
	var readers sync.WaitGroup
	for _, c := range conns {
		readers.Add(1)
		go func() { defer readers.Done(); sim.read(c) }()
	}
	runCtx, cancel := context.WithTimeout(ctx, *duration)
	defer cancel()
	start := time.Now()
	sim.heartbeats(runCtx, conns, *devices, *prefix, *interval)
	if *leave {
		for n := range *devices {
			sim.send(conns[n%len(conns)], codes.DELETE, fmt.Sprintf("d=%s%d", *prefix, n))
		}
	}
	// Give the last answers a moment, then stop the readers.
	time.Sleep(500 * time.Millisecond)
	for _, c := range conns {
		c.Close()
	}
	readers.Wait()
	elapsed := time.Since(start)
	sim.mu.Lock()
	defer sim.mu.Unlock()
	fmt.Fprintf(stdout, "sent %d requests in %s (%.0f/s), %d answers, %d send errors\n",
		sim.sent.Load(), elapsed.Round(time.Millisecond), float64(sim.sent.Load())/elapsed.Seconds(), sim.answered.Load(), sim.sendErrs.Load())
	for c, n := range sim.codes {
		fmt.Fprintf(stdout, "  %v: %d\n", c, n)
	}
	return nil
}

type simulator struct {
	typ      message.Type
	mid      atomic.Uint32
	sent     atomic.Int64
	answered atomic.Int64
	sendErrs atomic.Int64
	mu       sync.Mutex
	codes    map[codes.Code]int
}

// heartbeats sends every device's POST /hb at its own phase of interval
// until ctx ends. Each round is bounded: devices due now are sent, then it
// waits for the next due one.
func (s *simulator) heartbeats(ctx context.Context, conns []*net.UDPConn, devices int, prefix string, interval time.Duration) {
	next := make([]time.Time, devices)
	now := time.Now()
	for i := range next {
		next[i] = now.Add(rand.N(interval))
	}
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for {
		now := time.Now()
		for i := range next {
			if next[i].After(now) {
				continue
			}
			s.send(conns[i%len(conns)], codes.POST, fmt.Sprintf("d=%s%d", prefix, i))
			jitter := time.Duration(rand.Int64N(int64(interval)/5+1)) - interval/10
			next[i] = now.Add(interval + jitter)
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

func (s *simulator) send(c *net.UDPConn, code codes.Code, query string) {
	m := pool.NewMessage(context.Background())
	mid := s.mid.Add(1)
	m.SetType(s.typ)
	m.SetCode(code)
	m.SetMessageID(int32(uint16(mid)))
	m.SetToken(message.Token{byte(mid >> 24), byte(mid >> 16), byte(mid >> 8), byte(mid)})
	_ = m.SetPath("/hb")
	m.AddQuery(query)
	b, err := m.MarshalWithEncoder(coder.DefaultCoder)
	if err == nil {
		_, err = c.Write(b)
	}
	if err != nil {
		s.sendErrs.Add(1)
		return
	}
	s.sent.Add(1)
}

func (s *simulator) read(c *net.UDPConn) {
	buf := make([]byte, 1500)
	for {
		n, err := c.Read(buf)
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			continue
		}
		m := pool.NewMessage(context.Background())
		if _, err := m.UnmarshalWithDecoder(coder.DefaultCoder, buf[:n]); err != nil {
			continue
		}
		s.answered.Add(1)
		s.mu.Lock()
		s.codes[m.Code()]++
		s.mu.Unlock()
	}
}
