package adapter

import (
	"cmp"
	"math"
	"testing"
	"time"

	"github.com/fleetgate/fleetgate/gateway"
)

func TestNamespaceRefusal(t *testing.T) {
	n := newNamespace([]string{"lw-*", "press-1"})
	all := newNamespace([]string{"*"})
	for _, tc := range []struct {
		ns     namespace
		device gateway.DeviceID
		listed bool
		want   string
	}{
		{n, "lw-0011", false, ""},
		{n, "press-1", false, ""},
		{n, "press-10", false, refusedOutside},
		{n, "lw", false, refusedOutside},
		{n, "lw-0011", true, refusedListed},
		{n, "press-1", true, refusedListed},
		{all, "anything", false, ""},
		{all, "alpha", true, refusedListed},
		{newNamespace(nil), "x", false, refusedOutside},
	} {
		if got := tc.ns.refusal(tc.device, tc.listed); got != tc.want {
			t.Errorf("refusal(%s, listed %v) = %q, want %q", tc.device, tc.listed, got, tc.want)
		}
	}
}

// A device counts while one of its sessions lives: its last session's
// leave or lease frees its place; a session lives for the lease of its
// last evidence (an hour for a device that wakes once an hour).
func TestSessionsCountDevices(t *testing.T) {
	now := time.Unix(1000, 0)
	s := newSessions(0, 2, nil)
	k := func(d, sess string) sessionKey { return sessionKey{gateway.DeviceID(d), gateway.SessionID(sess)} }
	for _, step := range []struct {
		key   sessionKey
		kind  gateway.Kind
		at    time.Duration
		lease time.Duration // 0: a minute
		want  bool
	}{
		{k("a", "x/1"), gateway.Renew, 0, 0, true},
		{k("a", "x/2"), gateway.Renew, 0, 0, true},
		{k("b", "x/1"), gateway.Renew, 0, 0, true},
		{k("c", "x/1"), gateway.Renew, 0, 0, false},               // two devices live
		{k("a", "x/1"), gateway.Leave, time.Second, 0, true},      // a keeps x/2
		{k("c", "x/1"), gateway.Renew, 2 * time.Second, 0, false}, // still two
		{k("a", "x/2"), gateway.Leave, 3 * time.Second, 0, true},
		{k("c", "x/1"), gateway.Renew, 4 * time.Second, 0, true}, // a is gone
		{k("d", "x/1"), gateway.Renew, time.Minute, 0, true},     // b's lease ran out
		{k("e", "x/1"), gateway.Renew, 3 * time.Minute, time.Hour, true},
		{k("f", "x/1"), gateway.Renew, 3 * time.Minute, 0, true},
		{k("g", "x/1"), gateway.Renew, 3*time.Minute + time.Second, 0, false}, // e and f live
		{k("g", "x/1"), gateway.Renew, 30 * time.Minute, 0, true},             // f is gone, e holds its hour
		{k("h", "x/1"), gateway.Renew, 30 * time.Minute, 0, false},
	} {
		lease := cmp.Or(step.lease, time.Minute)
		if got := s.admit(step.key, step.kind, now.Add(step.at), lease); got != step.want {
			t.Fatalf("admit(%v, %v) at +%s = %v, want %v", step.key, step.kind, step.at, got, step.want)
		}
	}
	if s.devices() != 2 || s.len() != 2 {
		t.Fatalf("%d devices, %d sessions, want e and g", s.devices(), s.len())
	}
}

func TestObservedAt(t *testing.T) {
	now := time.Unix(1000, 0)
	lease := 90 * time.Second
	for _, tc := range []struct {
		age  int64
		want time.Time
		err  bool
	}{
		{0, now, false},
		{-1, now, false},
		{math.MinInt64, now, false},
		{1, now.Add(-time.Microsecond), false},
		{lease.Microseconds(), now.Add(-lease), false},
		{lease.Microseconds() + 1, time.Time{}, true},
		{math.MaxInt64/1000 + 1, time.Time{}, true},
		{math.MaxInt64, time.Time{}, true},
	} {
		got, err := observedAt(now, tc.age, lease)
		if (err != nil) != tc.err || !got.Equal(tc.want) {
			t.Errorf("observedAt(age %d) = %v, %v; want %v (error %v)", tc.age, got, err, tc.want, tc.err)
		}
	}
}
