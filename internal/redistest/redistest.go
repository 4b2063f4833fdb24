// Package redistest starts real redis-server processes for tests: a
// standalone server or a small Redis Cluster, on free loopback ports, in
// the test's temporary directory, stopped by t.Cleanup. A missing
// redis-server fails the test (make test installs it); it never skips.
package redistest

import (
	"bufio"
	"context"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// Server is one redis-server child process.
type Server struct {
	Addr string
	Dir  string
	cmd  *exec.Cmd
	args []string
	t    testing.TB
}

// Binary returns the path of redis-server, failing the test if absent.
func Binary(t testing.TB) string {
	t.Helper()
	p, err := exec.LookPath("redis-server")
	if err != nil {
		t.Fatalf("redis-server not found in PATH (make test installs it: apt-get install -y redis-server): %v", err)
	}
	return p
}

// FreePort returns a loopback TCP port that was free a moment ago.
//
// It picks below the kernel's ephemeral range (32768 and up on Linux):
// a port the kernel handed out for :0 is soon handed to some outgoing
// connection of another test too, which then holds it when the port's
// server binds it ("address already in use").
// A port is handed out once per process: two tests running in parallel
// that drew the same free port would both bind it.
func FreePort(t testing.TB) int {
	t.Helper()
	for range 200 {
		port := freeLow + rand.N(freeHigh-freeLow)
		if _, taken := handedOut.LoadOrStore(port, true); taken {
			continue
		}
		if portFree(port) {
			return port
		}
	}
	t.Fatalf("free port: none found in %d..%d", freeLow, freeHigh)
	return 0
}

// The range FreePort picks from.
const freeLow, freeHigh = 20000, 32700

// handedOut holds the ports FreePort returned (or found taken) in this
// process.
var handedOut sync.Map

// portFree reports whether port can be bound on loopback, for TCP and UDP
// alike (a gateway listens on both).
func portFree(port int) bool {
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return false
	}
	defer l.Close()
	pc, err := net.ListenPacket("udp", addr)
	if err != nil {
		return false
	}
	pc.Close()
	return true
}

// Start runs a standalone redis-server on a free loopback port with
// persistence off. extra are more redis-server arguments ("--name", "value").
func Start(t testing.TB, extra ...string) *Server {
	t.Helper()
	dir := t.TempDir()
	return startIn(t, dir, extra...)
}

func startIn(t testing.TB, dir string, extra ...string) *Server {
	t.Helper()
	bin := Binary(t)
	var s *Server
	for attempt := 0; attempt < 5; attempt++ {
		port := FreePort(t)
		args := []string{
			"--port", strconv.Itoa(port), "--bind", "127.0.0.1",
			"--dir", dir, "--save", "", "--appendonly", "no",
			"--daemonize", "no", "--loglevel", "warning",
			"--logfile", filepath.Join(dir, "redis.log"),
		}
		args = append(args, extra...)
		s = &Server{Addr: fmt.Sprintf("127.0.0.1:%d", port), Dir: dir, args: args, t: t}
		if err := s.run(bin); err == nil {
			t.Cleanup(s.Kill)
			return s
		} else if attempt == 4 {
			t.Fatalf("start redis-server: %v\n%s", err, s.Log())
		}
	}
	return s
}

func (s *Server) run(bin string) error {
	s.cmd = exec.Command(bin, s.args...)
	s.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := s.cmd.Start(); err != nil {
		return err
	}
	if err := s.waitReady(10 * time.Second); err != nil {
		_ = s.cmd.Process.Kill()
		_ = s.cmd.Wait()
		return err
	}
	return nil
}

func (s *Server) waitReady(limit time.Duration) error {
	deadline := time.Now().Add(limit)
	c := redis.NewClient(&redis.Options{Addr: s.Addr, MaxRetries: -1, DialTimeout: 200 * time.Millisecond})
	defer c.Close()
	var err error
	for time.Now().Before(deadline) {
		ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
		err = c.Ping(ctx).Err()
		cancel()
		if err == nil {
			return nil
		}
		time.Sleep(20 * time.Millisecond)
	}
	return fmt.Errorf("redis at %s not ready after %v: %w", s.Addr, limit, err)
}

