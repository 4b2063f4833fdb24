package main

import (
	"bytes"
	"cmp"
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/plgd-dev/go-coap/v3/message"
	"github.com/plgd-dev/go-coap/v3/message/codes"
	"github.com/plgd-dev/go-coap/v3/options"
	"github.com/plgd-dev/go-coap/v3/udp"
	udpClient "github.com/plgd-dev/go-coap/v3/udp/client"
	"github.com/redis/go-redis/v9"

	"github.com/fleetgate/fleetgate/gateway"
	"github.com/fleetgate/fleetgate/internal/buildtest"
	"github.com/fleetgate/fleetgate/internal/redistest"
)

// binary is the fleetgate binary and udpline the shipped UDP line
// adapter, built once by TestMain.
var binary, udpline, lorawan string

func TestMain(m *testing.M) {
	syscall.Umask(0o022) // the adapter host refuses group-writable adapters and directories
	buildtest.Main(m, map[string]*string{".": &binary, "../../plugins/udpline": &udpline, "../../plugins/lorawan": &lorawan})
}

// e2eTiming is short enough for tests and passes the flap rule:
// lease − renew_every − flush_interval ≥ 2 × heartbeat_interval. The
// test devices send every heartbeat/2, more often than they are told.
// shards is presence.shards (0: 4); grace is presence.gateway_grace
// (0: half the lease, so that outage tests see their devices' offline
// events within lease + grace).
type e2eTiming struct {
	lease, heartbeat, renewEvery, flush, runnerInterval time.Duration
	shards                                              int
	grace                                               time.Duration
}

var fastTiming = e2eTiming{lease: 4 * time.Second, heartbeat: time.Second, renewEvery: time.Second, flush: 100 * time.Millisecond, runnerInterval: 100 * time.Millisecond}

// freeUDPPort is a port free for UDP (and TCP) on loopback, below the
// ephemeral range (redistest.FreePort).
func freeUDPPort(t testing.TB) int {
	t.Helper()
	return redistest.FreePort(t)
}

// gatewayProc is one `fleetgate run` child process.
type gatewayProc struct {
	t        testing.TB
	id       string
	config   string
	coapAddr string
	dtlsAddr string
	mqttAddr string
	admin    string
	cmd      *exec.Cmd
	log      *syncBuffer
	done     chan error
	env      []string // added to the process environment
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// newGateway writes a configuration for a gateway called id with its own
// state directory and loopback ports; redisAddr "" means the embedded store.
func newGateway(t testing.TB, id, redisAddr string, tm e2eTiming) *gatewayProc {
	t.Helper()
	dir := t.TempDir()
	g := &gatewayProc{
		t: t, id: id,
		config:   filepath.Join(dir, "fleetgate.yaml"),
		coapAddr: fmt.Sprintf("127.0.0.1:%d", freeUDPPort(t)),
		mqttAddr: fmt.Sprintf("127.0.0.1:%d", redistest.FreePort(t)),
		admin:    fmt.Sprintf("127.0.0.1:%d", redistest.FreePort(t)),
	}
	store := "backend: embedded"
	if redisAddr != "" {
		store = fmt.Sprintf("backend: redis\n  redis: { addrs: [%q] }", redisAddr)
	}
	cfg := fmt.Sprintf(`gateway: { id: %s, state_dir: %q }
presence: { lease: %s, heartbeat_interval: %s, renew_every: %s, suspect_after: %s, shards: %d, gateway_grace: %s }
store:
  %s
uplink: { flush_interval: %s, max_batch: 1000 }
runner: { enabled: true, interval: %s, batch: 500, lock_ttl: 1s }
listen:
  coap: { udp: %q }
  mqtt: { tcp: %q }
  admin: { http: %q }
log: { level: debug }
`, id, filepath.Join(dir, "state"), tm.lease, tm.heartbeat, tm.renewEvery, tm.lease/2, cmp.Or(tm.shards, 4), cmp.Or(tm.grace, tm.lease/2), store, tm.flush, tm.runnerInterval, g.coapAddr, g.mqttAddr, g.admin)
	cfg += "auth: { allow_anonymous: true, devices_file: \"\" }\n"
	if err := os.WriteFile(g.config, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		g.kill()
		checkLogKeys(t, "gateway "+id, g.logs())
		if t.Failed() {
			t.Logf("gateway %s log:\n%s", id, g.logs())
		}
	})
	return g
}

