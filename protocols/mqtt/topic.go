package mqtt

import (
	"strings"

	"github.com/fleetgate/fleetgate/gateway"
)

// Topics of the data path. A device's root is "<prefix>/<device>"
// ("<device>" without a prefix); what it publishes there goes up with the
// topic below its root (the rest: "" for the root itself), and its
// commands arrive under "<root>/cmd", which it may read but not write.

// commandLevel is the first level of the command subtree below a root.
const commandLevel = "cmd"

// splitTopic parses topic as a device's root or a topic below it, under
// prefix: "<prefix>/<device>" (rest "") or "<prefix>/<device>/<rest>".
// ok is false when topic is not under prefix, its device level is not a
// device ID, or the rest is empty after a "/" ("<prefix>/<device>/", which
// a rest cannot tell from the root). rest is returned as it is: the data
// path checks it (gateway.ValidTopicRest).
func splitTopic(prefix, topic string) (device gateway.DeviceID, rest string, ok bool) {
	if prefix != "" {
		after, found := strings.CutPrefix(topic, prefix)
		if !found || after == "" || after[0] != '/' {
			return "", "", false
		}
		topic = after[1:]
	}
	id, rest, slash := strings.Cut(topic, "/")
	device, err := gateway.ParseDeviceID(id)
	if err != nil || (slash && rest == "") {
		return "", "", false
	}
	return device, rest, true
}

// restBelow is topic's rest below root ("" for root itself); ok is false
// when topic is not root or below it, or is root followed by "/" only.
func restBelow(topic, root string) (rest string, ok bool) {
	after, found := strings.CutPrefix(topic, root)
	switch {
	case !found:
		return "", false
	case after == "":
		return "", true
	case after[0] == '/' && len(after) > 1:
		return after[1:], true
	}
	return "", false
}

// isCommand reports whether rest (a topic below a root) is in the command
// subtree: "cmd" or "cmd/...".
func isCommand(rest string) bool {
	after, ok := strings.CutPrefix(rest, commandLevel)
	return ok && (after == "" || after[0] == '/')
}

// covers reports whether every topic that filter f matches, filter r
// matches too; for a topic name f (no wildcards), whether r matches it.
// MQTT's rules: "+" is one level, "#" the rest including its parent
// ("a/#" matches "a"), and a filter starting with a wildcard matches no
// topic starting with "$".
func covers(r, f string) bool {
	if f != "" && f[0] == '$' && r != "" && (r[0] == '+' || r[0] == '#') {
		return false
	}
	fDone := false
	for {
		rl, rRest, rMore := strings.Cut(r, "/")
		if rl == "#" {
			return true
		}
		if fDone {
			return false
		}
		fl, fRest, fMore := strings.Cut(f, "/")
		if rl == "+" {
			if fl == "#" {
				return false
			}
		} else if fl != rl {
			return false
		}
		if !rMore {
			return !fMore
		}
		r, f, fDone = rRest, fRest, !fMore
	}
}

// unshared is filter without a shared subscription's "$share/<group>/".
// The prefix is matched in any case, as the broker does.
func unshared(filter string) string {
	const share = "$share/"
	if len(filter) < len(share) || !strings.EqualFold(filter[:len(share)], share) {
		return filter
	}
	if _, f, ok := strings.Cut(filter[len(share):], "/"); ok {
		return f
	}
	return filter
}
