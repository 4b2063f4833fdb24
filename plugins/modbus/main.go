// Command modbus is a fleetgate adapter plugin for PLCs and meters that
// answer Modbus TCP and never send anything on their own: it polls each
// configured device, and every successful read is presence evidence for
// it (a renewal of its "default" session) and its data: the values read,
// as JSON on topic "registers",
//
//	{"type": "holding", "address": 0, "values": [231, 0, 17]}
//
// (booleans for coils and discrete inputs). A failed read is logged at
// debug level and sends nothing: the lease decides. It takes one command,
// cmd/write, whose JSON body names the registers or coils to write:
//
//	{"type": "holding", "address": 10, "values": [1, 2]}
//	{"type": "coil", "address": 3, "values": [true]}
//
// written with one Modbus write (multiple registers or coils) over the
// device's connection; the command is taken once the device confirmed
// the write. Config (the adapter's `config` subtree):
//
//	qos: 0                     # the data's QoS: 0, or 1 (each poll waits
//	                           # until the gateway holds it durably)
//	devices:
//	  - device: plc-1          # the device ID
//	    host: "10.0.0.5:502"   # Modbus TCP address
//	    unit_id: 1             # 0..255, default 1
//	    register: 0            # first address read, 0..65535
//	    count: 1               # values read: 1..125 registers, 1..2000 bits
//	    type: holding          # holding, input, coil or discrete
//	    interval: 10s          # poll period, >= 100ms
//	    timeout: 2s            # per request, default min(interval, 2s)
package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log"
	"net"
	"os"
	"sync"
	"time"

	"github.com/simonvetter/modbus"

	"github.com/fleetgate/fleetgate/plugins/sdk"
)

// version is set by the Makefile's -ldflags.
var version = "dev"

func main() {
	sdk.Serve(sdk.Info{Name: "modbus", Version: version, Protocols: []string{"modbus-tcp"}}, &adapter{})
}

// duration is a JSON Go duration string.
type duration time.Duration

func (d *duration) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		return fmt.Errorf("want a duration string such as \"10s\": %w", err)
	}
	v, err := time.ParseDuration(s)
	if err != nil {
		return err
	}
	*d = duration(v)
	return nil
}

// target is one polled device.
type target struct {
	Device   string   `json:"device"`
	Host     string   `json:"host"`
	UnitID   *int     `json:"unit_id"`
	Register int      `json:"register"`
	Count    int      `json:"count"`
	Type     string   `json:"type"`
	Interval duration `json:"interval"`
	Timeout  duration `json:"timeout"`
}

type config struct {
	QoS     int      `json:"qos"`
	Devices []target `json:"devices"`
}

// Bounds of one read (Modbus: read registers, read coils or inputs).
const (
	maxReadRegisters = 125
	maxReadBits      = 2000
)

type adapter struct {
	cfg   config
	conns map[string]*conn // by device, made by Configure
}

var (
	_ sdk.Adapter   = (*adapter)(nil)
	_ sdk.Commander = (*adapter)(nil)
)

func (a *adapter) Configure(_ context.Context, raw []byte) error {
	var c config
	if err := sdk.DecodeConfig(raw, &c); err != nil {
		return err
	}
	if c.QoS != 0 && c.QoS != 1 {
		return fmt.Errorf("qos: must be 0 or 1, got %d", c.QoS)
	}
	if len(c.Devices) == 0 {
		return errors.New("devices: list at least one device to poll")
	}
	seen := map[string]bool{}
	for i := range c.Devices {
		t := &c.Devices[i]
		key := fmt.Sprintf("devices[%d]", i)
		if t.Device == "" {
			return fmt.Errorf("%s.device: must be set", key)
		}
		if seen[t.Device] {
			return fmt.Errorf("%s.device: %q is listed twice", key, t.Device)
		}
		seen[t.Device] = true
		if _, _, err := net.SplitHostPort(t.Host); err != nil {
			return fmt.Errorf("%s.host: %q: want host:port", key, t.Host)
		}
		if t.UnitID == nil {
			one := 1
			t.UnitID = &one
		}
		if *t.UnitID < 0 || *t.UnitID > 255 {
			return fmt.Errorf("%s.unit_id: must be 0..255, got %d", key, *t.UnitID)
		}
		if t.Register < 0 || t.Register > 65535 {
			return fmt.Errorf("%s.register: must be 0..65535, got %d", key, t.Register)
		}
		switch t.Type {
		case "":
			t.Type = "holding"
		case "holding", "input", "coil", "discrete":
		default:
			return fmt.Errorf("%s.type: must be holding, input, coil or discrete, got %q", key, t.Type)
		}
		if t.Count == 0 {
			t.Count = 1
		}
		limit := maxReadRegisters
		if t.Type == "coil" || t.Type == "discrete" {
			limit = maxReadBits
		}
		if t.Count < 1 || t.Count > limit || t.Register+t.Count-1 > 65535 {
			return fmt.Errorf("%s.count: must be 1..%d for %s, within addresses 0..65535, got %d", key, limit, t.Type, t.Count)
		}
		if t.Interval == 0 {
			t.Interval = duration(10 * time.Second)
		}
		if time.Duration(t.Interval) < 100*time.Millisecond {
			return fmt.Errorf("%s.interval: must be >= 100ms, got %s", key, time.Duration(t.Interval))
		}
		if t.Timeout == 0 {
			t.Timeout = duration(min(time.Duration(t.Interval), 2*time.Second))
		}
		if t.Timeout < 0 {
			return fmt.Errorf("%s.timeout: must be > 0", key)
		}
	}
	a.cfg = c
	a.conns = make(map[string]*conn, len(c.Devices))
	for _, t := range c.Devices {
		a.conns[t.Device] = &conn{t: t}
	}
	return nil
}

