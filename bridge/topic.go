package bridge

import (
	"fmt"
	"strings"

	"github.com/fleetgate/fleetgate/gateway"
)

// deviceTopic is the topic of rest below device's root under prefix:
// "<prefix>/<device>" or "<prefix>/<device>/<rest>".
func deviceTopic(prefix string, device gateway.DeviceID, rest string) string {
	if rest == "" {
		return prefix + "/" + string(device)
	}
	return prefix + "/" + string(device) + "/" + rest
}

// upstreamTopic is the topic a device's message is published on
// upstream: "<topicPrefix>/devices/<device>[/<rest>]".
func upstreamTopic(topicPrefix string, device gateway.DeviceID, rest string) string {
	return deviceTopic(topicPrefix+"/devices", device, rest)
}

// parseCommandTopic reads a topic the upstream broker delivered on the
// commands subscription, "<topicPrefix>/devices/<device>/cmd[/<rest>]":
// the device and the command's topic below the device's root ("cmd" or
// "cmd/<rest>"). It refuses a topic outside the subscription, an invalid
// device ID and a rest that ValidTopicRest refuses.
func parseCommandTopic(topicPrefix, topic string) (gateway.DeviceID, string, error) {
	below, ok := strings.CutPrefix(topic, topicPrefix+"/devices/")
	if !ok {
		return "", "", fmt.Errorf("topic %q is not below %q", topic, topicPrefix+"/devices/")
	}
	id, rest, ok := strings.Cut(below, "/")
	if !ok {
		return "", "", fmt.Errorf("topic %q: no command below the device", topic)
	}
	device, err := gateway.ParseDeviceID(id)
	if err != nil {
		return "", "", err
	}
	if rest != "cmd" && !strings.HasPrefix(rest, "cmd/") {
		return "", "", fmt.Errorf("topic %q: not a command (cmd or cmd/...)", topic)
	}
	if !gateway.ValidTopicRest(rest) {
		return "", "", fmt.Errorf("topic %q: invalid levels below the device", topic)
	}
	return device, rest, nil
}

// matchFilter reports whether topic matches the MQTT topic filter f
// (gateway.ValidTopicFilter(f) holds): "+" matches one level, a trailing "#" the
// level before it and every level below. Neither wildcard matches a
// topic starting with "$" at the first level.
func matchFilter(f, topic string) bool {
	if topic != "" && topic[0] == '$' && f != "" && (f[0] == '+' || f[0] == '#') {
		return false
	}
	for {
		fl, frest, fmore := strings.Cut(f, "/")
		if fl == "#" {
			return true
		}
		tl, trest, tmore := strings.Cut(topic, "/")
		if fl != "+" && fl != tl {
			return false
		}
		switch {
		case !fmore && !tmore:
			return true
		case !tmore:
			// "a/#" matches "a": the parent level of a trailing "#"
			return frest == "#"
		case !fmore:
			return false
		}
		f, topic = frest, trest
	}
}
