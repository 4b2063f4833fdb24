// Package proto is the contract between the fleetgate gateway and its
// adapter plugins: the gRPC service Adapter (adapter.proto, with the
// generated code committed next to it; `make generate` regenerates it with
// the generators pinned as tools in go.mod) and the go-plugin handshake
// both sides use.
//
// # The contract, call by call
//
// The host (protocols/adapter) starts the adapter executable under
// hashicorp/go-plugin (gRPC only, AutoMTLS, protocol version 1 in
// VersionedPlugins) and then calls, each with a deadline:
//
//   - Info: returns a non-empty name and version, the protocols the
//     adapter speaks, and commands = true when it takes commands
//     (Deliver). It has no side effect and may be called at any time,
//     before or after Configure.
//   - Configure(config, data): config is the adapter's `config` subtree
//     as JSON ("{}" when the gateway's configuration gives none); data is
//     true when the host reads Evidence.data and settles QoS 1 items (a
//     host older than data leaves it false: the adapter then sends none).
//     Called once per process, before Evidence. A config the adapter
//     cannot use is refused with codes.InvalidArgument and a message that
//     names the bad key; the host then reports the adapter failed and does
//     not call Evidence. A second Configure is refused with
//     codes.FailedPrecondition.
//   - Evidence: the adapter starts its work (listening, polling) and
//     streams EvidenceFrames to the host. The first frame has ready = true
//     (and may carry evidence); no later frame has. Evidence is batched:
//     one frame carries everything pending when it is sent. age_us is the
//     time since the device acted, measured when the frame is sent; the
//     host rejects an age beyond its lease and counts a negative one as 0. Only
//     one Evidence stream is open at a time: a second one, or one before
//     Configure, is refused with codes.FailedPrecondition. When the host
//     cancels the stream the adapter stops its work. Bad evidence (an
//     invalid device or instance) is rejected by the host item by item and
//     counted; it never ends the stream.
//   - Health: answers "ok" while the adapter can work. The host pings it
//     periodically; an error or a missed deadline makes the host restart
//     the adapter.
//   - Shutdown: stops the adapter's work, sends what is still pending on
//     the Evidence stream, ends that stream (io.EOF on the host), and
//     returns. It is idempotent. The process exits when the host then
//     closes the go-plugin connection.
//   - Settle(settlements): the host's answer about QoS 1 data (below):
//     after it has handled a frame, one call with a settlement for each
//     QoS 1 item of that frame (in no particular order), before it reads
//     the next frame: one call per such frame, so that an adapter may
//     count the calls to pace its frames (the SDK sends at most two
//     frames ahead of their settlements).
//     An id the adapter does not know (it stopped waiting) is ignored. A
//     settlement is sent once and never again: one lost with the stream
//     or the process leaves its item unsettled.
//   - Deliver(command): a command for one of the adapter's devices, only
//     to an adapter whose Info says commands = true and only while its
//     Evidence stream is open and ready (before that: codes.
//     FailedPrecondition). accepted = true means the adapter took it: it
//     sent it to the device, or queued it where the device will get it
//     (a network server's downlink queue); the host then acknowledges it
//     (gateway.Commands.Ack) and never delivers it again. accepted = false
//     (with a reason) or an error keeps it pending: the host tries it
//     again later, until it expires. The host delivers one command at a
//     time per adapter, a device's commands in order (the next one only
//     after the previous was accepted), each within a deadline.
//     Delivery is at least once: a command accepted just before the host
//     failed to acknowledge it is delivered again with the same id.
//
// Sessions: every evidence names the session "<adapter>/<instance>",
// where <adapter> is the name the gateway's configuration gives the
// adapter (not Info's name), so that two instances of one executable
// never share sessions. A crash of the adapter ends no session: the
// leases decide.
//
// Data: an Evidence item of kind CONNECT or RENEW may carry Data, what
// the device said (a LEAVE with data is rejected). The item is evidence
// of its session like any other, and its data goes to the gateway's data
// path as a message of the device (topic <device's root>/<data.topic>,
// source the adapter's configured name). Data rides on the evidence so
// that a device's data and its leave keep the order the adapter sent them
// in. The host checks an item with data as a whole: an invalid topic, a
// QoS other than 0 or 1, or a message beyond the data path's size rejects
// the whole item. QoS 1 data is at least once: its id is > 0 and unique
// within the process, and the host settles it (any item with an id, valid
// or not) once the data path has answered — DURABLE when it is on disk, else why not (REJECTED or
// REFUSED: never taken; DROPPED or FAILED: may be taken if sent again;
// DISCARDED: the gateway has no data path, the evidence counted). An
// adapter answers its own source (an HTTP request, a device's
// acknowledgement) only after the settlement, and a source whose item
// was not settled sends it again: duplicates are possible, losses not.
// QoS 0 data (id 0) is never settled.
package proto

import (
	"context"
	"errors"

	plugin "github.com/hashicorp/go-plugin"
	"google.golang.org/grpc"
)

// ProtocolVersion is the contract version of this package; a v2 would be
// served next to it in VersionedPlugins.
const ProtocolVersion = 1

// PluginName is the name under which the adapter is dispensed.
const PluginName = "adapter"

// Handshake is the go-plugin handshake of fleetgate adapters. The magic
// cookie only keeps an adapter executable from being run by hand by
// mistake; it is not a security measure.
var Handshake = plugin.HandshakeConfig{
	ProtocolVersion:  ProtocolVersion,
	MagicCookieKey:   "FLEETGATE_ADAPTER_PLUGIN",
	MagicCookieValue: "4b1f2c55-presence-evidence-v1",
}

// VersionedPlugins is the plugin set of each protocol version, for the
// host (which needs no Server) and the adapter (which passes its own).
func VersionedPlugins(server AdapterServer) map[int]plugin.PluginSet {
	return map[int]plugin.PluginSet{
		ProtocolVersion: {PluginName: &GRPCPlugin{Impl: server}},
	}
}

// GRPCPlugin is the go-plugin glue of the Adapter service: the adapter
// side registers Impl, the host side gets an AdapterClient.
type GRPCPlugin struct {
	plugin.NetRPCUnsupportedPlugin
	// Impl is the adapter's implementation (nil on the host).
	Impl AdapterServer
}

var _ plugin.GRPCPlugin = (*GRPCPlugin)(nil)

// GRPCServer registers the adapter's implementation.
func (p *GRPCPlugin) GRPCServer(_ *plugin.GRPCBroker, s *grpc.Server) error {
	if p.Impl == nil {
		return errors.New("adapter plugin: no server implementation")
	}
	RegisterAdapterServer(s, p.Impl)
	return nil
}

// GRPCClient returns the host's client of the adapter.
func (p *GRPCPlugin) GRPCClient(_ context.Context, _ *plugin.GRPCBroker, c *grpc.ClientConn) (any, error) {
	return NewAdapterClient(c), nil
}
