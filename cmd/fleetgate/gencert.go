package main

import (
	"cmp"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/fleetgate/fleetgate/configs"
)

// cmdGenCert writes a self-signed certificate and its key for the MQTT
// TLS listener, where listen.mqtt.cert_file and key_file name them (or
// --cert and --key), and prints the certificate's SHA-256 fingerprint.
func cmdGenCert(_ context.Context, args []string, stdout, stderr io.Writer) error {
	fs, path := newFlags("gen-cert", "gen-cert [-c FILE] [--cert FILE] [--key FILE] [--host NAME,...] [--days N] [--force]")
	certFile := fs.String("cert", "", "certificate `FILE` to write (default: listen.mqtt.cert_file of the configuration)")
	keyFile := fs.String("key", "", "key `FILE` to write (default: listen.mqtt.key_file of the configuration)")
	hosts := fs.String("host", "", "more DNS names and IP addresses the certificate names, comma-separated `NAME,...` (always: this host's name, localhost, 127.0.0.1, ::1)")
	days := fs.Int("days", 825, "`N` days of validity (1-3650)")
	force := fs.Bool("force", false, "replace existing files")
	if err := parse(fs, args); err != nil {
		return err
	}
	if err := noArgs(fs); err != nil {
		return err
	}
	if *days < 1 || *days > 3650 {
		return fmt.Errorf("%w: --days %d: want 1 to 3650", errUsage, *days)
	}
	if *certFile == "" || *keyFile == "" {
		cfg, err := configs.Load(*path, os.Environ())
		if err != nil {
			return configError{err}
		}
		*certFile = cmp.Or(*certFile, cfg.Listen.MQTT.CertFile)
		*keyFile = cmp.Or(*keyFile, cfg.Listen.MQTT.KeyFile)
	}
	if *certFile == "" || *keyFile == "" || *certFile == *keyFile {
		return fmt.Errorf("%w: want two distinct files: --cert and --key, or listen.mqtt.cert_file and key_file", errUsage)
	}
	names := []string{"localhost", "127.0.0.1", "::1"}
	if h, err := os.Hostname(); err == nil && h != "" {
		names = append([]string{h}, names...)
	}
	for _, h := range strings.Split(*hosts, ",") {
		if h = strings.TrimSpace(h); h != "" {
			names = append(names, h)
		}
	}
	certPEM, keyPEM, cert, err := selfSigned(names, time.Now(), *days, rand.Reader)
	if err != nil {
		return err
	}
	// The key is readable by the group of its directory: in /etc/fleetgate
	// (root:fleetgate 0750) that is the service's.
	group, err := writeNew(*keyFile, keyPEM, 0o640, *force, true)
	if err != nil {
		return err
	}
	if _, err := writeNew(*certFile, certPEM, 0o644, *force, false); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "wrote %s: self-signed, CN=%s, names %s, valid until %s\n",
		*certFile, cert.Subject.CommonName, strings.Join(certNames(cert), ", "), cert.NotAfter.UTC().Format(time.DateOnly))
	fmt.Fprintf(stdout, "wrote %s: its private key, mode 0640, group %s\n", *keyFile, group)
	fmt.Fprintf(stdout, "SHA-256 fingerprint: %s\n", fingerprint(cert.Raw))
	fmt.Fprintf(stdout, "clients trust it as their CA: mosquitto_pub --cafile %s -h %s -p 8883 ...\n", *certFile, cert.Subject.CommonName)
	return nil
}

// selfSigned makes an ECDSA P-256 certificate for names (DNS names and
// IP addresses; the first is its common name), valid from an hour before
// now for days, signed by its own key: clients take it as their CA. It
// returns the certificate and the key in PEM, and the certificate.
func selfSigned(names []string, now time.Time, days int, random io.Reader) (certPEM, keyPEM []byte, cert *x509.Certificate, err error) {
	if len(names) == 0 {
		return nil, nil, nil, errors.New("gen-cert: no name for the certificate")
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), random)
	if err != nil {
		return nil, nil, nil, err
	}
	serial, err := rand.Int(random, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		return nil, nil, nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{CommonName: names[0], Organization: []string{"fleetgate"}},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.AddDate(0, 0, days),
		KeyUsage:              x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	for _, n := range names {
		if ip := net.ParseIP(n); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else {
			tmpl.DNSNames = append(tmpl.DNSNames, n)
		}
	}
	der, err := x509.CreateCertificate(random, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, nil, nil, err
	}
	if cert, err = x509.ParseCertificate(der); err != nil {
		return nil, nil, nil, err
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, nil, nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}), cert, nil
}

// certNames lists the DNS names and IP addresses of cert.
func certNames(cert *x509.Certificate) []string {
	names := append([]string(nil), cert.DNSNames...)
	for _, ip := range cert.IPAddresses {
		names = append(names, ip.String())
	}
	return names
}

// fingerprint is the SHA-256 of der as colon-separated upper-case hex,
// as `openssl x509 -fingerprint -sha256` prints it.
func fingerprint(der []byte) string {
	sum := sha256.Sum256(der)
	parts := make([]string, len(sum))
	for i, b := range sum {
		parts[i] = fmt.Sprintf("%02X", b)
	}
	return strings.Join(parts, ":")
}

// writeNew writes b to path with mode perm, refusing an existing file
// unless force; with dirGroup, the file gets the group of its directory.
// It returns the file's group name.
func writeNew(path string, b []byte, perm os.FileMode, force, dirGroup bool) (string, error) {
	flags := os.O_WRONLY | os.O_CREATE | os.O_EXCL
	if force {
		flags = os.O_WRONLY | os.O_CREATE | os.O_TRUNC
	}
	f, err := os.OpenFile(path, flags, perm)
	if errors.Is(err, os.ErrExist) {
		return "", fmt.Errorf("%s exists: keep it, or replace it with --force", path)
	}
	if err != nil {
		return "", err
	}
	if dirGroup {
		if fi, err := os.Stat(filepath.Dir(path)); err == nil {
			if st, ok := fi.Sys().(*syscall.Stat_t); ok {
				if err := f.Chown(-1, int(st.Gid)); err != nil {
					f.Close()
					return "", fmt.Errorf("%s: give it the group of its directory: %w", path, err)
				}
			}
		}
	}
	_, err = f.Write(b)
	err = errors.Join(err, f.Chmod(perm), f.Close())
	if err != nil {
		return "", err
	}
	fi, err := os.Stat(path)
	if err != nil {
		return "", err
	}
	return groupName(int(fi.Sys().(*syscall.Stat_t).Gid)), nil
}
