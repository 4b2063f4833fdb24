package main

import (
	"context"
	"fmt"
	"io"
	"log"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/simonvetter/modbus"

	pb "github.com/fleetgate/fleetgate/plugins/proto"
	"github.com/fleetgate/fleetgate/plugins/sdk"
	"github.com/fleetgate/fleetgate/plugins/sdk/sdktest"
)

// plc answers reads of unit 1 (register 0..9 of every type) and refuses
// every other unit.
type plc struct{}

func (plc) check(unit uint8, addr, qty uint16) error {
	if unit != 1 {
		return modbus.ErrGWTargetFailedToRespond
	}
	if int(addr)+int(qty) > 10 {
		return modbus.ErrIllegalDataAddress
	}
	return nil
}

func (p plc) HandleCoils(r *modbus.CoilsRequest) ([]bool, error) {
	return make([]bool, r.Quantity), p.check(r.UnitId, r.Addr, r.Quantity)
}

func (p plc) HandleDiscreteInputs(r *modbus.DiscreteInputsRequest) ([]bool, error) {
	return make([]bool, r.Quantity), p.check(r.UnitId, r.Addr, r.Quantity)
}

func (p plc) HandleHoldingRegisters(r *modbus.HoldingRegistersRequest) ([]uint16, error) {
	return make([]uint16, r.Quantity), p.check(r.UnitId, r.Addr, r.Quantity)
}

func (p plc) HandleInputRegisters(r *modbus.InputRegistersRequest) ([]uint16, error) {
	return make([]uint16, r.Quantity), p.check(r.UnitId, r.Addr, r.Quantity)
}

func freeTCP(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// startPLC runs a Modbus TCP server on loopback until the test ends.
func startPLC(t *testing.T) string {
	t.Helper()
	addr := freeTCP(t)
	s, err := modbus.NewServer(&modbus.ServerConfiguration{URL: "tcp://" + addr, MaxClients: 16, Timeout: 10 * time.Second, Logger: log.New(io.Discard, "", 0)}, plc{})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Stop() })
	return addr
}

type recSink struct {
	mu     sync.Mutex
	counts map[string]int
}

func (r *recSink) Ready() {}

func (r *recSink) Data(context.Context, sdk.Data) error { return nil }
func (r *recSink) Send(_ context.Context, ev sdk.Evidence) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if ev.Kind == sdk.Renew {
		r.counts[ev.Device]++
	}
	return nil
}

func (r *recSink) count(dev string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.counts[dev]
}

// TestPollsOnlyAnsweringDevices polls four devices: two read fine
// (holding register, coil), one names a unit the server refuses, one a
// port nobody listens on; only the first two become evidence.
func TestPollsOnlyAnsweringDevices(t *testing.T) {
	addr := startPLC(t)
	dead := freeTCP(t)
	cfg := fmt.Sprintf(`{"devices": [
		{"device": "plc-1", "host": %q, "register": 3, "interval": "100ms"},
		{"device": "plc-coil", "host": %q, "type": "coil", "register": 9, "interval": "100ms"},
		{"device": "plc-other-unit", "host": %q, "unit_id": 7, "interval": "100ms"},
		{"device": "plc-dead", "host": %q, "interval": "100ms", "timeout": "200ms"}
	]}`, addr, addr, addr, dead)
	a := &adapter{}
	if err := a.Configure(t.Context(), []byte(cfg)); err != nil {
		t.Fatal(err)
	}
	sink := &recSink{counts: map[string]int{}}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx, sink) }()
	deadline := time.Now().Add(10 * time.Second)
	for sink.count("plc-1") < 3 || sink.count("plc-coil") < 3 {
		if time.Now().After(deadline) {
			t.Fatalf("after 10s: %v, want 3 reads of plc-1 and plc-coil", sink.counts)
		}
		time.Sleep(20 * time.Millisecond)
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Run did not return after cancel")
	}
	if n := sink.count("plc-other-unit") + sink.count("plc-dead"); n != 0 {
		t.Fatalf("evidence for devices that did not answer: %v", sink.counts)
	}
}

func TestConfigureRefuses(t *testing.T) {
	for _, cfg := range []string{
		`{}`,
		`{"devices": [{"device": "a", "host": "nope"}]}`,
		`{"devices": [{"device": "a", "host": "h:1", "unit_id": 300}]}`,
		`{"devices": [{"device": "a", "host": "h:1", "type": "string"}]}`,
		`{"devices": [{"device": "a", "host": "h:1", "interval": "1ms"}]}`,
		`{"devices": [{"device": "a", "host": "h:1"}, {"device": "a", "host": "h:2"}]}`,
		`{"devices": [{"device": "a", "host": "h:1", "interval": 10}]}`,
	} {
		if err := (&adapter{}).Configure(t.Context(), []byte(cfg)); err == nil {
			t.Errorf("Configure(%s) = nil, want an error", cfg)
		}
	}
}

func TestConformance(t *testing.T) {
	sdktest.Conformance(t, sdktest.Suite{
		Info: sdk.Info{Name: "modbus", Version: "test"},
		New:  func(*testing.T) sdk.Adapter { return &adapter{} },
		Setup: func(t *testing.T) ([]byte, func(context.Context) (sdktest.Expect, error)) {
			addr := startPLC(t)
			cfg := fmt.Sprintf(`{"devices": [{"device": "plc-1", "host": %q, "interval": "100ms"}]}`, addr)
			// The adapter polls on its own: every poll is the next evidence.
			return []byte(cfg), func(context.Context) (sdktest.Expect, error) {
				return sdktest.Expect{Kind: pb.Kind_KIND_RENEW, Device: "plc-1"}, nil
			}
		},
		BadConfig: []byte(`{"devices": []}`),
	})
}
