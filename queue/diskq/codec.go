package diskq

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"time"

	"github.com/fleetgate/fleetgate/gateway"
)

// On-disk format (format 1). Integers named "u64" are 8-byte big-endian,
// "uv" an unsigned varint, "v" a signed (zig-zag) varint
// (encoding/binary); "str" is a uv length followed by that many bytes.
//
// A queue is one top-level bucket of the file, named by Options.Bucket:
//
//	"meta"   byte format (1), u64 the last ID handed out, u64 messages
//	         held, u64 their bytes (Message.Size summed)
//	msgs/    u64 ID → message
//
// Every commit writes "meta" together with the messages it puts and
// removes, so Open reads the queue's size from it without a scan.
//
// Message (the value under its ID):
//
//	u32 CRC-32C (Castagnoli) of everything after it
//	byte format (1)
//	v    Received, milliseconds since the Unix epoch
//	byte QoS
//	str  device, str topic, str content type, str source
//	uv   property count, then per property: str key, str value
//	     payload: the rest of the value
//
// A value that is too short, fails its checksum, has another format or
// does not parse to its last byte is corrupt: Read drops it and counts
// it (DropCorrupt). Its Size is not known; the queue's byte count goes
// down by its length plus 64, never below zero, and is zero again
// whenever the queue is empty.
const (
	format     = 1
	metaLen    = 1 + 3*8
	crcLen     = 4
	headerSize = 64 // Message.Size's fixed part
)

var (
	keyMeta    = []byte("meta")
	bucketMsgs = []byte("msgs")
	castagnoli = crc32.MakeTable(crc32.Castagnoli)
)

// errCorrupt marks a message value that does not decode.
var errCorrupt = errors.New("corrupt message")

// meta is a queue's "meta" record.
type meta struct {
	last  uint64
	count uint64
	bytes uint64
}

func (m meta) encode() []byte {
	b := make([]byte, 0, metaLen)
	b = append(b, format)
	b = binary.BigEndian.AppendUint64(b, m.last)
	b = binary.BigEndian.AppendUint64(b, m.count)
	return binary.BigEndian.AppendUint64(b, m.bytes)
}

// decodeMeta reads a meta record. A newer format is ErrNewerFormat.
func decodeMeta(v []byte) (meta, error) {
	if len(v) > 0 && v[0] > format {
		return meta{}, fmt.Errorf("%w: queue format %d, this binary reads up to %d", ErrNewerFormat, v[0], format)
	}
	if len(v) != metaLen || v[0] != format {
		return meta{}, fmt.Errorf("meta record of %d bytes, format %d: want %d bytes, format %d", len(v), firstByte(v), metaLen, format)
	}
	return meta{
		last:  binary.BigEndian.Uint64(v[1:]),
		count: binary.BigEndian.Uint64(v[9:]),
		bytes: binary.BigEndian.Uint64(v[17:]),
	}, nil
}

func firstByte(v []byte) int {
	if len(v) == 0 {
		return -1
	}
	return int(v[0])
}

// idKey is the key of message id.
func idKey(id uint64) []byte { return binary.BigEndian.AppendUint64(make([]byte, 0, 8), id) }

// keyID is the ID of a key, false for a key that is not 8 bytes.
func keyID(k []byte) (uint64, bool) {
	if len(k) != 8 {
		return 0, false
	}
	return binary.BigEndian.Uint64(k), true
}

func appendStr(b []byte, s string) []byte {
	b = binary.AppendUvarint(b, uint64(len(s)))
	return append(b, s...)
}

// encode is m's value.
func encode(m gateway.Message) []byte {
	n := crcLen + 1 + binary.MaxVarintLen64 + 1 + m.Size()
	b := make([]byte, crcLen, n)
	b = append(b, format)
	b = binary.AppendVarint(b, m.Received.UnixMilli())
	b = append(b, m.QoS)
	b = appendStr(b, string(m.Device))
	b = appendStr(b, m.Topic)
	b = appendStr(b, m.ContentType)
	b = appendStr(b, m.Source)
	b = binary.AppendUvarint(b, uint64(len(m.Properties)))
	for _, p := range m.Properties {
		b = appendStr(b, p.Key)
		b = appendStr(b, p.Value)
	}
	b = append(b, m.Payload...)
	binary.BigEndian.PutUint32(b, crc32Of(b[crcLen:]))
	return b
}

