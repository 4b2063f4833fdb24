package main

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"log/slog"
	"os"

	"github.com/fleetgate/fleetgate/configs"
	"github.com/fleetgate/fleetgate/events/mqttpub"
	"github.com/fleetgate/fleetgate/gateway"
	"github.com/prometheus/client_golang/prometheus"
)

// newPublisher returns the events.mqtt publisher (nil when events.mqtt.url
// is empty) publishing store's events under the lease owner owner, its
// metrics registered with reg.
func newPublisher(cfg configs.Config, store gateway.Store, owner string, log *slog.Logger, reg prometheus.Registerer) (*mqttpub.Publisher, error) {
	m := cfg.Events.MQTT
	if !m.Enabled() {
		return nil, nil
	}
	tc, err := publisherTLS(m.TLS)
	if err != nil {
		return nil, err
	}
	clientID := m.ClientID
	if clientID == "" {
		// unique per process: two processes of one gateway (run and a
		// runner) must not take each other's connection over
		clientID = fmt.Sprintf("fleetgate-%s-%d", cfg.Gateway.ID, os.Getpid())
	}
	p, err := mqttpub.New(store, mqttpub.Options{
		URL: m.URL, ClientID: clientID, Username: m.Username, Password: m.Password, TLS: tc,
		TopicPrefix: m.TopicPrefix, QoS: byte(m.QoS), RetainState: m.RetainState,
		OfflineDelay: m.OfflineDelay.Std(), Owner: owner, Logger: log, Registerer: reg,
	})
	if err != nil {
		return nil, fmt.Errorf("events.mqtt: %w", err)
	}
	log.Info("publishing events to an upstream broker", "url", m.URL, "topic_prefix", m.TopicPrefix)
	return p, nil
}

// publisherTLS loads events.mqtt.tls (nil when no file is named: the
// system roots, for mqtts:// URLs).
func publisherTLS(t configs.EventsMQTTTLS) (*tls.Config, error) {
	if t.CA == "" && t.Cert == "" {
		return nil, nil
	}
	tc := &tls.Config{MinVersion: tls.VersionTLS12}
	if t.CA != "" {
		pem, err := os.ReadFile(t.CA)
		if err != nil {
			return nil, fmt.Errorf("events.mqtt.tls.ca: %w", err)
		}
		tc.RootCAs = x509.NewCertPool()
		if !tc.RootCAs.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("events.mqtt.tls.ca: %s holds no PEM certificate", t.CA)
		}
	}
	if t.Cert != "" {
		c, err := tls.LoadX509KeyPair(t.Cert, t.Key)
		if err != nil {
			return nil, fmt.Errorf("events.mqtt.tls: %w", err)
		}
		tc.Certificates = []tls.Certificate{c}
	}
	return tc, nil
}
