package adapter_test

import (
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/fleetgate/fleetgate/gateway"
	"github.com/fleetgate/fleetgate/internal/buildtest"
	"github.com/fleetgate/fleetgate/protocols/adapter"
)

// TestSDKRefusesStdoutWrites runs an adapter that prints to stdout after
// the handshake, on descriptor 1 (refused by the SDK, logged as an error)
// and with fmt (os.Stdout, which go-plugin forwards: logged as a
// warning); the plugin channel is intact and the adapter works.
func TestSDKRefusesStdoutWrites(t *testing.T) {
	var path string
	if err := buildtest.Build(t.TempDir(), map[string]*string{"github.com/fleetgate/fleetgate/protocols/adapter/testdata/noisyadapter": &path}); err != nil {
		t.Fatal(err)
	}
	e := newHost(t, nil)
	if err := e.host.Apply(ctx(t), []adapter.Spec{{Name: "noisy", Path: path, StartTimeout: 10 * time.Second, Devices: []string{"noisy-*"}}}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 5*time.Second, "evidence", func() bool { return e.count("noisy-1", gateway.Renew) == 1 })
	waitFor(t, 5*time.Second, "both refusals logged", func() bool {
		l := e.logs.String()
		return strings.Contains(l, "refused a write to stdout") && strings.Contains(l, "raw write to descriptor 1") &&
			strings.Contains(l, "wrote to stdout, which is not its log") && strings.Contains(l, "debug: starting run")
	})
	if st := e.status(t, "noisy"); st.State != adapter.StateRunning || st.Restarts != 0 {
		t.Fatalf("status = %+v, want running without restarts", st)
	}
}

// TestSDKExitsOnSIGTERM: an adapter told to stop by SIGTERM exits; the
// host sees an exit and restarts it after backoff.
func TestSDKExitsOnSIGTERM(t *testing.T) {
	e := newHost(t, nil)
	if err := e.host.Apply(ctx(t), []adapter.Spec{udpSpec("legacy", freeUDP(t))}); err != nil {
		t.Fatal(err)
	}
	pid := e.status(t, "legacy").PID
	if err := syscall.Kill(pid, syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, "the adapter gone and in backoff", func() bool {
		return !alive(pid) && e.status(t, "legacy").State == adapter.StateBackoff
	})
	if !strings.Contains(e.logs.String(), "SIGTERM: stopping") {
		t.Fatalf("no SIGTERM line in the log:\n%s", e.logs.String())
	}
}
