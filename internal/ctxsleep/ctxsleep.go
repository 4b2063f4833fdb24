// Package ctxsleep waits for a duration or a context, whichever ends
// first: the retry and back-off waits of the gateway's loops.
package ctxsleep

import (
	"context"
	"time"
)

// Sleep waits for d; false when ctx ended first.
func Sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}
