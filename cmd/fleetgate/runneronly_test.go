package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/fleetgate/fleetgate/gateway"
	"github.com/fleetgate/fleetgate/internal/redistest"
	redisstore "github.com/fleetgate/fleetgate/uplink/redis"
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
	cmd := exec.Command(binary, "runner", "-c", cfg, "--metrics", metrics)
	out := &syncBuffer{}
	cmd.Stdout, cmd.Stderr = out, out
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		if t.Failed() {
			t.Logf("runner log:\n%s", out)
		}
	})

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
	if err := cmd.Process.Signal(os.Interrupt); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("runner exited with %v after SIGINT", err)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("runner did not stop within 15s of SIGINT")
	}
}
