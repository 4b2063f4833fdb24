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
// metrics registered with reg; onPublished (may be nil) is called with
// every event published.
func newPublisher(cfg configs.Config, store gateway.Store, owner string, onPublished func(gateway.Event), log *slog.Logger, reg prometheus.Registerer) (*mqttpub.Publisher, error) {
	m := cfg.Events.MQTT
	if !m.Enabled() {
		return nil, nil
	}
	tc, err := clientTLS("events.mqtt.tls", m.TLS.CA, m.TLS.Cert, m.TLS.Key, "")
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
		OnPublished: onPublished,
	})
	if err != nil {
		return nil, fmt.Errorf("events.mqtt: %w", err)
	}
	log.Info("publishing events to an upstream broker", "url", m.URL, "topic_prefix", m.TopicPrefix)
	return p, nil
}

// clientTLS loads the TLS settings of an MQTT client's key (events.mqtt.tls,
// bridge.mqtt.tls): a CA bundle, a client certificate and key, the server
// name to verify. Nil when none is set: the system roots, for mqtts://
// URLs.
func clientTLS(key, ca, cert, certKey, serverName string) (*tls.Config, error) {
	if ca == "" && cert == "" && serverName == "" {
		return nil, nil
	}
	tc := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: serverName}
	if ca != "" {
		pem, err := os.ReadFile(ca)
		if err != nil {
			return nil, fmt.Errorf("%s.ca: %w", key, err)
		}
		tc.RootCAs = x509.NewCertPool()
		if !tc.RootCAs.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("%s.ca: %s holds no PEM certificate", key, ca)
		}
	}
	if cert != "" {
		c, err := tls.LoadX509KeyPair(cert, certKey)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", key, err)
		}
		tc.Certificates = []tls.Certificate{c}
	}
	return tc, nil
}
