package mqttpub_test

import (
	"context"
	"encoding/json"
	"net/url"
	"sync"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/autopaho"
	"github.com/eclipse/paho.golang/paho"

	"github.com/fleetgate/fleetgate/events/mqttpub"
	"github.com/fleetgate/fleetgate/gateway"
	"github.com/fleetgate/fleetgate/internal/redistest"
)

// BenchmarkPublisher publishes 20,000 events of a Redis store (4 shards)
// to mosquitto at QoS 1, two messages each (events and retained
// presence), from saved positions at the start of the logs; and, as the
// ceiling, a bare paho.golang loop publishing the same 40,000 messages,
// pre-encoded, from as many goroutines as the publisher keeps in flight
// (64 per shard), each device's messages in order: events/s of each and
// their ratio.
func BenchmarkPublisher(b *testing.B) {
	const events = 20_000
	srv := redistest.Start(b)
	br := startBroker(b, false)
	ctx := context.Background()
	var pubTime, bareTime time.Duration
	for range b.N {
		store := benchStore(b, srv, events)
		// the same messages, for the bare loop
		perDevice := map[gateway.DeviceID][]*paho.Publish{}
		for s := range shards {
			after := ""
			for {
				evs, err := store.Events(ctx, s, after, 1000)
				if err != nil {
					b.Fatal(err)
				}
				if len(evs) == 0 {
					break
				}
				for _, e := range evs {
					p, _ := json.Marshal(gateway.EnvelopeOf(e))
					perDevice[e.Device] = append(perDevice[e.Device],
						&paho.Publish{Topic: "bare/events/" + string(e.Device), QoS: 1, Payload: p},
						&paho.Publish{Topic: "bare/presence/" + string(e.Device), QoS: 1, Retain: true, Payload: p})
				}
				after = evs[len(evs)-1].ID
			}
		}
		p, err := mqttpub.New(store, mqttpub.Options{URL: br.url(), Owner: "bench", QoS: 1, RetainState: true, TopicPrefix: "pub"})
		if err != nil {
			b.Fatal(err)
		}
		pctx, stop := context.WithCancel(ctx)
		done := make(chan error, 1)
		b.StartTimer()
		t0 := time.Now()
		go func() { done <- p.Run(pctx) }()
		deadline := time.Now().Add(5 * time.Minute)
		for p.Stats().Published < events {
			if time.Now().After(deadline) {
				b.Fatalf("published %d of %d events in 5 minutes", p.Stats().Published, events)
			}
			time.Sleep(time.Millisecond)
		}
		pubTime += time.Since(t0)
		b.StopTimer()
		stop()
		<-done

		cm := bareConnection(b, br)
		work := make(chan []*paho.Publish, len(perDevice))
		for _, ms := range perDevice {
			work <- ms
		}
		close(work)
		b.StartTimer()
		t0 = time.Now()
		var wg sync.WaitGroup
		for range mqttpub.DefaultInFlight * shards {
			wg.Go(func() {
				for ms := range work {
					for _, m := range ms {
						if _, err := cm.Publish(ctx, m); err != nil {
							b.Error(err)
							return
						}
					}
				}
			})
		}
		wg.Wait()
		bareTime += time.Since(t0)
		b.StopTimer()
		dctx, cancel := context.WithTimeout(ctx, time.Second)
		_ = cm.Disconnect(dctx)
		cancel()
	}
	total := float64(events * b.N)
	b.ReportMetric(total/pubTime.Seconds(), "events/s")
	b.ReportMetric(total/bareTime.Seconds(), "bare-events/s")
	b.ReportMetric(bareTime.Seconds()/pubTime.Seconds(), "ratio")
}

// benchStore is a fresh store holding events events (devices connecting
// and leaving), with every shard's publisher position at its log start.
func benchStore(b *testing.B, srv *redistest.Server, events int) gateway.Store {
	b.StopTimer()
	store := redisStore(b, srv, uniquePrefix())
	devs := devices("bench", events/2)
	for i := 0; i < len(devs); i += 1000 {
		apply(b, store, gateway.Connect, devs[i:min(i+1000, len(devs))]...)
		apply(b, store, gateway.Leave, devs[i:min(i+1000, len(devs))]...)
	}
	startAtLogStart(b, store)
	return store
}

func bareConnection(b *testing.B, br *broker) *autopaho.ConnectionManager {
	u, _ := url.Parse(br.url())
	ctx := context.Background()
	cm, err := autopaho.NewConnection(ctx, autopaho.ClientConfig{
		ServerUrls: []*url.URL{u}, KeepAlive: 30, CleanStartOnInitialConnection: true,
		ClientConfig: paho.ClientConfig{ClientID: "bare-loop"},
	})
	if err != nil {
		b.Fatal(err)
	}
	if err := cm.AwaitConnection(ctx); err != nil {
		b.Fatal(err)
	}
	return cm
}
