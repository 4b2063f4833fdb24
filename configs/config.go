// Package configs holds fleetgate's configuration: the types that mirror
// the YAML of docs/design.md §6.3, their defaults, the strict loader, environment
// overrides and validation. The shipped files live next to it:
// fleetgate.yaml (every key with its production default and a comment)
// and dev.yaml (the loopback set-up that `make run` uses).
//
// A configuration is built in three layers: Default(), then the file,
// then FLEETGATE_<SECTION>_<KEY> variables. Decoding is strict: an
// unknown or repeated key, a value of the wrong type or a duration without
// a unit is an error that names the file, line and column. Validate then
// checks the values together (the flap rule among them).
package configs

import (
	"bytes"
	"fmt"
	"os"
	"slices"
	"strconv"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/fleetgate/fleetgate/gateway"
)

// Store backends accepted by store.backend.
const (
	BackendEmbedded = "embedded"
	BackendRedis    = "redis"
)

// DefaultPath is where the CLI looks for the configuration without -c.
const DefaultPath = "/etc/fleetgate/fleetgate.yaml"

// Config is the whole configuration. Its YAML form is docs/design.md §6.3 plus
// presence.max_sessions, runner.lock_ttl and log.
type Config struct {
	Gateway  GatewayConfig  `yaml:"gateway"`
	Presence PresenceConfig `yaml:"presence"`
	Store    StoreConfig    `yaml:"store"`
	Uplink   UplinkConfig   `yaml:"uplink"`
	Runner   RunnerConfig   `yaml:"runner"`
	Events   EventsConfig   `yaml:"events"`
	Listen   ListenConfig   `yaml:"listen"`
	Auth     AuthConfig     `yaml:"auth"`
	Limits   LimitsConfig   `yaml:"limits"`
	Plugins  PluginsConfig  `yaml:"plugins"`
	Bridge   BridgeConfig   `yaml:"bridge"`
	Canary   CanaryConfig   `yaml:"canary"`
	Log      LogConfig      `yaml:"log"`
}

// GatewayConfig names this gateway and where it keeps its state.
type GatewayConfig struct {
	// ID names the gateway in session IDs and store records. Empty in a
	// file or the environment means the host name, sanitised to the
	// device-ID alphabet (see HostID).
	ID string `yaml:"id"`
	// StateDir holds the bbolt file (epoch, outbox, embedded store).
	StateDir string `yaml:"state_dir"`
}

// PresenceConfig holds the lease model of docs/design.md §1 and §2.
type PresenceConfig struct {
	Lease             Duration `yaml:"lease"`
	HeartbeatInterval Duration `yaml:"heartbeat_interval"`
	RenewEvery        Duration `yaml:"renew_every"`
	SuspectAfter      Duration `yaml:"suspect_after"`
	Shards            int      `yaml:"shards"`
	// GatewayGrace is how long a device whose lease ran out is held while
	// the gateway that wrote it last is not heard (a site uplink cut, a
	// store outage): devices that kept sending meanwhile are not reported
	// offline when it comes back; those of a gateway that stays lost are,
	// with reason gateway_lost. 0 turns holds off.
	GatewayGrace Duration `yaml:"gateway_grace"`
	// MaxLease is the longest lease a CoAP device may ask for per request
	// (POST /hb?...&l=<seconds>), for sleep cycles longer than the
	// heartbeat; it is answered with a Max-Age to match. 0 (the default)
	// allows none longer than lease.
	MaxLease Duration `yaml:"max_lease"`
	// LearnLease learns each device's sending period and holds the
	// evidence that carries no lease of its own (none asked for, none in
	// the devices file, none of its adapter) for 3 periods +
	// renew_every, within [Lease, MaxLease] (gateway.Period); off by
	// default. It needs a MaxLease above Lease.
	LearnLease bool `yaml:"learn_lease"`
	// MaxSessions caps the gateway's session table: new sessions beyond it
	// are refused.
	MaxSessions int `yaml:"max_sessions"`
}

// StoreConfig selects the central presence store.
type StoreConfig struct {
	Backend string      `yaml:"backend"`
	Redis   RedisConfig `yaml:"redis"`
}

