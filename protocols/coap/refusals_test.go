package coap

import (
	"context"
	"os/exec"
	"sync"
	"testing"
	"time"

	"github.com/fleetgate/fleetgate/gateway"
)

// refusalLog records the refusals a front end reports.
type refusalLog struct {
	mu  sync.Mutex
	all []gateway.Refusal
}

var _ gateway.Refusals = (*refusalLog)(nil)

func (l *refusalLog) Refuse(r gateway.Refusal) {
	l.mu.Lock()
	l.all = append(l.all, r)
	l.mu.Unlock()
}

// wait returns the last refusal of device, waiting up to d for one.
func (l *refusalLog) wait(t *testing.T, device string, d time.Duration) gateway.Refusal {
	t.Helper()
	deadline := time.Now().Add(d)
	for {
		l.mu.Lock()
		var found gateway.Refusal
		for _, r := range l.all {
			if r.Device == device {
				found = r
			}
		}
		l.mu.Unlock()
		if found.Device != "" {
			return found
		}
		if time.Now().After(deadline) {
			t.Fatalf("no refusal of %q within %v; refusals: %+v", device, d, l.all)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// coapClient runs a libcoap coap-client build with args and returns
// what it printed, whatever its exit status (a refused request is not
// an error to the test).
func coapClient(t *testing.T, client string, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	out, _ := exec.CommandContext(ctx, client, append([]string{"-B", "4"}, args...)...).CombinedOutput()
	return string(out)
}

// TestPlainRequestRefusalsReported: coap-client-notls heartbeats without
// DTLS, anonymous access off, are answered 4.01 and reported as an
// unknown device (ghost) or bad credentials (a device of the devices
// file: it must use DTLS), with the client's address.
func TestPlainRequestRefusalsReported(t *testing.T) {
	refusals := &refusalLog{}
	s := startDTLS(t, &recorder{}, Options{Refusals: refusals})
	for device, reason := range map[string]string{"ghost": gateway.RefusedUnknownDevice, "dev-1": gateway.RefusedBadCredentials} {
		out := coapClient(t, "coap-client-notls", "-m", "post", "coap://"+s.Addr().String()+"/hb?d="+device)
		r := refusals.wait(t, device, 5*time.Second)
		if r.Protocol != "coap" || r.Reason != reason || r.Remote == "" || r.Detail != "4.01 credentials required" {
			t.Fatalf("%s: refusal %+v, want %s\ncoap-client: %s", device, r, reason, out)
		}
	}
}

// TestDTLSHandshakeRefusalsReported: coap-client-openssl with a wrong key
// for a device, and with an identity the devices file lacks, fail their
// handshakes; each is reported with the identity and why.
func TestDTLSHandshakeRefusalsReported(t *testing.T) {
	refusals := &refusalLog{}
	s := startDTLS(t, &recorder{}, Options{Refusals: refusals, HandshakeTimeout: time.Second})
	for _, c := range []struct{ identity, key, reason string }{
		{"id-1", "not the right key", gateway.RefusedBadCredentials},
		{"ghost", "sixteen byte key", gateway.RefusedUnknownDevice},
	} {
		out := coapClient(t, "coap-client-openssl", "-m", "post", "-k", c.key, "-u", c.identity,
			"coaps://"+s.DTLSAddr().String()+"/hb")
		r := refusals.wait(t, c.identity, 10*time.Second)
		if r.Protocol != "coap" || r.Reason != c.reason || r.Remote == "" {
			t.Fatalf("%s: refusal %+v, want %s\ncoap-client: %s", c.identity, r, c.reason, out)
		}
		t.Logf("%s: %s: %s", c.identity, r.Reason, r.Detail)
	}
}
