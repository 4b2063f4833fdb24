package memq_test

import (
	"testing"

	"github.com/fleetgate/fleetgate/gateway"
	"github.com/fleetgate/fleetgate/queue/memq"
	"github.com/fleetgate/fleetgate/queue/queuetest"
)

// open makes a harness whose Open returns a new memory queue: not
// durable, a restart starts empty.
func open(t *testing.T, o queuetest.Options) queuetest.Harness {
	return queuetest.Harness{Open: func() (gateway.Queue, error) {
		return memq.New(memq.Options{MaxBytes: o.MaxBytes, MaxAge: o.MaxAge, Clock: o.Clock})
	}}
}

func TestConformance(t *testing.T) { queuetest.Run(t, open) }

func TestProperties(t *testing.T) { queuetest.RunProperties(t, open) }
