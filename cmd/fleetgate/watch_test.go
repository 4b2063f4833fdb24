package main

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/fleetgate/fleetgate/internal/redistest"
)

// runBackground runs `fleetgate args...` in the background until the returned
// stop is called; out collects its stdout.
func runBackground(t *testing.T, args ...string) (out *syncBuffer, stop func() int) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	out, errs := &syncBuffer{}, &syncBuffer{}
	done := make(chan int, 1)
	go func() { done <- dispatch(ctx, args, out, errs) }()
	var code *int
	stop = func() int {
		if code == nil {
			cancel()
			select {
			case c := <-done:
				code = &c
			case <-time.After(10 * time.Second):
				t.Fatalf("fleetgate %v did not end within 10s of its context", args)
			}
			if *code != 0 {
				t.Errorf("fleetgate %v: exit %d\n%s", args, *code, errs.String())
			}
		}
		return *code
	}
	t.Cleanup(func() { stop() })
	return out, stop
}

// fleetgate watch prints a snapshot, then the changes; with a cursor file
// it resumes after a restart of the gateway and of itself, and events
// tail --follow streams from the same API.
func TestWatchCommand(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	gw := newGateway(t, "gw-w", srv.Addr, fastTiming)
	gw.start()
	device{t: t, id: "dev-a"}.heartbeat(gw.coapAddr)
	waitFor(t, 10*time.Second, "dev-a online", func() bool {
		code, out, _ := runCLI(t, "devices", "get", "--addr", gw.admin, "--json", "dev-a")
		return code == 0 && strings.Contains(out, `"state": "online"`)
	})
	cursorFile := filepath.Join(t.TempDir(), "cursor")
	out, stop := runBackground(t, "watch", "--addr", gw.admin, "--json", "--cursor-file", cursorFile)
	waitFor(t, 10*time.Second, "dev-a in the snapshot", func() bool {
		return strings.Contains(out.String(), `"device":"dev-a","state":"online","ver":1`) && strings.Contains(out.String(), `"reason":"snapshot"`)
	})
	device{t: t, id: "dev-b"}.heartbeat(gw.coapAddr)
	waitFor(t, 10*time.Second, "dev-b's online event", func() bool {
		return strings.Contains(out.String(), `"device":"dev-b","state":"online","ver":1`)
	})
	stop()
	saved, err := os.ReadFile(cursorFile)
	if err != nil || !strings.HasPrefix(string(saved), "v1:") {
		t.Fatalf("cursor file: %q, %v", saved, err)
	}
	// the gateway restarts and dev-c connects while watch is not running
	gw.stop()
	gw.start()
	device{t: t, id: "dev-c"}.heartbeat(gw.coapAddr)
	out2, stop2 := runBackground(t, "watch", "--addr", gw.admin, "--json", "--cursor-file", cursorFile)
	waitFor(t, 10*time.Second, "dev-c's online event after the restarts", func() bool {
		return strings.Contains(out2.String(), `"device":"dev-c","state":"online","ver":1`)
	})
	stop2()
	if s := out2.String(); strings.Contains(s, `"reason":"snapshot"`) || strings.Contains(s, `"device":"dev-b"`) {
		t.Errorf("resumed watch printed the snapshot or dev-b again:\n%s", s)
	}
	// events tail --follow
	tail, stop3 := runBackground(t, "events", "tail", "--addr", gw.admin, "--json", "--since", "1m", "--follow")
	waitFor(t, 10*time.Second, "the past events", func() bool { return strings.Contains(tail.String(), `"device":"dev-c"`) })
	device{t: t, id: "dev-d"}.heartbeat(gw.coapAddr)
	waitFor(t, 10*time.Second, "dev-d followed", func() bool { return strings.Contains(tail.String(), `"device":"dev-d"`) })
	stop3()
}
