package redisstore_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/fleetgate/fleetgate/gateway"
	"github.com/fleetgate/fleetgate/internal/redistest"
	"github.com/fleetgate/fleetgate/store/redisstore"
)

// pki is a private CA with a server certificate for "redis.internal" and
// a client certificate, written as PEM files.
type pki struct {
	dir                       string
	caFile, certFile, keyFile string
	serverCert, serverKey     string // the server's, for redis-server
	server                    tls.Certificate
	caPool                    *x509.CertPool
}

func newPKI(t *testing.T) pki {
	t.Helper()
	p := pki{dir: t.TempDir()}
	caKey := genKey(t)
	caTmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "fleetgate test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	ca, _ := x509.ParseCertificate(caDER)
	p.caPool = x509.NewCertPool()
	p.caPool.AddCert(ca)
	p.caFile = p.write(t, "ca.pem", "CERTIFICATE", caDER)

	leaf := func(serial int64, usage x509.ExtKeyUsage, names ...string) ([]byte, *ecdsa.PrivateKey) {
		k := genKey(t)
		tmpl := &x509.Certificate{
			SerialNumber: big.NewInt(serial), Subject: pkix.Name{CommonName: "leaf"},
			NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
			DNSNames: names, KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{usage},
		}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &k.PublicKey, caKey)
		if err != nil {
			t.Fatal(err)
		}
		return der, k
	}
	srvDER, srvKey := leaf(2, x509.ExtKeyUsageServerAuth, "redis.internal")
	p.server = tls.Certificate{Certificate: [][]byte{srvDER}, PrivateKey: srvKey}
	p.serverCert = p.write(t, "server.pem", "CERTIFICATE", srvDER)
	srvKeyDER, err := x509.MarshalECPrivateKey(srvKey)
	if err != nil {
		t.Fatal(err)
	}
	p.serverKey = p.write(t, "server.key", "EC PRIVATE KEY", srvKeyDER)
	cliDER, cliKey := leaf(3, x509.ExtKeyUsageClientAuth)
	p.certFile = p.write(t, "client.pem", "CERTIFICATE", cliDER)
	keyDER, err := x509.MarshalECPrivateKey(cliKey)
	if err != nil {
		t.Fatal(err)
	}
	p.keyFile = p.write(t, "client.key", "EC PRIVATE KEY", keyDER)
	return p
}

