// Command modbus is a fleetgate adapter plugin for PLCs and meters that
// answer Modbus TCP and never send anything on their own: it polls each
// configured device, and every successful read is presence evidence for
// it (a renewal of its "default" session). A failed read is logged at
// debug level and sends nothing: the lease decides. Config (the adapter's
// `config` subtree):
//
//	devices:
//	  - device: plc-1          # the device ID
//	    host: "10.0.0.5:502"   # Modbus TCP address
//	    unit_id: 1             # 0..255, default 1
//	    register: 0            # address read, 0..65535
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
	Type     string   `json:"type"`
	Interval duration `json:"interval"`
	Timeout  duration `json:"timeout"`
}

type config struct {
	Devices []target `json:"devices"`
}

type adapter struct {
	cfg config
}

func (a *adapter) Configure(_ context.Context, raw []byte) error {
	var c config
	if err := sdk.DecodeConfig(raw, &c); err != nil {
		return err
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
	return nil
}

func (a *adapter) Run(ctx context.Context, sink sdk.Sink) error {
	sink.Ready()
	var wg sync.WaitGroup
	for _, t := range a.cfg.Devices {
		wg.Go(func() { poll(ctx, t, sink) })
	}
	wg.Wait()
	return nil
}

// poll reads t's register every interval until ctx ends.
func poll(ctx context.Context, t target, sink sdk.Sink) {
	lg := sdk.Logger(ctx).With("device", t.Device, "host", t.Host)
	// The library logs to stdout unless told otherwise; stdout belongs to
	// the plugin handshake.
	libLog := log.New(os.Stderr, "modbus: ", 0)
	var c *modbus.ModbusClient
	closeClient := func() {
		if c != nil {
			_ = c.Close()
			c = nil
		}
	}
	defer closeClient()
	tick := time.NewTicker(time.Duration(t.Interval))
	defer tick.Stop()
	for {
		if c == nil {
			nc, err := modbus.NewClient(&modbus.ClientConfiguration{URL: "tcp://" + t.Host, Timeout: time.Duration(t.Timeout), Logger: libLog})
			if err == nil {
				err = nc.Open()
			}
			if err == nil {
				err = nc.SetUnitId(uint8(*t.UnitID))
			}
			if err != nil {
				lg.Debug("connect failed", "error", err)
			} else {
				c = nc
			}
		}
		if c != nil {
			if err := read(c, t); err != nil {
				lg.Debug("read failed", "error", err)
				closeClient()
			} else if err := sink.Send(ctx, sdk.Evidence{Kind: sdk.Renew, Device: t.Device}); err != nil {
				return
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

func read(c *modbus.ModbusClient, t target) error {
	addr := uint16(t.Register)
	var err error
	switch t.Type {
	case "holding":
		_, err = c.ReadRegister(addr, modbus.HOLDING_REGISTER)
	case "input":
		_, err = c.ReadRegister(addr, modbus.INPUT_REGISTER)
	case "coil":
		_, err = c.ReadCoil(addr)
	case "discrete":
		_, err = c.ReadDiscreteInput(addr)
	}
	return err
}
