package configs

import (
	"net/url"
	"strings"
	"time"
)

// EventsMQTTConfig is events.mqtt: publishing presence events to an
// upstream MQTT broker (docs/events.md). An empty URL disables it.
type EventsMQTTConfig struct {
	// URL is mqtt://host:port, or mqtts://host:port for TLS.
	URL string `yaml:"url"`
	// ClientID is the MQTT client ID; empty means
	// "fleetgate-<gateway.id>-<pid>" (unique per process, as the broker
	// needs: a gateway and a runner may share one configuration).
	ClientID string `yaml:"client_id"`
	Username string `yaml:"username"`
	Password string `yaml:"password"`
	// PasswordFile names a file holding the password instead
	// (configs/secrets.go).
	PasswordFile string `yaml:"password_file"`
	// TLS names PEM files: a CA bundle (empty: the system roots) and a
	// client certificate and key (both or neither).
	TLS         EventsMQTTTLS `yaml:"tls"`
	TopicPrefix string        `yaml:"topic_prefix"`
	QoS         int           `yaml:"qos"`
	RetainState bool          `yaml:"retain_state"`
	// OfflineDelay holds offline events back; one followed by the
	// device's online event within it is published as neither.
	OfflineDelay Duration `yaml:"offline_delay"`
}

// EventsMQTTTLS names the PEM files of events.mqtt.tls.
type EventsMQTTTLS struct {
	CA   string `yaml:"ca"`
	Cert string `yaml:"cert"`
	Key  string `yaml:"key"`
}

// defaultEventsMQTT is events.mqtt by default: disabled.
func defaultEventsMQTT() EventsMQTTConfig {
	return EventsMQTTConfig{TopicPrefix: "fleetgate", QoS: 1, RetainState: true}
}

// Enabled reports whether the publisher runs.
func (m EventsMQTTConfig) Enabled() bool { return m.URL != "" }

// MaxOfflineDelay bounds events.mqtt.offline_delay.
const MaxOfflineDelay = time.Hour

func (c Config) validateEventsMQTT(p *problems) {
	m := c.Events.MQTT
	if m.URL != "" {
		u, err := url.Parse(m.URL)
		switch {
		case err != nil:
			p.add("events.mqtt.url", "%v", err)
		case !oneOf(u.Scheme, "mqtt", "mqtts", "tcp", "tls", "ssl") || u.Host == "":
			p.add("events.mqtt.url", "%q: want mqtt://host:port or mqtts://host:port", m.URL)
		case u.User != nil:
			p.add("events.mqtt.url", "credentials go in events.mqtt.username and password, not in the URL")
		case !oneOf(u.Scheme, "mqtts", "tls", "ssl") && m.TLS != (EventsMQTTTLS{}):
			p.add("events.mqtt.tls", "is set, but events.mqtt.url %q connects without TLS: use mqtts://%s, or leave events.mqtt.tls empty", m.URL, u.Host)
		}
	}
	if m.QoS < 0 || m.QoS > 2 {
		p.add("events.mqtt.qos", "must be 0, 1 or 2, got %d", m.QoS)
	}
	tp := m.TopicPrefix
	if tp == "" || strings.ContainsAny(tp, "+#\x00") || strings.HasPrefix(tp, "/") || strings.HasSuffix(tp, "/") || strings.HasPrefix(tp, "$") {
		p.add("events.mqtt.topic_prefix", "%q: want topic levels without wildcards, $ or a leading or trailing /", tp)
	}
	if (m.TLS.Cert == "") != (m.TLS.Key == "") {
		p.add("events.mqtt.tls", "cert and key go together")
	}
	if m.OfflineDelay < 0 || m.OfflineDelay.Std() > MaxOfflineDelay {
		p.add("events.mqtt.offline_delay", "must be between 0 and %s, got %s", Duration(MaxOfflineDelay), m.OfflineDelay)
	}
}
