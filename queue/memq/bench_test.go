package memq

import (
	"context"
	"testing"
	"time"

	"github.com/fleetgate/fleetgate/gateway"
)

// BenchmarkPutReadAck measures the memory queue's round trip of one
// message (100-byte payload): Put, Read after the last one read, Ack;
// ns/op and allocs/op are per message, and x-copy is the time over
// keep alone, Put's copy of the message (the least a Put that keeps its
// own copy does).
func BenchmarkPutReadAck(b *testing.B) {
	q, err := New(Options{MaxBytes: 16 << 20})
	if err != nil {
		b.Fatal(err)
	}
	defer q.Close()
	ctx := context.Background()
	m := []gateway.Message{{Device: "bench-device-000001", Topic: "telemetry/temp", Payload: make([]byte, 100),
		ContentType: "application/json", QoS: 0, Received: time.Now(), Source: "mqtt"}}
	var after uint64
	ids := make([]uint64, 1)
	b.ReportAllocs()
	start := time.Now()
	for b.Loop() {
		if err := q.Put(ctx, m); err != nil {
			b.Fatal(err)
		}
		got, err := q.Read(ctx, after, 1)
		if err != nil {
			b.Fatal(err)
		}
		ids[0] = got[0].ID
		after = ids[0]
		if err := q.Ack(ids); err != nil {
			b.Fatal(err)
		}
	}
	per := time.Since(start) / time.Duration(b.N)
	b.StopTimer()
	copyStart, n := time.Now(), 100_000
	var sink gateway.Message
	for range n {
		sink = keep(m[0])
	}
	_ = sink
	b.ReportMetric(float64(per)/(float64(time.Since(copyStart))/float64(n)), "x-copy")
}
