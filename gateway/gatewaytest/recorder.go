// Package gatewaytest holds test helpers shared by the protocol front
// ends: an evidence recorder, reloadable credentials, a
// serve-until-cleanup runner, and recorders of the data path's
// collaborators (DataSink, Commands).
//
// DataSink and Commands are the one exception to the project's "no fakes
// but the clock": they are the front ends' collaborators, not the system
// under test, and a front end may not import the real ones (protocols
// import only gateway and internal). They keep the contract of
// gateway/data.go as far as a front end can see it, in memory, and
// record what they are handed. The real ones, package bridge over
// queue/diskq and queue/memq, are tested against real brokers in bridge
// and end to end through the binary in cmd/fleetgate.
package gatewaytest

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/fleetgate/fleetgate/gateway"
)

// Recorder is a test's observation point behind a front end: it records
// the evidence handed to it and answers with the error set by SetErr
// (nil: accepted). The zero value is ready to use.
type Recorder struct {
	mu  sync.Mutex
	evs []gateway.Evidence
	err error
}

var _ gateway.Observer = (*Recorder)(nil)

// Observe records ev unless an error is set, which it returns instead.
func (r *Recorder) Observe(_ context.Context, ev gateway.Evidence) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.err != nil {
		return r.err
	}
	r.evs = append(r.evs, ev)
	return nil
}

// SetErr makes Observe refuse with err (nil: accept again).
func (r *Recorder) SetErr(err error) {
	r.mu.Lock()
	r.err = err
	r.mu.Unlock()
}

// Evidence is a copy of what was recorded, in order.
func (r *Recorder) Evidence() []gateway.Evidence {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]gateway.Evidence(nil), r.evs...)
}

// Take returns what was recorded so far and forgets it.
func (r *Recorder) Take() []gateway.Evidence {
	r.mu.Lock()
	defer r.mu.Unlock()
	evs := r.evs
	r.evs = nil
	return evs
}

// Count is the number of pieces of evidence of kind k for session.
func (r *Recorder) Count(session gateway.SessionID, k gateway.Kind) int {
	n := 0
	for _, ev := range r.Evidence() {
		if ev.Session == session && ev.Kind == k {
			n++
		}
	}
	return n
}

// SessionOf is the session of the latest Connect of device ("" if none).
func (r *Recorder) SessionOf(device gateway.DeviceID) gateway.SessionID {
	var s gateway.SessionID
	for _, ev := range r.Evidence() {
		if ev.Device == device && ev.Kind == gateway.Connect {
			s = ev.Session
		}
	}
	return s
}

// Server is a front end as the tests drive it.
type Server interface {
	Serve(ctx context.Context) error
	Close() error
}

// Serve runs s until the test ends; at cleanup it closes s and checks
// that Serve returned nil within 10 s.
func Serve(t testing.TB, s Server) {
	t.Helper()
	served := make(chan error, 1)
	go func() { served <- s.Serve(context.Background()) }()
	t.Cleanup(func() {
		if err := s.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
		select {
		case err := <-served:
			if err != nil {
				t.Errorf("Serve: %v", err)
			}
		case <-time.After(10 * time.Second):
			t.Errorf("Serve did not return after Close")
		}
	})
}