// RedisConfig is used when Backend is BackendRedis. One address means a
// standalone server, several a Redis Cluster.
type RedisConfig struct {
	Addrs    []string `yaml:"addrs"`
	Username string   `yaml:"username"`
	Password string   `yaml:"password"`
	// PasswordFile names a file holding the password instead
	// (configs/secrets.go).
	PasswordFile string `yaml:"password_file"`
	TLS          bool   `yaml:"tls"`
	KeyPrefix    string `yaml:"key_prefix"`
	// TLS details (configs/security.go): a private CA, the name to verify,
	// and a client certificate; each implies tls.
	TLSCAFile     string `yaml:"tls_ca_file"`
	TLSServerName string `yaml:"tls_server_name"`
	TLSCertFile   string `yaml:"tls_cert_file"`
	TLSKeyFile    string `yaml:"tls_key_file"`
	// WaitReplicas: a flush that writes events (or replays the outbox)
	// waits until this many replicas have it before the gateway drops it
	// from its outbox (Redis WAIT, on each Cluster master it wrote to);
	// 0 does not wait.
	WaitReplicas int `yaml:"wait_replicas"`
}

// UplinkConfig tunes the batcher and the bbolt outbox.
type UplinkConfig struct {
	FlushInterval     Duration `yaml:"flush_interval"`
	MaxBatch          int      `yaml:"max_batch"`
	OutboxMaxSessions int      `yaml:"outbox_max_sessions"`
}

// RunnerConfig tunes the expiry runner.
type RunnerConfig struct {
	Enabled  bool     `yaml:"enabled"`
	Interval Duration `yaml:"interval"`
	Batch    int      `yaml:"batch"`
	// LockTTL is the lifetime of a shard's runner lock: how long another
	// runner waits before taking over a shard whose runner died.
	LockTTL Duration `yaml:"lock_ttl"`
}

// EventsConfig caps the event streams.
type EventsConfig struct {
	// MaxLen is the approximate number of events kept over all shards;
	// each shard's stream is capped at MaxLen / presence.shards.
	MaxLen int `yaml:"max_len"`
	// MQTT publishes the events to an upstream broker (events.go).
	MQTT EventsMQTTConfig `yaml:"mqtt"`
}

// ListenConfig holds the listen addresses; an empty address disables that
// listener.
type ListenConfig struct {
	CoAP  CoAPListen  `yaml:"coap"`
	MQTT  MQTTListen  `yaml:"mqtt"`
	Admin AdminListen `yaml:"admin"`
}

// CoAPListen holds the CoAP UDP and DTLS addresses.
type CoAPListen struct {
	UDP  string `yaml:"udp"`
	DTLS string `yaml:"dtls"`
}

// MQTTListen holds the MQTT TCP and TLS addresses, and the certificate
// and key (PEM files) the TLS listener presents.
type MQTTListen struct {
	TCP      string `yaml:"tcp"`
	TLS      string `yaml:"tls"`
	CertFile string `yaml:"cert_file"`
	KeyFile  string `yaml:"key_file"`
}

// AdminListen holds the admin HTTP address, and optionally its bearer
// token and TLS certificate (configs/security.go). Insecure allows an
// address beyond loopback without a token.
type AdminListen struct {
	HTTP      string `yaml:"http"`
	TokenFile string `yaml:"token_file"`
	CertFile  string `yaml:"cert_file"`
	KeyFile   string `yaml:"key_file"`
	Insecure  bool   `yaml:"insecure"`
	// CredentialsAPI serves POST and DELETE /v1/credentials/{id}, which
	// edit auth.devices_file; it needs TokenFile.
	CredentialsAPI bool `yaml:"credentials_api"`
	// Pprof serves Go's runtime profiles under /debug/pprof/.
	Pprof bool `yaml:"pprof"`
}

// AuthConfig says which devices may connect.
type AuthConfig struct {
	DevicesFile    string `yaml:"devices_file"`
	AllowAnonymous bool   `yaml:"allow_anonymous"`
	// TopicPrefix: an MQTT device may publish and subscribe only under
	// <topic_prefix>/<device>/#.
	TopicPrefix string `yaml:"topic_prefix"`
	// Clients are the MQTT clients that are not devices (bridge.go).
	Clients []LocalClient `yaml:"clients"`
}

