package configs

import (
	"fmt"
	"net"

	"github.com/fleetgate/fleetgate/gateway"
)

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
	if checkAddr(a.HTTP) == nil {
		if err := a.CheckExposure(a.HTTP); err != nil {
			p.add("listen.admin.http", "%v", err)
		}
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

// CheckExposure refuses an admin listener at addr (listen.admin.http, or
// the address of `fleetgate runner --metrics`, which serves the same API
// with the same settings) that binds beyond loopback without a token,
// unless a.Insecure says to serve it so.
func (a AdminListen) CheckExposure(addr string) error {
	if addr == "" || Loopback(addr) || a.TokenFile != "" || a.Insecure {
		return nil
	}
	return fmt.Errorf("%q is reachable beyond this host and the admin API would have no authentication (listen.admin.token_file is empty): set a token_file, bind it to 127.0.0.1, or set listen.admin.insecure: true to serve it to anyone who reaches it", addr)
}

// Loopback reports whether listen address addr binds only loopback: a
// loopback IP or localhost (a wildcard or another host name does not).
func Loopback(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}
