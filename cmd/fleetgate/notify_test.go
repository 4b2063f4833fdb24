package main

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/fleetgate/fleetgate/internal/statefile"

	bolt "go.etcd.io/bbolt"

	"github.com/fleetgate/fleetgate/gateway"
	"github.com/fleetgate/fleetgate/store/embedded"
	"github.com/fleetgate/fleetgate/uplink"
)

// notifySocket is a service manager's end of NOTIFY_SOCKET: a unixgram
// socket that collects every datagram sent to it.
type notifySocket struct {
	path string
	conn *net.UnixConn
	mu   sync.Mutex
	msgs []string
}

func newNotifySocket(t *testing.T) *notifySocket {
	t.Helper()
	// A short directory: socket paths are limited to 107 bytes.
	dir, err := os.MkdirTemp("", "fgnotify")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	s := &notifySocket{path: filepath.Join(dir, "notify.sock")}
	s.conn, err = net.ListenUnixgram("unixgram", &net.UnixAddr{Name: s.path, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.conn.Close() })
	go func() {
		buf := make([]byte, 4096)
		for {
			n, err := s.conn.Read(buf)
			if err != nil {
				return
			}
			s.mu.Lock()
			s.msgs = append(s.msgs, string(buf[:n]))
			s.mu.Unlock()
		}
	}()
	return s
}

// all returns the datagrams received so far.
func (s *notifySocket) all() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.msgs...)
}

// find returns the index of the first datagram at or after from that has
// a line equal to line (or starting with it, when line ends in "=" or
// " "); -1 when there is none.
func (s *notifySocket) find(from int, line string) int {
	msgs := s.all()
	for i := from; i < len(msgs); i++ {
		for _, l := range strings.Split(msgs[i], "\n") {
			prefix := strings.HasSuffix(line, "=") || strings.HasSuffix(line, " ")
			if l == line || (prefix && strings.HasPrefix(l, line)) {
				return i
			}
		}
	}
	return -1
}

// await waits (bounded) for a datagram with line at or after from and
// returns its index.
func (s *notifySocket) await(t *testing.T, from int, line string, limit time.Duration) int {
	t.Helper()
	i := -1
	waitFor(t, limit, line+" on NOTIFY_SOCKET", func() bool { i = s.find(from, line); return i >= 0 })
	return i
}

// The real binary under a service manager: READY=1 once it serves,
// WATCHDOG=1 with a STATUS= line at half WATCHDOG_USEC, RELOADING=1 with
// MONOTONIC_USEC then READY=1 around SIGHUP (a refused reload named in
// STATUS=), STOPPING=1 at SIGTERM.
func TestSystemdNotifyProtocol(t *testing.T) {
	t.Parallel()
	sock := newNotifySocket(t)
	g := newGateway(t, "gw-notify", "", fastTiming)
	g.env = []string{"NOTIFY_SOCKET=" + sock.path, "WATCHDOG_USEC=2000000"}
	g.start()

	ready := sock.await(t, 0, "READY=1", 10*time.Second)
	if sock.find(0, "STOPPING=1") >= 0 {
		t.Fatal("STOPPING=1 before any stop")
	}
	w := sock.await(t, ready, "WATCHDOG=1", 10*time.Second)
	if !strings.Contains(sock.all()[w], "STATUS=0 devices online, 0 suspect; 0 sessions; uplink up; outbox 0 sessions") {
		t.Fatalf("keep-alive without a readable status: %q", sock.all()[w])
	}
	sock.await(t, w+1, "WATCHDOG=1", 10*time.Second) // it keeps pinging

	g.signal(syscall.SIGHUP)
	r := sock.await(t, ready+1, "RELOADING=1", 10*time.Second)
	if !strings.Contains(sock.all()[r], "MONOTONIC_USEC=") {
		t.Fatalf("RELOADING=1 without MONOTONIC_USEC: %q", sock.all()[r])
	}
	ok := sock.await(t, r+1, "READY=1", 10*time.Second)

	// A refused reload stays in STATUS= (systemctl status) until a
	// reload that is not refused.
	good, err := os.ReadFile(g.config)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(g.config, append(good, "presence: { leese: 1s }\n"...), 0o600); err != nil {
		t.Fatal(err)
	}
	g.signal(syscall.SIGHUP)
	r = sock.await(t, ok+1, "RELOADING=1", 10*time.Second)
	ok = sock.await(t, r+1, "READY=1", 10*time.Second)
	if m := sock.all()[ok]; !strings.Contains(m, "; LAST RELOAD REFUSED at ") || !strings.Contains(m, g.config+":") {
		t.Fatalf("STATUS= after a refused reload: %q", m)
	}
	if err := os.WriteFile(g.config, good, 0o600); err != nil {
		t.Fatal(err)
	}
	g.signal(syscall.SIGHUP)
	r = sock.await(t, ok+1, "RELOADING=1", 10*time.Second)
	ok = sock.await(t, r+1, "READY=1", 10*time.Second)
	if m := sock.all()[ok]; strings.Contains(m, "REFUSED") {
		t.Fatalf("STATUS= after a good reload: %q", m)
	}

	g.stop()
	sock.await(t, ok+1, "STOPPING=1", 5*time.Second)
}

