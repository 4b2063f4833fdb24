package gateway_test

import (
	"testing"
	"time"

	"github.com/fleetgate/fleetgate/gateway"
)

func TestDeriveState(t *testing.T) {
	const (
		lease   = 90 * time.Second
		suspect = 45 * time.Second
	)
	now := t0
	for _, tc := range []struct {
		name     string
		deadline time.Time
		want     gateway.State
	}{
		{"no live session", time.Time{}, gateway.Offline},
		{"deadline passed", now.Add(-time.Second), gateway.Offline},
		{"deadline is now", now, gateway.Offline},
		{"fresh evidence", now.Add(lease), gateway.Online},
		{"evidence just under suspect_after old", now.Add(lease - suspect + time.Nanosecond), gateway.Online},
		{"evidence suspect_after old", now.Add(lease - suspect), gateway.Suspect},
		{"lease about to run out", now.Add(time.Nanosecond), gateway.Suspect},
	} {
		if got := gateway.DeriveState(now, tc.deadline, lease, suspect); got != tc.want {
			t.Errorf("%s: DeriveState(deadline now%+v) = %s, want %s", tc.name, tc.deadline.Sub(now), got, tc.want)
		}
	}
	// suspect_after ≥ lease: never suspect, online until the deadline.
	if got := gateway.DeriveState(now, now.Add(time.Second), lease, lease); got != gateway.Online {
		t.Errorf("suspect_after = lease: %s, want online", got)
	}
}

func TestKindString(t *testing.T) {
	for k, want := range map[gateway.Kind]string{gateway.Connect: "connect", gateway.Renew: "renew", gateway.Leave: "leave", 9: "kind(9)"} {
		if got := k.String(); got != want {
			t.Errorf("Kind(%d).String() = %q, want %q", uint8(k), got, want)
		}
	}
}