// LimitsConfig bounds what devices can make the gateway spend. Rates are
// per source address and second.
type LimitsConfig struct {
	MQTTMaxPacketSize     int      `yaml:"mqtt_max_packet_size"`
	MQTTMaxClients        int      `yaml:"mqtt_max_clients"`
	MQTTConnectsPerSecond int      `yaml:"mqtt_connects_per_second"`
	MQTTMaxPendingWrites  int      `yaml:"mqtt_max_pending_writes"`
	CoAPMaxMessageSize    int      `yaml:"coap_max_message_size"`
	CoAPRequestsPerSecond int      `yaml:"coap_requests_per_second"`
	DTLSHandshakeTimeout  Duration `yaml:"dtls_handshake_timeout"`
	DTLSMaxPeers          int      `yaml:"dtls_max_peers"`
	DTLSIdleTimeout       Duration `yaml:"dtls_idle_timeout"`
	DTLSMaxParked         int      `yaml:"dtls_max_parked"`
	// MaxSessionsPerDevice bounds the sessions one device holds on this
	// gateway (configs/security.go).
	MaxSessionsPerDevice int `yaml:"max_sessions_per_device"`
	// MQTTMaxInflight bounds the QoS 1/2 messages held for one client;
	// the MQTTMaxRetained keys bound retained messages per device and in
	// all (protocols/mqtt/retained.go).
	MQTTMaxInflight               int `yaml:"mqtt_max_inflight"`
	MQTTMaxRetainedPerDevice      int `yaml:"mqtt_max_retained_per_device"`
	MQTTMaxRetainedBytesPerDevice int `yaml:"mqtt_max_retained_bytes_per_device"`
	MQTTMaxRetainedBytes          int `yaml:"mqtt_max_retained_bytes"`
	// AnonymousMaxDevices bounds the anonymous devices with sessions on
	// this gateway; AnonymousConnectsPerSecond the anonymous MQTT
	// CONNECTs per source network (/24, /64).
	AnonymousMaxDevices        int `yaml:"anonymous_max_devices"`
	AnonymousConnectsPerSecond int `yaml:"anonymous_connects_per_second"`
}

// LogConfig selects the log level (debug, info, warn, error) and format
// (text, json).
type LogConfig struct {
	Level  string `yaml:"level"`
	Format string `yaml:"format"`
}

// Default returns every default of docs/design.md §6.3. gateway.id is HostID().
func Default() Config {
	return Config{
		Gateway: GatewayConfig{ID: HostID(), StateDir: "/var/lib/fleetgate"},
		Presence: PresenceConfig{
			Lease:             Duration(gateway.DefaultLease),
			HeartbeatInterval: Duration(gateway.DefaultHeartbeatInterval),
			RenewEvery:        Duration(gateway.DefaultRenewEvery),
			SuspectAfter:      Duration(gateway.DefaultSuspectAfter),
			Shards:            gateway.DefaultShards,
			GatewayGrace:      Duration(gateway.DefaultGatewayGrace),
			MaxSessions:       gateway.DefaultMaxSessions,
		},
		Store: StoreConfig{
			Backend: BackendEmbedded,
			Redis:   RedisConfig{Addrs: []string{"127.0.0.1:6379"}, KeyPrefix: "fleetgate"},
		},
		Uplink: UplinkConfig{FlushInterval: Duration(gateway.DefaultFlushInterval), MaxBatch: gateway.DefaultMaxBatch, OutboxMaxSessions: 1_000_000},
		Runner: RunnerConfig{Enabled: true, Interval: Duration(gateway.DefaultRunnerInterval), Batch: gateway.DefaultRunnerBatch, LockTTL: Duration(gateway.DefaultRunnerLockTTL)},
		Events: EventsConfig{MaxLen: 1_000_000, MQTT: defaultEventsMQTT()},
		Listen: ListenConfig{
			CoAP:  CoAPListen{UDP: "127.0.0.1:5683"},
			MQTT:  MQTTListen{TCP: "127.0.0.1:1883", CertFile: "/etc/fleetgate/mqtt.crt", KeyFile: "/etc/fleetgate/mqtt.key"},
			Admin: AdminListen{HTTP: "127.0.0.1:9180"},
		},
		Auth: AuthConfig{DevicesFile: "/etc/fleetgate/devices.yaml", TopicPrefix: "devices", Clients: []LocalClient{}},
		Limits: LimitsConfig{
			MQTTMaxPacketSize:     65536,
			MQTTMaxClients:        100000,
			MQTTConnectsPerSecond: 20,
			MQTTMaxPendingWrites:  64,
			CoAPMaxMessageSize:    1152,
			CoAPRequestsPerSecond: 20,
			DTLSHandshakeTimeout:  Duration(10 * time.Second),
			DTLSMaxPeers:          4096,
			DTLSIdleTimeout:       Duration(time.Second),
			DTLSMaxParked:         100_000,
			MaxSessionsPerDevice:  DefaultMaxSessionsPerDevice,
			// MQTT state held for devices (protocols/mqtt/retained.go)
			MQTTMaxInflight:               32,
			MQTTMaxRetainedPerDevice:      16,
			MQTTMaxRetainedBytesPerDevice: 64 << 10,
			MQTTMaxRetainedBytes:          64 << 20,
			// anonymous devices (docs/security.md)
			AnonymousMaxDevices:        gateway.DefaultMaxAnonymousDevices,
			AnonymousConnectsPerSecond: 100,
		},
		Plugins: PluginsConfig{Dir: "/usr/lib/fleetgate/plugins", Adapters: []AdapterConfig{}},
		Bridge:  defaultBridge(),
		Canary:  CanaryConfig{Live: DefaultCanaryLive},
		Log:     LogConfig{Level: "info", Format: "text"},
	}
}

