package adapter_test

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/fleetgate/fleetgate/gateway"
	"github.com/fleetgate/fleetgate/gateway/gatewaytest"
	"github.com/fleetgate/fleetgate/protocols/adapter"
)

func TestEvidenceReachesObserver(t *testing.T) {
	e := newHost(t, nil)
	addr := freeUDP(t)
	if err := e.host.Apply(ctx(t), []adapter.Spec{udpSpec("legacy", addr)}); err != nil {
		t.Fatal(err)
	}
	st := e.status(t, "legacy")
	if st.State != adapter.StateRunning || !alive(st.PID) || st.Implementation != "udpline" {
		t.Fatalf("status = %+v, want running with a live pid", st)
	}
	sendLine(t, addr, "hb dev-1 radio1\nhb dev-2\nbye dev-2\n")
	waitFor(t, 5*time.Second, "evidence", func() bool { return len(e.rec.Evidence()) == 3 })
	evs := e.rec.Evidence()
	want := []struct {
		dev  gateway.DeviceID
		sess gateway.SessionID
		kind gateway.Kind
	}{{"dev-1", "legacy/radio1", gateway.Renew}, {"dev-2", "legacy/default", gateway.Renew}, {"dev-2", "legacy/default", gateway.Leave}}
	for i, w := range want {
		ev := evs[i]
		if ev.Device != w.dev || ev.Session != w.sess || ev.Kind != w.kind || ev.Protocol != "legacy" {
			t.Errorf("evidence %d = %+v, want %+v", i, ev, w)
		}
		if age := e.clock.Now().Sub(ev.ObservedAt); age < 0 || age > time.Second {
			t.Errorf("evidence %d observed %s before now", i, age)
		}
	}
	if !strings.Contains(e.logs.String(), "listening") || !strings.Contains(e.logs.String(), "adapter=legacy") {
		t.Errorf("the adapter's own log line did not reach the gateway's log under its name:\n%s", e.logs.String())
	}
}

func TestInvalidIDsRejectedStreamStaysUp(t *testing.T) {
	e := newHost(t, nil)
	addr := freeUDP(t)
	if err := e.host.Apply(ctx(t), []adapter.Spec{udpSpec("legacy", addr)}); err != nil {
		t.Fatal(err)
	}
	pid := e.status(t, "legacy").PID
	sendLine(t, addr, "hb bad/device\nhb ok-1 bad|instance\nhb "+strings.Repeat("x", 129)+"\nhb ok-2\n")
	waitFor(t, 5*time.Second, "ok-2", func() bool { return e.count("ok-2", gateway.Renew) == 1 })
	st := e.status(t, "legacy")
	if st.Rejected != 3 || st.Accepted != 1 || st.PID != pid || st.Restarts != 0 || st.State != adapter.StateRunning {
		t.Fatalf("status = %+v, want 3 rejected, 1 accepted, same pid %d, no restart", st, pid)
	}
}

func TestLimitsDropAndCount(t *testing.T) {
	e := newHost(t, nil)
	addr := freeUDP(t)
	spec := udpSpec("legacy", addr)
	spec.MaxSessions = 2
	if err := e.host.Apply(ctx(t), []adapter.Spec{spec}); err != nil {
		t.Fatal(err)
	}
	sendLine(t, addr, "hb a\nhb b\nhb c\nhb a\nbye b\nhb d\n")
	waitFor(t, 5*time.Second, "six items", func() bool {
		st := e.status(t, "legacy")
		return st.Accepted+st.Dropped == 6
	})
	st := e.status(t, "legacy")
	if st.Dropped != 1 || e.count("c", gateway.Renew) != 0 || e.count("d", gateway.Renew) != 1 || st.Sessions != 2 {
		t.Fatalf("status = %+v, evidence %v; want c dropped (third session), d admitted after b left", st, e.rec.Evidence())
	}

	// evidence_per_second: a burst of the rate passes, the rest is dropped.
	e2 := newHost(t, nil)
	addr2 := freeUDP(t)
	spec2 := udpSpec("rated", addr2)
	spec2.EvidencePerSecond = 5
	if err := e2.host.Apply(ctx(t), []adapter.Spec{spec2}); err != nil {
		t.Fatal(err)
	}
	e2.renewMany(t, "rated", addr2, 20)
	if st := e2.status(t, "rated"); st.Accepted != 5 || st.Dropped != 15 {
		t.Fatalf("status = %+v, want 5 accepted and 15 dropped (the clock does not move)", st)
	}
}

