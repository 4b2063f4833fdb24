package configs

import (
	"fmt"
	"net/url"
	"strconv"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/fleetgate/fleetgate/gateway"
)

// BridgeConfig is bridge: the data path (docs/design.md §6.14). Device
// messages reach local MQTT consumers always, and an upstream broker
// when bridge.mqtt.url is set; commands come down from it and from local
// clients.
type BridgeConfig struct {
	MQTT     BridgeMQTTConfig     `yaml:"mqtt"`
	Queue    BridgeQueueConfig    `yaml:"queue"`
	Commands BridgeCommandsConfig `yaml:"commands"`
}

// BridgeMQTTConfig is bridge.mqtt: the upstream broker. An empty URL
// means none.
type BridgeMQTTConfig struct {
	// URL is mqtt://host:port, or mqtts://host:port for TLS.
	URL string `yaml:"url"`
	// ClientID is the MQTT client ID; empty means
	// "fleetgate-<gateway.id>-bridge". The bridge keeps a persistent
	// session under it (its command subscription), so it must be unique
	// per gateway and stable across restarts.
	ClientID string `yaml:"client_id"`
	Username string `yaml:"username"`
	Password string `yaml:"password"`
	// PasswordFile names a file holding the password instead
	// (configs/secrets.go).
	PasswordFile string          `yaml:"password_file"`
	TLS          BridgeTLSConfig `yaml:"tls"`
	// ProtocolVersion is 5 (MQTT 5: content types and user properties
	// kept) or 4 (MQTT 3.1.1: payloads only).
	ProtocolVersion int `yaml:"protocol_version"`
	// TopicPrefix is the upstream topics' first level(s): a device's
	// message goes to <topic_prefix>/devices/<id>/<rest>; empty means
	// "fleetgate/<gateway.id>".
	TopicPrefix string `yaml:"topic_prefix"`
	// Up lists the local topic filters forwarded upstream, matched
	// against <auth.topic_prefix>/<id>/<rest>; empty forwards every
	// device message (<auth.topic_prefix>/#).
	Up []string `yaml:"up"`
	// Down subscribes <topic_prefix>/devices/+/cmd/# and makes what
	// arrives there commands.
	Down bool `yaml:"down"`
}

// BridgeTLSConfig names the PEM files of bridge.mqtt.tls and the server
// name to verify.
type BridgeTLSConfig struct {
	CA         string `yaml:"ca"`
	Cert       string `yaml:"cert"`
	Key        string `yaml:"key"`
	ServerName string `yaml:"server_name"`
}

// BridgeQueueConfig is bridge.queue: what waits for the upstream. QoS 1
// messages wait in <gateway.state_dir>/bridge.db (bbolt), QoS 0 messages
// in memory; both drop their oldest messages when full, and any older
// than max_age.
type BridgeQueueConfig struct {
	MaxBytes ByteSize `yaml:"max_bytes"`
	MaxAge   Duration `yaml:"max_age"`
	// CommitInterval spaces the durable queue's commits (one fsync each):
	// a QoS 1 message is acknowledged to its device after at most about
	// this and one commit. 0 commits as soon as the last commit ended.
	CommitInterval Duration `yaml:"commit_interval"`
	// MemoryBytes bounds the QoS 0 queue.
	MemoryBytes ByteSize `yaml:"memory_bytes"`
}

// BridgeCommandsConfig is bridge.commands: commands pending for devices.
type BridgeCommandsConfig struct {
	TTL                 Duration `yaml:"ttl"`
	MaxPendingPerDevice int      `yaml:"max_pending_per_device"`
}

// Defaults of bridge.
const (
	DefaultBridgeQueueBytes   = 256 << 20
	DefaultBridgeMemoryBytes  = 16 << 20
	DefaultBridgeQueueMaxAge  = 24 * time.Hour
	DefaultBridgeCommit       = 10 * time.Millisecond
	DefaultCommandTTL         = time.Hour
	DefaultMaxPendingCommands = 32
	// MaxCommandTTL bounds bridge.commands.ttl.
	MaxCommandTTL = 7 * 24 * time.Hour
	// MaxCommitInterval bounds bridge.queue.commit_interval: a QoS 1
	// message waits for the commit before its device hears back.
	MaxCommitInterval = time.Second
)

// defaultBridge is bridge by default: no upstream, local consumers only.
func defaultBridge() BridgeConfig {
	return BridgeConfig{
		MQTT: BridgeMQTTConfig{ProtocolVersion: 5, Up: []string{}, Down: true},
		Queue: BridgeQueueConfig{MaxBytes: DefaultBridgeQueueBytes, MaxAge: Duration(DefaultBridgeQueueMaxAge),
			CommitInterval: Duration(DefaultBridgeCommit), MemoryBytes: DefaultBridgeMemoryBytes},
		Commands: BridgeCommandsConfig{TTL: Duration(DefaultCommandTTL), MaxPendingPerDevice: DefaultMaxPendingCommands},
	}
}

