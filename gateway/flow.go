package gateway

import "context"

// Observer takes evidence from a protocol front end (the session table
// implements it). An error means the evidence was refused: ErrInvalidDeviceID
// and ErrInvalidSessionID for bad input, ErrOverloaded when the gateway
// sheds load; front ends map them to protocol codes at the edge.
type Observer interface {
	Observe(ctx context.Context, ev Evidence) error
}

// Uplink takes the writes the session table decided to send centrally
// (after the throttle): connects, leaves, and renewals that move the
// deadline by at least renew_every. The uplink batches them per shard.
// Enqueue may block for backpressure until ctx is done.
type Uplink interface {
	Enqueue(ctx context.Context, ev Evidence) error
}
