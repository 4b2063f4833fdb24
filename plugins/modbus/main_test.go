package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/simonvetter/modbus"

	pb "github.com/fleetgate/fleetgate/plugins/proto"
	"github.com/fleetgate/fleetgate/plugins/sdk"
	"github.com/fleetgate/fleetgate/plugins/sdk/sdktest"
)

// plc answers unit 1 with 16 holding registers, input registers, coils
// and discrete inputs (addresses 0..15) it keeps, takes writes of holding
// registers and coils, and refuses every other unit.
type plc struct {
	mu    sync.Mutex
	regs  [16]uint16
	coils [16]bool
}

func newPLC() *plc {
	p := &plc{}
	p.regs[3], p.regs[4], p.regs[5] = 231, 0, 17
	p.coils[9] = true
	return p
}

func (*plc) check(unit uint8, addr, qty uint16) error {
	if unit != 1 {
		return modbus.ErrGWTargetFailedToRespond
	}
	if int(addr)+int(qty) > 16 {
		return modbus.ErrIllegalDataAddress
	}
	return nil
}

func (p *plc) HandleCoils(r *modbus.CoilsRequest) ([]bool, error) {
	if err := p.check(r.UnitId, r.Addr, r.Quantity); err != nil {
		return nil, err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if r.IsWrite {
		copy(p.coils[r.Addr:], r.Args)
		return nil, nil
	}
	return append([]bool(nil), p.coils[r.Addr:r.Addr+r.Quantity]...), nil
}

func (p *plc) HandleDiscreteInputs(r *modbus.DiscreteInputsRequest) ([]bool, error) {
	return make([]bool, r.Quantity), p.check(r.UnitId, r.Addr, r.Quantity)
}

func (p *plc) HandleHoldingRegisters(r *modbus.HoldingRegistersRequest) ([]uint16, error) {
	if err := p.check(r.UnitId, r.Addr, r.Quantity); err != nil {
		return nil, err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if r.IsWrite {
		copy(p.regs[r.Addr:], r.Args)
		return nil, nil
	}
	return append([]uint16(nil), p.regs[r.Addr:r.Addr+r.Quantity]...), nil
}

func (p *plc) HandleInputRegisters(r *modbus.InputRegistersRequest) ([]uint16, error) {
	return make([]uint16, r.Quantity), p.check(r.UnitId, r.Addr, r.Quantity)
}

func (p *plc) register(i int) uint16 {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.regs[i]
}

func (p *plc) coil(i int) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.coils[i]
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

// startPLC runs a Modbus TCP server of p on loopback until the test ends.
func startPLC(t *testing.T, p *plc) string {
	t.Helper()
	addr := freeTCP(t)
	s, err := modbus.NewServer(&modbus.ServerConfiguration{URL: "tcp://" + addr, MaxClients: 16, Timeout: 10 * time.Second, Logger: log.New(io.Discard, "", 0)}, p)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Stop() })
	return addr
}

// recSink records the data of each device.
type recSink struct {
	mu   sync.Mutex
	data map[string][]sdk.Data
}

func (r *recSink) Ready() {}

func (r *recSink) Send(context.Context, sdk.Evidence) error { return nil }

func (r *recSink) Data(_ context.Context, d sdk.Data) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.data[d.Device] = append(r.data[d.Device], d)
	return nil
}

func (r *recSink) of(dev string) []sdk.Data {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]sdk.Data(nil), r.data[dev]...)
}