func TestHandshakeTimeoutIsClear(t *testing.T) {
	e := newHost(t, nil)
	dir := t.TempDir()
	pidFile := filepath.Join(dir, "pid")
	path := script(t, "echo $$ > "+pidFile+"\nexec sleep 30")
	err := e.host.Apply(ctx(t), []adapter.Spec{{Name: "mute", Path: path, StartTimeout: 500 * time.Millisecond}})
	if err == nil || !strings.Contains(err.Error(), "did not complete the plugin handshake within start_timeout 500ms") {
		t.Fatalf("err = %v, want a handshake timeout naming start_timeout", err)
	}
	st := e.status(t, "mute")
	if st.State != adapter.StateBackoff || !strings.Contains(st.LastError, path) {
		t.Fatalf("status = %+v, want backoff with the error", st)
	}
	b, _ := os.ReadFile(pidFile)
	pid, _ := strconv.Atoi(strings.TrimSpace(string(b)))
	waitFor(t, 5*time.Second, "the mute adapter killed", func() bool { return !alive(pid) })
}

func TestStdoutBeforeHandshakeInPlainWords(t *testing.T) {
	e := newHost(t, nil)
	path := script(t, "echo 'hello from main'\nexec sleep 30")
	err := e.host.Apply(ctx(t), []adapter.Spec{{Name: "chatty", Path: path, StartTimeout: 5 * time.Second}})
	if err == nil || !strings.Contains(err.Error(), `printed "hello from main" on stdout before the plugin handshake`) {
		t.Fatalf("err = %v, want the stdout line reported", err)
	}
}

func TestChecksumMismatchRefused(t *testing.T) {
	e := newHost(t, nil)
	b, err := os.ReadFile(udpline)
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(b)
	good := hex.EncodeToString(sum[:])
	bad := strings.Repeat("0", 64)
	spec := udpSpec("legacy", freeUDP(t))
	spec.SHA256 = bad
	err = e.host.Apply(ctx(t), []adapter.Spec{spec})
	if err == nil || !strings.Contains(err.Error(), udpline) || !strings.Contains(err.Error(), good) || !strings.Contains(err.Error(), bad) {
		t.Fatalf("err = %v, want the file and both sums", err)
	}
	if st := e.status(t, "legacy"); st.PID != 0 || st.State != adapter.StateBackoff {
		t.Fatalf("status = %+v, want not started", st)
	}
	spec.SHA256 = strings.ToUpper(good)
	if err := e.host.Apply(ctx(t), []adapter.Spec{spec}); err != nil {
		t.Fatalf("with the right sum: %v", err)
	}
}

// TestKill9RestartsKeepsSessions kills the adapter: it comes back after
// the backoff (the fake clock is advanced), no session is ended, and the
// same sessions are renewed through the new process.
func TestKill9RestartsKeepsSessions(t *testing.T) {
	e := newHost(t, func(o *adapter.Options) { o.HealthInterval = time.Hour })
	addr := freeUDP(t)
	if err := e.host.Apply(ctx(t), []adapter.Spec{udpSpec("legacy", addr)}); err != nil {
		t.Fatal(err)
	}
	sendLine(t, addr, "hb dev-1\n")
	waitFor(t, 5*time.Second, "first heartbeat", func() bool { return e.count("dev-1", gateway.Renew) == 1 })
	old := e.status(t, "legacy").PID
	if err := syscall.Kill(old, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 5*time.Second, "backoff", func() bool { return e.status(t, "legacy").State == adapter.StateBackoff })
	if st := e.status(t, "legacy"); st.Restarts != 1 || st.LastError == "" {
		t.Fatalf("status = %+v, want one restart with the crash as last error", st)
	}
	waitFor(t, 5*time.Second, "the backoff timer", func() bool { return e.clock.Timers() == 1 })
	e.clock.Advance(adapter.DefaultBackoff.Min)
	waitFor(t, 10*time.Second, "running again", func() bool {
		st := e.status(t, "legacy")
		return st.State == adapter.StateRunning && st.PID != old
	})
	if alive(old) {
		t.Fatalf("the killed process %d is still there", old)
	}
	waitFor(t, 5*time.Second, "heartbeats through the new process", func() bool {
		sendLine(t, addr, "hb dev-1\n")
		return e.count("dev-1", gateway.Renew) >= 2
	})
	if n := e.count("dev-1", gateway.Leave); n != 0 {
		t.Fatalf("%d leaves for dev-1: a crash must end no session", n)
	}
}

