package gateway_test

import (
	"testing"
	"time"

	"github.com/fleetgate/fleetgate/gateway"
)

func TestTimingGrant(t *testing.T) {
	const s = time.Second
	on := gateway.Timing{Lease: 90 * s, HeartbeatInterval: 30 * s, MaxLease: time.Hour}
	off := gateway.Timing{Lease: 90 * s, HeartbeatInterval: 30 * s}
	for _, tc := range []struct {
		tm                gateway.Timing
		asked, lease, max time.Duration
	}{
		{on, 0, 90 * s, 30 * s},
		{on, 10 * s, 90 * s, 30 * s},
		{on, 600 * s, 600 * s, 540 * s},
		{on, time.Hour, time.Hour, time.Hour - 60*s},
		{on, 2 * time.Hour, time.Hour, time.Hour - 60*s},
		{off, 600 * s, 90 * s, 30 * s},
	} {
		if got := tc.tm.Grant(tc.asked); got != tc.lease {
			t.Errorf("%+v Grant(%v) = %v, want %v", tc.tm, tc.asked, got, tc.lease)
		}
		if got := tc.tm.HeartbeatFor(tc.tm.Grant(tc.asked)); got != tc.max {
			t.Errorf("%+v HeartbeatFor(Grant(%v)) = %v, want %v", tc.tm, tc.asked, got, tc.max)
		}
	}
}