func (a *adapter) Run(ctx context.Context, sink sdk.Sink) error {
	sink.Ready()
	var wg sync.WaitGroup
	for _, t := range a.cfg.Devices {
		wg.Go(func() { a.poll(ctx, a.conns[t.Device], sink) })
	}
	wg.Wait()
	for _, c := range a.conns {
		c.close()
	}
	return nil
}

// conn is the connection to one device, shared by its polls and its
// commands (one request at a time), opened when needed and closed after
// a failed request.
type conn struct {
	t  target
	mu sync.Mutex
	c  *modbus.ModbusClient
}

// do runs f on the device's connection, opening it first if needed; an
// error closes it (the next request opens a new one).
func (c *conn) do(f func(*modbus.ModbusClient) error) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.c == nil {
		// The library logs to stdout unless told otherwise; stdout belongs
		// to the plugin handshake.
		nc, err := modbus.NewClient(&modbus.ClientConfiguration{URL: "tcp://" + c.t.Host, Timeout: time.Duration(c.t.Timeout),
			Logger: log.New(os.Stderr, "modbus: ", 0)})
		if err == nil {
			err = nc.Open()
		}
		if err == nil {
			err = nc.SetUnitId(uint8(*c.t.UnitID))
		}
		if err != nil {
			return fmt.Errorf("connect: %w", err)
		}
		c.c = nc
	}
	if err := f(c.c); err != nil {
		_ = c.c.Close()
		c.c = nil
		return err
	}
	return nil
}

func (c *conn) close() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.c != nil {
		_ = c.c.Close()
		c.c = nil
	}
}

// Registers is the data of one poll (topic "registers").
type Registers struct {
	Type    string `json:"type"`
	Address int    `json:"address"`
	// Values are numbers (holding, input) or booleans (coil, discrete).
	Values any `json:"values"`
}

// poll reads c's registers every interval until ctx ends and sends them.
func (a *adapter) poll(ctx context.Context, c *conn, sink sdk.Sink) {
	t := c.t
	lg := sdk.Logger(ctx).With("device", t.Device, "host", t.Host)
	tick := time.NewTicker(time.Duration(t.Interval))
	defer tick.Stop()
	for {
		var values any
		err := c.do(func(mc *modbus.ModbusClient) (err error) {
			values, err = read(mc, t)
			return err
		})
		if err != nil {
			lg.Debug("read failed", "error", err)
		} else {
			payload, err := json.Marshal(Registers{Type: t.Type, Address: t.Register, Values: values})
			if err != nil {
				lg.Error("encode the values", "error", err)
			} else {
				err = sink.Data(ctx, sdk.Data{Device: t.Device, Topic: "registers", Payload: payload,
					ContentType: "application/json", QoS: byte(a.cfg.QoS)})
				switch {
				case ctx.Err() != nil:
					return
				case err != nil && !errors.Is(err, sdk.ErrNoDataPath):
					lg.Debug("data not taken", "error", err)
				}
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

// read reads t's values: []uint16 for registers, []bool for bits.
func read(c *modbus.ModbusClient, t target) (any, error) {
	addr, n := uint16(t.Register), uint16(t.Count)
	switch t.Type {
	case "input":
		return c.ReadRegisters(addr, n, modbus.INPUT_REGISTER)
	case "coil":
		return c.ReadCoils(addr, n)
	case "discrete":
		return c.ReadDiscreteInputs(addr, n)
	}
	return c.ReadRegisters(addr, n, modbus.HOLDING_REGISTER)
}

// Command takes cmd/write for a configured device and writes it; the
// device's confirmation of the write takes the command.
func (a *adapter) Command(_ context.Context, cmd sdk.Command) error {
	c, ok := a.conns[cmd.Device]
	if !ok {
		return fmt.Errorf("%s is not a device of this adapter's config", cmd.Device)
	}
	if cmd.Topic != "cmd/write" {
		return fmt.Errorf("topic %q: this adapter takes cmd/write", truncate(cmd.Topic))
	}
	w, err := ParseWrite(cmd.Payload)
	if err != nil {
		return err
	}
	return c.do(func(mc *modbus.ModbusClient) error {
		if w.Type == "coil" {
			return mc.WriteCoils(w.Address, w.Coils)
		}
		return mc.WriteRegisters(w.Address, w.Registers)
	})
}
