package redisstore

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
)

// TLSOptions are the TLS keys of store.redis: a private CA, the name to
// verify, and a client certificate. Empty fields take the defaults noted.
type TLSOptions struct {
	// CAFile is a PEM file of the CAs that sign the server's certificate
	// (tls_ca_file); empty: the system's roots.
	CAFile string
	// ServerName is the name verified in the server's certificate
	// (tls_server_name); empty: the host being dialled.
	ServerName string
	// CertFile and KeyFile are the client certificate and its key, PEM
	// (tls_cert_file, tls_key_file); both or neither.
	CertFile, KeyFile string
}

// TLSConfig builds the *tls.Config of Redis connections from o: TLS 1.2
// or later, the server's certificate verified against CAFile (or the
// system's roots) for ServerName, and the client certificate when set.
// Errors name the key of the file at fault.
func TLSConfig(o TLSOptions) (*tls.Config, error) {
	c := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: o.ServerName}
	if o.CAFile != "" {
		pem, err := os.ReadFile(o.CAFile)
		if err != nil {
			return nil, fmt.Errorf("store.redis.tls_ca_file: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("store.redis.tls_ca_file: %s holds no PEM certificate", o.CAFile)
		}
		c.RootCAs = pool
	}
	switch {
	case o.CertFile == "" && o.KeyFile == "":
	case o.CertFile == "" || o.KeyFile == "":
		return nil, errors.New("store.redis.tls_cert_file and tls_key_file must be set together")
	default:
		cert, err := tls.LoadX509KeyPair(o.CertFile, o.KeyFile)
		if err != nil {
			return nil, fmt.Errorf("store.redis.tls_cert_file, tls_key_file: %w", err)
		}
		c.Certificates = []tls.Certificate{cert}
	}
	return c, nil
}
