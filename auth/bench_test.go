package auth_test

import (
	"bytes"
	"fmt"
	"testing"
	"time"

	"github.com/fleetgate/fleetgate/auth"
	"go.yaml.in/yaml/v3"
	"golang.org/x/crypto/bcrypt"
)

// fleetFile is a devices file of n devices, each with a key and a
// password hash.
func fleetFile(b *testing.B, n int) []byte {
	hash := hash4(b, "pw")
	var buf bytes.Buffer
	buf.WriteString("devices:\n")
	for i := range n {
		fmt.Fprintf(&buf, "  - id: dev-%07d\n    psk: \"hex:%032x\"\n    password_bcrypt: %q\n", i, i, hash)
	}
	return buf.Bytes()
}

// BenchmarkParseFleet parses a file of 100,000 devices (what a SIGHUP
// reload costs) and reports the time per device next to the ceiling
// measured in the same run: decoding the same file into a bare yaml.Node,
// which Parse does before it validates. ratio = Parse / ceiling.
func BenchmarkParseFleet(b *testing.B) {
	const n = 100_000
	data := fleetFile(b, n)
	var parse, ceiling time.Duration
	for range b.N {
		start := time.Now()
		var node yaml.Node
		if err := yaml.Unmarshal(data, &node); err != nil {
			b.Fatal(err)
		}
		ceiling += time.Since(start)

		start = time.Now()
		d, err := auth.Parse("devices.yaml", data)
		if err != nil {
			b.Fatal(err)
		}
		parse += time.Since(start)
		if d.Len() != n {
			b.Fatalf("parsed %d devices, want %d", d.Len(), n)
		}
	}
	perDevice := float64(parse.Nanoseconds()) / float64(b.N*n)
	ceilingPerDevice := float64(ceiling.Nanoseconds()) / float64(b.N*n)
	b.ReportMetric(perDevice, "ns/device")
	b.ReportMetric(ceilingPerDevice, "ceiling-ns/device")
	b.ReportMetric(perDevice/ceilingPerDevice, "ratio")
}

// BenchmarkCheckPassword reports the time of CheckPassword for a known
// device with a wrong password and for an unknown device, each as a ratio
// to a bare bcrypt comparison at the same cost measured in the same run
// (the ceiling): both should be ≈ 1 whether the guard compared or only
// waited, so that the time does not tell which devices exist. It also
// reports the time of a verification answered by the cache (known device,
// its password), which does no bcrypt work.
func BenchmarkCheckPassword(b *testing.B) {
	hash, err := auth.HashPassword([]byte("pw"), auth.DefaultCost)
	if err != nil {
		b.Fatal(err)
	}
	d, err := auth.Parse("devices.yaml", fmt.Appendf(nil, "devices:\n  - id: known\n    password_bcrypt: %q\n", hash))
	if err != nil {
		b.Fatal(err)
	}
	if err := d.CheckPassword("known", []byte("pw")); err != nil {
		b.Fatal(err)
	}
	var cached, wrong, unknown, ceiling time.Duration
	for range b.N {
		start := time.Now()
		_ = bcrypt.CompareHashAndPassword([]byte(hash), []byte("pw"))
		ceiling += time.Since(start)

		start = time.Now()
		if err := d.CheckPassword("known", []byte("pw")); err != nil {
			b.Fatal(err)
		}
		cached += time.Since(start)

		start = time.Now()
		if d.CheckPassword("known", []byte("pv")) == nil {
			b.Fatal("wrong password accepted")
		}
		wrong += time.Since(start)

		start = time.Now()
		if d.CheckPassword("unknown", []byte("pw")) == nil {
			b.Fatal("unknown device accepted")
		}
		unknown += time.Since(start)
	}
	b.ReportMetric(float64(ceiling.Microseconds())/float64(b.N), "ceiling-µs/check")
	b.ReportMetric(float64(cached.Microseconds())/float64(b.N), "cached-µs/check")
	b.ReportMetric(float64(wrong)/float64(ceiling), "wrong-ratio")
	b.ReportMetric(float64(unknown)/float64(ceiling), "unknown-ratio")
}
