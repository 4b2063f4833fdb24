package configs

import "github.com/fleetgate/fleetgate/gateway"

// Security settings (docs/security.md).
const (
	// DefaultMaxSessionsPerDevice is limits.max_sessions_per_device.
	DefaultMaxSessionsPerDevice = gateway.DefaultMaxSessionsPerDevice
	// MaxMaxSessionsPerDevice bounds limits.max_sessions_per_device: the
	// store's scripts take time in proportion to a device's sessions.
	MaxMaxSessionsPerDevice = 256
)

// validateSecurity checks the security settings.
func (c Config) validateSecurity(p *problems) {
	if n := c.Limits.MaxSessionsPerDevice; n < 1 || n > MaxMaxSessionsPerDevice {
		p.add("limits.max_sessions_per_device", "must be between 1 and %d, got %d", MaxMaxSessionsPerDevice, n)
	}
	a := c.Listen.Admin
	if (a.CertFile == "") != (a.KeyFile == "") {
		p.add("listen.admin.cert_file", "and listen.admin.key_file must be set together")
	}
	r := c.Store.Redis
	if (r.TLSCertFile == "") != (r.TLSKeyFile == "") {
		p.add("store.redis.tls_cert_file", "and store.redis.tls_key_file must be set together")
	}
}

// RedisTLS reports whether the Redis connections use TLS: store.redis.tls
// or any of its tls_ keys.
func (r RedisConfig) RedisTLS() bool {
	return r.TLS || r.TLSCAFile != "" || r.TLSServerName != "" || r.TLSCertFile != "" || r.TLSKeyFile != ""
}
