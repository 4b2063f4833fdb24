package main

import (
	"crypto/rand"
	"fmt"
	"log/slog"
	"net"
	"slices"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/fleetgate/fleetgate/canary"
	"github.com/fleetgate/fleetgate/configs"
	"github.com/fleetgate/fleetgate/gateway"
	"github.com/fleetgate/fleetgate/protocols/coap"
)

// canaryKey makes the canary's PSK for this process (over DTLS), or nil
// when the canary is off or sends plain UDP.
func canaryKey(cfg configs.Config) []byte {
	if !cfg.Canary.Enabled || !cfg.CanaryDTLS() {
		return nil
	}
	key := make([]byte, 32)
	_, _ = rand.Read(key)
	return key
}

// canaryCredentials are the devices file's credentials with the canary's
// key for this process added: the CoAP front end takes the canary's DTLS
// handshake like any listed device's.
type canaryCredentials struct {
	gateway.Credentials
	id  gateway.DeviceID
	key []byte
}

var _ gateway.LeaseCredentials = canaryCredentials{}

func (c canaryCredentials) PSK(identity []byte) (gateway.DeviceID, []byte, error) {
	if string(identity) == string(c.id) {
		return c.id, c.key, nil
	}
	return c.Credentials.PSK(identity)
}

func (c canaryCredentials) CheckPassword(device gateway.DeviceID, password []byte) error {
	if device == c.id {
		return gateway.ErrUnauthorized
	}
	return c.Credentials.CheckPassword(device, password)
}

// Lease is the devices file's lease of device; the canary has none (its
// bound is the lease's).
func (c canaryCredentials) Lease(device gateway.DeviceID) time.Duration {
	if device == c.id {
		return 0
	}
	return gateway.DeviceLease(c.Credentials, device)
}

func (c canaryCredentials) Revision(device gateway.DeviceID) string {
	if device == c.id {
		return "canary"
	}
	return c.Credentials.Revision(device)
}

// coapCredentials are the credentials the CoAP front end checks: the
// devices file's, with the canary's key when it speaks DTLS.
func (g *gatewayProcess) coapCredentials() gateway.Credentials {
	if g.creds == nil {
		return nil
	}
	if g.canaryKey == nil {
		return g.creds
	}
	return canaryCredentials{Credentials: g.creds, id: g.canaryID, key: g.canaryKey}
}

// openCanary creates the canary (nil when canary.enabled is off) on the
// CoAP listener coapServer bound.
func (g *gatewayProcess) openCanary(cfg configs.Config, coapServer *coap.Server, log *slog.Logger, reg prometheus.Registerer) (*canary.Canary, error) {
	if !cfg.Canary.Enabled {
		return nil, nil
	}
	id := g.canaryID
	if g.creds != nil && g.creds.Revision(id) != "" {
		return nil, configError{fmt.Errorf("canary.device: %q is listed in auth.devices_file %s: the canary must be a device of its own", id, cfg.Auth.DevicesFile)}
	}
	addr := coapServer.Addr()
	if g.canaryKey != nil {
		addr = coapServer.DTLSAddr()
	}
	var upstream func(int) bool
	if g.pub != nil {
		upstream = func(shard int) bool { return slices.Contains(g.pub.Stats().Shards, shard) }
	}
	b := cfg.Bounds()
	return canary.New(canary.Options{
		Device: id, Addr: loopback(addr), PSK: g.canaryKey,
		Plan: canary.Plan{
			Heartbeat: cfg.Presence.HeartbeatInterval.Std(), Live: cfg.Canary.Live.Std(),
			Bound: b.WorstCaseDetection.Std(),
		},
		Store: g.store, Upstream: upstream, Logger: log, Registerer: reg,
	})
}

// loopback is the address to reach a listener bound to addr from this
// host: an unspecified IP (":5683") becomes the loopback address.
func loopback(addr net.Addr) string {
	u, ok := addr.(*net.UDPAddr)
	if !ok || !u.IP.IsUnspecified() {
		return addr.String()
	}
	ip := net.IPv4(127, 0, 0, 1)
	if u.IP.To4() == nil {
		ip = net.IPv6loopback
	}
	return (&net.UDPAddr{IP: ip, Port: u.Port}).String()
}

// published hands an event the publisher had acknowledged to the canary.
func (g *gatewayProcess) published(e gateway.Event) {
	if g.canary != nil {
		g.canary.Published(e)
	}
}
