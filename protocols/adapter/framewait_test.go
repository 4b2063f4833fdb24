package adapter

import (
	"testing"
	"time"
)

func TestFrameWait(t *testing.T) {
	wall := time.UnixMicro(1_800_000_000_000_000)
	const lease = time.Minute
	for _, tc := range []struct {
		name   string
		sentUs int64
		want   time.Duration
	}{
		{"unknown", 0, 0},
		{"negative", -5, 0},
		{"waited 2 s", wall.Add(-2 * time.Second).UnixMicro(), 2 * time.Second},
		{"made after it was read (a clock stepped back)", wall.Add(time.Second).UnixMicro(), 0},
		{"waited beyond the lease (a clock stepped forward)", wall.Add(-lease - time.Microsecond).UnixMicro(), 0},
		{"waited exactly the lease", wall.Add(-lease).UnixMicro(), lease},
	} {
		if got := frameWait(wall, tc.sentUs, lease); got != tc.want {
			t.Errorf("%s: frameWait = %v, want %v", tc.name, got, tc.want)
		}
	}
}
