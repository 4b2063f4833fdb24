package bridge

import (
	"strings"
	"testing"

	"github.com/fleetgate/fleetgate/gateway"
)

func TestParseCommandTopic(t *testing.T) {
	for _, tc := range []struct {
		topic, device, rest string
	}{
		{"fg/gw/devices/d1/cmd", "d1", "cmd"},
		{"fg/gw/devices/d1/cmd/reboot", "d1", "cmd/reboot"},
		{"fg/gw/devices/a.b:c-d_e/cmd/x/y", "a.b:c-d_e", "cmd/x/y"},
		{"fg/gw/devices/d1/cmdx", "", ""},
		{"fg/gw/devices/d1", "", ""},
		{"fg/gw/devices//cmd", "", ""},
		{"fg/gw/devices/d 1/cmd", "", ""},
		{"fg/gw/devices/d1/cmd/", "", ""},
		{"fg/gw/devices/d1/cmd//x", "", ""},
		{"fg/gw/devices/d1/telemetry", "", ""},
		{"other/devices/d1/cmd", "", ""},
		{"fg/gw/devicesd1/cmd", "", ""},
	} {
		device, rest, err := parseCommandTopic("fg/gw", tc.topic)
		if tc.device == "" {
			if err == nil {
				t.Errorf("%q: parsed as %q %q, want an error", tc.topic, device, rest)
			}
			continue
		}
		if err != nil || string(device) != tc.device || rest != tc.rest {
			t.Errorf("%q: %q %q %v, want %q %q", tc.topic, device, rest, err, tc.device, tc.rest)
		}
	}
}

// FuzzCommandTopic: a topic the upstream broker delivers is outside
// input. Whatever it is, a topic parsed is a valid command's (a message
// with it passes ValidateMessage) and is the one the device's command
// would be published on: parsing inverts upstreamTopic.
func FuzzCommandTopic(f *testing.F) {
	for _, s := range []string{"fg/gw/devices/d1/cmd", "fg/gw/devices/d1/cmd/a/b", "fg/gw/devices/+/cmd/#",
		"fg/gw/devices/d1/cmd/$x", "fg/gw/devices/d1/cmd/\x00", "fg/gw/devices/" + strings.Repeat("x", 129) + "/cmd"} {
		f.Add("fg/gw", s)
	}
	f.Fuzz(func(t *testing.T, prefix, topic string) {
		device, rest, err := parseCommandTopic(prefix, topic)
		if err != nil {
			return
		}
		if got := upstreamTopic(prefix, device, rest); got != topic {
			t.Fatalf("parse(%q) = %q %q, published on %q", topic, device, rest, got)
		}
		if !isCommandTopic(rest) {
			t.Fatalf("parse(%q): rest %q is no command's topic", topic, rest)
		}
		if err := gateway.ValidateMessage(gateway.Message{Device: device, Topic: rest}); err != nil {
			t.Fatalf("parse(%q) = %q %q: %v", topic, device, rest, err)
		}
	})
}

func TestMatchFilter(t *testing.T) {
	for _, tc := range []struct {
		filter, topic string
		want          bool
	}{
		{"devices/#", "devices/d1", true},
		{"devices/#", "devices", true},
		{"devices/#", "devicesx/d1", false},
		{"#", "devices/d1/x", true},
		{"#", "$SYS/x", false},
		{"+/d1", "$SYS/d1", false},
		{"devices/+", "devices/d1", true},
		{"devices/+", "devices/d1/x", false},
		{"devices/+/telemetry/#", "devices/d1/telemetry", true},
		{"devices/+/telemetry/#", "devices/d1/telemetry/a/b", true},
		{"devices/+/telemetry/#", "devices/d1/telemetryx", false},
		{"devices/+/+", "devices/d1", false},
		{"devices/d1", "devices/d1", true},
		{"devices/d1", "devices/d2", false},
		{"a/+/c", "a//c", true},
	} {
		if got := matchFilter(tc.filter, tc.topic); got != tc.want {
			t.Errorf("match(%q, %q) = %v, want %v", tc.filter, tc.topic, got, tc.want)
		}
	}
	for _, f := range []string{"", "a/#/b", "a+", "a/b#", "#/"} {
		if gateway.ValidTopicFilter(f) {
			t.Errorf("gateway.ValidTopicFilter(%q) = true", f)
		}
	}
}

// FuzzMatchFilter checks matchFilter against the MQTT rules written the
// plain way, level by level (a device's topic is outside input).
func FuzzMatchFilter(f *testing.F) {
	for _, s := range [][2]string{{"devices/#", "devices/d1/t"}, {"devices/+/t/#", "devices/d1/t"}, {"+/+", "a/b"},
		{"#", "$SYS/a"}, {"a/+", "a/"}, {"a/#", "a"}, {"+", ""}} {
		f.Add(s[0], s[1])
	}
	f.Fuzz(func(t *testing.T, filter, topic string) {
		if !gateway.ValidTopicFilter(filter) {
			return
		}
		if got, want := matchFilter(filter, topic), matchPlain(filter, topic); got != want {
			t.Fatalf("match(%q, %q) = %v, want %v", filter, topic, got, want)
		}
	})
}

func matchPlain(filter, topic string) bool {
	if strings.HasPrefix(topic, "$") && (strings.HasPrefix(filter, "+") || strings.HasPrefix(filter, "#")) {
		return false
	}
	fl, tl := strings.Split(filter, "/"), strings.Split(topic, "/")
	for i, l := range fl {
		if l == "#" {
			return true
		}
		if i == len(tl) {
			return false
		}
		if l != "+" && l != tl[i] {
			return false
		}
	}
	return len(fl) == len(tl)
}
