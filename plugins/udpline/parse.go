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
	// Data is true for a heartbeat that carries data: Topic and Payload.
	Data    bool
	Topic   string
	Payload []byte
	Err     error
}

// maxField bounds a field; the gateway refuses longer IDs anyway.
const maxField = 200

// ParseDatagram splits a datagram into lines (LF or CRLF; empty lines
// are skipped) and parses each:
//
//	hb <device> [instance]
//	hb <device> [instance] ><topic> <payload>
//	bye <device> [instance]
//
// Fields are separated by spaces or tabs. A field that starts with ">"
// begins a heartbeat's data: the rest of that field is the topic ("" for
// the device's root), and the payload is everything after the one space
// or tab that follows it, to the end of the line, kept byte for byte
// (empty when the line ends after the topic). It checks the shape only;
// the gateway checks the device and instance alphabet and the topic.
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

func isBlank(c byte) bool { return c == ' ' || c == '\t' }

// cutField returns the first field of b (after leading blanks) and what
// follows it (starting with the blank that ends it, if any).
func cutField(b []byte) (field, rest []byte) {
	i := 0
	for i < len(b) && isBlank(b[i]) {
		i++
	}
	j := i
	for j < len(b) && !isBlank(b[j]) {
		j++
	}
	return b[i:j], b[j:]
}

func parseLine(line []byte) Line {
	var fields [][]byte
	var l Line
	rest := line
	for {
		f, r := cutField(rest)
		if len(f) == 0 {
			break
		}
		if f[0] == '>' {
			l.Data, l.Topic = true, string(f[1:])
			if len(r) > 0 { // the one blank after the topic
				r = r[1:]
			}
			l.Payload = bytes.Clone(r) // the datagram's buffer is read into again
			break
		}
		fields = append(fields, f)
		rest = r
		if len(fields) > 3 {
			break
		}
	}
	if len(fields) < 2 || len(fields) > 3 {
		return Line{Err: fmt.Errorf("want \"hb|bye <device> [instance]\" or \"hb <device> [instance] ><topic> <payload>\", got %d fields", len(fields))}
	}
	switch string(fields[0]) {
	case "hb":
		l.Kind = sdk.Renew
	case "bye":
		if l.Data {
			return Line{Err: fmt.Errorf("bye carries no data (\">%s\")", truncate([]byte(l.Topic)))}
		}
		l.Kind = sdk.Leave
	default:
		return Line{Err: fmt.Errorf("unknown verb %q (want hb or bye)", truncate(fields[0]))}
	}
	for _, x := range fields[1:] {
		if len(x) > maxField {
			return Line{Err: fmt.Errorf("field of %d bytes, longest allowed is %d", len(x), maxField)}
		}
	}
	if len(l.Topic) > maxTopic {
		return Line{Err: fmt.Errorf("topic of %d bytes, longest allowed is %d", len(l.Topic), maxTopic)}
	}
	l.Device = string(fields[1])
	if len(fields) == 3 {
		l.Instance = string(fields[2])
	}
	return l
}

// maxTopic bounds a data topic (the gateway's bound).
const maxTopic = 1024

func truncate(b []byte) string {
	if len(b) > 16 {
		return string(b[:16]) + "…"
	}
	return string(b)
}
