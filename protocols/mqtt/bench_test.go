package mqtt

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	mochi "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/listeners"
	"github.com/mochi-mqtt/server/v2/packets"
	"golang.org/x/crypto/bcrypt"

	"github.com/fleetgate/fleetgate/gateway"
	"github.com/fleetgate/fleetgate/queue/diskq"
)

// TestMain turns the test binary into the benchmark's client process
// when MQTT_BENCH_DIAL is set, so that the server's memory is measured
// without the clients' sockets in the same heap.
func TestMain(m *testing.M) {
	if addr := os.Getenv("MQTT_BENCH_DIAL"); addr != "" {
		os.Exit(benchClient(addr))
	}
	os.Exit(m.Run())
}

// countingObserver accepts everything at the cost of one atomic add.
type countingObserver struct{ n atomic.Int64 }

func (c *countingObserver) Observe(context.Context, gateway.Evidence) error {
	c.n.Add(1)
	return nil
}

// raiseNoFile lifts RLIMIT_NOFILE towards n+100 descriptors, as far as
// the hard limit allows (raising that needs CAP_SYS_RESOURCE), and
// returns how many connections fit: n, or fewer under a lower hard limit.
func raiseNoFile(n int) (int, error) {
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		return 0, err
	}
	want := uint64(n) + 100
	if lim.Max < want {
		lim.Max = want
		if syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lim) != nil {
			if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
				return 0, err
			}
		}
	}
	lim.Cur = min(lim.Max, want)
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		return 0, err
	}
	return min(n, int(lim.Cur)-100), nil
}

// benchClient is the client process: it opens MQTT_BENCH_N connections
// to addr, 64 at a time, from source addresses 127.0.0.2.., each with an
// MQTT 5 CONNECT of its own device, waits for every CONNACK, prints
// "connected <n> <nanoseconds>", and holds the connections until its
// stdin closes.
func benchClient(addr string) int {
	n, err := strconv.Atoi(os.Getenv("MQTT_BENCH_N"))
	if err == nil {
		_, err = raiseNoFile(n)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench client:", err)
		return 2
	}
	conns := make([]net.Conn, n)
	begin := time.Now()
	err = each(n, func(i int) error {
		c, err := dialConnect(addr, i)
		conns[i] = c
		return err
	})
	elapsed := time.Since(begin)
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench client:", err)
		return 1
	}
	fmt.Printf("connected %d %d\n", n, elapsed.Nanoseconds())
	if os.Getenv("MQTT_BENCH_PUBLISH") != "" {
		if err := publishOnEach(conns); err != nil {
			fmt.Fprintln(os.Stderr, "bench client:", err)
			return 1
		}
		fmt.Println("published")
	}
	_, _ = io.Copy(io.Discard, os.Stdin)
	for _, c := range conns {
		_ = c.Close()
	}
	return 0
}

// dialConnect opens connection i and completes its MQTT 5 CONNECT.
func dialConnect(addr string, i int) (net.Conn, error) {
	d := net.Dialer{Timeout: 10 * time.Second, LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 0, byte(2+i/20000), byte(2+i%200))}}
	c, err := d.Dial("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("dial %d: %w", i, err)
	}
	pk := packets.Packet{
		FixedHeader:     packets.FixedHeader{Type: packets.Connect},
		ProtocolVersion: 5,
		Connect: packets.ConnectParams{
			ProtocolName: []byte("MQTT"), Clean: true, Keepalive: 3600,
			ClientIdentifier: fmt.Sprintf("bench-%d", i),
		},
	}
	var buf bytes.Buffer
	if err := pk.ConnectEncode(&buf); err != nil {
		return nil, err
	}
	_ = c.SetDeadline(time.Now().Add(30 * time.Second))
	if _, err := c.Write(buf.Bytes()); err != nil {
		return nil, fmt.Errorf("connect %d: %w", i, err)
	}
	ack := make([]byte, 64)
	n, err := c.Read(ack)
	if err != nil {
		return nil, fmt.Errorf("connack %d: %w", i, err)
	}
	// Fixed header (2 bytes), flags, reason code.
	if n < 4 || ack[0]>>4 != packets.Connack || ack[3] != 0 {
		return nil, fmt.Errorf("connack %d: %x", i, ack[:n])
	}
	_ = c.SetDeadline(time.Time{})
	return c, nil
}

// publishOnEach sends one QoS 1 PUBLISH of 4 bytes to "devices/bench-<i>/t"
// on each connection, 64 connections at a time, and waits for every
// PUBACK: a device's telemetry at its heartbeat.
func publishOnEach(conns []net.Conn) error {
	return each(len(conns), func(i int) error {
		if err := publishOne(conns[i], fmt.Sprintf("devices/bench-%d/t", i)); err != nil {
			return fmt.Errorf("publish %d: %w", i, err)
		}
		return nil
	})
}