// TestPollsOnlyAnsweringDevices polls four devices: two read fine
// (holding registers, a coil), one names a unit the server refuses, one a
// port nobody listens on; only the first two send data, the values they
// read.
func TestPollsOnlyAnsweringDevices(t *testing.T) {
	addr := startPLC(t, newPLC())
	dead := freeTCP(t)
	cfg := fmt.Sprintf(`{"qos": 1, "devices": [
		{"device": "plc-1", "host": %q, "register": 3, "count": 3, "interval": "100ms"},
		{"device": "plc-coil", "host": %q, "type": "coil", "register": 9, "interval": "100ms"},
		{"device": "plc-other-unit", "host": %q, "unit_id": 7, "interval": "100ms"},
		{"device": "plc-dead", "host": %q, "interval": "100ms", "timeout": "200ms"}
	]}`, addr, addr, addr, dead)
	a := &adapter{}
	if err := a.Configure(t.Context(), []byte(cfg)); err != nil {
		t.Fatal(err)
	}
	sink := &recSink{data: map[string][]sdk.Data{}}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx, sink) }()
	deadline := time.Now().Add(10 * time.Second)
	for len(sink.of("plc-1")) < 3 || len(sink.of("plc-coil")) < 3 {
		if time.Now().After(deadline) {
			t.Fatalf("after 10s: %d and %d polls, want 3 of plc-1 and plc-coil", len(sink.of("plc-1")), len(sink.of("plc-coil")))
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
	if n := len(sink.of("plc-other-unit")) + len(sink.of("plc-dead")); n != 0 {
		t.Fatalf("%d data items for devices that did not answer", n)
	}
	for dev, want := range map[string]string{
		"plc-1":    `{"type":"holding","address":3,"values":[231,0,17]}`,
		"plc-coil": `{"type":"coil","address":9,"values":[true]}`,
	} {
		d := sink.of(dev)[0]
		if string(d.Payload) != want || d.Topic != "registers" || d.ContentType != "application/json" || d.QoS != 1 {
			t.Errorf("%s's data %+v (%s), want %s on registers, QoS 1", dev, d, d.Payload, want)
		}
	}
}

// TestCommandWrites: cmd/write writes holding registers and coils of a
// real Modbus server; a write the server refuses, another topic, a bad
// body and an unknown device are refused.
func TestCommandWrites(t *testing.T) {
	p := newPLC()
	addr := startPLC(t, p)
	a := &adapter{}
	if err := a.Configure(t.Context(), []byte(fmt.Sprintf(`{"devices": [{"device": "plc-1", "host": %q}]}`, addr))); err != nil {
		t.Fatal(err)
	}
	defer a.conns["plc-1"].close()
	write := func(dev, topic, body string) error {
		return a.Command(t.Context(), sdk.Command{ID: 1, Device: dev, Topic: topic, Payload: []byte(body)})
	}
	if err := write("plc-1", "cmd/write", `{"type": "holding", "address": 10, "values": [1, 65535]}`); err != nil {
		t.Fatal(err)
	}
	if err := write("plc-1", "cmd/write", `{"type": "coil", "address": 2, "values": [true, false, true]}`); err != nil {
		t.Fatal(err)
	}
	if p.register(10) != 1 || p.register(11) != 65535 || !p.coil(2) || p.coil(3) || !p.coil(4) {
		t.Fatalf("registers %v, coils %v after the writes", p.regs, p.coils)
	}
	for _, c := range []struct{ dev, topic, body string }{
		{"plc-1", "cmd/write", `{"type": "holding", "address": 15, "values": [1, 2]}`}, // beyond the server's registers
		{"plc-1", "cmd/reboot", `{}`},
		{"plc-1", "cmd/write", `{"type": "holding", "address": 1}`},
		{"plc-2", "cmd/write", `{"type": "holding", "address": 1, "values": [1]}`},
	} {
		if err := write(c.dev, c.topic, c.body); err == nil {
			t.Errorf("Command(%s, %s, %s) = nil, want a refusal", c.dev, c.topic, c.body)
		}
	}
	// The connection survives a refused write: the next one goes through.
	if err := write("plc-1", "cmd/write", `{"type": "holding", "address": 0, "values": [7]}`); err != nil || p.register(0) != 7 {
		t.Fatalf("write after a refusal: %v, register 0 = %d", err, p.register(0))
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
		`{"devices": [{"device": "a", "host": "h:1", "count": 126}]}`,
		`{"devices": [{"device": "a", "host": "h:1", "type": "coil", "count": 2001}]}`,
		`{"devices": [{"device": "a", "host": "h:1", "register": 65535, "count": 2}]}`,
		`{"qos": 2, "devices": [{"device": "a", "host": "h:1"}]}`,
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
			addr := startPLC(t, newPLC())
			cfg := fmt.Sprintf(`{"devices": [{"device": "plc-1", "host": %q, "interval": "100ms"}]}`, addr)
			// The adapter polls on its own: every poll is the next evidence.
			return []byte(cfg), func(context.Context) (sdktest.Expect, error) {
				return sdktest.Expect{Kind: pb.Kind_KIND_RENEW, Device: "plc-1"}, nil
			}
		},
		BadConfig: []byte(`{"devices": []}`),
		SetupData: func(t *testing.T) ([]byte, sdktest.DataTrigger) {
			addr := startPLC(t, newPLC())
			cfg := fmt.Sprintf(`{"qos": 1, "devices": [{"device": "plc-1", "host": %q, "register": 3, "count": 3, "interval": "100ms"}]}`, addr)
			// Each poll waits for its settlement; the next one follows.
			return []byte(cfg), func(context.Context) (sdktest.ExpectData, <-chan error, error) {
				return sdktest.ExpectData{Kind: pb.Kind_KIND_RENEW, Device: "plc-1", Topic: "registers", ContentType: "application/json", QoS: 1,
					Payload: []byte(`{"type":"holding","address":3,"values":[231,0,17]}`)}, nil, nil
			}
		},
		SetupCommands: func(t *testing.T) ([]byte, sdktest.CommandCase) {
			p := newPLC()
			addr := startPLC(t, p)
			cfg := fmt.Sprintf(`{"devices": [{"device": "plc-1", "host": %q, "interval": "1s"}]}`, addr)
			return []byte(cfg), sdktest.CommandCase{
				Accept: &pb.Command{Id: 1, Device: "plc-1", Topic: "cmd/write", ContentType: "application/json",
					Payload: []byte(`{"type": "holding", "address": 12, "values": [4242]}`)},
				Received: func(context.Context) error {
					if v := p.register(12); v != 4242 {
						return fmt.Errorf("register 12 = %d, want 4242", v)
					}
					return nil
				},
				Refuse: &pb.Command{Id: 2, Device: "plc-1", Topic: "cmd/reboot"},
			}
		},
	})
}