// Pid is the server's process id (for /proc/<pid>/stat and signals).
func (s *Server) Pid() int { return s.cmd.Process.Pid }

// Signal sends sig to the server (SIGSTOP / SIGCONT to hang it).
func (s *Server) Signal(sig syscall.Signal) {
	s.t.Helper()
	if err := s.cmd.Process.Signal(sig); err != nil {
		s.t.Fatalf("signal redis %s: %v", s.Addr, err)
	}
}

// Kill stops the server with SIGKILL and waits for it; safe to call twice.
func (s *Server) Kill() {
	if s.cmd == nil || s.cmd.Process == nil || s.cmd.ProcessState != nil {
		return
	}
	_ = s.cmd.Process.Signal(syscall.SIGCONT)
	_ = s.cmd.Process.Kill()
	_ = s.cmd.Wait()
}

// Restart kills the server and starts it again on the same port and
// directory: all data and loaded scripts are gone (persistence is off).
func (s *Server) Restart() {
	s.t.Helper()
	s.Kill()
	bin := Binary(s.t)
	var err error
	for attempt := 0; attempt < 50; attempt++ {
		if err = s.run(bin); err == nil {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
	s.t.Fatalf("restart redis %s: %v\n%s", s.Addr, err, s.Log())
}

// Log returns the tail of the server's log file.
func (s *Server) Log() string {
	b, _ := os.ReadFile(filepath.Join(s.Dir, "redis.log"))
	if len(b) > 4000 {
		b = b[len(b)-4000:]
	}
	return string(b)
}

// Client returns a go-redis client for the server, closed at cleanup.
func (s *Server) Client(t testing.TB) *redis.Client {
	c := redis.NewClient(&redis.Options{Addr: s.Addr})
	t.Cleanup(func() { c.Close() })
	return c
}

// Cluster is a Redis Cluster of masters without replicas.
type Cluster struct {
	Nodes []*Server
}

// StartCluster starts n (≥ 3) cluster-enabled servers and joins them with
// `redis-cli --cluster create`, waiting until every node reports
// cluster_state:ok.
func StartCluster(t testing.TB, n int) *Cluster {
	t.Helper()
	if n < 3 {
		t.Fatalf("a Redis Cluster needs at least 3 masters, got %d", n)
	}
	cli, err := exec.LookPath("redis-cli")
	if err != nil {
		t.Fatalf("redis-cli not found (make test installs redis-server, which brings it): %v", err)
	}
	c := &Cluster{}
	addrs := make([]string, n)
	for i := 0; i < n; i++ {
		dir := t.TempDir()
		s := startIn(t, dir, "--cluster-enabled", "yes",
			"--cluster-config-file", filepath.Join(dir, "nodes.conf"),
			"--cluster-node-timeout", "2000")
		c.Nodes = append(c.Nodes, s)
		addrs[i] = s.Addr
	}
	args := append([]string{"--cluster", "create"}, addrs...)
	args = append(args, "--cluster-replicas", "0", "--cluster-yes")
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, cli, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("redis-cli --cluster create: %v\n%s", err, out)
	}
	deadline := time.Now().Add(30 * time.Second)
	for _, s := range c.Nodes {
		rc := redis.NewClient(&redis.Options{Addr: s.Addr})
		for {
			info, err := rc.ClusterInfo(context.Background()).Result()
			if err == nil && strings.Contains(info, "cluster_state:ok") {
				break
			}
			if time.Now().After(deadline) {
				rc.Close()
				t.Fatalf("cluster node %s not ok after 30s: %v %q", s.Addr, err, info)
			}
			time.Sleep(50 * time.Millisecond)
		}
		rc.Close()
	}
	return c
}

// Addrs lists the nodes' addresses.
func (c *Cluster) Addrs() []string {
	a := make([]string, len(c.Nodes))
	for i, s := range c.Nodes {
		a[i] = s.Addr
	}
	return a
}

// Client returns a cluster client, closed at cleanup.
func (c *Cluster) Client(t testing.TB) *redis.ClusterClient {
	cc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: c.Addrs()})
	t.Cleanup(func() { cc.Close() })
	return cc
}

