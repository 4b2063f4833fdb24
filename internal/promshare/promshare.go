// Package promshare registers Prometheus collectors that several parts of
// one process may declare alike (the CoAP and MQTT front ends both count
// fleetgate_evidence_total): the second registration shares the first.
package promshare

import (
	"errors"
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
)

// Register registers c with reg (nil: not registered) and returns the
// collector to use: c, or the one already registered with the same
// description.
func Register[C prometheus.Collector](reg prometheus.Registerer, c C) (C, error) {
	if reg == nil {
		return c, nil
	}
	err := reg.Register(c)
	if err == nil {
		return c, nil
	}
	var are prometheus.AlreadyRegisteredError
	if errors.As(err, &are) {
		if existing, ok := are.ExistingCollector.(C); ok {
			return existing, nil
		}
	}
	var zero C
	return zero, fmt.Errorf("register metrics: %w", err)
}
