package mqtt

import (
	"context"
	"net"
	"os/exec"
	"sync"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/paho"

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

// last is the last refusal of device, waiting up to 5 s for one.
func (l *refusalLog) last(t *testing.T, device string) gateway.Refusal {
	t.Helper()
	var found gateway.Refusal
	eventually(t, 5*time.Second, "a refusal of "+device, func() bool {
		l.mu.Lock()
		defer l.mu.Unlock()
		for _, r := range l.all {
			if r.Device == device {
				found = r
			}
		}
		return found.Device != ""
	})
	return found
}

// reset forgets the refusals seen.
func (l *refusalLog) reset() {
	l.mu.Lock()
	l.all = nil
	l.mu.Unlock()
}

// TestConnectRefusalsSayWhy: mosquitto_pub with a wrong password, an
// unknown client ID, no password, a user name of no device (the user
// name names the device), and a raw CONNECT
// with a client ID that is not a device ID are each refused with
// "not authorized" (or "client identifier not valid") on the wire, and
// reported to the Refusals with the reason and detail the operator
// needs, and the client's address.
func TestConnectRefusalsSayWhy(t *testing.T) {
	refusals := &refusalLog{}
	s := startServer(t, &recorder{}, Options{Credentials: testCreds(t), Refusals: refusals})
	host, port, _ := net.SplitHostPort(tcpAddr(s))
	for _, c := range []struct {
		name, device, reason, detail string
		args                         []string
	}{
		{"wrong password", "dev-1", gateway.RefusedBadCredentials, deniedPassword.detail, []string{"-i", "dev-1", "-u", "dev-1", "-P", "wrong"}},
		{"unknown device", "ghost", gateway.RefusedUnknownDevice, deniedUnknown.detail, []string{"-i", "ghost", "-u", "ghost", "-P", "x"}},
		{"no password", "dev-2", gateway.RefusedBadCredentials, deniedNoPassword.detail, []string{"-i", "dev-2"}},
		{"user name of no device", "admin", gateway.RefusedUnknownDevice, deniedUnknown.detail, []string{"-i", "dev-1", "-u", "admin", "-P", "secret-1"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			refusals.reset()
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			args := append([]string{"-h", host, "-p", port, "-t", "devices/" + c.device + "/t", "-m", "x"}, c.args...)
			out, err := exec.CommandContext(ctx, "mosquitto_pub", args...).CombinedOutput()
			if err == nil {
				t.Fatalf("mosquitto_pub %v was admitted:\n%s", args, out)
			}
			r := refusals.last(t, c.device)
			if r.Protocol != "mqtt" || r.Reason != c.reason || r.Detail != c.detail || r.At.IsZero() {
				t.Fatalf("refusal %+v, want reason %s, detail %q", r, c.reason, c.detail)
			}
			if ip, _, err := net.SplitHostPort(r.Remote); err != nil || ip != "127.0.0.1" {
				t.Fatalf("refusal's remote %q, want the client's address", r.Remote)
			}
		})
	}
	t.Run("client ID not a device ID", func(t *testing.T) {
		refusals.reset()
		r := dialRaw(t, tcpAddr(s))
		r.connack(connectPacket(t, 5, "bad id\n", "", 30))
		got := refusals.last(t, "bad id\n")
		if got.Reason != gateway.RefusedBadRequest {
			t.Fatalf("refusal %+v, want bad_request", got)
		}
	})
}

// TestACLRefusalReported: a device's PUBLISH and SUBSCRIBE outside its
// subtree are reported as not_authorized.
func TestACLRefusalReported(t *testing.T) {
	refusals := &refusalLog{}
	s := startServer(t, &recorder{}, Options{Credentials: testCreds(t), Refusals: refusals})
	c := mustConnectV5(t, s, "dev-1", "secret-1")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	// Answered PUBACK 0x87, whatever paho makes of it.
	_, _ = c.Publish(ctx, &paho.Publish{Topic: "devices/dev-2/t", QoS: 1})
	r := refusals.last(t, "dev-1")
	if r.Reason != gateway.RefusedNotAuthorized || r.Detail != "PUBLISH outside its topic subtree" {
		t.Fatalf("refusal %+v", r)
	}
}
