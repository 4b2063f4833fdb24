package configs

import (
	"time"

	"github.com/fleetgate/fleetgate/gateway"
)

// DefaultCanaryLive is how long the canary heartbeats before it stops.
const DefaultCanaryLive = Duration(5 * time.Minute)

// CanaryConfig is the presence canary (docs/design.md §6.3, §6.6): a
// synthetic device of the gateway itself, sent through its own CoAP front
// end, stopped on a schedule, and timed until its offline event.
type CanaryConfig struct {
	Enabled bool `yaml:"enabled"`
	// Device is the canary's device ID; empty means canary-<gateway.id>.
	Device string `yaml:"device"`
	// Live is how long the canary heartbeats before it goes silent.
	Live Duration `yaml:"live"`
}

// CanaryDevice is the canary's device ID: canary.device, or
// canary-<gateway.id> when that is empty.
func (c Config) CanaryDevice() string {
	if c.Canary.Device != "" {
		return c.Canary.Device
	}
	return "canary-" + c.Gateway.ID
}

// CanaryDTLS reports whether the canary speaks DTLS (listen.coap.dtls is
// set) rather than plain UDP.
func (c Config) CanaryDTLS() bool { return c.Listen.CoAP.DTLS != "" }

func (c Config) validateCanary(p *problems) {
	cn := c.Canary
	p.positive("canary.live", cn.Live)
	if !cn.Enabled {
		return
	}
	id := c.CanaryDevice()
	if _, err := gateway.ParseDeviceID(id); err != nil {
		p.add("canary.device", "%q: %v", id, err)
	}
	if cn.Live < c.Presence.HeartbeatInterval {
		p.add("canary.live", "%s must be at least presence.heartbeat_interval (%s): the canary heartbeats in its live phase", cn.Live, c.Presence.HeartbeatInterval)
	}
	l := c.Listen.CoAP
	if l.DTLS == "" && (l.UDP == "" || !c.Auth.AllowAnonymous) {
		p.add("canary.enabled", "the canary needs a CoAP listener it can reach: listen.coap.dtls, or listen.coap.udp with auth.allow_anonymous")
	}
	for _, a := range c.Plugins.Adapters {
		for _, d := range a.Devices {
			if entriesOverlap(d, id) {
				p.add("canary.device", "%q is one of adapter %q's devices (%q): the canary must be a device of its own", id, a.Name, d)
			}
		}
	}
}