// HostID is the default gateway ID: the host name with every byte outside
// [A-Za-z0-9._:-] replaced by '-', cut to gateway.MaxDeviceIDLen bytes, or
// "fleetgate" when the host name is unknown.
func HostID() string {
	h, err := os.Hostname()
	if err != nil {
		h = ""
	}
	return sanitizeID(h)
}

func sanitizeID(s string) string {
	b := []byte(s)
	if len(b) > gateway.MaxDeviceIDLen {
		b = b[:gateway.MaxDeviceIDLen]
	}
	for i, c := range b {
		if _, err := gateway.ParseDeviceID(string(c)); err != nil {
			b[i] = '-'
		}
	}
	if len(b) == 0 {
		return "fleetgate"
	}
	return string(b)
}

// Redacted returns a copy of c with every secret (SecretKeys, and adapter
// settings whose key names a secret) replaced by "<redacted>" when it is
// set, for printing.
func (c Config) Redacted() Config {
	c.Store.Redis.Addrs = slices.Clone(c.Store.Redis.Addrs)
	c.Plugins.Adapters = redactAdapters(c.Plugins.Adapters)
	redactSecrets(&c)
	return c
}

// YAML renders c in the file's layout (two-space indent); Parse reads it
// back to c. A secret read from its _file is rendered as the file's name
// alone. Redact first when the output is shown to anyone.
func (c Config) YAML() ([]byte, error) {
	clearFileSecrets(&c)
	var buf bytes.Buffer
	enc := yaml.NewEncoder(&buf)
	enc.SetIndent(2)
	if err := enc.Encode(c); err != nil {
		return nil, fmt.Errorf("config: render yaml: %w", err)
	}
	if err := enc.Close(); err != nil {
		return nil, fmt.Errorf("config: render yaml: %w", err)
	}
	return buf.Bytes(), nil
}

// Duration is a time.Duration written as a Go duration string ("90s",
// "1m30s", "500ms"). A bare number is refused: its unit would be a guess.
type Duration time.Duration

// Std returns d as a time.Duration.
func (d Duration) Std() time.Duration { return time.Duration(d) }

// String formats d readably: whole hours as "2h", whole minutes or
// seconds under an hour as "15m" or "90s", anything else as time.Duration
// does ("1.5s", "250ms", "1h30m0s").
func (d Duration) String() string {
	td := time.Duration(d)
	switch {
	case td == 0:
		return "0s"
	case td%time.Hour == 0:
		return strconv.FormatInt(int64(td/time.Hour), 10) + "h"
	case td%time.Second != 0, td >= time.Hour, td <= -time.Hour:
		return td.String()
	case td%time.Minute == 0:
		return strconv.FormatInt(int64(td/time.Minute), 10) + "m"
	default:
		return strconv.FormatInt(int64(td/time.Second), 10) + "s"
	}
}

// MarshalText writes d as String does.
func (d Duration) MarshalText() ([]byte, error) { return []byte(d.String()), nil }

// UnmarshalText parses a Go duration string and refuses a bare number.
func (d *Duration) UnmarshalText(b []byte) error {
	v, err := parseDuration(string(b))
	if err != nil {
		return err
	}
	*d = v
	return nil
}

// UnmarshalYAML parses a scalar Go duration string and refuses a bare
// number or a non-scalar.
func (d *Duration) UnmarshalYAML(n *yaml.Node) error {
	if n.Kind != yaml.ScalarNode || n.ShortTag() == "!!null" {
		return fmt.Errorf("want a duration such as \"90s\", got %s", describe(n))
	}
	return d.UnmarshalText([]byte(n.Value))
}

func parseDuration(s string) (Duration, error) {
	if _, err := strconv.ParseFloat(s, 64); err == nil {
		return 0, fmt.Errorf("duration %s has no unit (write \"%ss\" for seconds)", s, s)
	}
	v, err := time.ParseDuration(s)
	if err != nil {
		return 0, fmt.Errorf("invalid duration %q (want a number with a unit: ns, us, ms, s, m or h, as in \"90s\")", s)
	}
	return Duration(v), nil
}