// useDevicesFile turns anonymous devices off, names a devices file and
// opens a CoAP DTLS listener; call it before start.
func (g *gatewayProc) useDevicesFile(path string) {
	g.t.Helper()
	g.dtlsAddr = fmt.Sprintf("127.0.0.1:%d", freeUDPPort(g.t))
	b, err := os.ReadFile(g.config)
	if err != nil {
		g.t.Fatal(err)
	}
	cfg := strings.Replace(string(b), `auth: { allow_anonymous: true, devices_file: "" }`,
		fmt.Sprintf("auth: { allow_anonymous: false, devices_file: %q }", path), 1)
	cfg = strings.Replace(cfg, fmt.Sprintf("coap: { udp: %q }", g.coapAddr),
		fmt.Sprintf("coap: { udp: %q, dtls: %q }", g.coapAddr, g.dtlsAddr), 1)
	if err := os.WriteFile(g.config, []byte(cfg), 0o600); err != nil {
		g.t.Fatal(err)
	}
}

func (g *gatewayProc) logs() string {
	if g.log == nil {
		return ""
	}
	return g.log.String()
}

// start runs the gateway and waits (bounded) until /readyz answers.
func (g *gatewayProc) start() {
	g.t.Helper()
	if g.log == nil {
		g.log = &syncBuffer{}
	}
	g.cmd = exec.Command(binary, "run", "-c", g.config)
	g.cmd.Env = append(append(os.Environ(), "FLEETGATE_LOG_FORMAT=text"), g.env...)
	g.cmd.Stdout, g.cmd.Stderr = g.log, g.log
	g.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := g.cmd.Start(); err != nil {
		g.t.Fatalf("start gateway %s: %v", g.id, err)
	}
	g.done = make(chan error, 1)
	go func(c *exec.Cmd, done chan error) { done <- c.Wait() }(g.cmd, g.done)
	waitFor(g.t, 30*time.Second, "gateway "+g.id+" ready", func() bool {
		select {
		case err := <-g.done:
			g.cmd = nil // reaped: kill must not wait for it again
			g.t.Fatalf("gateway %s exited before it was ready: %v", g.id, err)
		default:
		}
		resp, err := http.Get("http://" + g.admin + "/readyz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})
}

// kill stops the gateway with SIGKILL (no flush, no goodbye).
func (g *gatewayProc) kill() {
	if g.cmd == nil || g.cmd.Process == nil {
		return
	}
	_ = g.cmd.Process.Kill()
	<-g.done
	g.cmd = nil
}

// stop sends SIGTERM and expects a clean exit within 20 s.
func (g *gatewayProc) stop() {
	g.t.Helper()
	if err := g.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		g.t.Fatal(err)
	}
	select {
	case err := <-g.done:
		if err != nil {
			g.t.Fatalf("gateway %s exited with %v after SIGTERM", g.id, err)
		}
	case <-time.After(20 * time.Second):
		g.t.Fatalf("gateway %s did not stop within 20s of SIGTERM", g.id)
	}
	g.cmd = nil
}

// waitFor polls cond every 20 ms until it holds or limit passes.
func waitFor(t testing.TB, limit time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(limit)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", limit, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// device is a CoAP device using go-coap's UDP client.
type device struct {
	t  *testing.T
	id string
}

// heartbeat sends POST /hb?d=<id> to addr and expects 2.04.
func (d device) heartbeat(addr string) {
	d.t.Helper()
	d.do(addr, codes.POST)
}

// leave sends DELETE /hb?d=<id>.
func (d device) leave(addr string) { d.do(addr, codes.DELETE) }

func (d device) do(addr string, code codes.Code) {
	d.t.Helper()
	cc := dialCoAP(d.t, addr)
	defer cc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	q := message.Option{ID: message.URIQuery, Value: []byte("d=" + d.id)}
	var resp interface{ Code() codes.Code }
	var err error
	if code == codes.POST {
		resp, err = cc.Post(ctx, "/hb", message.TextPlain, nil, q)
	} else {
		resp, err = cc.Delete(ctx, "/hb", q)
	}
	if err != nil {
		d.t.Fatalf("device %s %v /hb at %s: %v", d.id, code, addr, err)
	}
	if resp.Code() != codes.Changed {
		d.t.Fatalf("device %s %v /hb: %v, want 2.04 Changed", d.id, code, resp.Code())
	}
}

func dialCoAP(t *testing.T, addr string) *udpClient.Conn {
	t.Helper()
	cc, err := udp.Dial(addr, options.WithErrors(func(error) {}))
	if err != nil {
		t.Fatalf("coap dial %s: %v", addr, err)
	}
	return cc
}

// keepSending sends a heartbeat every interval from a goroutine until the
// returned stop is called (bounded by limit); it returns the time of the
// last heartbeat sent.
func (d device) keepSending(addr func() string, interval, limit time.Duration) (stop func() time.Time) {
	quit := make(chan struct{})
	last := make(chan time.Time, 1)
	go func() {
		var at time.Time
		end := time.Now().Add(limit)
		for time.Now().Before(end) {
			if err := sendOnce(addr(), d.id); err == nil {
				at = time.Now()
			}
			select {
			case <-quit:
				last <- at
				return
			case <-time.After(interval):
			}
		}
		<-quit
		last <- at
	}()
	return func() time.Time { close(quit); return <-last }
}

// sendOnce is heartbeat without t (for goroutines); errors are returned.
func sendOnce(addr, id string) error {
	cc, err := udp.Dial(addr, options.WithErrors(func(error) {}))
	if err != nil {
		return err
	}
	defer cc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	resp, err := cc.Post(ctx, "/hb", message.TextPlain, nil, message.Option{ID: message.URIQuery, Value: []byte("d=" + id)})
	if err != nil {
		return err
	}
	if resp.Code() != codes.Changed {
		return fmt.Errorf("answer %v", resp.Code())
	}
	return nil
}

// event is one entry of a shard's Redis event stream, read directly.
type event struct {
	id       string
	device   string
	state    string
	ver      int
	at       time.Time
	reason   string
	gw       string
	deadline time.Time
}

// events reads the devices' events of every shard's stream from Redis
// (not the gateway events), ordered by time.
func events(t *testing.T, c *redis.Client, shards int) []event {
	t.Helper()
	var all []event
	for s := 0; s < shards; s++ {
		msgs, err := c.XRange(context.Background(), fmt.Sprintf("{fleetgate:%d}:events", s), "-", "+").Result()
		if err != nil {
			t.Fatalf("xrange shard %d: %v", s, err)
		}
		for _, m := range msgs {
			if m.Values["device"] == nil {
				continue // a gateway event
			}
			e := event{id: m.ID, device: str(m.Values["device"]), state: str(m.Values["state"]), reason: str(m.Values["reason"]), gw: str(m.Values["gw"])}
			e.ver, _ = strconv.Atoi(str(m.Values["ver"]))
			e.at = msTime(str(m.Values["at"]))
			e.deadline = msTime(str(m.Values["deadline"]))
			all = append(all, e)
		}
	}
	sort.SliceStable(all, func(i, j int) bool { return all[i].at.Before(all[j].at) })
	return all
}

func eventsOf(all []event, dev string) []event {
	var out []event
	for _, e := range all {
		if e.device == dev {
			out = append(out, e)
		}
	}
	return out
}

func str(v any) string {
	s, _ := v.(string)
	return s
}

func msTime(s string) time.Time {
	ms, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		return time.Time{}
	}
	return time.UnixMilli(ms)
}

// checkAlternates fails unless evs alternate online/offline from online,
// the first ver the store time of the first event (ms), then one more
// each.
func checkAlternates(t *testing.T, dev string, evs []event) {
	t.Helper()
	for i, e := range evs {
		want := "online"
		if i%2 == 1 {
			want = "offline"
		}
		wantVer := int(evs[0].at.UnixMilli()) + i
		if e.state != want || e.ver != wantVer {
			t.Fatalf("device %s event %d: %s ver %d, want %s ver %d (all: %+v)", dev, i, e.state, e.ver, want, wantVer, evs)
		}
	}
}

func (g *gatewayProc) signal(sig syscall.Signal) {
	g.t.Helper()
	if err := g.cmd.Process.Signal(sig); err != nil {
		g.t.Fatal(err)
	}
}

// maxAge sends one heartbeat and returns the Max-Age of the answer.
func maxAge(t *testing.T, addr, id string) uint32 {
	t.Helper()
	cc := dialCoAP(t, addr)
	defer cc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	resp, err := cc.Post(ctx, "/hb", message.TextPlain, nil, message.Option{ID: message.URIQuery, Value: []byte("d=" + id)})
	if err != nil {
		t.Fatal(err)
	}
	v, err := resp.GetOptionUint32(message.MaxAge)
	if err != nil {
		t.Fatalf("no Max-Age: %v", err)
	}
	return v
}

// shardKey is the Redis key of one of a device's shard keys (docs/design.md §3.1).
func shardKey(dev string, shards int, name string) string {
	return fmt.Sprintf("{fleetgate:%d}:%s", gateway.ShardOf(gateway.DeviceID(dev), shards), name)
}
