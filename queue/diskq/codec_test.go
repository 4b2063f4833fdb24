package diskq

import (
	"bytes"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/fleetgate/fleetgate/gateway"
)

var t0 = time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)

// samples are messages that cover every field of the encoding.
var samples = []gateway.Message{
	{Device: "dev-1", Received: t0},
	{Device: "dev-2", Topic: "telemetry/temp", Payload: []byte(`{"c":21.5}`), ContentType: "application/json",
		Properties: []gateway.Property{{Key: "k", Value: "v"}, {Key: "", Value: ""}, {Key: "ü", Value: "√"}}, QoS: 1,
		Received: t0.Add(1234 * time.Millisecond), Source: "mqtt"},
	{Device: "dev-3", Topic: "x", Payload: []byte{0, 0xff, 0x80}, QoS: 1, Received: time.Time{}, Source: "coap"},
	{Device: "dev-4", Topic: "cmd/reboot", Payload: bytes.Repeat([]byte("p"), 70_000), Received: time.UnixMilli(-1).UTC(), Source: "upstream"},
}

// Every sample decodes to itself, and the fields' size is its Size.
func TestEncodeDecode(t *testing.T) {
	for i, m := range samples {
		v := encode(m)
		got, err := decode(v)
		if err != nil {
			t.Fatalf("sample %d: %v", i, err)
		}
		if !sameMessage(got, m) {
			t.Fatalf("sample %d: decoded %+v, want %+v", i, got, m)
		}
		f, _ := parse(v)
		if f.size() != int64(m.Size()) {
			t.Fatalf("sample %d: size %d, Size %d", i, f.size(), m.Size())
		}
	}
}

// Any damage a disk may do to one value is found: every single bit
// flipped, every truncation, and a byte appended fail to decode with
// errCorrupt (the checksum covers everything after it, and the parser
// reads to the last byte).
func TestDamageFound(t *testing.T) {
	v := encode(samples[1])
	for i := range len(v) * 8 {
		w := slices.Clone(v)
		w[i/8] ^= 1 << (i % 8)
		if _, err := decode(w); !errors.Is(err, errCorrupt) {
			t.Fatalf("bit %d flipped: %v, want errCorrupt", i, err)
		}
	}
	for n := range len(v) {
		if _, err := decode(v[:n]); !errors.Is(err, errCorrupt) {
			t.Fatalf("cut to %d bytes: %v, want errCorrupt", n, err)
		}
	}
	// The payload is the rest of the value: a byte appended is a longer
	// payload, which the checksum refuses.
	if _, err := decode(append(slices.Clone(v), 'x')); !errors.Is(err, errCorrupt) {
		t.Fatalf("byte appended: %v, want errCorrupt", err)
	}
}

// A value of another format is refused even with a good checksum.
func TestOtherFormatRefused(t *testing.T) {
	v := encode(samples[0])
	v[crcLen] = format + 1
	reseal(v)
	if _, err := decode(v); !errors.Is(err, errCorrupt) {
		t.Fatalf("format %d: %v, want errCorrupt", format+1, err)
	}
}

// reseal writes v's checksum again after a change.
func reseal(v []byte) {
	sum := crc32Of(v[crcLen:])
	v[0], v[1], v[2], v[3] = byte(sum>>24), byte(sum>>16), byte(sum>>8), byte(sum)
}

func sameMessage(a, b gateway.Message) bool {
	return a.Device == b.Device && a.Topic == b.Topic && bytes.Equal(a.Payload, b.Payload) &&
		a.ContentType == b.ContentType && slices.Equal(a.Properties, b.Properties) && a.QoS == b.QoS &&
		a.Received.Equal(time.UnixMilli(b.Received.UnixMilli())) && a.Source == b.Source
}

// FuzzDecode feeds values as a damaged file may hold them (the seed
// corpus in testdata/fuzz/FuzzDecode has valid values of each shape,
// lengths past the end, a huge property count, another format, each
// resealed so that the parser, not the checksum, meets them). decode
// refuses or reads them, never panics nor allocates past the value's
// size, and what it reads encodes to a value that decodes the same.
func FuzzDecode(f *testing.F) {
	for _, m := range samples[:3] {
		f.Add(encode(m))
	}
	f.Fuzz(func(t *testing.T, v []byte) {
		check := func(v []byte) {
			m, err := decode(v)
			if err != nil {
				if !errors.Is(err, errCorrupt) {
					t.Fatalf("error %v does not wrap errCorrupt", err)
				}
				return
			}
			fs, _ := parse(v)
			if fs.size() != int64(m.Size()) {
				t.Fatalf("size %d, Size %d", fs.size(), m.Size())
			}
			again, err := decode(encode(m))
			if err != nil {
				t.Fatalf("re-encoded value does not decode: %v", err)
			}
			if !sameMessage(again, m) {
				t.Fatalf("decoded %+v, after a round trip %+v", m, again)
			}
		}
		check(v)
		// The same bytes with a good checksum reach the parser.
		if len(v) >= crcLen {
			w := slices.Clone(v)
			reseal(w)
			check(w)
		}
	})
}
