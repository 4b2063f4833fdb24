package main

import (
	"bytes"
	"fmt"

	"github.com/fleetgate/fleetgate/plugins/sdk"
)

// Line is one parsed line of a datagram; Err is set for a malformed line.
type Line struct {
	Kind     sdk.Kind
	Device   string
	Instance string
	Err      error
}

// maxField bounds a field; the gateway refuses longer IDs anyway.
const maxField = 200

// ParseDatagram splits a datagram into lines (LF or CRLF; empty lines
// are skipped) and parses each: "hb <device> [instance]" or
// "bye <device> [instance]", fields separated by spaces or tabs. It checks
// the shape only; the gateway checks the device and instance alphabet.
func ParseDatagram(b []byte) []Line {
	var out []Line
	for len(b) > 0 {
		var line []byte
		if i := bytes.IndexByte(b, '\n'); i >= 0 {
			line, b = b[:i], b[i+1:]
		} else {
			line, b = b, nil
		}
		line = bytes.TrimSuffix(line, []byte("\r"))
		if len(bytes.TrimSpace(line)) == 0 {
			continue
		}
		out = append(out, parseLine(line))
	}
	return out
}

func parseLine(line []byte) Line {
	f := bytes.Fields(line)
	if len(f) < 2 || len(f) > 3 {
		return Line{Err: fmt.Errorf("want \"hb|bye <device> [instance]\", got %d fields", len(f))}
	}
	var l Line
	switch string(f[0]) {
	case "hb":
		l.Kind = sdk.Renew
	case "bye":
		l.Kind = sdk.Leave
	default:
		return Line{Err: fmt.Errorf("unknown verb %q (want hb or bye)", truncate(f[0]))}
	}
	for _, x := range f[1:] {
		if len(x) > maxField {
			return Line{Err: fmt.Errorf("field of %d bytes, longest allowed is %d", len(x), maxField)}
		}
	}
	l.Device = string(f[1])
	if len(f) == 3 {
		l.Instance = string(f[2])
	}
	return l
}

func truncate(b []byte) string {
	if len(b) > 16 {
		return string(b[:16]) + "…"
	}
	return string(b)
}