func TestParseWrite(t *testing.T) {
	for _, tc := range []struct {
		body string
		want string // fmt of the Write, "" for an error
	}{
		{`{"type": "holding", "address": 10, "values": [1, 65535]}`, "{holding 10 [1 65535] []}"},
		{`{"type": "coil", "address": 0, "values": [true, false]}`, "{coil 0 [] [true false]}"},
		{` {"values": [0], "address": 65535, "type": "holding"} `, "{holding 65535 [0] []}"},
		{`{"type": "holding", "address": 65535, "values": [1, 2]}`, ""},
		{`{"type": "holding", "address": 1, "values": [65536]}`, ""},
		{`{"type": "holding", "address": 1, "values": [-1]}`, ""},
		{`{"type": "holding", "address": 1, "values": [1.5]}`, ""},
		{`{"type": "holding", "address": 1, "values": [true]}`, ""},
		{`{"type": "coil", "address": 1, "values": [1]}`, ""},
		{`{"type": "input", "address": 1, "values": [1]}`, ""},
		{`{"type": "holding", "values": [1]}`, ""},
		{`{"type": "holding", "address": 1, "values": []}`, ""},
		{`{"type": "holding", "address": 1, "values": [1], "unit": 2}`, ""},
		{`{"type": "holding", "address": 1, "values": [1]} {}`, ""},
		{`{"type": "holding", "address": 1, "values": [` + strings.Repeat("1,", 123) + `1]}`, ""},
	} {
		w, err := ParseWrite([]byte(tc.body))
		got := ""
		if err == nil {
			got = fmt.Sprint(w)
		}
		if got != tc.want {
			t.Errorf("ParseWrite(%s) = %s (%v), want %q", tc.body, got, err, tc.want)
		}
	}
}

// FuzzParseWrite: a write taken is of holding registers or coils, with 1
// to 123 registers or 1 to 1968 coils (never both) that all fit below
// address 65536.
func FuzzParseWrite(f *testing.F) {
	f.Add([]byte(`{"type": "holding", "address": 10, "values": [1, 2]}`))
	f.Add([]byte(`{"type": "coil", "address": 65534, "values": [true, false]}`))
	f.Add([]byte(`{"type": "holding", "address": 1e3, "values": [1e2]}`))
	f.Fuzz(func(t *testing.T, body []byte) {
		w, err := ParseWrite(body)
		if err != nil {
			return
		}
		n := len(w.Registers) + len(w.Coils)
		switch {
		case w.Type == "holding" && len(w.Coils) == 0 && n >= 1 && n <= maxWriteRegisters:
		case w.Type == "coil" && len(w.Registers) == 0 && n >= 1 && n <= maxWriteCoils:
		default:
			t.Fatalf("%s: %+v", body, w)
		}
		if int(w.Address)+n-1 > 65535 || !json.Valid(body) {
			t.Fatalf("%s: %+v beyond the addresses", body, w)
		}
	})
}
