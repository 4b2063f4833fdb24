package mqttpub_test

import (
	"context"
	"net"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/fleetgate/fleetgate/events/mqttpub"
	"github.com/fleetgate/fleetgate/gateway"
	"github.com/fleetgate/fleetgate/internal/redistest"
)

// retainedPresence is what a fresh mosquitto_sub prints of the retained
// presence topics under prefix: "topic payload" lines.
func retainedPresence(t *testing.T, b *broker, prefix string) string {
	t.Helper()
	host, port, _ := net.SplitHostPort(b.Addr)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	// --retained-only: print the retained messages, end at the first
	// live one or after -W seconds (exit 27, a timeout: not a failure)
	out, err := exec.CommandContext(ctx, "mosquitto_sub", "-h", host, "-p", port, "-v", "--retained-only",
		"-W", "2", "-t", prefix+"/presence/+").CombinedOutput()
	if ee, ok := err.(*exec.ExitError); err != nil && !(ok && ee.ExitCode() == 27) {
		t.Fatalf("mosquitto_sub: %v: %s", err, out)
	}
	return string(out)
}

// TestForgetClearsRetainedPresence: a forgotten device's removed event
// goes to its events topic, and its retained presence is cleared on the
// broker (a new subscriber, mosquitto_sub, gets none for it), while the
// other devices' retained presence stays.
func TestForgetClearsRetainedPresence(t *testing.T) {
	srv := redistest.Start(t)
	b := startBroker(t, false)
	store := redisStore(t, srv, uniquePrefix())
	const prefix = "site/forget"
	gone, kept := gateway.DeviceID("fg-gone"), gateway.DeviceID("fg-kept")
	apply(t, store, gateway.Connect, gone, kept)
	watcher := subscribe(t, b, prefix, "events/+")
	runPublisher(t, store, b, mqttpub.Options{TopicPrefix: prefix, RetainState: true})

	deadline := time.Now().Add(20 * time.Second)
	for !strings.Contains(retainedPresence(t, b, prefix), prefix+"/presence/"+string(gone)+" ") {
		if time.Now().After(deadline) {
			t.Fatalf("no retained presence of %s after 20s: %q", gone, retainedPresence(t, b, prefix))
		}
		time.Sleep(100 * time.Millisecond)
	}

	ev, err := store.Forget(context.Background(), gone, "gw-admin")
	if err != nil {
		t.Fatal(err)
	}
	watcher.await(t, 20*time.Second, "the removed event on the events topic", func(m []received) bool {
		for _, r := range m {
			if r.topic == prefix+"/events/"+string(gone) && r.env.State == gateway.Removed && r.env.Ver == ev.Ver && r.env.Reason == gateway.ReasonForget {
				return true
			}
		}
		return false
	})
	// the presence message follows the events one in the same device's
	// sequence; give the broker a moment, bounded
	var out string
	for range 50 {
		if out = retainedPresence(t, b, prefix); !strings.Contains(out, string(gone)) {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if strings.Contains(out, string(gone)) {
		t.Errorf("retained presence after Forget still names %s:\n%s", gone, out)
	}
	if !strings.Contains(out, prefix+"/presence/"+string(kept)+" ") || !strings.Contains(out, `"state":"online"`) {
		t.Errorf("retained presence of %s missing after forgetting another device:\n%s", kept, out)
	}
}
