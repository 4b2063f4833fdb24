package promshare

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

func TestRegisterShares(t *testing.T) {
	reg := prometheus.NewRegistry()
	opts := prometheus.CounterOpts{Name: "x_total", Help: "x"}
	a, err := Register(reg, prometheus.NewCounter(opts))
	if err != nil {
		t.Fatal(err)
	}
	b, err := Register(reg, prometheus.NewCounter(opts))
	if err != nil || b != a {
		t.Fatalf("second registration: %v, shared=%v; want the first collector", err, b == a)
	}
	if _, err := Register(reg, prometheus.NewGauge(prometheus.GaugeOpts{Name: "x_total", Help: "other help"})); err == nil {
		t.Fatal("a conflicting collector was accepted")
	}
	if c, err := Register[prometheus.Counter](nil, a); err != nil || c != a {
		t.Fatalf("nil registry: %v", err)
	}
}
