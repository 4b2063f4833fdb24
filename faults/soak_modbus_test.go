//go:build faults && soak

package faults

import (
	"fmt"
	"io"
	"log"
	"sync"
	"testing"
	"time"

	"github.com/simonvetter/modbus"

	"github.com/fleetgate/fleetgate/internal/buildtest"
)

// modbusFleet is the soak's Modbus devices: one Modbus TCP server in the
// test process answers for all of them, one unit ID each, and each
// gateway's modbus adapter (the shipped plugin) polls its own devices.
// A device answers while it lives and replies with an exception between
// lives; every answer is acknowledged evidence in the truth, sent to the
// gateway that polls it.
type modbusFleet struct {
	truth  *soakTruth
	plugin string // the built adapter's directory
	server *modbus.ModbusServer
	addr   string

	mu    sync.Mutex
	units map[uint8]*modbusDevice
}

type modbusDevice struct {
	id string
	gw int
	lf *lifeRecord // nil between lives
	// last is when it last answered in its current life.
	last time.Time
}

// newModbusFleet builds the modbus adapter and starts the server for the
// plan's Modbus devices.
func newModbusFleet(t *testing.T, plan soakPlan, truth *soakTruth) *modbusFleet {
	m := &modbusFleet{truth: truth, plugin: t.TempDir(), units: map[uint8]*modbusDevice{}}
	var bin string
	if err := buildtest.Build(m.plugin, map[string]*string{"../plugins/modbus": &bin}); err != nil {
		t.Fatal(err)
	}
	unit := uint8(0)
	for _, p := range plan.devices {
		if p.kind != kindModbus {
			continue
		}
		if unit == 247 {
			t.Fatal("more than 247 Modbus devices")
		}
		unit++
		m.units[unit] = &modbusDevice{id: p.id, gw: p.lives[0].gw}
	}
	m.addr = freeTCP(t)
	srv, err := modbus.NewServer(&modbus.ServerConfiguration{URL: "tcp://" + m.addr, MaxClients: uint(2*len(m.units) + 8),
		Timeout: time.Minute, Logger: log.New(io.Discard, "", 0)}, m)
	if err == nil {
		err = srv.Start()
	}
	if err != nil {
		t.Fatalf("modbus server: %v", err)
	}
	m.server = srv
	t.Cleanup(func() { _ = srv.Stop() })
	return m
}

// config is gateway g's configuration of the modbus adapter (nil when no
// device is polled by it): every device polled every half heartbeat.
func (m *modbusFleet) config(g int) map[string]any {
	var devs []map[string]any
	for unit := uint8(1); int(unit) <= len(m.units); unit++ {
		d := m.units[unit]
		if d.gw != g {
			continue
		}
		devs = append(devs, map[string]any{"device": d.id, "host": m.addr, "unit_id": int(unit), "register": 0, "type": "holding",
			"interval": (fast.heartbeat / 2).String(), "timeout": time.Second.String()})
	}
	if len(devs) == 0 {
		return nil
	}
	return map[string]any{
		"plugins.dir": m.plugin,
		"plugins.adapters": []map[string]any{{"name": "modbus", "devices": []string{"soak-modbus-*"},
			"config": map[string]any{"devices": devs}}},
	}
}

// live runs one life of device id: it answers from now until l.end (or
// the fleet's stop); false when the fleet stopped during it.
func (m *modbusFleet) live(f *soakFleet, id string, l life) bool {
	d := m.device(id)
	lf := f.truth.beginLife(id, time.Now())
	m.mu.Lock()
	d.lf, d.last = lf, time.Time{}
	m.mu.Unlock()
	planned := l.end < f.duration
	stopped := false
	if planned {
		stopped = !f.wait(l.end)
	} else {
		<-f.quit
		stopped = true
	}
	m.mu.Lock()
	d.lf = nil
	last := d.last
	m.mu.Unlock()
	if !last.IsZero() {
		f.truth.sessionEnded(lf, d.gw, last, false)
	}
	f.truth.endLife(lf, stopped || !planned)
	return !stopped
}

func (m *modbusFleet) device(id string) *modbusDevice {
	for _, d := range m.units {
		if d.id == id {
			return d
		}
	}
	panic(fmt.Sprintf("no Modbus device %s", id))
}

// HandleHoldingRegisters answers a read of a living device and records
// it as evidence its gateway acknowledged; a device between lives
// answers with an exception (the adapter sends nothing then).
func (m *modbusFleet) HandleHoldingRegisters(req *modbus.HoldingRegistersRequest) ([]uint16, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	d := m.units[req.UnitId]
	if d == nil || d.lf == nil || req.IsWrite {
		return nil, modbus.ErrServerDeviceFailure
	}
	now := time.Now()
	m.truth.attempt(d.id, d.lf, 0, d.gw, now, true)
	d.last = now
	return make([]uint16, req.Quantity), nil
}

func (m *modbusFleet) HandleCoils(*modbus.CoilsRequest) ([]bool, error) {
	return nil, modbus.ErrIllegalFunction
}

func (m *modbusFleet) HandleDiscreteInputs(*modbus.DiscreteInputsRequest) ([]bool, error) {
	return nil, modbus.ErrIllegalFunction
}

func (m *modbusFleet) HandleInputRegisters(*modbus.InputRegistersRequest) ([]uint16, error) {
	return nil, modbus.ErrIllegalFunction
}
