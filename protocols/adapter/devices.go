package adapter

import (
	"strings"

	"github.com/fleetgate/fleetgate/gateway"
)

// namespace is the set of device IDs an adapter may speak for, built from
// Spec.Devices: an entry ending in "*" is a prefix ("*" alone: every ID),
// any other entry one exact ID. No entry: no device.
type namespace struct {
	ids      map[gateway.DeviceID]struct{}
	prefixes []string
}

func newNamespace(entries []string) namespace {
	n := namespace{ids: make(map[gateway.DeviceID]struct{})}
	for _, e := range entries {
		if p, ok := strings.CutSuffix(e, "*"); ok {
			n.prefixes = append(n.prefixes, p)
		} else {
			n.ids[gateway.DeviceID(e)] = struct{}{}
		}
	}
	return n
}

func (n namespace) has(d gateway.DeviceID) bool {
	if _, ok := n.ids[d]; ok {
		return true
	}
	for _, p := range n.prefixes {
		if strings.HasPrefix(string(d), p) {
			return true
		}
	}
	return false
}

// Reasons an adapter may not speak for a device.
const (
	refusedListed  = "listed in the devices file"
	refusedOutside = "outside the adapter's devices"
)

// refusal says why an adapter of namespace n may not speak for device d,
// or "" when it may. A device of the devices file (listed) authenticates
// itself over CoAP or MQTT: no adapter speaks for it, whatever its
// namespace says.
func (n namespace) refusal(d gateway.DeviceID, listed bool) string {
	switch {
	case listed:
		return refusedListed
	case !n.has(d):
		return refusedOutside
	}
	return ""
}
