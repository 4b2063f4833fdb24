package configs_test

import (
	"testing"

	"github.com/fleetgate/fleetgate/configs"
)

// events.mqtt.tls applies to TLS URLs only: with mqtt:// the publisher
// would connect in the clear and ignore it, so the combination is refused.
func TestEventsMQTTTLSNeedsTLSURL(t *testing.T) {
	for _, tc := range []struct {
		url  string
		tls  configs.EventsMQTTTLS
		want string
	}{
		{"mqtt://broker:1883", configs.EventsMQTTTLS{CA: "/etc/ca.pem"},
			`events.mqtt.tls: is set, but events.mqtt.url "mqtt://broker:1883" connects without TLS: use mqtts://broker:1883, or leave events.mqtt.tls empty`},
		{"tcp://10.0.0.1:1883", configs.EventsMQTTTLS{Cert: "/c.pem", Key: "/k.pem"},
			`events.mqtt.tls: is set, but events.mqtt.url "tcp://10.0.0.1:1883" connects without TLS: use mqtts://10.0.0.1:1883, or leave events.mqtt.tls empty`},
		{"mqtts://broker:8883", configs.EventsMQTTTLS{CA: "/etc/ca.pem", Cert: "/c.pem", Key: "/k.pem"}, ""},
		{"tls://broker:8883", configs.EventsMQTTTLS{CA: "/etc/ca.pem"}, ""},
		{"ssl://broker:8883", configs.EventsMQTTTLS{CA: "/etc/ca.pem"}, ""},
		{"mqtt://broker:1883", configs.EventsMQTTTLS{}, ""},
	} {
		c := configs.Default()
		c.Events.MQTT.URL, c.Events.MQTT.TLS = tc.url, tc.tls
		err := c.Validate()
		if tc.want == "" && err != nil || tc.want != "" && (err == nil || err.Error() != tc.want) {
			t.Errorf("%s with %+v: %v, want %q", tc.url, tc.tls, err, tc.want)
		}
	}
}
