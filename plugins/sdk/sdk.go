// Package sdk is the adapter author's side of fleetgate's adapter
// contract (plugins/proto): implement Adapter, call Serve from main, and
// the SDK does the rest — the go-plugin handshake (gRPC, AutoMTLS), the
// Info/Configure/Evidence/Health/Shutdown calls, batching evidence into
// frames, SIGTERM, exiting when the gateway is gone, and keeping stdout
// (the handshake channel) clean. plugins/README.md walks through a
// complete adapter; sdktest runs one in-process without a gateway.
package sdk

import (
	"context"
	"time"

	"github.com/hashicorp/go-hclog"

	pb "github.com/fleetgate/fleetgate/plugins/proto"
)

// Adapter is what an adapter author implements.
type Adapter interface {
	// Configure receives the adapter's `config` subtree of the gateway's
	// configuration as JSON ("{}" when none is given). It is called once,
	// before Run. An error refuses the configuration: the host reports it
	// and does not call Run; name the bad key in it. Bind sockets in Run,
	// not here.
	Configure(ctx context.Context, config []byte) error
	// Run does the adapter's work until ctx ends: it listens or polls and
	// hands evidence to sink. It calls sink.Ready once it can receive
	// traffic (sending evidence implies ready). A nil return once ctx has
	// ended is a clean stop; an error is reported to the host, which
	// restarts the adapter.
	Run(ctx context.Context, sink Sink) error
}

// Info names an adapter implementation (the Info call).
type Info struct {
	Name      string
	Version   string
	Protocols []string
}

// Kind is the kind of a piece of evidence.
type Kind int

const (
	// Connect opens a session (or renews a live one).
	Connect Kind = Kind(pb.Kind_KIND_CONNECT)
	// Renew is fresh evidence for a session.
	Renew Kind = Kind(pb.Kind_KIND_RENEW)
	// Leave is a clean goodbye that ends the session.
	Leave Kind = Kind(pb.Kind_KIND_LEAVE)
)

// Evidence is one thing a device did.
type Evidence struct {
	Kind Kind
	// Device is the device ID, [A-Za-z0-9._:-]{1,128}; the host rejects
	// anything else (counted, the stream stays up).
	Device string
	// Instance names the session within the adapter; "" is "default".
	Instance string
	// At is when the device did it; zero means when Send is called.
	At time.Time
	// Metadata is informational (the host logs it at debug level). The
	// SDK reads the map when it encodes the frame, after Send has
	// returned: do not change it after Send.
	Metadata map[string]string
}

// Sink takes an adapter's evidence. Its methods are safe for concurrent
// use.
type Sink interface {
	// Ready tells the host the adapter is listening; the first frame of
	// the stream goes out at once. Calling it again does nothing.
	Ready()
	// Send queues evidence for the next frame. It blocks while the queue
	// is full (the host is slower than the adapter) until ctx ends.
	Send(ctx context.Context, ev Evidence) error
}

type loggerKey struct{}

// Logger returns the adapter's logger, carried by the contexts that
// Configure and Run receive. Its output (JSON on stderr) reaches the
// gateway's log under the adapter's configured name. Outside those
// contexts it returns a logger that discards.
func Logger(ctx context.Context) hclog.Logger {
	if l, ok := ctx.Value(loggerKey{}).(hclog.Logger); ok {
		return l
	}
	return hclog.NewNullLogger()
}

// WithLogger returns ctx carrying l for Logger (for tests and sdktest).
func WithLogger(ctx context.Context, l hclog.Logger) context.Context {
	return context.WithValue(ctx, loggerKey{}, l)
}
