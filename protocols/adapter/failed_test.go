package adapter_test

import (
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/fleetgate/fleetgate/protocols/adapter"
)

// TestCrashLoopMarkedFailed starts an adapter that exits at once: each
// attempt fails, the backoff doubles (the fake clock jumps over it), and
// the fifth crash within 10 minutes marks it failed — in status, in the
// metric and in the log — while it is still retried.
func TestCrashLoopMarkedFailed(t *testing.T) {
	reg := prometheus.NewRegistry()
	e := newHost(t, func(o *adapter.Options) { o.Registerer = reg })
	path := script(t, "echo 'cannot open /dev/ttyS9' >&2\nexit 3")
	err := e.host.Apply(ctx(t), []adapter.Spec{{Name: "broken", Path: path, StartTimeout: 5 * time.Second}})
	if err == nil || !strings.Contains(err.Error(), "exited before the plugin handshake") {
		t.Fatalf("err = %v, want an exit before the handshake", err)
	}
	for i := 1; i < adapter.DefaultBackoff.FailAfter; i++ {
		waitFor(t, 10*time.Second, "the backoff timer", func() bool { return e.clock.Timers() == 1 })
		if st := e.status(t, "broken"); st.State != adapter.StateBackoff || st.Restarts != i {
			t.Fatalf("after crash %d: %+v, want backoff", i, st)
		}
		e.clock.Advance(adapter.DefaultBackoff.Max)
		waitFor(t, 10*time.Second, "the next crash", func() bool { return e.status(t, "broken").Restarts == i+1 })
	}
	st := e.status(t, "broken")
	if st.State != adapter.StateFailed || st.Restarts != adapter.DefaultBackoff.FailAfter || !strings.Contains(st.LastError, "exited before") {
		t.Fatalf("after %d crashes: %+v, want failed", adapter.DefaultBackoff.FailAfter, st)
	}
	if !strings.Contains(e.logs.String(), "adapter failed: too many crashes") || !strings.Contains(e.logs.String(), "cannot open /dev/ttyS9") {
		t.Fatalf("log lacks the failure or the adapter's stderr:\n%s", e.logs.String())
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, mf := range mfs {
		if mf.GetName() == "fleetgate_adapter_failed" {
			for _, m := range mf.GetMetric() {
				found = found || m.GetGauge().GetValue() == 1
			}
		}
	}
	if !found {
		t.Fatal("fleetgate_adapter_failed{adapter=broken} is not 1")
	}
	// Still retried, at the cap.
	waitFor(t, 10*time.Second, "the retry timer", func() bool { return e.clock.Timers() == 1 })
	e.clock.Advance(adapter.DefaultBackoff.Max)
	waitFor(t, 10*time.Second, "a retry while failed", func() bool { return e.status(t, "broken").Restarts == adapter.DefaultBackoff.FailAfter+1 })
}
