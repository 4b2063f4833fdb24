package main

import (
	"bytes"
	"crypto/x509"
	"encoding/pem"
	"testing"

	"golang.org/x/crypto/x509roots/fallback/bundle"
)

// The bundle holds every unconstrained root of the pinned module and
// only those, each a certificate that parses, and two runs give the same
// bytes.
func TestBundle(t *testing.T) {
	b, err := pemBundle()
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]bool{}
	constrained := 0
	for r := range bundle.Roots() {
		if r.Constraint != nil {
			constrained++
			continue
		}
		want[string(r.Certificate)] = true
	}
	pool := x509.NewCertPool()
	got := 0
	for rest := b; ; {
		var blk *pem.Block
		blk, rest = pem.Decode(rest)
		if blk == nil {
			if len(bytes.TrimSpace(rest)) != 0 {
				t.Fatalf("not PEM after %d certificates: %.80q", got, rest)
			}
			break
		}
		c, err := x509.ParseCertificate(blk.Bytes)
		if err != nil || blk.Type != "CERTIFICATE" || !want[string(blk.Bytes)] {
			t.Fatalf("block %d (%s): %v, or not an unconstrained root of the bundle", got, blk.Type, err)
		}
		pool.AddCert(c)
		got++
	}
	if got != len(want) || got < 100 {
		t.Errorf("%d certificates, want the bundle's %d unconstrained roots (%d constrained left out)", got, len(want), constrained)
	}
	if again, _ := pemBundle(); !bytes.Equal(again, b) {
		t.Error("a second run gives other bytes")
	}
	t.Logf("%d roots, %d constrained left out, %d bytes", got, constrained, len(b))
}
