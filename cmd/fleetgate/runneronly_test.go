package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/fleetgate/fleetgate/gateway"
	"github.com/fleetgate/fleetgate/internal/redistest"
	"github.com/fleetgate/fleetgate/store/redisstore"
)

// `fleetgate runner` alone reaps what gateways wrote, serves its metrics,
// and stops cleanly on SIGTERM.
func TestRunnerCommand(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	rc := srv.Client(t)
	cfg := newGateway(t, "gw-r", srv.Addr, fastTiming).config
	store, err := redisstore.Open(context.Background(), rc, redisstore.Options{Prefix: "fleetgate", Shards: 4})
	if err != nil {
		t.Fatal(err)
	}
	d := gateway.DeviceID("dev-r")
	b := gateway.Batch{Gateway: "gw-elsewhere", Epoch: 1, Lease: time.Second,
		Writes: []gateway.Write{{Device: d, Session: "coap/default", Kind: gateway.Connect}}}
	if _, err := store.Apply(context.Background(), gateway.ShardOf(d, 4), b); err != nil {
		t.Fatal(err)
	}

	metrics := fmt.Sprintf("127.0.0.1:%d", redistest.FreePort(t))
	r := startRunner(t, cfg, []string{"--metrics", metrics})

	waitFor(t, 15*time.Second, "offline event written by the runner process", func() bool {
		evs := eventsOf(events(t, rc, 4), string(d))
		return len(evs) == 2 && evs[1].reason == "expired"
	})
	waitFor(t, 10*time.Second, "runner metrics", func() bool {
		resp, err := http.Get("http://" + metrics + "/metrics")
		if err != nil {
			return false
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		return strings.Contains(string(body), "fleetgate_runner_reaped_total 1")
	})
	r.stop(os.Interrupt)
}

// runnerProc is one `fleetgate runner` child process.
type runnerProc struct {
	t    *testing.T
	cmd  *exec.Cmd
	done chan error
}

// startRunner starts `fleetgate runner -c cfg args...` with env added to
// its environment; the test's end kills it and, on failure, logs its
// output.
func startRunner(t *testing.T, cfg string, args []string, env ...string) *runnerProc {
	t.Helper()
	cmd := exec.Command(binary, append([]string{"runner", "-c", cfg}, args...)...)
	cmd.Env = append(os.Environ(), env...)
	out := &syncBuffer{}
	cmd.Stdout, cmd.Stderr = out, out
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	r := &runnerProc{t: t, cmd: cmd, done: make(chan error, 1)}
	go func() { r.done <- cmd.Wait() }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		checkLogKeys(t, "runner", out.String())
		if t.Failed() {
			t.Logf("runner log:\n%s", out)
		}
	})
	return r
}

// stop sends sig and expects a clean exit within 15 s.
func (r *runnerProc) stop(sig os.Signal) {
	r.t.Helper()
	if err := r.cmd.Process.Signal(sig); err != nil {
		r.t.Fatal(err)
	}
	select {
	case err := <-r.done:
		if err != nil {
			r.t.Fatalf("runner exited with %v after %v", err, sig)
		}
	case <-time.After(15 * time.Second):
		r.t.Fatalf("runner did not stop within 15s of %v", sig)
	}
}

