// Command cabundle writes the CA certificates of the container image
// (/etc/ssl/certs/ca-certificates.crt) as PEM: the roots of the NSS
// trust store that golang.org/x/crypto/x509roots/fallback carries, at the
// version go.mod pins, so the image's bundle follows go.mod and not the
// build host's ca-certificates package.
//
//	go run ./internal/cabundle -o build/image/rootfs/etc/ssl/certs/ca-certificates.crt
//
// A root with a constraint that X.509 cannot express (NSS's "distrust
// after" date for certificates issued later) is left out: a PEM bundle
// would trust it without the constraint. The order is the module's, so
// the same version gives the same bytes.
package main

import (
	"bytes"
	"crypto/x509"
	"encoding/pem"
	"flag"
	"fmt"
	"os"

	"golang.org/x/crypto/x509roots/fallback/bundle"
)

func main() {
	out := flag.String("o", "", "the PEM bundle to write")
	flag.Parse()
	if *out == "" || flag.NArg() != 0 {
		fmt.Fprintln(os.Stderr, "usage: cabundle -o FILE")
		os.Exit(2)
	}
	b, err := pemBundle()
	if err == nil {
		err = os.WriteFile(*out, b, 0o644)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "cabundle:", err)
		os.Exit(1)
	}
}

// pemBundle is the unconstrained roots, each as a PEM block preceded by
// a comment line with its subject.
func pemBundle() ([]byte, error) {
	var b bytes.Buffer
	for r := range bundle.Roots() {
		if r.Constraint != nil {
			continue
		}
		c, err := x509.ParseCertificate(r.Certificate)
		if err != nil {
			return nil, err
		}
		fmt.Fprintf(&b, "# %s\n", c.Subject)
		if err := pem.Encode(&b, &pem.Block{Type: "CERTIFICATE", Bytes: r.Certificate}); err != nil {
			return nil, err
		}
	}
	if b.Len() == 0 {
		return nil, fmt.Errorf("no unconstrained root in golang.org/x/crypto/x509roots/fallback/bundle")
	}
	return b.Bytes(), nil
}
