package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"syscall"

	"github.com/fleetgate/fleetgate/auth"
	"github.com/fleetgate/fleetgate/configs"
)

func cmdCheckConfig(_ context.Context, args []string, stdout, stderr io.Writer) error {
	fs, path := newFlags("check-config", "check-config [-c FILE] [--quiet] [--ports]")
	quiet := fs.Bool("quiet", false, "print one summary line instead of the effective configuration (the units run it so at every start and reload)")
	ports := fs.Bool("ports", false, "also bind every listen address for a moment: fails when another program holds one (for an install script; not while the gateway runs)")
	cfg, err := parseAndLoad(fs, args, path)
	if err != nil {
		return err
	}
	devices, err := checkFiles(cfg)
	if err != nil {
		return err
	}
	if *ports {
		if err := bindable(listeners(cfg)); err != nil {
			return err
		}
	}
	for _, w := range securityWarnings(cfg) {
		fmt.Fprintf(stderr, "warning: %s\n", w)
	}
	if *quiet {
		fmt.Fprintln(stdout, summary(*path, cfg, devices))
		return nil
	}
	out, err := cfg.Redacted().YAML()
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "# effective configuration of %s (defaults, file, FLEETGATE_ environment)\n", *path)
	stdout.Write(out)
	fmt.Fprintf(stdout, "\n# derived bounds\n%s", cfg.Bounds())
	for _, b := range deviceLeaseBounds(cfg, devices) {
		fmt.Fprint(stdout, b)
	}
	return nil
}

// deviceLeaseBounds are the worst-case detections of the devices file's
// devices with a lease of their own: of the shortest and the longest
// lease; none without such devices.
func deviceLeaseBounds(cfg configs.Config, devices *auth.Devices) []configs.ClassBound {
	if devices == nil {
		return nil
	}
	r := devices.Leases()
	if r.Devices == 0 {
		return nil
	}
	return []configs.ClassBound{
		{Name: "devices file: shortest", Lease: configs.Duration(r.Shortest), WorstCaseDetection: cfg.Detection(r.Shortest)},
		{Name: "devices file: longest", Lease: configs.Duration(r.Longest), WorstCaseDetection: cfg.Detection(r.Longest)},
	}
}

// listener is one listen address of the configuration: its key, its
// network (tcp or udp) and its address ("" when off).
type listener struct{ key, network, addr string }

// listeners lists every listener of cfg, in the order of the file.
func listeners(cfg configs.Config) []listener {
	l := cfg.Listen
	return []listener{
		{"listen.coap.udp", "udp", l.CoAP.UDP},
		{"listen.coap.dtls", "udp", l.CoAP.DTLS},
		{"listen.mqtt.tcp", "tcp", l.MQTT.TCP},
		{"listen.mqtt.tls", "tcp", l.MQTT.TLS},
		{"listen.admin.http", "tcp", l.Admin.HTTP},
	}
}

// bindable binds every listener that is on for a moment and reports
// each one that cannot be bound, with the key to change.
func bindable(ls []listener) error {
	var errs []error
	for _, l := range ls {
		if l.addr == "" {
			continue
		}
		var err error
		if l.network == "udp" {
			var c net.PacketConn
			if c, err = net.ListenPacket("udp", l.addr); err == nil {
				err = c.Close()
			}
		} else {
			var c net.Listener
			if c, err = net.Listen("tcp", l.addr); err == nil {
				err = c.Close()
			}
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("%s %s cannot be bound (%v): another program holds the port; set %s to a free address (or \"\" to turn it off) in the configuration", l.key, l.addr, unwrapOp(err), l.key))
		}
	}
	return errors.Join(errs...)
}

// unwrapOp is the system's reason of a failed bind ("address already in
// use"), else err.
func unwrapOp(err error) error {
	var errno syscall.Errno
	if errors.As(err, &errno) {
		return errno
	}
	return err
}

// summary is check-config's one line for the journal at every start and
// reload: the file, the gateway, the store, each device listener, the
// devices, and the worst-case detection bound.
func summary(path string, cfg configs.Config, devices *auth.Devices) string {
	var on []string
	loopback := true
	for _, l := range listeners(cfg)[:4] {
		if l.addr == "" {
			continue
		}
		name := map[string]string{"listen.coap.udp": "coap", "listen.coap.dtls": "coaps", "listen.mqtt.tcp": "mqtt", "listen.mqtt.tls": "mqtts"}[l.key]
		on = append(on, name+" "+l.addr)
		loopback = loopback && configs.Loopback(l.addr)
	}
	reach := "no device listener"
	if len(on) > 0 {
		reach = strings.Join(on, ", ")
		if loopback {
			reach += " (loopback only: devices on the network cannot connect until listen.coap and listen.mqtt name an address of theirs)"
		}
	}
	n := "no devices file"
	if devices != nil {
		n = fmt.Sprintf("%d devices in %s", devices.Len(), cfg.Auth.DevicesFile)
	}
	if cfg.Auth.AllowAnonymous {
		n += ", anonymous devices allowed"
	}
	admin := "admin API off"
	if cfg.Listen.Admin.HTTP != "" {
		admin = "admin API " + cfg.Listen.Admin.HTTP
	}
	return fmt.Sprintf("configuration %s is valid: gateway %s, %s store, %d shards; %s; %s; %s; offline reported within %s of a device's last evidence (check-config -c %s prints the rest)",
		path, cfg.Gateway.ID, cfg.Store.Backend, cfg.Presence.Shards, reach, n, admin, cfg.Bounds().WorstCaseDetection, path)
}
