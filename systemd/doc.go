// Package systemd holds fleetgate's systemd units, its sysusers file and
// its packaging (nfpm.yaml, maintainer scripts, lintian overrides). It has
// no Go code: its tests check those files with the tools that consume
// them (systemd-analyze, systemd-sysusers, dpkg-deb, rpm, lintian,
// promtool) and check the dashboards against a running gateway.
package systemd
