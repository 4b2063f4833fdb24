package diskq_test

import "context"

// done is a context that has ended: Read returns what is there without
// waiting.
func done() context.Context {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	return ctx
}
