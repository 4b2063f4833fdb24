// Command benchadapter is the adapter of the host's benchmarks: once its
// stream opens it sends "items" renewals as fast as the SDK takes them,
// cycling over "devices" device IDs, then idles.
package main

import (
	"context"
	"encoding/json"
	"strconv"

	"github.com/fleetgate/fleetgate/plugins/sdk"
)

type adapter struct {
	Items   int `json:"items"`
	Devices int `json:"devices"`
}

func (a *adapter) Configure(_ context.Context, raw []byte) error {
	a.Devices = 1000
	return json.Unmarshal(raw, a)
}

func (a *adapter) Run(ctx context.Context, sink sdk.Sink) error {
	sink.Ready()
	ids := make([]string, a.Devices)
	for i := range ids {
		ids[i] = "bench-" + strconv.Itoa(i)
	}
	for i := 0; i < a.Items; i++ {
		if err := sink.Send(ctx, sdk.Evidence{Kind: sdk.Renew, Device: ids[i%len(ids)]}); err != nil {
			return nil
		}
	}
	<-ctx.Done()
	return nil
}

func main() { sdk.Serve(sdk.Info{Name: "benchadapter", Version: "1"}, &adapter{}) }
