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
//   - Info: returns a non-empty name and version, and the protocols the
//     adapter speaks. It has no side effect and may be called at any time,
//     before or after Configure.
//   - Configure(config): the adapter's `config` subtree as JSON ("{}" when
//     the gateway's configuration gives none). Called once per process,
//     before Evidence. A config the adapter cannot use is refused with
//     codes.InvalidArgument and a message that names the bad key; the host
//     then reports the adapter failed and does not call Evidence. A second
//     Configure is refused with codes.FailedPrecondition.
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
//
// Sessions: every evidence names the session "<adapter>/<instance>",
// where <adapter> is the name the gateway's configuration gives the
// adapter (not Info's name), so that two instances of one executable
// never share sessions. A crash of the adapter ends no session: the
// leases decide.
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