// TestHealthPingFailureRestarts stops the adapter with SIGSTOP: its
// health ping times out and it is restarted.
func TestHealthPingFailureRestarts(t *testing.T) {
	e := newHost(t, func(o *adapter.Options) {
		o.HealthInterval = time.Second
		o.HealthTimeout = 200 * time.Millisecond
	})
	if err := e.host.Apply(ctx(t), []adapter.Spec{udpSpec("legacy", freeUDP(t))}); err != nil {
		t.Fatal(err)
	}
	pid := e.status(t, "legacy").PID
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	// Each advance fires the next ping once the supervisor waits for it.
	waitFor(t, 15*time.Second, "backoff after a failed ping", func() bool {
		if e.clock.Timers() == 1 && e.status(t, "legacy").State == adapter.StateRunning {
			e.clock.Advance(time.Second)
		}
		return e.status(t, "legacy").State == adapter.StateBackoff
	})
	if st := e.status(t, "legacy"); !strings.Contains(st.LastError, "health ping") {
		t.Fatalf("status = %+v, want a health ping error", st)
	}
	waitFor(t, 5*time.Second, "the stopped process killed", func() bool { return !alive(pid) })
}

func TestApplyAddsRemovesRestartsChanged(t *testing.T) {
	e := newHost(t, nil)
	a, b, c := freeUDP(t), freeUDP(t), freeUDP(t)
	if err := e.host.Apply(ctx(t), []adapter.Spec{udpSpec("a", a), udpSpec("b", b)}); err != nil {
		t.Fatal(err)
	}
	pidA, pidB := e.status(t, "a").PID, e.status(t, "b").PID
	changedB := udpSpec("b", b)
	changedB.MaxSessions = 10
	if err := e.host.Apply(ctx(t), []adapter.Spec{udpSpec("a", a), changedB, udpSpec("c", c)}); err != nil {
		t.Fatal(err)
	}
	if st := e.status(t, "a"); st.PID != pidA {
		t.Errorf("a restarted (pid %d → %d), want untouched", pidA, st.PID)
	}
	if st := e.status(t, "b"); st.PID == pidB || st.State != adapter.StateRunning || alive(pidB) {
		t.Errorf("b = %+v (old pid %d), want restarted", st, pidB)
	}
	if st := e.status(t, "c"); st.State != adapter.StateRunning {
		t.Errorf("c = %+v, want started", st)
	}
	pidC := e.status(t, "c").PID
	if err := e.host.Apply(ctx(t), []adapter.Spec{udpSpec("a", a)}); err != nil {
		t.Fatal(err)
	}
	if got := len(e.host.Status()); got != 1 {
		t.Fatalf("%d adapters after removing b and c, want 1", got)
	}
	waitFor(t, 5*time.Second, "b and c gone", func() bool { return !alive(pidC) && !alive(e.status(t, "b").PID) })
}

const hostHelperEnv = "ADAPTER_TEST_HOST_HELPER"

// hostHelper is a gateway stand-in run in a child process: it starts the
// adapter named by the environment and blocks.
func hostHelper() {
	h, err := adapter.New(&gatewaytest.Recorder{}, adapter.Options{Lease: time.Minute, Logger: slog.New(slog.NewTextHandler(os.Stderr, nil))})
	if err != nil {
		panic(err)
	}
	_ = h.Apply(context.Background(), []adapter.Spec{{Name: "x", Path: os.Getenv(hostHelperEnv), StartTimeout: time.Minute}})
	select {}
}

