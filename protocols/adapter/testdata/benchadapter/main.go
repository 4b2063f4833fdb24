// Command benchadapter is the adapter of the host's benchmarks: once its
// stream opens it sends "items" renewals as fast as the SDK takes them,
// cycling over "devices" device IDs, then idles. With "data" set it sends
// data items instead, of "bytes" bytes and QoS "qos", from "senders"
// goroutines at once (each QoS 1 Data call waits for its settlement, as
// an HTTP request of a network server would).
package main

import (
	"context"
	"encoding/json"
	"strconv"
	"sync"

	"github.com/fleetgate/fleetgate/plugins/sdk"
)

type adapter struct {
	Items   int  `json:"items"`
	Devices int  `json:"devices"`
	Data    bool `json:"data"`
	QoS     byte `json:"qos"`
	Bytes   int  `json:"bytes"`
	Senders int  `json:"senders"`
}

func (a *adapter) Configure(_ context.Context, raw []byte) error {
	a.Devices, a.Senders = 1000, 1
	return json.Unmarshal(raw, a)
}

func (a *adapter) Run(ctx context.Context, sink sdk.Sink) error {
	sink.Ready()
	ids := make([]string, a.Devices)
	for i := range ids {
		ids[i] = "bench-" + strconv.Itoa(i)
	}
	if !a.Data {
		for i := 0; i < a.Items; i++ {
			if err := sink.Send(ctx, sdk.Evidence{Kind: sdk.Renew, Device: ids[i%len(ids)]}); err != nil {
				return nil
			}
		}
		<-ctx.Done()
		return nil
	}
	payload := make([]byte, a.Bytes)
	var wg sync.WaitGroup
	for s := range a.Senders {
		wg.Go(func() {
			for i := s; i < a.Items; i += a.Senders {
				err := sink.Data(ctx, sdk.Data{Device: ids[i%len(ids)], Topic: "t", Payload: payload, QoS: a.QoS})
				if ctx.Err() != nil {
					return
				}
				if err != nil {
					panic(err)
				}
			}
		})
	}
	wg.Wait()
	<-ctx.Done()
	return nil
}

func main() { sdk.Serve(sdk.Info{Name: "benchadapter", Version: "1"}, &adapter{}) }
