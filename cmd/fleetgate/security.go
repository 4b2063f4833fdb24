package main

import (
	"crypto/tls"
	"fmt"
	"net"
	"os"

	"github.com/fleetgate/fleetgate/auth"
	"github.com/fleetgate/fleetgate/configs"
)

// checkFiles loads what run loads besides the configuration, and fails as
// run would: the devices file (syntax, duplicates, keys and hashes) and
// the MQTT TLS certificate and key.
func checkFiles(cfg configs.Config) error {
	if path := cfg.Auth.DevicesFile; path != "" {
		if _, err := auth.Load(path); err != nil {
			return err
		}
	}
	if cfg.Listen.MQTT.TLS != "" {
		if _, err := tls.LoadX509KeyPair(cfg.Listen.MQTT.CertFile, cfg.Listen.MQTT.KeyFile); err != nil {
			return fmt.Errorf("listen.mqtt: load certificate: %w", err)
		}
	}
	return nil
}

// securityWarnings lists the risky settings of cfg (docs/security.md):
// the admin API reachable beyond loopback, a devices file that group or
// others may read, and a state directory that others may write.
func securityWarnings(cfg configs.Config) []string {
	var out []string
	if a := cfg.Listen.Admin.HTTP; a != "" && !loopback(a) {
		out = append(out, fmt.Sprintf("listen.admin.http %s is reachable beyond this host and the admin API has no authentication: bind it to 127.0.0.1 or put it behind an authenticating proxy", a))
	}
	if path := cfg.Auth.DevicesFile; path != "" {
		if fi, err := os.Stat(path); err == nil && fi.Mode().Perm()&0o044 != 0 {
			out = append(out, fmt.Sprintf("auth.devices_file %s is readable by group or others (mode %04o); it holds device keys: chmod 600 (or 640 with a dedicated group)", path, fi.Mode().Perm()))
		}
	}
	if dir := cfg.Gateway.StateDir; dir != "" {
		if fi, err := os.Stat(dir); err == nil && fi.Mode().Perm()&0o002 != 0 {
			out = append(out, fmt.Sprintf("gateway.state_dir %s is writable by others (mode %04o): anyone on the host could replace the state file; chmod o-w", dir, fi.Mode().Perm()))
		}
	}
	return out
}

// loopback reports whether listen address addr binds only a loopback
// address (a wildcard or a host name that is not localhost does not).
func loopback(addr string) bool {
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