// TestKill9OfHostLeavesNoAdapter kills (-9) a host process while its
// adapter is starting; the adapter is a shell script that execs sleep, so
// nothing but the parent-death signal can end it.
func TestKill9OfHostLeavesNoAdapter(t *testing.T) {
	dir := t.TempDir()
	pidFile := filepath.Join(dir, "pid")
	path := script(t, "echo $$ > "+pidFile+"\nexec sleep 60")
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), hostHelperEnv+"="+path)
	stderr, _ := cmd.StderrPipe()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			t.Log("host:", sc.Text())
		}
	}()
	var pid int
	waitFor(t, 10*time.Second, "the adapter's pid", func() bool {
		b, _ := os.ReadFile(pidFile)
		pid, _ = strconv.Atoi(strings.TrimSpace(string(b)))
		return pid > 0
	})
	// Leave the host time to park its goroutines: the forking thread must
	// stay alive on its own, not by luck.
	waitFor(t, 5*time.Second, "sleep exec'd", func() bool {
		b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid))
		return strings.TrimSpace(string(b)) == "sleep"
	})
	if !alive(pid) {
		t.Fatal("adapter not running")
	}
	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()
	waitFor(t, 5*time.Second, "the adapter gone with its host", func() bool { return !alive(pid) })
}

// Unread follows the made time of the last frame the host read from an
// adapter that ticks: it keeps up while the adapter runs idle (empty
// frames, not counted as evidence frames), stops while the adapter is
// stopped (SIGSTOP: what it observed meanwhile would be in its stream),
// catches up after, and is zero for a host that asks for no ticks and
// once the adapter is gone.
func TestUnreadFollowsTheTicks(t *testing.T) {
	e := newHost(t, func(o *adapter.Options) { o.Clock, o.Tick = gateway.SystemClock{}, 50*time.Millisecond })
	if got := e.host.Unread(); !got.IsZero() {
		t.Fatalf("Unread with no adapter = %v, want zero", got)
	}
	addr := freeUDP(t)
	if err := e.host.Apply(ctx(t), []adapter.Spec{udpSpec("legacy", addr)}); err != nil {
		t.Fatal(err)
	}
	keepsUp := func() bool { u := e.host.Unread(); return !u.IsZero() && time.Since(u) < 300*time.Millisecond }
	waitFor(t, 5*time.Second, "Unread within 300 ms of now", keepsUp)
	st := e.status(t, "legacy")
	if st.Frames != 1 {
		t.Errorf("evidence frames of an idle adapter = %d, want 1 (the ready frame; ticks are not counted)", st.Frames)
	}
	if err := syscall.Kill(st.PID, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	stopped := time.Now()
	time.Sleep(600 * time.Millisecond)
	if u := e.host.Unread(); u.After(stopped) {
		t.Errorf("Unread %v after the adapter stopped at %v", u, stopped)
	}
	if err := syscall.Kill(st.PID, syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 5*time.Second, "Unread within 300 ms of now after SIGCONT", keepsUp)
	if err := e.host.Apply(ctx(t), nil); err != nil {
		t.Fatal(err)
	}
	if got := e.host.Unread(); !got.IsZero() {
		t.Errorf("Unread once the adapter is gone = %v, want zero", got)
	}

	quiet := newHost(t, func(o *adapter.Options) { o.Clock = gateway.SystemClock{} })
	addr = freeUDP(t)
	if err := quiet.host.Apply(ctx(t), []adapter.Spec{udpSpec("legacy", addr)}); err != nil {
		t.Fatal(err)
	}
	sendLine(t, addr, "hb dev-1\n")
	waitFor(t, 5*time.Second, "evidence", func() bool { return len(quiet.rec.Evidence()) == 1 })
	if got := quiet.host.Unread(); !got.IsZero() {
		t.Errorf("Unread of a host that asks for no ticks = %v, want zero", got)
	}
}