// A gateway whose batcher cannot make progress stops its keep-alives, so
// that systemd restarts it; they resume when the batcher does. The stall
// is real: the test holds the state file's bbolt write transaction, which
// every flush into the embedded store needs.
func TestWatchdogStopsWhileFlushStalls(t *testing.T) {
	sock := newNotifySocket(t)
	t.Setenv("NOTIFY_SOCKET", sock.path)
	log := slog.New(slog.DiscardHandler)

	db, err := statefile.Open(filepath.Join(t.TempDir(), stateFile), log, stateMigrations)
	if err != nil {
		t.Fatal(err)
	}
	defer statefile.Close(db)
	store, err := embedded.Open(db, embedded.Options{Shards: 4})
	if err != nil {
		t.Fatal(err)
	}
	ob, err := uplink.OpenOutbox(db, uplink.OutboxOptions{Shards: 4})
	if err != nil {
		t.Fatal(err)
	}
	g := &gatewayProcess{
		up: uplink.New(store, ob, uplink.Options{Gateway: "gw-stall", Epoch: 1, FlushInterval: 20 * time.Millisecond}),
	}
	w := &watchdog{every: 100 * time.Millisecond, limit: time.Second, stalled: g.stalled,
		status: func() string { return "test" }, log: log}

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 2)
	go func() { done <- g.up.Run(ctx) }()
	go func() { done <- w.run(ctx) }()
	defer func() {
		cancel()
		for range 2 {
			if err := <-done; err != nil && !errors.Is(err, context.Canceled) {
				t.Error(err)
			}
		}
	}()
	ev := func(dev string) gateway.Evidence {
		return gateway.Evidence{Device: gateway.DeviceID(dev), Session: "coap/default", Kind: gateway.Renew, ObservedAt: time.Now()}
	}
	if err := g.up.Enqueue(ctx, ev("d1")); err != nil {
		t.Fatal(err)
	}
	first := sock.await(t, 0, "WATCHDOG=1", 5*time.Second)

	tx, err := db.Begin(true) // the state file's write lock, held
	if err != nil {
		t.Fatal(err)
	}
	held := len(sock.all())
	release := sync.OnceValue(tx.Rollback)
	defer release() // before the loops are stopped: their final flush needs the lock
	if err := g.up.Enqueue(ctx, ev("d2")); err != nil {
		t.Fatal(err)
	}
	stalled := sock.await(t, max(first, held), "STATUS=STALLED: ", 10*time.Second)
	// From the stall on, no keep-alive: watch a window of 8 ping periods.
	mark := len(sock.all())
	deadline := time.Now().Add(8 * w.every)
	for time.Now().Before(deadline) {
		if i := sock.find(stalled, "WATCHDOG=1"); i >= 0 {
			t.Fatalf("WATCHDOG=1 sent while the flush loop was stalled: %q", sock.all()[stalled:])
		}
		time.Sleep(10 * time.Millisecond)
	}
	if !strings.Contains(sock.all()[stalled], "uplink batcher loop stuck") {
		t.Errorf("stall status names no loop: %q", sock.all()[stalled])
	}
	if err := release(); err != nil {
		t.Fatal(err)
	}
	sock.await(t, mark, "WATCHDOG=1", 5*time.Second)
}

// `fleetgate run` with an invalid configuration exits 78 (EX_CONFIG),
// which the unit lists in RestartPreventExitStatus=.
func TestRunBadConfigExitsConfig(t *testing.T) {
	bad := filepath.Join(t.TempDir(), "bad.yaml")
	if err := os.WriteFile(bad, []byte("presence:\n  leese: 90s\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{{"run", "-c", bad}, {"check-config", "-c", bad}, {"run", "-c", "/nonexistent.yaml"}} {
		out, err := exec.Command(binary, args...).CombinedOutput()
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.ExitCode() != exitConfig {
			t.Errorf("fleetgate %v: %v, want exit %d\n%s", args, err, exitConfig, out)
		}
	}
}

// `fleetgate run` on a state file of a newer release (a downgrade) exits
// 65, also in RestartPreventExitStatus=, and leaves the file as it was.
func TestRunRefusesNewerStateFile(t *testing.T) {
	g := newGateway(t, "gw-downgrade", "", fastTiming)
	dir := filepath.Join(filepath.Dir(g.config), "state")
	if err := os.MkdirAll(dir, 0o750); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, stateFile)
	db, err := bolt.Open(path, 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	err = db.Update(func(tx *bolt.Tx) error {
		b, err := tx.CreateBucket([]byte("state.format"))
		if err != nil {
			return err
		}
		return b.Put([]byte("version"), []byte{0, 0, 0, 0, 0, 0, 0, byte(statefile.Version(stateMigrations)) + 1})
	})
	if cerr := db.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		t.Fatal(err)
	}
	before, _ := os.ReadFile(path)
	out, err := exec.Command(binary, "run", "-c", g.config).CombinedOutput()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != exitNewerState || !strings.Contains(string(out), "newer fleetgate release") {
		t.Fatalf("run on a newer state file: %v, want exit %d\n%s", err, exitNewerState, out)
	}
	if after, _ := os.ReadFile(path); !bytes.Equal(before, after) {
		t.Fatal("the refused state file changed")
	}
}
