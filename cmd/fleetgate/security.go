package main

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"os"
	"strings"

	"github.com/fleetgate/fleetgate/admin"
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
	if cfg.Listen.Admin.HTTP != "" {
		if _, _, err := adminSecurity(cfg.Listen.Admin); err != nil {
			return err
		}
	}
	return nil
}

// adminSecurity loads the admin API's bearer token and TLS certificate,
// when configured.
func adminSecurity(a configs.AdminListen) (string, *tls.Config, error) {
	var token string
	if a.TokenFile != "" {
		b, err := os.ReadFile(a.TokenFile)
		if err != nil {
			return "", nil, fmt.Errorf("listen.admin.token_file: %w", err)
		}
		if token = strings.TrimSpace(string(b)); len(token) < 16 {
			return "", nil, fmt.Errorf("listen.admin.token_file: %s holds a token of %d bytes; want at least 16", a.TokenFile, len(token))
		}
	}
	if a.CertFile == "" {
		return token, nil, nil
	}
	cert, err := tls.LoadX509KeyPair(a.CertFile, a.KeyFile)
	if err != nil {
		return "", nil, fmt.Errorf("listen.admin: load certificate: %w", err)
	}
	return token, &tls.Config{MinVersion: tls.VersionTLS12, Certificates: []tls.Certificate{cert}}, nil
}

// adminClient is the query commands' client of the admin API at a, with
// its token and, for HTTPS, its certificate as the CA.
func adminClient(a configs.AdminListen) (*admin.Client, error) {
	c := admin.NewClient(a.HTTP)
	token, tlsConf, err := adminSecurity(a)
	if err != nil {
		return nil, err
	}
	if tlsConf == nil {
		return c.WithAuth(token, nil), nil
	}
	pem, err := os.ReadFile(a.CertFile)
	if err != nil {
		return nil, fmt.Errorf("listen.admin.cert_file: %w", err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(pem)
	return c.WithAuth(token, &tls.Config{MinVersion: tls.VersionTLS12, RootCAs: pool}), nil
}

// securityWarnings lists the risky settings of cfg (docs/security.md):
// the admin API beyond loopback without a token or with a token over
// plain HTTP (adminWarnings), a devices file that group or others may
// read, and a state directory that others may write.
func securityWarnings(cfg configs.Config) []string {
	out := adminWarnings(cfg.Listen.Admin, "listen.admin.http", cfg.Listen.Admin.HTTP)
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

// adminWarnings lists the risks of serving the admin API of a at addr
// (named key in the warning): beyond loopback without a token (allowed
// by listen.admin.insecure only), or with a token over plain HTTP.
func adminWarnings(a configs.AdminListen, key, addr string) []string {
	switch {
	case addr == "" || configs.Loopback(addr):
		return nil
	case a.TokenFile == "":
		return []string{fmt.Sprintf("%s %s serves the admin API beyond this host without authentication (listen.admin.insecure: true): anyone who reaches it reads every device and event", key, addr)}
	case a.CertFile == "":
		return []string{fmt.Sprintf("%s %s is reachable beyond this host over plain HTTP: the bearer token of listen.admin.token_file travels in clear; set listen.admin.cert_file and key_file, or bind it to 127.0.0.1", key, addr)}
	}
	return nil
}