// crc32Of is the checksum of a value's bytes after the checksum.
func crc32Of(b []byte) uint32 { return crc32.Checksum(b, castagnoli) }

// parser reads a message value in place.
type parser struct {
	b   []byte
	err error
}

func (p *parser) fail(what string) {
	if p.err == nil {
		p.err = fmt.Errorf("%w: %s", errCorrupt, what)
	}
}

func (p *parser) byte(what string) byte {
	if p.err != nil || len(p.b) < 1 {
		p.fail(what)
		return 0
	}
	c := p.b[0]
	p.b = p.b[1:]
	return c
}

func (p *parser) uvarint(what string) uint64 {
	if p.err != nil {
		return 0
	}
	v, n := binary.Uvarint(p.b)
	if n <= 0 {
		p.fail(what)
		return 0
	}
	p.b = p.b[n:]
	return v
}

func (p *parser) varint(what string) int64 {
	if p.err != nil {
		return 0
	}
	v, n := binary.Varint(p.b)
	if n <= 0 {
		p.fail(what)
		return 0
	}
	p.b = p.b[n:]
	return v
}

// str returns the next string's bytes, aliasing the value.
func (p *parser) str(what string) []byte {
	n := p.uvarint(what)
	if p.err != nil {
		return nil
	}
	if n > uint64(len(p.b)) {
		p.fail(what + " longer than the value")
		return nil
	}
	s := p.b[:n]
	p.b = p.b[n:]
	return s
}

// fields are a message value's parts, aliasing the value.
type fields struct {
	received    int64
	qos         byte
	device      []byte
	topic       []byte
	contentType []byte
	source      []byte
	props       [][2][]byte
	payload     []byte
}

// size is the Message.Size of the message the fields hold.
func (f *fields) size() int64 {
	n := headerSize + len(f.payload) + len(f.device) + len(f.topic) + len(f.contentType) + len(f.source)
	for _, p := range f.props {
		n += len(p[0]) + len(p[1]) + 4
	}
	return int64(n)
}

// parse checks v (its length, checksum, format, every length within the
// value) and splits it into its fields, without copying. It never
// allocates more than the value's own length in property slots.
func parse(v []byte) (fields, error) {
	var f fields
	if len(v) < crcLen+1 {
		return f, fmt.Errorf("%w: %d bytes", errCorrupt, len(v))
	}
	if sum := crc32Of(v[crcLen:]); sum != binary.BigEndian.Uint32(v) {
		return f, fmt.Errorf("%w: checksum %08x, stored %08x", errCorrupt, sum, binary.BigEndian.Uint32(v))
	}
	p := parser{b: v[crcLen:]}
	if fm := p.byte("format"); fm != format {
		return f, fmt.Errorf("%w: format %d, want %d", errCorrupt, fm, format)
	}
	f.received = p.varint("received")
	f.qos = p.byte("qos")
	f.device = p.str("device")
	f.topic = p.str("topic")
	f.contentType = p.str("content type")
	f.source = p.str("source")
	n := p.uvarint("property count")
	// Each property takes at least two bytes (two empty strings).
	if p.err == nil && n > uint64(len(p.b))/2 {
		p.fail("property count larger than the value")
	}
	if p.err != nil {
		return f, p.err
	}
	if n > 0 {
		f.props = make([][2][]byte, n)
	}
	for i := range f.props {
		f.props[i] = [2][]byte{p.str("property key"), p.str("property value")}
	}
	f.payload = p.b
	return f, p.err
}

// message is the gateway.Message the fields hold, copied out of the
// value.
func (f *fields) message() gateway.Message {
	m := gateway.Message{
		Device:      gateway.DeviceID(f.device),
		Topic:       string(f.topic),
		ContentType: string(f.contentType),
		QoS:         f.qos,
		Received:    time.UnixMilli(f.received).UTC(),
		Source:      string(f.source),
	}
	if len(f.payload) > 0 {
		m.Payload = append([]byte(nil), f.payload...)
	}
	if len(f.props) > 0 {
		m.Properties = make([]gateway.Property, len(f.props))
		for i, p := range f.props {
			m.Properties[i] = gateway.Property{Key: string(p[0]), Value: string(p[1])}
		}
	}
	return m
}

// decode is the message in v.
func decode(v []byte) (gateway.Message, error) {
	f, err := parse(v)
	if err != nil {
		return gateway.Message{}, err
	}
	return f.message(), nil
}