// MigrateSlot moves one hash slot from the node that owns it to node dst,
// key by key, with the CLUSTER SETSLOT IMPORTING / MIGRATING / MIGRATE /
// NODE sequence that redis-cli --cluster reshard uses, while clients keep
// working (they follow ASK and MOVED redirections).
func (c *Cluster) MigrateSlot(t testing.TB, slot int, dst int) {
	t.Helper()
	ctx := context.Background()
	ids := make([]string, len(c.Nodes))
	clients := make([]*redis.Client, len(c.Nodes))
	for i, s := range c.Nodes {
		clients[i] = redis.NewClient(&redis.Options{Addr: s.Addr})
		defer clients[i].Close()
		id, err := clients[i].Do(ctx, "CLUSTER", "MYID").Text()
		if err != nil {
			t.Fatalf("cluster myid %s: %v", s.Addr, err)
		}
		ids[i] = id
	}
	src := -1
	slots, err := clients[0].ClusterSlots(ctx).Result()
	if err != nil {
		t.Fatalf("cluster slots: %v", err)
	}
	for _, r := range slots {
		if int(r.Start) <= slot && slot <= int(r.End) {
			for i, id := range ids {
				if r.Nodes[0].ID == id {
					src = i
				}
			}
		}
	}
	if src < 0 {
		t.Fatalf("slot %d has no owner", slot)
	}
	if src == dst {
		return
	}
	must := func(err error, what string) {
		if err != nil {
			t.Fatalf("migrate slot %d %s: %v", slot, what, err)
		}
	}
	must(clients[dst].Do(ctx, "CLUSTER", "SETSLOT", slot, "IMPORTING", ids[src]).Err(), "importing")
	must(clients[src].Do(ctx, "CLUSTER", "SETSLOT", slot, "MIGRATING", ids[dst]).Err(), "migrating")
	host, port, _ := net.SplitHostPort(c.Nodes[dst].Addr)
	for round := 0; round < 100000; round++ {
		keys, err := clients[src].ClusterGetKeysInSlot(ctx, slot, 100).Result()
		must(err, "getkeysinslot")
		if len(keys) == 0 {
			break
		}
		args := []any{"MIGRATE", host, port, "", 0, 5000, "KEYS"}
		for _, k := range keys {
			args = append(args, k)
		}
		must(clients[src].Do(ctx, args...).Err(), "migrate")
	}
	for i := range clients {
		must(clients[i].Do(ctx, "CLUSTER", "SETSLOT", slot, "NODE", ids[dst]).Err(), "node")
	}
}

// ProcStat returns utime+stime of pid in clock ticks, from /proc/<pid>/stat.
func ProcStat(pid int) (ticks int64, err error) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	defer f.Close()
	line, err := bufio.NewReader(f).ReadString('\n')
	if err != nil && line == "" {
		return 0, err
	}
	// The command name (field 2) may contain spaces; fields after ')'.
	i := strings.LastIndexByte(line, ')')
	fields := strings.Fields(line[i+1:])
	// fields[0] is state (field 3): utime is field 14, stime field 15.
	u, err1 := strconv.ParseInt(fields[11], 10, 64)
	s, err2 := strconv.ParseInt(fields[12], 10, 64)
	if err1 != nil || err2 != nil {
		return 0, fmt.Errorf("parse /proc/%d/stat", pid)
	}
	return u + s, nil
}

// RoundTrips is a go-redis hook counting a client's round trips to the
// server: single commands and pipelines (add it with client.AddHook).
type RoundTrips struct{ singles, pipelines atomic.Int64 }

// Singles is the number of single commands sent.
func (r *RoundTrips) Singles() int64 { return r.singles.Load() }

// Pipelines is the number of pipelines sent.
func (r *RoundTrips) Pipelines() int64 { return r.pipelines.Load() }

// Total is Singles + Pipelines.
func (r *RoundTrips) Total() int64 { return r.singles.Load() + r.pipelines.Load() }

// DialHook leaves dialing alone.
func (r *RoundTrips) DialHook(next redis.DialHook) redis.DialHook { return next }

// ProcessHook counts a single command.
func (r *RoundTrips) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		r.singles.Add(1)
		return next(ctx, cmd)
	}
}

// ProcessPipelineHook counts a pipeline.
func (r *RoundTrips) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		r.pipelines.Add(1)
		return next(ctx, cmds)
	}
}
