package memq

import (
	"context"
	"testing"
	"time"

	"github.com/fleetgate/fleetgate/gateway"
)

// BenchmarkPutReadAck measures the memory queue's round trip of one
// message (100-byte payload): Put, Read after the last one read, Ack;
// ns/op and allocs/op are per message. Its ceiling, timed in turns of
// 1024 messages with the queue's (the machine is shared), is a buffered
// channel of messages: the same copy as Put's (keep), a send and a
// receive. x-chan is the queue's time over the channel's.
func BenchmarkPutReadAck(b *testing.B) {
	const turn = 1024
	q, err := New(Options{MaxBytes: 16 << 20})
	if err != nil {
		b.Fatal(err)
	}
	defer q.Close()
	ctx := context.Background()
	m := []gateway.Message{{Device: "bench-device-000001", Topic: "telemetry/temp", Payload: make([]byte, 100),
		ContentType: "application/json", QoS: 0, Received: time.Now(), Source: "mqtt"}}
	ch := make(chan gateway.Message, turn)
	var after uint64
	ids := make([]uint64, 1)
	var queueTime, chanTime time.Duration
	b.ReportAllocs()
	for n := 0; n < b.N; n += turn {
		k := min(turn, b.N-n)
		start := time.Now()
		for range k {
			if _, err := q.Put(ctx, m); err != nil {
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
		queueTime += time.Since(start)
		b.StopTimer()
		start = time.Now()
		for range k {
			ch <- keep(m[0])
			<-ch
		}
		chanTime += time.Since(start)
		b.StartTimer()
	}
	b.ReportMetric(float64(queueTime)/float64(chanTime), "x-chan")
}
