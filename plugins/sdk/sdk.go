// Package sdk is the adapter author's side of fleetgate's adapter
// contract (plugins/proto): implement Adapter (and Commander to take
// commands), call Serve from main, and the SDK does the rest — the
// go-plugin handshake (gRPC, AutoMTLS), the calls of the contract,
// batching evidence and data into frames, waiting for the gateway's
// settlement of QoS 1 data, SIGTERM, exiting when the gateway is gone,
// and keeping stdout (the handshake channel) clean. plugins/README.md
// walks through a complete adapter; sdktest runs one in-process without
// a gateway.
package sdk

import (
	"context"
	"errors"
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
	// Lease, when not 0, is how long this evidence holds the device's
	// session: its own lease, such as three of its configured uplink
	// intervals (a device that sends every hour is not reported offline
	// between two uplinks). The gateway grants it within its
	// presence.lease and presence.max_lease (a longer one is cut to
	// max_lease and counted); 0 means the adapter's lease
	// (plugins.adapters[].lease), else the gateway's. Sent in whole
	// milliseconds, rounded up.
	Lease time.Duration
}

// Sink takes an adapter's evidence and data. Its methods are safe for
// concurrent use.
type Sink interface {
	// Ready tells the host the adapter is listening; the first frame of
	// the stream goes out at once. Calling it again does nothing.
	Ready()
	// Send queues evidence for the next frame. It blocks while the queue
	// is full (the host is slower than the adapter) until ctx ends.
	Send(ctx context.Context, ev Evidence) error
	// Data sends a message of a device up to the gateway's data path. It
	// is evidence of the device's session too (a renewal; a connect when
	// the session is new), so a device that sends data needs no separate
	// Send. It blocks while the queue is full, as Send.
	//
	// QoS 0: Data returns nil once the item is queued for the next frame
	// (best effort: it may be lost on the way or in the gateway).
	//
	// QoS 1: Data returns once the gateway has settled the item: nil when
	// it is durable (answer your source now: the 2xx, the device's ack);
	// an error wrapping ErrRejected (it will never be taken: do not send
	// it again), ErrUnavailable (not taken now: the source should send it
	// again later) or ErrNoDataPath (the gateway keeps no data; the
	// evidence counted). It returns ctx's error when ctx ends first, and
	// ErrUnavailable when Run's context ends before the settlement: the
	// item may then have become durable all the same, so a source that
	// sends again may cause a duplicate — at least once, never lost.
	//
	// A gateway that takes no data at all (one older than the data path)
	// gets the evidence alone, and Data returns ErrNoDataPath at once.
	// Invalid data (QoS above 1, beyond MaxDataBytes) is refused with
	// ErrRejected before it is sent. The SDK reads Payload and Properties
	// when it encodes the frame, after a QoS 0 Data has returned: do not
	// change them after the call.
	Data(ctx context.Context, d Data) error
}

// Data is a message of a device (Sink.Data).
type Data struct {
	// Device and Instance name the device and its session, as in
	// Evidence.
	Device   string
	Instance string
	// Topic is the rest below the device's root topic: "" for the root
	// itself, else "/"-separated levels without wildcards
	// ("telemetry/temp").
	Topic string
	// Payload is the message's bytes, kept as they are.
	Payload []byte
	// ContentType is the payload's MIME type ("application/json"), ""
	// when unknown.
	ContentType string
	// QoS is 0 (best effort) or 1 (at least once: Data waits for the
	// gateway's settlement).
	QoS byte
	// Properties are user properties (MQTT 5 upstream), in order.
	Properties []Property
	// At is when the device said it; zero means when Data is called.
	At time.Time
	// Lease is the lease of the evidence the data is (Evidence.Lease).
	Lease time.Duration
}

// Property is one user property.
type Property struct{ Key, Value string }

// MaxDataBytes bounds one data item as the gateway counts it: payload,
// device, topic, content type and properties, plus 64 bytes of header
// (the gateway's gateway.MaxMessageBytes, which also counts the
// adapter's configured name).
const MaxDataBytes = 1 << 20

// Errors of Sink.Data, wrapped with the gateway's reason.
var (
	// ErrRejected: the gateway will never take this item: it is invalid
	// (device, instance, topic, size, QoS) or for a device the adapter
	// may not speak for.
	ErrRejected = errors.New("data rejected")
	// ErrUnavailable: the item was not taken now (beyond the adapter's
	// limits, the data path's disk failed, the stream ended before the
	// settlement); sending it again later may succeed.
	ErrUnavailable = errors.New("data not taken now")
	// ErrNoDataPath: the gateway keeps no device data; the item counted
	// as evidence of its session.
	ErrNoDataPath = errors.New("the gateway has no data path")
)

// Commander is implemented by an adapter that takes commands for its
// devices (the gateway then calls it; Info tells the gateway so). Command
// is called only while Run runs (after Ready), one command at a time,
// with a deadline in ctx, which also ends when Run's context does.
//
// Command returns nil when the adapter took the command: it sent it to
// the device or queued it where the device will get it (a network
// server's downlink queue). The gateway then counts it delivered and
// never hands it over again. An error refuses it (say why: the device is
// unreachable, the topic or payload is not one the adapter can carry):
// the command stays pending and comes again later, until it expires.
// Delivery is at least once: the same command (the same ID) may come
// again after it was taken.
type Commander interface {
	Command(ctx context.Context, c Command) error
}

// Command is a command for one of the adapter's devices.
type Command struct {
	// ID is the gateway's ID of the command; the same command delivered
	// again has the same ID.
	ID     uint64
	Device string
	// Topic is "cmd" or "cmd/<rest>", below the device's root topic.
	Topic       string
	Payload     []byte
	ContentType string
	Properties  []Property
	// Expires is when the gateway drops the command; zero for never.
	Expires time.Time
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