// Enabled reports whether an upstream broker is configured.
func (m BridgeMQTTConfig) Enabled() bool { return m.URL != "" }

// Prefix is the upstream topic prefix, its default resolved for gateway
// id.
func (m BridgeMQTTConfig) Prefix(id string) string {
	if m.TopicPrefix == "" {
		return "fleetgate/" + id
	}
	return m.TopicPrefix
}

// UpFilters is bridge.mqtt.up with its default resolved for the local
// topic prefix.
func (c Config) UpFilters() []string {
	if len(c.Bridge.MQTT.Up) == 0 {
		return []string{c.Auth.TopicPrefix + "/#"}
	}
	return c.Bridge.MQTT.Up
}

func (c Config) validateBridge(p *problems) {
	m := c.Bridge.MQTT
	if m.URL != "" {
		u, err := url.Parse(m.URL)
		switch {
		case err != nil:
			p.add("bridge.mqtt.url", "%v", err)
		case !oneOf(u.Scheme, "mqtt", "mqtts", "tcp", "tls", "ssl") || u.Host == "":
			p.add("bridge.mqtt.url", "%q: want mqtt://host:port or mqtts://host:port", m.URL)
		case u.User != nil:
			p.add("bridge.mqtt.url", "credentials go in bridge.mqtt.username and password, not in the URL")
		case !oneOf(u.Scheme, "mqtts", "tls", "ssl") && m.TLS != (BridgeTLSConfig{}):
			p.add("bridge.mqtt.tls", "is set, but bridge.mqtt.url %q connects without TLS: use mqtts://%s, or leave bridge.mqtt.tls empty", m.URL, u.Host)
		}
	}
	if m.ClientID != "" {
		if _, err := gateway.ParseDeviceID(m.ClientID); err != nil {
			p.add("bridge.mqtt.client_id", "%q: want 1 to %d characters of [A-Za-z0-9._:-]", m.ClientID, gateway.MaxDeviceIDLen)
		}
	}
	if m.ProtocolVersion != 4 && m.ProtocolVersion != 5 {
		p.add("bridge.mqtt.protocol_version", "must be 5 (MQTT 5) or 4 (MQTT 3.1.1), got %d", m.ProtocolVersion)
	}
	if tp := m.TopicPrefix; tp != "" && !validTopicName(tp) {
		p.add("bridge.mqtt.topic_prefix", "%q: want topic levels without wildcards, $ or a leading or trailing /", tp)
	}
	if (m.TLS.Cert == "") != (m.TLS.Key == "") {
		p.add("bridge.mqtt.tls", "cert and key go together")
	}
	for i, f := range m.Up {
		if !gateway.ValidTopicFilter(f) {
			p.add(fmt.Sprintf("bridge.mqtt.up[%d]", i), "%q: not an MQTT topic filter (levels separated by /, + alone in a level, # alone and last)", f)
		}
	}
	q := c.Bridge.Queue
	if q.MaxBytes < 1<<20 {
		p.add("bridge.queue.max_bytes", "must be at least 1MiB, got %s", q.MaxBytes)
	}
	if q.MemoryBytes < 64<<10 {
		p.add("bridge.queue.memory_bytes", "must be at least 64KiB, got %s", q.MemoryBytes)
	}
	if q.MaxAge < Duration(time.Minute) {
		p.add("bridge.queue.max_age", "must be at least 1m, got %s", q.MaxAge)
	}
	if q.CommitInterval < 0 || q.CommitInterval.Std() > MaxCommitInterval {
		p.add("bridge.queue.commit_interval", "must be between 0 and %s, got %s", Duration(MaxCommitInterval), q.CommitInterval)
	}
	cm := c.Bridge.Commands
	if cm.TTL < Duration(time.Second) || cm.TTL.Std() > MaxCommandTTL {
		p.add("bridge.commands.ttl", "must be between 1s and %s, got %s", Duration(MaxCommandTTL), cm.TTL)
	}
	if cm.MaxPendingPerDevice < 1 || cm.MaxPendingPerDevice > 1024 {
		p.add("bridge.commands.max_pending_per_device", "must be between 1 and 1024, got %d", cm.MaxPendingPerDevice)
	}
}

// validTopicName reports whether s is a topic name of non-empty levels
// without wildcards, NUL or a leading $.
func validTopicName(s string) bool {
	return s != "" && !strings.HasPrefix(s, "$") && gateway.ValidTopicRest(s)
}

// ByteSize is a size in bytes, written as a number with a unit: B, KiB,
// MiB, GiB (powers of 1024) or KB, MB, GB (powers of 1000); a bare number
// is refused, as for durations.
type ByteSize int64

