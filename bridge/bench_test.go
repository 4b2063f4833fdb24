package bridge_test

import (
	"context"
	"fmt"
	"net/url"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/autopaho"
	"github.com/eclipse/paho.golang/paho"

	"github.com/fleetgate/fleetgate/bridge"
	"github.com/fleetgate/fleetgate/gateway"
)

// BenchmarkForward forwards 20,000 QoS 1 messages (200 devices, 64-byte
// payloads, one content type and user property each) from a durable
// queue (diskq, filled beforehand) to mosquitto through a bridge, until
// the queue is empty (each acknowledged by a PUBACK and removed); and,
// as the ceiling in the same run, a bare paho.golang loop publishing the
// same messages, pre-built, straight to the same mosquitto, as many in
// flight as the bridge has lanes (64), each device's in order. It
// reports messages/s and this process's CPU (user + system) per message
// of each, and their ratio.
func BenchmarkForward(b *testing.B) {
	const messages, devices = 20_000, 200
	br := startBroker(b)
	msgs := make([]gateway.Message, messages)
	for i := range msgs {
		msgs[i] = gateway.Message{Device: gateway.DeviceID(fmt.Sprintf("dev-%03d", i%devices)), Topic: "telemetry",
			Payload: make([]byte, 64), ContentType: "application/octet-stream", QoS: 1,
			Properties: []gateway.Property{{Key: "seq", Value: fmt.Sprint(i / devices)}}, Received: time.Now(), Source: "coap"}
	}
	var bridgeTime, bareTime, bridgeCPU, bareCPU time.Duration
	for range b.N {
		b.StopTimer()
		durable := diskQueue(b, b.TempDir(), "durable")
		for i := 0; i < len(msgs); i += 500 {
			if _, err := durable.Put(context.Background(), msgs[i:i+500]); err != nil {
				b.Fatal(err)
			}
		}
		b.StartTimer()
		t0, c0 := time.Now(), cpuTime()
		fw, err := bridge.New(context.Background(), bridge.Options{URL: brokerURL(br), ClientID: "bench", TopicPrefix: "fg",
			Durable: durable, Memory: memQueue(b, nil), Commands: memQueue(b, nil), Logger: testLogger(b)})
		if err != nil {
			b.Fatal(err)
		}
		deadline := time.Now().Add(5 * time.Minute)
		for durable.Stats().Messages > 0 {
			if time.Now().After(deadline) {
				b.Fatalf("%d messages left after 5 minutes", durable.Stats().Messages)
			}
			time.Sleep(time.Millisecond)
		}
		bridgeTime += time.Since(t0)
		bridgeCPU += cpuTime() - c0
		b.StopTimer()
		fw.Close()
		durable.Close()

		bareTime1, bareCPU1 := bareForward(b, br.Addr, msgs, bridge.DefaultLanes)
		bareTime += bareTime1
		bareCPU += bareCPU1
	}
	total := float64(messages * b.N)
	b.ReportMetric(total/bridgeTime.Seconds(), "msgs/s")
	b.ReportMetric(total/bareTime.Seconds(), "ceiling-msgs/s")
	b.ReportMetric(bareTime.Seconds()/bridgeTime.Seconds(), "ratio")
	b.ReportMetric(float64(bridgeCPU.Microseconds())/total, "cpu-µs/msg")
	b.ReportMetric(float64(bareCPU.Microseconds())/total, "ceiling-cpu-µs/msg")
}

// bareForward publishes msgs, pre-built, with one paho.golang connection
// from lanes goroutines, each device's in order, and returns the time
// and CPU it took.
func bareForward(b *testing.B, addr string, msgs []gateway.Message, lanes int) (time.Duration, time.Duration) {
	u, _ := url.Parse("mqtt://" + addr)
	ctx := context.Background()
	cm, err := autopaho.NewConnection(ctx, autopaho.ClientConfig{
		ServerUrls: []*url.URL{u}, KeepAlive: 30, CleanStartOnInitialConnection: true,
		ClientConfig: paho.ClientConfig{ClientID: "bench-bare"},
	})
	if err != nil {
		b.Fatal(err)
	}
	if err := cm.AwaitConnection(ctx); err != nil {
		b.Fatal(err)
	}
	perDevice := map[gateway.DeviceID][]*paho.Publish{}
	var order []gateway.DeviceID
	for _, m := range msgs {
		if _, ok := perDevice[m.Device]; !ok {
			order = append(order, m.Device)
		}
		p := &paho.Publish{Topic: "bare/devices/" + string(m.Device) + "/" + m.Topic, QoS: 1, Payload: m.Payload,
			Properties: &paho.PublishProperties{ContentType: m.ContentType}}
		for _, up := range m.Properties {
			p.Properties.User = append(p.Properties.User, paho.UserProperty{Key: up.Key, Value: up.Value})
		}
		perDevice[m.Device] = append(perDevice[m.Device], p)
	}
	work := make(chan []*paho.Publish, len(order))
	for _, d := range order {
		work <- perDevice[d]
	}
	close(work)
	b.StartTimer()
	t0, c0 := time.Now(), cpuTime()
	var wg sync.WaitGroup
	for range lanes {
		wg.Go(func() {
			for ps := range work {
				for _, p := range ps {
					if _, err := cm.Publish(ctx, p); err != nil {
						b.Error(err)
						return
					}
				}
			}
		})
	}
	wg.Wait()
	took, cpu := time.Since(t0), cpuTime()-c0
	b.StopTimer()
	dctx, cancel := context.WithTimeout(ctx, time.Second)
	_ = cm.Disconnect(dctx)
	cancel()
	return took, cpu
}

// cpuTime is the CPU time (user and system) this process used so far.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