func genKey(t *testing.T) *ecdsa.PrivateKey {
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

func (p pki) write(t *testing.T, name, typ string, der []byte) string {
	path := filepath.Join(p.dir, name)
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// serveTLS accepts one connection on loopback with the server's
// certificate, requiring a client certificate of the CA, and reports the
// handshake's result.
func serveTLS(t *testing.T, p pki) (string, <-chan error) {
	t.Helper()
	ln, err := tls.Listen("tcp", "127.0.0.1:0", &tls.Config{
		Certificates: []tls.Certificate{p.server}, ClientCAs: p.caPool,
		ClientAuth: tls.RequireAndVerifyClientCert, MinVersion: tls.VersionTLS12,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ln.Close() })
	done := make(chan error, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			done <- err
			return
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(5 * time.Second))
		done <- c.(*tls.Conn).Handshake()
	}()
	return ln.Addr().String(), done
}

func dialWith(t *testing.T, addr string, c *tls.Config) error {
	t.Helper()
	d := &net.Dialer{Timeout: 5 * time.Second}
	conn, err := tls.DialWithDialer(d, "tcp", addr, c)
	if err != nil {
		return err
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(5 * time.Second))
	// TLS 1.3 reports a refused client certificate on the first read.
	_, err = conn.Read(make([]byte, 1))
	if err != nil && !strings.Contains(err.Error(), "EOF") {
		return err
	}
	return nil
}

// A private CA, a server name and a client certificate make a handshake
// with a server that requires a client certificate.
func TestTLSConfig(t *testing.T) {
	p := newPKI(t)
	c, err := redisstore.TLSConfig(redisstore.TLSOptions{CAFile: p.caFile, ServerName: "redis.internal", CertFile: p.certFile, KeyFile: p.keyFile})
	if err != nil {
		t.Fatal(err)
	}
	if c.MinVersion != tls.VersionTLS12 || len(c.Certificates) != 1 || c.InsecureSkipVerify {
		t.Fatalf("config %+v", c)
	}
	addr, done := serveTLS(t, p)
	if err := dialWith(t, addr, c); err != nil {
		t.Fatalf("handshake: %v", err)
	}
	if err := <-done; err != nil {
		t.Fatalf("server side: %v", err)
	}

	// Another name than the certificate's is refused.
	wrong, err := redisstore.TLSConfig(redisstore.TLSOptions{CAFile: p.caFile, ServerName: "other.internal", CertFile: p.certFile, KeyFile: p.keyFile})
	if err != nil {
		t.Fatal(err)
	}
	addr, _ = serveTLS(t, p)
	if err := dialWith(t, addr, wrong); err == nil {
		t.Fatal("a certificate for another name was accepted")
	}
	// Without the CA, the system's roots do not know the server.
	noCA, err := redisstore.TLSConfig(redisstore.TLSOptions{ServerName: "redis.internal", CertFile: p.certFile, KeyFile: p.keyFile})
	if err != nil {
		t.Fatal(err)
	}
	addr, _ = serveTLS(t, p)
	if err := dialWith(t, addr, noCA); err == nil {
		t.Fatal("a private CA's certificate was accepted without tls_ca_file")
	}
	// Without a client certificate, the server refuses.
	noCert, err := redisstore.TLSConfig(redisstore.TLSOptions{CAFile: p.caFile, ServerName: "redis.internal"})
	if err != nil {
		t.Fatal(err)
	}
	addr, _ = serveTLS(t, p)
	if err := dialWith(t, addr, noCert); err == nil {
		t.Fatal("the server took a client without a certificate")
	}
}

func TestTLSConfigErrors(t *testing.T) {
	p := newPKI(t)
	for _, c := range []struct {
		o    redisstore.TLSOptions
		want string
	}{
		{redisstore.TLSOptions{CAFile: filepath.Join(p.dir, "missing.pem")}, "store.redis.tls_ca_file: open"},
		{redisstore.TLSOptions{CAFile: p.keyFile}, "store.redis.tls_ca_file: " + p.keyFile + " holds no PEM certificate"},
		{redisstore.TLSOptions{CertFile: p.certFile}, "store.redis.tls_cert_file and tls_key_file must be set together"},
		{redisstore.TLSOptions{CertFile: p.certFile, KeyFile: p.caFile}, "store.redis.tls_cert_file, tls_key_file:"},
	} {
		_, err := redisstore.TLSConfig(c.o)
		if err == nil || !strings.HasPrefix(err.Error(), c.want) {
			t.Errorf("%+v: %v, want %q", c.o, err, c.want)
		}
	}
}

// Dial turns TLS on from the store.redis tls_ keys' options: against a
// redis-server that serves only TLS and requires a client certificate of
// the CA it opens the store and writes; without them it never reaches
// the store; a file it cannot use fails Dial at once, naming its key.
func TestDialTLS(t *testing.T) {
	p := newPKI(t)
	tlsAddr := fmt.Sprintf("127.0.0.1:%d", redistest.FreePort(t))
	_, port, _ := net.SplitHostPort(tlsAddr)
	redistest.Start(t, "--tls-port", port, "--tls-cert-file", p.serverCert, "--tls-key-file", p.serverKey,
		"--tls-ca-cert-file", p.caFile, "--tls-auth-clients", "yes")
	ctx := t.Context()
	opts := &redisstore.TLSOptions{CAFile: p.caFile, ServerName: "redis.internal", CertFile: p.certFile, KeyFile: p.keyFile}
	s, err := redisstore.Dial(ctx, redisstore.DialConfig{Addrs: []string{tlsAddr}, TLS: opts,
		Options: redisstore.Options{Prefix: "tls", Shards: 1}})
	if err != nil {
		t.Fatalf("dial over TLS: %v", err)
	}
	defer s.Close()
	b := gateway.Batch{Gateway: "gw-a", Epoch: 1, Lease: time.Minute,
		Writes: []gateway.Write{{Device: "dev-1", Session: "s", Kind: gateway.Connect}}}
	if _, err := s.Apply(ctx, 0, b); err != nil {
		t.Fatalf("apply over TLS: %v", err)
	}
	if d, err := s.Device(ctx, "dev-1"); err != nil || d.State != gateway.Online {
		t.Fatalf("device over TLS: %+v %v", d, err)
	}

	plain, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	if _, err := redisstore.Dial(plain, redisstore.DialConfig{Addrs: []string{tlsAddr},
		Options: redisstore.Options{Prefix: "tls", Shards: 1}}); err == nil {
		t.Fatal("a dial without TLS reached the TLS-only server")
	}
	bad := *opts
	bad.CAFile = filepath.Join(p.dir, "missing.pem")
	if _, err := redisstore.Dial(ctx, redisstore.DialConfig{Addrs: []string{tlsAddr}, TLS: &bad,
		Options: redisstore.Options{Prefix: "tls", Shards: 1}}); err == nil || !strings.HasPrefix(err.Error(), "store.redis.tls_ca_file: open") {
		t.Fatalf("dial with a missing CA file: %v", err)
	}
}
