package main

import (
	"cmp"
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"log/slog"
	"net"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/fleetgate/fleetgate/auth"
	"github.com/fleetgate/fleetgate/configs"
	"github.com/fleetgate/fleetgate/gateway"
	"github.com/fleetgate/fleetgate/protocols/coap"
	"github.com/fleetgate/fleetgate/protocols/mqtt"
)

// frontEnd is what run needs of a protocol front end.
type frontEnd interface {
	Serve(ctx context.Context) error
	Close() error
	// SetTiming takes the presence timing of a reload.
	SetTiming(t gateway.Timing)
	// SetCredentials hands over the devices file after a reload: later
	// checks use it, and sessions it revokes end (both servers: nil is
	// refused).
	SetCredentials(c gateway.Credentials)
}

var (
	_ frontEnd = (*coap.Server)(nil)
	_ frontEnd = (*mqtt.Server)(nil)
)

// openFrontEnds loads the devices file and the TLS certificate and binds
// the configured CoAP and MQTT listeners.
func (g *gatewayProcess) openFrontEnds(cfg configs.Config, log *slog.Logger, reg prometheus.Registerer) error {
	var creds gateway.Credentials
	if path := cfg.Auth.DevicesFile; path != "" {
		d, err := loadDevices(path, cfg)
		if err != nil {
			return err
		}
		g.creds = auth.NewReloadable(d)
		creds = g.creds
		log.Info("devices file loaded", "path", path, "devices", d.Len())
	}
	if creds == nil && !cfg.Auth.AllowAnonymous {
		log.Warn("no auth.devices_file and auth.allow_anonymous is off: no device can connect")
	}
	l := cfg.Limits
	heartbeat, lease := cfg.Presence.HeartbeatInterval.Std(), cfg.Presence.Lease.Std()
	if cfg.Listen.CoAP.UDP != "" || cfg.Listen.CoAP.DTLS != "" {
		s, err := coap.New(g.table, coap.Options{
			Addr:              cfg.Listen.CoAP.UDP,
			DTLS:              cfg.Listen.CoAP.DTLS,
			Credentials:       g.coapCredentials(),
			AllowAnonymous:    cfg.Auth.AllowAnonymous,
			HeartbeatInterval: heartbeat,
			Lease:             lease,
			MaxLease:          cfg.Presence.MaxLease.Std(),
			MaxMessageSize:    l.CoAPMaxMessageSize,
			RequestsPerSecond: l.CoAPRequestsPerSecond,
			HandshakeTimeout:  l.DTLSHandshakeTimeout.Std(),
			MaxDTLSPeers:      l.DTLSMaxPeers,
			DTLSIdleTimeout:   l.DTLSIdleTimeout.Std(),
			MaxDTLSParked:     cmp.Or(l.DTLSMaxParked, -1), // 0: parking off
			Sink:              g.data.bridge,
			Commands:          g.data.bridge,
			Clock:             gateway.SystemClock{},
			Logger:            log,
			Registerer:        reg,
			Refusals:          g.refusals,
		})
		if err != nil {
			return err
		}
		g.fronts = append(g.fronts, s)
		log.Info("coap listening", "udp", addrString(s.Addr()), "dtls", addrString(s.DTLSAddr()), "anonymous", cfg.Auth.AllowAnonymous)
		if g.canary, err = g.openCanary(cfg, s, log, reg); err != nil {
			g.closeFrontEnds()
			return err
		}
	}
	if cfg.Listen.MQTT.TCP != "" || cfg.Listen.MQTT.TLS != "" {
		var tlsConfig *tls.Config
		if cfg.Listen.MQTT.TLS != "" {
			g.cert = &certificate{}
			if err := g.cert.load(cfg.Listen.MQTT.CertFile, cfg.Listen.MQTT.KeyFile); err != nil {
				g.closeFrontEnds()
				return err
			}
			tlsConfig = &tls.Config{MinVersion: tls.VersionTLS12, GetCertificate: g.cert.get}
		}
		clients, pw, err := localClients(cfg)
		if err != nil {
			g.closeFrontEnds()
			return configError{err}
		}
		var clientPasswords gateway.Credentials
		if pw != nil {
			g.clients = auth.NewReloadable(pw)
			clientPasswords = g.clients
		}
		s, err := mqtt.New(g.table, mqtt.Options{
			TCP:               cfg.Listen.MQTT.TCP,
			TLS:               cfg.Listen.MQTT.TLS,
			TLSConfig:         tlsConfig,
			Gateway:           cfg.Gateway.ID,
			Epoch:             g.epoch,
			AllowAnonymous:    cfg.Auth.AllowAnonymous,
			Credentials:       creds,
			TopicPrefix:       cfg.Auth.TopicPrefix,
			HeartbeatInterval: heartbeat,
			Lease:             lease,
			MaxLease:          cfg.Presence.MaxLease.Std(),
			MaxPacketSize:     l.MQTTMaxPacketSize,
			MaxClients:        l.MQTTMaxClients,
			ConnectsPerSecond: l.MQTTConnectsPerSecond,
			MaxPendingWrites:  l.MQTTMaxPendingWrites,
			Clock:             gateway.SystemClock{},
			Logger:            log,
			Registerer:        reg,
			Refusals:          g.refusals,

			MaxInflight:            l.MQTTMaxInflight,
			RetainedPerDevice:      l.MQTTMaxRetainedPerDevice,
			RetainedBytesPerDevice: l.MQTTMaxRetainedBytesPerDevice,
			RetainedBytes:          l.MQTTMaxRetainedBytes,

			AnonymousConnectsPerSecond: l.AnonymousConnectsPerSecond,

			Sink:            g.data.bridge,
			Commands:        g.data.bridge,
			Clients:         clients,
			ClientPasswords: clientPasswords,
		})
		if err != nil {
			g.closeFrontEnds()
			return err
		}
		g.fronts = append(g.fronts, s)
		g.mqtt = s
		g.data.local.Store(s)
		tcp, tlsAddr := s.Addrs()
		log.Info("mqtt listening", "tcp", addrString(tcp), "tls", addrString(tlsAddr), "anonymous", cfg.Auth.AllowAnonymous)
	}
	return nil
}

// revoke tells the front ends that the devices file was reloaded, so that
// they end the sessions of devices removed or whose credentials changed.
func (g *gatewayProcess) revoke() {
	if g.creds == nil {
		return
	}
	for _, f := range g.fronts {
		if _, ok := f.(*coap.Server); ok {
			f.SetCredentials(g.coapCredentials())
			continue
		}
		f.SetCredentials(g.creds)
	}
}

func (g *gatewayProcess) closeFrontEnds() {
	for _, f := range g.fronts {
		f.Close()
	}
}

func addrString(a net.Addr) string {
	if a == nil {
		return ""
	}
	return a.String()
}

// certificate is the TLS listener's certificate, swapped at SIGHUP.
type certificate struct {
	cur atomic.Pointer[tls.Certificate]
}

func (c *certificate) load(certFile, keyFile string) error {
	cert, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		return configError{fmt.Errorf("listen.mqtt: load certificate: %w", unreadable(err))}
	}
	c.cur.Store(&cert)
	return nil
}

func (c *certificate) get(*tls.ClientHelloInfo) (*tls.Certificate, error) { return c.cur.Load(), nil }

// servedCert is the MQTT TLS listener's certificate in use, nil without
// one.
func (g *gatewayProcess) servedCert() *x509.Certificate {
	if g.cert == nil {
		return nil
	}
	return g.cert.cur.Load().Leaf
}
