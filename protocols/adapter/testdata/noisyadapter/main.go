// Command noisyadapter prints to stdout once it runs, as a careless
// adapter would: the SDK must refuse those writes and keep the plugin
// channel intact.
package main

import (
	"context"
	"fmt"
	"os"

	"github.com/fleetgate/fleetgate/plugins/sdk"
)

type adapter struct{}

func (adapter) Configure(context.Context, []byte) error { return nil }

func (adapter) Run(ctx context.Context, sink sdk.Sink) error {
	fmt.Println("debug: starting run")
	_, _ = os.NewFile(1, "fd1").WriteString("raw write to descriptor 1\n")
	if err := sink.Send(ctx, sdk.Evidence{Kind: sdk.Renew, Device: "noisy-1"}); err != nil {
		return nil
	}
	<-ctx.Done()
	return nil
}

func main() { sdk.Serve(sdk.Info{Name: "noisy", Version: "1"}, adapter{}) }
