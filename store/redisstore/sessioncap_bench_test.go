package redisstore

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/fleetgate/fleetgate/gateway"
	"github.com/fleetgate/fleetgate/internal/redistest"
)

// BenchmarkApplyAtSessionCap measures the worst case that
// limits.max_sessions_per_device leaves: one apply script
// call renewing one session of a device that holds the cap's number of
// sessions, against the same call for a device with one session (the
// ceiling, measured in the same run). It reports both script times from
// SLOWLOG (median and worst of b.N × 200 calls) and their ratio, for the
// default cap (8) and the largest one configs accepts (256).
func BenchmarkApplyAtSessionCap(b *testing.B) {
	for _, sessions := range []int{gateway.DefaultMaxSessionsPerDevice, 256} {
		b.Run(fmt.Sprintf("sessions=%d", sessions), func(b *testing.B) { benchmarkApplyAtCap(b, sessions) })
	}
}

func benchmarkApplyAtCap(b *testing.B, sessions int) {
	const calls = 200
	srv := redistest.Start(b, "--slowlog-log-slower-than", "0", "--slowlog-max-len", "100000")
	c := srv.Client(b)
	ctx := context.Background()
	s, err := Open(ctx, c, Options{Prefix: "cap", Shards: 1})
	if err != nil {
		b.Fatal(err)
	}
	apply := func(ws ...gateway.Write) {
		if _, err := s.Apply(ctx, 0, gateway.Batch{Gateway: "gw-1", Epoch: 1, Lease: 90 * time.Second, Writes: ws}); err != nil {
			b.Fatal(err)
		}
	}
	// The device at the cap, and a single-session device.
	for i := range sessions {
		apply(gateway.Write{Device: "capped", Session: gateway.SessionID(fmt.Sprintf("coap/%d", i)), Kind: gateway.Connect})
	}
	apply(gateway.Write{Device: "single", Session: "coap/default", Kind: gateway.Connect})

	var capped, single []time.Duration
	b.ResetTimer()
	for range b.N {
		for _, run := range []struct {
			dev  gateway.DeviceID
			sess gateway.SessionID
			out  *[]time.Duration
		}{{"capped", "coap/0", &capped}, {"single", "coap/default", &single}} {
			c.SlowLogReset(ctx)
			for range calls {
				apply(gateway.Write{Device: run.dev, Session: run.sess, Kind: gateway.Renew})
			}
			*run.out = append(*run.out, scriptDurations(b, ctx, c)...)
		}
	}
	b.StopTimer()
	slices.Sort(capped)
	slices.Sort(single)
	med := func(ds []time.Duration) float64 { return float64(ds[len(ds)/2].Microseconds()) }
	b.ReportMetric(med(capped), "capped-us/call")
	b.ReportMetric(float64(capped[len(capped)-1].Microseconds()), "capped-max-us/call")
	b.ReportMetric(med(single), "ceiling-us/call")
	b.ReportMetric(med(capped)/max(med(single), 1), "ratio")
}
