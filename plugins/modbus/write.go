package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
)

// Bounds of one write (Modbus: write multiple registers, write multiple
// coils).
const (
	maxWriteRegisters = 123
	maxWriteCoils     = 1968
)

// Write is a cmd/write command: values written from Address on, to
// holding registers (Registers) or coils (Coils).
type Write struct {
	Type      string
	Address   uint16
	Registers []uint16
	Coils     []bool
}

// ParseWrite reads a cmd/write body, a JSON object:
//
//	{"type": "holding", "address": 10, "values": [1, 2, 65535]}
//	{"type": "coil", "address": 3, "values": [true, false]}
//
// type is holding (values 0..65535, 1 to 123 of them) or coil (values
// true or false, 1 to 1968); address is 0..65535 and the last value's
// address too. Unknown keys and anything after the object are errors.
func ParseWrite(body []byte) (Write, error) {
	var raw struct {
		Type    string            `json:"type"`
		Address *int              `json:"address"`
		Values  []json.RawMessage `json:"values"`
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&raw); err != nil {
		return Write{}, fmt.Errorf("write: %w", err)
	}
	if dec.More() || len(bytes.TrimSpace(body[dec.InputOffset():])) > 0 {
		return Write{}, errors.New("write: trailing data after the JSON object")
	}
	if raw.Address == nil || *raw.Address < 0 || *raw.Address > 65535 {
		return Write{}, errors.New("write: address must be 0..65535")
	}
	w := Write{Type: raw.Type, Address: uint16(*raw.Address)}
	limit := 0
	switch raw.Type {
	case "holding":
		limit = maxWriteRegisters
	case "coil":
		limit = maxWriteCoils
	default:
		return Write{}, fmt.Errorf("write: type %q: want holding or coil", truncate(raw.Type))
	}
	if len(raw.Values) == 0 || len(raw.Values) > limit {
		return Write{}, fmt.Errorf("write: %d values, want 1 to %d for %s", len(raw.Values), limit, raw.Type)
	}
	if *raw.Address+len(raw.Values)-1 > 65535 {
		return Write{}, fmt.Errorf("write: %d values from address %d go beyond 65535", len(raw.Values), *raw.Address)
	}
	for i, v := range raw.Values {
		if raw.Type == "coil" {
			var b bool
			if err := json.Unmarshal(v, &b); err != nil {
				return Write{}, fmt.Errorf("write: values[%d]: want true or false", i)
			}
			w.Coils = append(w.Coils, b)
			continue
		}
		var n uint16
		if err := json.Unmarshal(v, &n); err != nil {
			return Write{}, fmt.Errorf("write: values[%d]: want an integer 0..65535", i)
		}
		w.Registers = append(w.Registers, n)
	}
	return w, nil
}

func truncate(s string) string {
	if len(s) > 32 {
		return s[:32] + "…"
	}
	return s
}