// `fleetgate runner` under a service manager: READY=1 with a STATUS= line
// once it runs, WATCHDOG=1 at half WATCHDOG_USEC while its cycles end,
// none while a cycle is stuck (the store stopped with SIGSTOP: every
// call waits for its timeout), again once the store answers, and
// STOPPING=1 at SIGTERM.
func TestRunnerSystemdNotify(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	cfg := newGateway(t, "gw-rn", srv.Addr, fastTiming).config
	sock := newNotifySocket(t)
	r := startRunner(t, cfg, nil, "NOTIFY_SOCKET="+sock.path, "WATCHDOG_USEC=1000000")

	ready := sock.await(t, 0, "READY=1", 15*time.Second)
	if !strings.Contains(sock.all()[ready], "STATUS=runner: ") {
		t.Fatalf("READY=1 without a readable status: %q", sock.all()[ready])
	}
	waitFor(t, 10*time.Second, "a keep-alive once the runner holds its shards", func() bool {
		for _, m := range sock.all()[ready:] {
			if strings.HasPrefix(m, "WATCHDOG=1\n") && strings.Contains(m, "STATUS=runner: 4 of 4 shards held") {
				return true
			}
		}
		return false
	})

	srv.Signal(syscall.SIGSTOP)
	t.Cleanup(func() { srv.Signal(syscall.SIGCONT) })
	mark := len(sock.all())
	stalled := sock.await(t, mark, "STATUS=STALLED: ", 10*time.Second)
	if !strings.Contains(sock.all()[stalled], "runner stuck in one cycle") {
		t.Errorf("stall status names no loop: %q", sock.all()[stalled])
	}
	// A stuck call lasts at least 2 s, the cycle one per shard: watch 4 s,
	// eight ping periods.
	deadline := time.Now().Add(4 * time.Second)
	for time.Now().Before(deadline) {
		if i := sock.find(stalled, "WATCHDOG=1"); i >= 0 {
			t.Fatalf("WATCHDOG=1 sent while the runner was stuck: %q", sock.all()[stalled:])
		}
		time.Sleep(10 * time.Millisecond)
	}
	srv.Signal(syscall.SIGCONT)
	sock.await(t, len(sock.all()), "WATCHDOG=1", 20*time.Second)
	if sock.find(0, "STOPPING=1") >= 0 {
		t.Fatal("STOPPING=1 before any stop")
	}
	r.stop(syscall.SIGTERM)
	sock.await(t, stalled, "STOPPING=1", time.Second)
}

// `fleetgate runner --metrics` serves the admin API over the whole store
// with the protection of listen.admin: its token (the probes excepted),
// the Host check of a loopback listener, and the refusal of an address
// beyond loopback without a token.
func TestRunnerListenerProtected(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	cfg := newGateway(t, "gw-rp", srv.Addr, fastTiming).config
	const token = "0123456789abcdef-runner-token"
	tokenFile := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(tokenFile, []byte(token+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	metrics := fmt.Sprintf("127.0.0.1:%d", redistest.FreePort(t))
	r := startRunner(t, cfg, []string{"--metrics", metrics}, "FLEETGATE_LISTEN_ADMIN_TOKEN_FILE="+tokenFile)
	get := func(path, auth, host string) int {
		t.Helper()
		req, _ := http.NewRequest(http.MethodGet, "http://"+metrics+path, nil)
		if auth != "" {
			req.Header.Set("Authorization", "Bearer "+auth)
		}
		if host != "" {
			req.Host = host
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return 0
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	waitFor(t, 15*time.Second, "the runner's listener", func() bool { return get("/healthz", "", "") == http.StatusOK })
	for _, path := range []string{"/metrics", "/v1/status", "/v1/devices", "/v1/events", "/v1/snapshot", "/v1/watch"} {
		if code := get(path, "", ""); code != http.StatusUnauthorized {
			t.Errorf("%s without the token: %d, want 401", path, code)
		}
		if code := get(path, "wrong-token-0123456789", ""); code != http.StatusUnauthorized {
			t.Errorf("%s with a wrong token: %d, want 401", path, code)
		}
	}
	for _, path := range []string{"/metrics", "/v1/status", "/v1/devices", "/v1/snapshot"} {
		if code := get(path, token, ""); code != http.StatusOK {
			t.Errorf("%s with the token: %d, want 200", path, code)
		}
	}
	if code := get("/v1/devices", token, "rebind.example"); code != http.StatusMisdirectedRequest {
		t.Errorf("Host rebind.example: %d, want 421", code)
	}
	if code, out, errs := runCLI(t, "status", "-c", cfg, "--addr", metrics, "--token-file", tokenFile, "--json"); code != 0 || !strings.Contains(out, `"runner"`) {
		t.Errorf("fleetgate status against the runner: exit %d\n%s%s", code, out, errs)
	}
	r.stop(os.Interrupt)

	// beyond loopback without a token: refused before anything starts
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, binary, "runner", "-c", cfg, "--metrics", "192.0.2.1:9181").CombinedOutput()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != exitConfig ||
		!strings.Contains(string(out), `runner --metrics: "192.0.2.1:9181" is reachable beyond this host and the admin API would have no authentication`) {
		t.Fatalf("runner --metrics beyond loopback without a token: %v\n%s", err, out)
	}
}