// each runs f for 0 ≤ i < n on 64 goroutines and returns the first error
// (a goroutine stops at its first).
func each(n int, f func(i int) error) error {
	var next atomic.Int64
	errs := make(chan error, 64)
	var wg sync.WaitGroup
	for range 64 {
		wg.Go(func() {
			for {
				i := int(next.Add(1)) - 1
				if i >= n {
					return
				}
				if err := f(i); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	return <-errs
}

// publishOne sends one QoS 1 PUBLISH on c and reads its PUBACK.
func publishOne(c net.Conn, topic string) error {
	pk := packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Publish, Qos: 1}, ProtocolVersion: 5,
		PacketID: 1, TopicName: topic, Payload: []byte("21.5")}
	var buf bytes.Buffer
	if err := pk.PublishEncode(&buf); err != nil {
		return err
	}
	_ = c.SetDeadline(time.Now().Add(30 * time.Second))
	defer func() { _ = c.SetDeadline(time.Time{}) }()
	if _, err := c.Write(buf.Bytes()); err != nil {
		return err
	}
	typ, err := readFrame(bufio.NewReaderSize(c, 16))
	if err == nil && typ != packets.Puback {
		err = fmt.Errorf("packet type %d, want PUBACK", typ)
	}
	return err
}

// live is the memory in use after a full GC: heap and goroutine stacks.
type live struct{ heap, stack float64 }

func liveBytes() live {
	runtime.GC()
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return live{heap: float64(ms.HeapAlloc), stack: float64(ms.StackInuse)}
}

// holdConnections runs the client process against addr until n
// connections are established, and returns the server process's live
// bytes per connection (the clients run in their own process, so the new
// stacks are the server's goroutines) and the connects per second the
// client saw. The client process ends before it returns.
func holdConnections(b *testing.B, addr string, n int) (perConn live, connectsPerSec float64) {
	return holdConnectionsThat(b, addr, n, false)
}

// holdConnectionsThat is holdConnections, where each connection also
// publishes one QoS 1 message before the server's bytes are measured when
// publish is set.
func holdConnectionsThat(b *testing.B, addr string, n int, publish bool) (perConn live, connectsPerSec float64) {
	b.Helper()
	before := liveBytes()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), "MQTT_BENCH_DIAL="+addr, "MQTT_BENCH_N="+strconv.Itoa(n))
	if publish {
		cmd.Env = append(cmd.Env, "MQTT_BENCH_PUBLISH=1")
	}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		b.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		b.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	defer func() {
		_ = stdin.Close()
		if err := cmd.Wait(); err != nil {
			b.Errorf("bench client: %v", err)
		}
	}()
	rd := bufio.NewReader(stdout)
	line, err := rd.ReadString('\n')
	if err != nil {
		b.Fatalf("bench client: %v", err)
	}
	var got int
	var ns int64
	if _, err := fmt.Sscanf(line, "connected %d %d", &got, &ns); err != nil || got != n {
		b.Fatalf("bench client said %q", line)
	}
	if publish {
		if line, err := rd.ReadString('\n'); err != nil || line != "published\n" {
			b.Fatalf("bench client said %q (%v)", line, err)
		}
	}
	after := liveBytes()
	perConn = live{heap: (after.heap - before.heap) / float64(n), stack: (after.stack - before.stack) / float64(n)}
	return perConn, float64(n) / time.Duration(ns).Seconds()
}

