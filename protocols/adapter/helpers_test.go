package adapter_test

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/fleetgate/fleetgate/gateway"
	"github.com/fleetgate/fleetgate/gateway/clocktest"
	"github.com/fleetgate/fleetgate/gateway/gatewaytest"
	"github.com/fleetgate/fleetgate/internal/buildtest"
	"github.com/fleetgate/fleetgate/protocols/adapter"
)

// udpline and lorawan are shipped adapters, built once by TestMain.
var udpline, lorawan string

func TestMain(m *testing.M) {
	if os.Getenv(hostHelperEnv) != "" {
		hostHelper()
		return
	}
	// The host refuses group-writable executables and directories: build
	// and write them without group write whatever the caller's umask.
	syscall.Umask(0o022)
	buildtest.Main(m, map[string]*string{
		"github.com/fleetgate/fleetgate/plugins/udpline": &udpline,
		"github.com/fleetgate/fleetgate/plugins/lorawan": &lorawan,
	})
}

// syncBuf is a log destination tests read.
type syncBuf struct {
	mu sync.Mutex
	b  strings.Builder
}

func (s *syncBuf) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuf) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

type env struct {
	host  *adapter.Host
	rec   *gatewaytest.Recorder
	clock *clocktest.Clock
	logs  *syncBuf
}

// newHost returns a host with a fake clock (backoff and health pings move
// only when the test advances it) feeding a recorder.
func newHost(t *testing.T, mod func(*adapter.Options)) *env {
	t.Helper()
	e := &env{rec: &gatewaytest.Recorder{}, clock: clocktest.New(time.Unix(1_000_000, 0)), logs: &syncBuf{}}
	o := adapter.Options{
		Lease: time.Minute, Clock: e.clock,
		Logger: slog.New(slog.NewTextHandler(e.logs, &slog.HandlerOptions{Level: slog.LevelDebug})),
		Jitter: func() float64 { return 0 },
	}
	if mod != nil {
		mod(&o)
	}
	h, err := adapter.New(e.rec, o)
	if err != nil {
		t.Fatal(err)
	}
	e.host = h
	t.Cleanup(func() {
		h.Close()
		if t.Failed() {
			t.Logf("host log:\n%s", e.logs.String())
		}
	})
	return e
}

func freeUDP(t testing.TB) string {
	t.Helper()
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer pc.Close()
	return pc.LocalAddr().String()
}

// udpSpec runs udpline on addr, speaking for every device.
func udpSpec(name, addr string) adapter.Spec {
	return adapter.Spec{Name: name, Path: udpline, StartTimeout: 10 * time.Second, Devices: []string{"*"},
		Config: []byte(fmt.Sprintf(`{"listen": %q}`, addr))}
}

func sendLine(t testing.TB, addr, text string) {
	t.Helper()
	c, err := net.Dial("udp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.Write([]byte(text)); err != nil {
		t.Fatal(err)
	}
}

// renewMany sends "hb r-<i>" for i < n in one datagram to the udpline
// adapter name at addr and waits until it has accepted or dropped them
// all.
func (e *env) renewMany(t *testing.T, name, addr string, n int) {
	t.Helper()
	var b strings.Builder
	for i := range n {
		fmt.Fprintf(&b, "hb r-%d\n", i)
	}
	sendLine(t, addr, b.String())
	waitFor(t, 5*time.Second, fmt.Sprintf("%d items", n), func() bool {
		st := e.status(t, name)
		return st.Accepted+st.Dropped == uint64(n)
	})
}

// waitFor polls cond every 10 ms for up to limit.
func waitFor(t testing.TB, limit time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(limit)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", limit, what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func (e *env) status(t testing.TB, name string) adapter.Status {
	t.Helper()
	for _, s := range e.host.Status() {
		if s.Name == name {
			return s
		}
	}
	return adapter.Status{}
}

// count is the evidence recorded for device.
func (e *env) count(dev string, k gateway.Kind) int {
	n := 0
	for _, ev := range e.rec.Evidence() {
		if string(ev.Device) == dev && ev.Kind == k {
			n++
		}
	}
	return n
}

// alive reports whether the process pid exists (and is not a zombie we
// could reap).
func alive(pid int) bool {
	if pid <= 0 {
		return false
	}
	if err := syscall.Kill(pid, 0); err != nil {
		return false
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	// state is the field after the parenthesised command name.
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	return i < 0 || i+2 >= len(s) || s[i+2] != 'Z'
}

func script(t *testing.T, body string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "adapter.sh")
	if err := os.WriteFile(p, []byte("#!/bin/sh\n"+body+"\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	return p
}

func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return c
}
