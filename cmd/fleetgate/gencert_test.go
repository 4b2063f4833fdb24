package main

import (
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// gen-cert writes a certificate that clients can take as their CA for
// this host's names, a key of mode 0640 that pairs with it, and prints
// the certificate's SHA-256 fingerprint; it keeps existing files unless
// --force.
func TestGenCert(t *testing.T) {
	dir := t.TempDir()
	cert, key := filepath.Join(dir, "mqtt.crt"), filepath.Join(dir, "mqtt.key")
	code, out, errs := runCLI(t, "gen-cert", "--cert", cert, "--key", key, "--host", "gw.example.org,192.0.2.7")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errs)
	}
	pair, err := tls.LoadX509KeyPair(cert, key)
	if err != nil {
		t.Fatal(err)
	}
	leaf, err := x509.ParseCertificate(pair.Certificate[0])
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(leaf.Raw)
	if want := "SHA-256 fingerprint: " + strings.ReplaceAll(fmt.Sprintf("% X", sum), " ", ":") + "\n"; !strings.Contains(out, want) {
		t.Errorf("output lacks %q:\n%s", want, out)
	}
	roots := x509.NewCertPool()
	roots.AddCert(leaf)
	for _, name := range []string{"localhost", "127.0.0.1", "::1", "gw.example.org", "192.0.2.7"} {
		if _, err := leaf.Verify(x509.VerifyOptions{DNSName: name, Roots: roots, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}); err != nil {
			t.Errorf("%s: %v", name, err)
		}
	}
	if _, err := leaf.Verify(x509.VerifyOptions{DNSName: "other.example.org", Roots: roots}); err == nil {
		t.Error("the certificate verifies for a name it does not hold")
	}
	for path, mode := range map[string]os.FileMode{cert: 0o644, key: 0o640} {
		if fi, err := os.Stat(path); err != nil || fi.Mode().Perm() != mode {
			t.Errorf("%s: %v, %v; want mode %04o", path, fi.Mode(), err, mode)
		}
	}
	if code, _, errs := runCLI(t, "gen-cert", "--cert", cert, "--key", key); code != 1 || !strings.Contains(errs, key+" exists: keep it, or replace it with --force") {
		t.Errorf("second run: exit %d, %s", code, errs)
	}
	if code, _, errs := runCLI(t, "gen-cert", "--cert", cert, "--key", key, "--force"); code != 0 {
		t.Errorf("--force: exit %d, %s", code, errs)
	}
	if again, err := tls.LoadX509KeyPair(cert, key); err != nil || string(again.Certificate[0]) == string(pair.Certificate[0]) {
		t.Errorf("--force did not write a new pair: %v", err)
	}
}