// rawHolder is the floor a goroutine-per-connection server can reach: it
// reads CONNECT into a 512-byte buffer, answers a 5-byte CONNACK, and
// keeps one goroutine blocked in Read per connection.
func rawHolder(b *testing.B) net.Addr {
	b.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	var conns []net.Conn
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
			wg.Add(1)
			go func() {
				defer wg.Done()
				buf := make([]byte, 512)
				if _, err := c.Read(buf); err != nil {
					return
				}
				if _, err := c.Write([]byte{packets.Connack << 4, 3, 0, 0, 0}); err != nil {
					return
				}
				for {
					if _, err := c.Read(buf); err != nil {
						return
					}
				}
			}()
		}
	}()
	b.Cleanup(func() {
		_ = ln.Close()
		mu.Lock()
		for _, c := range conns {
			_ = c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	return ln.Addr()
}

// benchConnections is 20,000 connections by default; MQTT_BENCH_CONNS
// changes it.
func benchConnections(b *testing.B) int {
	if v, err := strconv.Atoi(os.Getenv("MQTT_BENCH_CONNS")); err == nil && v > 0 {
		return v
	}
	return 20000
}

// BenchmarkConnections holds 20,000 MQTT 5 connections (anonymous, so no
// bcrypt; fewer when the hard RLIMIT_NOFILE is lower, as logged) and reports the server's live bytes per connection and the
// connects per second, against the raw goroutine-per-connection floor
// measured in the same run, and bytes per connection against the 8 KB
// goal; B/conn is heap-B/conn + stack-B/conn. One op is the whole run.
func BenchmarkConnections(b *testing.B) {
	n, err := raiseNoFile(benchConnections(b))
	if err != nil {
		b.Fatalf("raise RLIMIT_NOFILE: %v", err)
	}
	b.Logf("%d connections", n)
	var mqttMem, rawMem live
	var mqttRate, rawRate float64
	for b.Loop() {
		obs := &countingObserver{}
		s := startServer(b, obs, Options{AllowAnonymous: true, HeartbeatInterval: time.Hour, ConnectsPerSecond: 1 << 30,
			AnonymousConnectsPerSecond: 1 << 30, MaxClients: n})
		mqttMem, mqttRate = holdConnections(b, tcpAddr(s), n)
		if got := obs.n.Load(); got < int64(n) {
			b.Fatalf("%d connects observed, want %d", got, n)
		}
		if err := s.Close(); err != nil {
			b.Fatal(err)
		}
		rawMem, rawRate = holdConnections(b, rawHolder(b).String(), n)
	}
	mqttBytes := mqttMem.heap + mqttMem.stack
	b.ReportMetric(mqttBytes, "B/conn")
	b.ReportMetric(mqttMem.heap, "heap-B/conn")
	b.ReportMetric(mqttMem.stack, "stack-B/conn")
	b.ReportMetric(rawMem.heap+rawMem.stack, "raw-B/conn")
	b.ReportMetric(mqttBytes/8192, "ratio-to-8KB-goal")
	b.ReportMetric(mqttRate, "connects/s")
	b.ReportMetric(rawRate, "raw-connects/s")
	b.ReportMetric(mqttRate/rawRate, "ratio-to-raw")
}

// BenchmarkConnectionsInUse is BenchmarkConnections on connections in
// use: after its CONNACK each connection publishes one QoS 1 message
// through the durable queue the data path uses (a bbolt file, committed
// before the PUBACK), as a device does at its heartbeat; MQTT_BENCH_CONNS
// connections (default 20,000, as many as fit). It reports the server's
// live bytes per connection against the 16 KB goal.
func BenchmarkConnectionsInUse(b *testing.B) {
	n, err := raiseNoFile(benchConnections(b))
	if err != nil {
		b.Fatalf("raise RLIMIT_NOFILE: %v", err)
	}
	b.Logf("%d connections", n)
	var mem live
	for b.Loop() {
		q, err := diskq.Open(diskq.Options{Path: filepath.Join(b.TempDir(), "queue.db"), MaxBytes: 1 << 30})
		if err != nil {
			b.Fatal(err)
		}
		obs := &countingObserver{}
		s := startServer(b, obs, Options{AllowAnonymous: true, HeartbeatInterval: time.Hour, ConnectsPerSecond: 1 << 30,
			MaxClients: n, AnonymousConnectsPerSecond: 1 << 30, Sink: queueSink{q}})
		mem, _ = holdConnectionsThat(b, tcpAddr(s), n, true)
		if got := q.Stats().Messages; got != n {
			b.Fatalf("%d messages queued, want %d", got, n)
		}
		if err := s.Close(); err != nil {
			b.Fatal(err)
		}
		if err := q.Close(); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(mem.heap+mem.stack, "B/conn")
	b.ReportMetric(mem.heap, "heap-B/conn")
	b.ReportMetric(mem.stack, "stack-B/conn")
	b.ReportMetric((mem.heap+mem.stack)/16384, "ratio-to-16KB-goal")
}

// queueSink is the DataSink of a durable queue alone: Publish returns
// once the messages are committed.
type queueSink struct{ q *diskq.Queue }

func (k queueSink) Publish(ctx context.Context, msgs []gateway.Message) error {
	_, err := k.q.Put(ctx, msgs)
	return err
}

// BenchmarkConnectionsMochiDefaults is the same run with mochi's default
// buffers and capabilities (and no presence hook), on 2,000 connections:
// what the tuning saves. Its stack per connection is mochi's alone (the
// buffers are heap), to hold BenchmarkConnections' stack-B/conn against.
func BenchmarkConnectionsMochiDefaults(b *testing.B) {
	const n = 2000
	if _, err := raiseNoFile(n); err != nil {
		b.Fatalf("raise RLIMIT_NOFILE: %v", err)
	}
	var def live
	for b.Loop() {
		srv := mochi.New(&mochi.Options{Logger: testLoggerOrDiscard()})
		if err := srv.AddHook(new(allowAll), nil); err != nil {
			b.Fatal(err)
		}
		ln := listeners.NewTCP(listeners.Config{ID: "tcp", Address: "127.0.0.1:0"})
		if err := srv.AddListener(ln); err != nil {
			b.Fatal(err)
		}
		if err := srv.Serve(); err != nil {
			b.Fatal(err)
		}
		def, _ = holdConnections(b, ln.Address(), n)
		if err := srv.Close(); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(def.heap+def.stack, "default-B/conn")
	b.ReportMetric(def.stack, "default-stack-B/conn")
	b.ReportMetric((def.heap+def.stack)/8192, "ratio-to-8KB-goal")
}

// allowAll admits every client, as mochi's auth.AllowHook.
type allowAll struct{ mochi.HookBase }

func (allowAll) ID() string { return "allow-all" }
func (allowAll) Provides(b byte) bool {
	return b == mochi.OnConnectAuthenticate || b == mochi.OnACLCheck
}
func (allowAll) OnConnectAuthenticate(*mochi.Client, packets.Packet) bool { return true }
func (allowAll) OnACLCheck(*mochi.Client, string, bool) bool              { return true }

// BenchmarkRenewHotPath is the cost of one packet read on an admitted
// connection (the hook's OnPacketRead: a Renew handed to the Observer)
// against the ceiling of calling the Observer directly with the same
// evidence.
func BenchmarkRenewHotPath(b *testing.B) {
	obs := &countingObserver{}
	s := startServer(b, obs, Options{AllowAnonymous: true})
	h := &presence{srv: s}
	cl := &mochi.Client{}
	cl.Net.Conn = &conn{device: "dev-1", session: "gw-1/7/1", root: "devices/dev-1"}
	pk := packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Pingreq}}

	const batch = 100000
	measure := func(f func()) time.Duration {
		begin := time.Now()
		for range batch {
			f()
		}
		return time.Since(begin)
	}
	var hook, direct time.Duration
	ev := gateway.Evidence{Device: "dev-1", Session: "gw-1/7/1", Kind: gateway.Renew, Protocol: "mqtt"}
	for b.Loop() {
		hook += measure(func() { _, _ = h.OnPacketRead(cl, pk) })
		direct += measure(func() {
			ev.ObservedAt = s.clock.Now()
			_ = obs.Observe(s.ctx, ev)
		})
	}
	b.ReportMetric(float64(hook.Nanoseconds())/float64(b.N*batch), "ns/renew")
	b.ReportMetric(float64(direct.Nanoseconds())/float64(b.N*batch), "direct-ns/renew")
	b.ReportMetric(float64(hook)/float64(direct), "ratio-to-direct")
}

func testLoggerOrDiscard() *slog.Logger {
	if l := testLogger(); l != nil {
		return l
	}
	return slog.New(slog.DiscardHandler)
}

// BenchmarkConnectBcrypt is the connect rate of devices with passwords
// hashed at bcrypt.DefaultCost (what a devices file holds), four
// connecting at once, against anonymous connects in the same run: the
// hash check is what bounds a reconnect storm.
func BenchmarkConnectBcrypt(b *testing.B) {
	const perOp = 40
	hash, err := bcrypt.GenerateFromPassword([]byte("secret"), bcrypt.DefaultCost)
	if err != nil {
		b.Fatal(err)
	}
	creds := bcryptCreds{}
	for i := range perOp {
		creds[gateway.DeviceID(fmt.Sprintf("dev-%d", i))] = hash
	}
	s := startServer(b, &countingObserver{}, Options{Credentials: creds, AllowAnonymous: true, ConnectsPerSecond: 1 << 30})
	run := func(prefix, password string) time.Duration {
		begin := time.Now()
		var wg sync.WaitGroup
		for w := range 4 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := w; i < perOp; i += 4 {
					r := dialRaw(b, tcpAddr(s))
					if code := r.connack(connectPacket(b, 5, fmt.Sprintf("%s-%d", prefix, i), password, 30)); code != 0 {
						b.Errorf("connect %s-%d: %#x", prefix, i, code)
					}
					_ = r.Close()
				}
			}()
		}
		wg.Wait()
		return time.Since(begin)
	}
	var hashed, anon time.Duration
	for b.Loop() {
		hashed += run("dev", "secret")
		anon += run("anon", "") // anonymous access covers unlisted devices only
	}
	rate := func(d time.Duration) float64 { return float64(b.N*perOp) / d.Seconds() }
	b.ReportMetric(rate(hashed), "bcrypt-connects/s")
	b.ReportMetric(rate(anon), "anonymous-connects/s")
	b.ReportMetric(rate(hashed)/rate(anon), "ratio-to-anonymous")
}
