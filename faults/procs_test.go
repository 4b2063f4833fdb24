//go:build faults

package faults

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"math"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/fleetgate/fleetgate/gateway"
	"github.com/fleetgate/fleetgate/internal/redistest"
)

// timing is the scenarios' presence timing: short, so that a scenario
// takes seconds, and inside the flap rule (lease − renew_every −
// flush_interval ≥ 2 × heartbeat_interval). grace is the gateways'
// presence.gateway_grace, part of the missed-offline bound of every
// device whose path to the store was cut.
type timing struct {
	lease, heartbeat, renewEvery, flush, runnerInterval, lockTTL, grace time.Duration
	// processing is the allowance for backlog and process scheduling in
	// the missed-offline bound (check-config's "plus processing").
	processing time.Duration
}

var fast = timing{
	lease: 4 * time.Second, heartbeat: time.Second, renewEvery: time.Second,
	flush: 150 * time.Millisecond, runnerInterval: 200 * time.Millisecond, lockTTL: time.Second,
	grace: 4 * time.Second, processing: time.Second,
}

// earliestOffline is check-config's "earliest offline": an offline event
// sooner than this after a device's evidence is a false offline.
func (tm timing) earliestOffline() time.Duration { return tm.lease - tm.renewEvery - tm.flush }

// detection is check-config's worst-case detection after a runner
// failover, plus processing: the missed-offline bound of a device whose
// path to the store stayed up.
func (tm timing) detection() time.Duration {
	return tm.lease + gateway.CoverageWait(tm.flush) + tm.runnerInterval + tm.lockTTL + tm.processing
}

// gwConfig is what the harness writes into a gateway's YAML. Extra holds
// more keys by dotted path ("presence.gateway_grace": "4s"), set after
// the others, so a key the binary learns later needs no harness change.
type gwConfig struct {
	ID         string
	StateDir   string
	RedisAddrs []string
	Shards     int
	T          timing
	CoAP       string
	MQTT       string
	Admin      string
	Extra      map[string]any
}

// yaml renders the configuration.
func (c gwConfig) yaml() ([]byte, error) {
	root := map[string]any{}
	set := func(path string, v any) {
		m := root
		parts := strings.Split(path, ".")
		for _, p := range parts[:len(parts)-1] {
			sub, ok := m[p].(map[string]any)
			if !ok {
				sub = map[string]any{}
				m[p] = sub
			}
			m = sub
		}
		m[parts[len(parts)-1]] = v
	}
	tm := c.T
	set("gateway.id", c.ID)
	set("gateway.state_dir", c.StateDir)
	set("presence.lease", tm.lease.String())
	set("presence.heartbeat_interval", tm.heartbeat.String())
	set("presence.renew_every", tm.renewEvery.String())
	set("presence.suspect_after", (tm.lease / 2).String())
	set("presence.shards", c.Shards)
	set("presence.gateway_grace", tm.grace.String())
	set("store.backend", "redis")
	set("store.redis.addrs", c.RedisAddrs)
	set("uplink.flush_interval", tm.flush.String())
	set("uplink.max_batch", 1000)
	set("runner.enabled", true)
	set("runner.interval", tm.runnerInterval.String())
	set("runner.batch", 500)
	set("runner.lock_ttl", tm.lockTTL.String())
	set("listen.coap.udp", c.CoAP)
	set("listen.coap.dtls", "")
	set("listen.mqtt.tcp", c.MQTT)
	set("listen.mqtt.tls", "")
	set("listen.admin.http", c.Admin)
	set("auth.allow_anonymous", true)
	set("auth.devices_file", "")
	// Every device of the fleet comes from 127.0.0.1: lift the per-source
	// rates that protect a gateway from one misbehaving source.
	set("limits.coap_requests_per_second", 100000)
	set("limits.mqtt_connects_per_second", 100000)
	set("log.level", cmp.Or(os.Getenv("FAULTS_LOG_LEVEL"), "info"))
	for k, v := range c.Extra {
		set(k, v)
	}
	return yaml.Marshal(root)
}

func freeUDP(t testing.TB) string {
	t.Helper()
	c, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	return c.LocalAddr().String()
}

func freeTCP(t testing.TB) string {
	return fmt.Sprintf("127.0.0.1:%d", redistest.FreePort(t))
}

// gatewayProc is one `fleetgate run` child process; start again after
// kill to restart it on the same ports and state directory.
type gatewayProc struct {
	t    testing.TB
	cfg  gwConfig
	path string
	// Env is added to the process environment (FLEETGATE_TEST_BOOT_ID).
	Env []string
	// Wrap runs the binary under a command (unshare for a time namespace).
	Wrap []string
	cmd  *exec.Cmd
	done chan error
	log  *syncBuffer
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

func (s *syncBuffer) tail(n int) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	b := s.b.Bytes()
	if len(b) > n {
		b = b[len(b)-n:]
	}
	return string(b)
}

// newGateway writes the configuration of gateway id on fresh loopback
// ports, storing in Redis at addrs.
func newGateway(t testing.TB, id string, addrs []string) *gatewayProc {
	t.Helper()
	dir := t.TempDir()
	g := &gatewayProc{t: t, log: &syncBuffer{}, path: filepath.Join(dir, "fleetgate.yaml"), cfg: gwConfig{
		ID: id, StateDir: filepath.Join(dir, "state"), RedisAddrs: addrs, Shards: shards, T: fast,
		CoAP: freeUDP(t), MQTT: freeTCP(t), Admin: freeTCP(t), Extra: map[string]any{},
	}}
	g.writeConfig()
	t.Cleanup(func() {
		g.kill()
		if t.Failed() {
			t.Logf("gateway %s log (tail):\n%s", id, g.log.tail(6000))
			if dir := os.Getenv("FAULTS_DUMP"); dir != "" {
				path := filepath.Join(dir, t.Name()+"-"+id+".log")
				if err := os.WriteFile(path, []byte(g.log.tail(math.MaxInt)), 0o644); err != nil {
					t.Logf("FAULTS_DUMP: %v", err)
				}
			}
		}
	})
	return g
}