var byteUnits = []struct {
	suffix string
	n      int64
}{
	{"KiB", 1 << 10}, {"MiB", 1 << 20}, {"GiB", 1 << 30},
	{"KB", 1000}, {"MB", 1000_000}, {"GB", 1000_000_000}, {"B", 1},
}

// String writes b with the largest binary unit that divides it.
func (b ByteSize) String() string {
	for _, u := range []struct {
		suffix string
		n      int64
	}{{"GiB", 1 << 30}, {"MiB", 1 << 20}, {"KiB", 1 << 10}} {
		if b != 0 && int64(b)%u.n == 0 {
			return strconv.FormatInt(int64(b)/u.n, 10) + u.suffix
		}
	}
	return strconv.FormatInt(int64(b), 10) + "B"
}

// MarshalText writes b as String does.
func (b ByteSize) MarshalText() ([]byte, error) { return []byte(b.String()), nil }

// UnmarshalText parses a size with its unit.
func (b *ByteSize) UnmarshalText(t []byte) error {
	s := strings.TrimSpace(string(t))
	for _, u := range byteUnits {
		num, ok := strings.CutSuffix(s, u.suffix)
		if !ok {
			continue
		}
		v, err := strconv.ParseInt(strings.TrimSpace(num), 10, 64)
		if err != nil || v < 0 || v > (1<<50)/u.n {
			break
		}
		*b = ByteSize(v * u.n)
		return nil
	}
	if _, err := strconv.ParseInt(s, 10, 64); err == nil {
		return fmt.Errorf("size %s has no unit (write \"%sB\" for bytes, or use KiB, MiB, GiB)", s, s)
	}
	return fmt.Errorf("invalid size %q (want a whole number with a unit: B, KiB, MiB, GiB, KB, MB or GB, as in \"256MiB\")", s)
}

// UnmarshalYAML parses a scalar size and refuses a non-scalar.
func (b *ByteSize) UnmarshalYAML(n *yaml.Node) error {
	if n.Kind != yaml.ScalarNode || n.ShortTag() == "!!null" {
		return fmt.Errorf("want a size such as \"256MiB\", got %s", describe(n))
	}
	return b.UnmarshalText([]byte(n.Value))
}

// LocalClient is one entry of auth.clients: an MQTT client that is not a
// device (a site's Node-RED, telegraf, a dashboard). It logs in with
// Name as its MQTT user name and a password whose bcrypt hash is
// PasswordBcrypt (`fleetgate hash-password`), holds no presence, and may
// subscribe to the topic filters of Read and publish to those of Write
// (under <auth.topic_prefix>/+/cmd/..., a publish is a command).
type LocalClient struct {
	Name           string   `yaml:"name"`
	PasswordBcrypt string   `yaml:"password_bcrypt"`
	Read           []string `yaml:"read"`
	Write          []string `yaml:"write"`
}

func (c Config) validateClients(p *problems) {
	seen := map[string]bool{}
	for i, cl := range c.Auth.Clients {
		key := fmt.Sprintf("auth.clients[%d]", i)
		if _, err := gateway.ParseDeviceID(cl.Name); err != nil {
			p.add(key+".name", "%q: want 1 to %d characters of [A-Za-z0-9._:-]", cl.Name, gateway.MaxDeviceIDLen)
		} else if seen[cl.Name] {
			p.add(key+".name", "%q is named twice", cl.Name)
		}
		seen[cl.Name] = true
		if !isBcrypt(cl.PasswordBcrypt) {
			p.add(key+".password_bcrypt", "want a bcrypt hash ($2a$, $2b$ or $2y$, as `fleetgate hash-password` prints), not a password")
		}
		if len(cl.Read) == 0 && len(cl.Write) == 0 {
			p.add(key, "%q may neither read nor write: give it read or write filters", cl.Name)
		}
		for j, f := range cl.Read {
			if !gateway.ValidTopicFilter(f) {
				p.add(fmt.Sprintf("%s.read[%d]", key, j), "%q: not an MQTT topic filter", f)
			}
		}
		for j, f := range cl.Write {
			if !gateway.ValidTopicFilter(f) {
				p.add(fmt.Sprintf("%s.write[%d]", key, j), "%q: not an MQTT topic filter", f)
			}
		}
	}
}

// isBcrypt reports whether s looks like a bcrypt hash (60 bytes,
// $2a$/$2b$/$2y$ and a two-digit cost).
func isBcrypt(s string) bool {
	if len(s) != 60 || !(strings.HasPrefix(s, "$2a$") || strings.HasPrefix(s, "$2b$") || strings.HasPrefix(s, "$2y$")) {
		return false
	}
	return s[4] >= '0' && s[4] <= '3' && s[5] >= '0' && s[5] <= '9' && s[6] == '$'
}
