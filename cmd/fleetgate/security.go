package main

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/user"
	"strconv"
	"strings"
	"syscall"

	"github.com/fleetgate/fleetgate/admin"
	"github.com/fleetgate/fleetgate/auth"
	"github.com/fleetgate/fleetgate/configs"
)

// checkFiles loads what run loads besides the configuration, and fails as
// run would, with a configError: the devices file (syntax, duplicates,
// keys and hashes; returned, nil without one), the MQTT TLS certificate
// and key, the local clients' password hashes and the admin API's token
// and certificate.
func checkFiles(cfg configs.Config) (*auth.Devices, error) {
	var devices *auth.Devices
	if path := cfg.Auth.DevicesFile; path != "" {
		d, err := loadDevices(path, cfg)
		if err != nil {
			return nil, err
		}
		devices = d
	}
	if cfg.Listen.MQTT.TLS != "" {
		if err := new(certificate).load(cfg.Listen.MQTT.CertFile, cfg.Listen.MQTT.KeyFile); err != nil {
			return nil, err
		}
	}
	if _, _, err := localClients(cfg); err != nil {
		return nil, configError{err}
	}
	if cfg.Listen.Admin.HTTP != "" {
		if _, _, err := adminSecurity(cfg.Listen.Admin); err != nil {
			return nil, configError{err}
		}
	}
	return devices, nil
}

// loadDevices loads the devices file at path, its devices' leases held
// within cfg's presence.lease and presence.max_lease; an error is a
// configError.
func loadDevices(path string, cfg configs.Config) (*auth.Devices, error) {
	d, err := auth.Load(path)
	if err == nil {
		err = d.CheckLeases(cfg.Presence.Lease.Std(), cfg.Presence.MaxLease.Std())
	}
	if err != nil {
		return nil, configError{unreadable(err)}
	}
	return d, nil
}

// leaseBounds are the bounds cfg puts on the devices file's leases.
func leaseBounds(cfg configs.Config) auth.LeaseBounds {
	return auth.LeaseBounds{Lease: cfg.Presence.Lease.Std(), MaxLease: cfg.Presence.MaxLease.Std()}
}

// unreadable adds to a permission error which user must be able to read
// the file and how the package arranges it.
func unreadable(err error) error {
	if !errors.Is(err, fs.ErrPermission) {
		return err
	}
	who := strconv.Itoa(os.Getuid())
	if u, uerr := user.Current(); uerr == nil {
		who = u.Username
	}
	return fmt.Errorf("%w (fleetgate runs as %s here, who must be able to read it: the package ships the files of /etc/fleetgate as root:fleetgate mode 0640, readable by the service's group)", err, who)
}

// adminSecurity loads the admin API's bearer token and TLS certificate,
// when configured.
func adminSecurity(a configs.AdminListen) (string, *tls.Config, error) {
	var token string
	if a.TokenFile != "" {
		b, err := os.ReadFile(a.TokenFile)
		if err != nil {
			return "", nil, fmt.Errorf("listen.admin.token_file: %w", unreadable(err))
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
		return "", nil, fmt.Errorf("listen.admin: load certificate: %w", unreadable(err))
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
// plain HTTP (adminWarnings), a devices file that others, or a group
// other than the gateway's, may read (devicesFileWarning), and a state
// directory that others may write.
func securityWarnings(cfg configs.Config) []string {
	out := adminWarnings(cfg.Listen.Admin, "listen.admin.http", cfg.Listen.Admin.HTTP)
	if path := cfg.Auth.DevicesFile; path != "" {
		if fi, err := os.Stat(path); err == nil {
			if st, ok := fi.Sys().(*syscall.Stat_t); ok {
				if w := devicesFileWarning(path, fi.Mode().Perm(), int(st.Uid), int(st.Gid), gatewayGID(cfg), groupName); w != "" {
					out = append(out, w)
				}
			}
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

// devicesFileWarning is the warning about a devices file at path with
// mode perm, owner uid and group gid, for a gateway that runs in group
// gatewayGID (-1: not known), or "". Others may not read it; its group
// may, when that is the gateway's group: the package ships it
// root:fleetgate 0640, which the service (user fleetgate) reads through
// its group. The advice works for the gateway: it never takes the
// gateway's own access away.
func devicesFileWarning(path string, perm fs.FileMode, uid, gid, gatewayGID int, group func(int) string) string {
	switch {
	case perm&0o007 != 0:
		return fmt.Sprintf("auth.devices_file %s is readable by others (mode %04o); it holds device keys: chmod o-rwx %s", path, perm, path)
	case perm&0o040 != 0 && gatewayGID >= 0 && gid != gatewayGID:
		return fmt.Sprintf("auth.devices_file %s is readable by group %s (mode %04o), which is not the gateway's group %s; it holds device keys: chgrp %s %s (the package ships it root:%s 0640)%s",
			path, group(gid), perm, group(gatewayGID), group(gatewayGID), path, group(gatewayGID), ownerAdvice(uid, path))
	}
	return ""
}

// ownerAdvice is the other way out for a file of the gateway's own user.
func ownerAdvice(uid int, path string) string {
	if uid != os.Geteuid() || uid == 0 {
		return ""
	}
	return ", or chmod g-r " + path
}

// gatewayGID is the group the gateway runs as: this process's, unless
// that is root's (check-config run by hand with sudo), then the group of
// gateway.state_dir, which systemd's StateDirectory= (and the package)
// give to the service's group; -1 when neither tells.
func gatewayGID(cfg configs.Config) int {
	if gid := os.Getegid(); gid != 0 {
		return gid
	}
	if fi, err := os.Stat(cfg.Gateway.StateDir); err == nil {
		if st, ok := fi.Sys().(*syscall.Stat_t); ok {
			return int(st.Gid)
		}
	}
	return -1
}

// groupName is the name of group gid, else its number.
func groupName(gid int) string {
	if g, err := user.LookupGroupId(strconv.Itoa(gid)); err == nil {
		return g.Name
	}
	return strconv.Itoa(gid)
}