func (g *gatewayProc) writeConfig() {
	g.t.Helper()
	b, err := g.cfg.yaml()
	if err != nil {
		g.t.Fatal(err)
	}
	if err := os.WriteFile(g.path, b, 0o600); err != nil {
		g.t.Fatal(err)
	}
}

// start runs the gateway and waits (bounded) until /readyz answers 200.
// The gateway is ready while Redis is unreachable too (it serves devices
// into its outbox).
func (g *gatewayProc) start() {
	g.t.Helper()
	args := append(append([]string{}, g.Wrap...), binary, "run", "-c", g.path)
	g.cmd = exec.Command(args[0], args[1:]...)
	g.cmd.Env = append(gatewayEnv(), "FLEETGATE_LOG_FORMAT=text")
	g.cmd.Env = append(g.cmd.Env, g.Env...)
	g.cmd.Stdout, g.cmd.Stderr = g.log, g.log
	g.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := g.cmd.Start(); err != nil {
		g.t.Fatalf("start gateway %s: %v", g.cfg.ID, err)
	}
	g.done = make(chan error, 1)
	go func(c *exec.Cmd, done chan error) { done <- c.Wait() }(g.cmd, g.done)
	deadline := time.Now().Add(30 * time.Second)
	for {
		select {
		case err := <-g.done:
			g.cmd = nil
			g.t.Fatalf("gateway %s exited before it was ready: %v\n%s", g.cfg.ID, err, g.log.tail(3000))
		default:
		}
		resp, err := http.Get("http://" + g.cfg.Admin + "/readyz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return
			}
		}
		if time.Now().After(deadline) {
			g.t.Fatalf("gateway %s not ready after 30s", g.cfg.ID)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// kill stops the gateway with SIGKILL: no final flush, no goodbye.
func (g *gatewayProc) kill() {
	if g.cmd == nil || g.cmd.Process == nil {
		return
	}
	_ = g.cmd.Process.Kill()
	<-g.done
	g.cmd = nil
}

// signal sends sig to the gateway (SIGSTOP / SIGCONT to hang it, SIGHUP
// to reload it).
func (g *gatewayProc) signal(sig syscall.Signal) {
	g.t.Helper()
	if err := g.cmd.Process.Signal(sig); err != nil {
		g.t.Errorf("signal %v to gateway %s: %v\n%s", sig, g.cfg.ID, err, g.log.tail(3000))
	}
}

// outboxSessions reads outbox_sessions from /v1/status (-1 on error).
func (g *gatewayProc) outboxSessions() int {
	var st map[string]any
	if !g.status(&st) {
		return -1
	}
	return findInt(st, "outbox_sessions")
}

// uplinkUp reports whether g's uplink says every shard is up
// (/v1/status uplink.up; false on error).
func (g *gatewayProc) uplinkUp() bool {
	var st struct {
		Uplink struct {
			Up bool `json:"up"`
		} `json:"uplink"`
	}
	return g.status(&st) && st.Uplink.Up
}

// status decodes g's /v1/status into v; false if it could not.
func (g *gatewayProc) status(v any) bool {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+g.cfg.Admin+"/v1/status", nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return false
	}
	defer resp.Body.Close()
	return json.NewDecoder(resp.Body).Decode(v) == nil
}

// findInt finds key at any depth of a decoded JSON object (-1 if absent).
func findInt(v any, key string) int {
	switch x := v.(type) {
	case map[string]any:
		if n, ok := x[key].(float64); ok {
			return int(n)
		}
		for _, sub := range x {
			if n := findInt(sub, key); n >= 0 {
				return n
			}
		}
	case []any:
		for _, sub := range x {
			if n := findInt(sub, key); n >= 0 {
				return n
			}
		}
	}
	return -1
}

// redisCLI runs one command against addr with a short timeout.
func redisCLI(t testing.TB, addr string, args ...string) string {
	t.Helper()
	host, port, _ := net.SplitHostPort(addr)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, "redis-cli", append([]string{"-h", host, "-p", port}, args...)...).CombinedOutput()
	if err != nil {
		t.Fatalf("redis-cli %s %v: %v\n%s", addr, args, err, out)
	}
	return strings.TrimSpace(string(out))
}

// bootIDEnv overrides the boot ID the gateway keys its outbox ages on,
// so that a test can simulate a reboot.
const bootIDEnv = "FLEETGATE_TEST_BOOT_ID"

// gatewayEnv is the test's environment without FLEETGATE_ variables: a
// gateway's configuration is its YAML and what the harness adds.
func gatewayEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "FLEETGATE_") {
			env = append(env, kv)
		}
	}
	return env
}

// bootID returns a fresh boot ID in /proc/sys/kernel/random/boot_id's
// format for the simulated reboot (FLEETGATE_TEST_BOOT_ID).
func bootID(n int) string {
	return fmt.Sprintf("00000000-0000-4000-8000-%012s", strconv.Itoa(n))
}
