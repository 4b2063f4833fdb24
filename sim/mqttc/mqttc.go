// Package mqttc is the simulator's minimal MQTT client: the packets a
// device of the simulator sends (CONNECT, PUBLISH at QoS 0 or 1,
// PINGREQ, DISCONNECT) and those it reads (CONNACK, PUBACK, PINGRESP,
// DISCONNECT), for MQTT 3.1.1 and 5, without properties beyond what a
// CONNACK or PUBACK may carry, which are skipped. A connection is a
// net.Conn and a small read buffer; the caller reads packets in one
// goroutine and writes from another. The product's MQTT clients are
// full libraries; this one is only the simulator's.
package mqttc

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"time"
)

// Version is the protocol level of CONNECT.
type Version byte

const (
	V311 Version = 4
	V5   Version = 5
)

// Packet types (the high nibble of the fixed header).
const (
	CONNECT    = 1
	CONNACK    = 2
	PUBLISH    = 3
	PUBACK     = 4
	PINGREQ    = 12
	PINGRESP   = 13
	DISCONNECT = 14
)

// MaxPacket bounds the remaining length of a packet read: the
// simulator reads only acknowledgements, never a message.
const MaxPacket = 4096

// Packet is one decoded packet the client reads.
type Packet struct {
	Type byte
	// ID is a PUBACK's packet identifier.
	ID uint16
	// Code is a CONNACK's return or reason code, a PUBACK's or a
	// DISCONNECT's reason code (MQTT 5; 0 when absent).
	Code byte
	// SessionPresent is a CONNACK's flag.
	SessionPresent bool
}

var (
	errMalformed = errors.New("mqtt: malformed packet")
	errTooLarge  = errors.New("mqtt: packet larger than the client reads")
)

// Decode decodes the packet of type and flags (the fixed header's
// first byte) whose variable header and payload are body, as version
// sends it. Packets other than those a client reads are errors.
func Decode(v Version, first byte, body []byte) (Packet, error) {
	p := Packet{Type: first >> 4}
	flags := first & 0x0f
	if flags != 0 {
		return p, errMalformed
	}
	switch p.Type {
	case CONNACK:
		if len(body) < 2 || body[0]&^1 != 0 {
			return p, errMalformed
		}
		p.SessionPresent, p.Code = body[0] == 1, body[1]
		if v == V5 {
			if err := properties(body[2:]); err != nil {
				return p, err
			}
		} else if len(body) != 2 {
			return p, errMalformed
		}
	case PUBACK:
		if len(body) < 2 {
			return p, errMalformed
		}
		p.ID = binary.BigEndian.Uint16(body)
		if p.ID == 0 {
			return p, errMalformed
		}
		switch {
		case len(body) == 2:
		case v != V5:
			return p, errMalformed
		case len(body) == 3:
			p.Code = body[2]
		default:
			p.Code = body[2]
			if err := properties(body[3:]); err != nil {
				return p, err
			}
		}
	case PINGRESP:
		if len(body) != 0 {
			return p, errMalformed
		}
	case DISCONNECT:
		switch {
		case len(body) == 0:
		case v != V5:
			return p, errMalformed
		case len(body) == 1:
			p.Code = body[0]
		default:
			p.Code = body[0]
			if err := properties(body[1:]); err != nil {
				return p, err
			}
		}
	default:
		return p, fmt.Errorf("mqtt: unexpected packet type %d", p.Type)
	}
	return p, nil
}

// properties checks that b is a property length and exactly that many
// bytes; the properties themselves are not read.
func properties(b []byte) error {
	n, k, err := varint(b)
	if err != nil || len(b)-k != n {
		return errMalformed
	}
	return nil
}

// varint decodes a variable byte integer (at most 4 bytes) from b and
// returns it and its length.
func varint(b []byte) (int, int, error) {
	var n, shift int
	for i := range 4 {
		if i >= len(b) {
			return 0, 0, errMalformed
		}
		n |= int(b[i]&0x7f) << shift
		if b[i]&0x80 == 0 {
			return n, i + 1, nil
		}
		shift += 7
	}
	return 0, 0, errMalformed
}

func appendVarint(b []byte, n int) []byte {
	for {
		c := byte(n & 0x7f)
		n >>= 7
		if n > 0 {
			c |= 0x80
		}
		b = append(b, c)
		if n == 0 {
			return b
		}
	}
}

func appendString(b []byte, s string) []byte {
	b = binary.BigEndian.AppendUint16(b, uint16(len(s)))
	return append(b, s...)
}

// packet frames body as a packet of type and flags.
func packet(typ, flags byte, body []byte) []byte {
	b := make([]byte, 0, len(body)+5)
	b = append(b, typ<<4|flags)
	b = appendVarint(b, len(body))
	return append(b, body...)
}

// ConnectPacket is a CONNECT with a clean session (clean start), no
// will and no credentials.
func ConnectPacket(v Version, clientID string, keepAlive time.Duration) []byte {
	var b []byte
	b = appendString(b, "MQTT")
	b = append(b, byte(v), 0x02) // clean session / clean start
	b = binary.BigEndian.AppendUint16(b, uint16(min(keepAlive/time.Second, 65535)))
	if v == V5 {
		b = append(b, 0) // no properties
	}
	b = appendString(b, clientID)
	return packet(CONNECT, 0, b)
}

// PublishPacket is a PUBLISH of payload to topic at qos 0 or 1 (id is
// the packet identifier of QoS 1, ignored at 0).
func PublishPacket(v Version, topic string, payload []byte, qos byte, id uint16) []byte {
	var b []byte
	b = appendString(b, topic)
	if qos > 0 {
		b = binary.BigEndian.AppendUint16(b, id)
	}
	if v == V5 {
		b = append(b, 0)
	}
	b = append(b, payload...)
	return packet(PUBLISH, qos<<1, b)
}

// PingPacket is a PINGREQ.
func PingPacket() []byte { return []byte{PINGREQ << 4, 0} }

// DisconnectPacket is a normal DISCONNECT.
func DisconnectPacket() []byte { return []byte{DISCONNECT << 4, 0} }

// Conn is one client connection.
type Conn struct {
	net.Conn
	v Version
	r *bufio.Reader
}

// Dial connects from local (nil: any) to addr, sends CONNECT and reads
// the CONNACK, all within timeout; a CONNACK that refuses is an error
// (a *RefusedError).
func Dial(ctx context.Context, v Version, local *net.TCPAddr, addr, clientID string, keepAlive, timeout time.Duration) (*Conn, error) {
	d := net.Dialer{Timeout: timeout}
	if local != nil {
		d.LocalAddr = local
	}
	nc, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	c := &Conn{Conn: nc, v: v, r: bufio.NewReaderSize(nc, 64)}
	_ = nc.SetDeadline(time.Now().Add(timeout))
	if _, err := nc.Write(ConnectPacket(v, clientID, keepAlive)); err != nil {
		nc.Close()
		return nil, err
	}
	p, err := c.Read()
	if err == nil && p.Type != CONNACK {
		err = fmt.Errorf("mqtt: packet type %d before CONNACK", p.Type)
	}
	if err == nil && p.Code != 0 {
		err = &RefusedError{Code: p.Code}
	}
	if err != nil {
		nc.Close()
		return nil, err
	}
	_ = nc.SetDeadline(time.Time{})
	return c, nil
}

// RefusedError is a CONNACK that refuses the connection.
type RefusedError struct{ Code byte }

func (e *RefusedError) Error() string { return fmt.Sprintf("connack 0x%02x", e.Code) }

// Read reads the next packet.
func (c *Conn) Read() (Packet, error) { return ReadPacket(c.r, c.v) }

// ReadPacket reads one packet from r, as version v sends it.
func ReadPacket(r *bufio.Reader, v Version) (Packet, error) {
	first, err := r.ReadByte()
	if err != nil {
		return Packet{}, err
	}
	var hdr [4]byte
	n := -1
	for i := 0; i < len(hdr) && n < 0; i++ {
		b, err := r.ReadByte()
		if err != nil {
			return Packet{}, err
		}
		hdr[i] = b
		if b&0x80 == 0 {
			n, _, _ = varint(hdr[:i+1])
		}
	}
	if n < 0 {
		return Packet{}, errMalformed
	}
	if n > MaxPacket {
		return Packet{}, errTooLarge
	}
	body := make([]byte, n)
	if _, err := io.ReadFull(r, body); err != nil {
		return Packet{}, err
	}
	return Decode(v, first, body)
}

// Send writes b (a packet) within timeout.
func (c *Conn) Send(b []byte, timeout time.Duration) error {
	_ = c.SetWriteDeadline(time.Now().Add(timeout))
	_, err := c.Write(b)
	return err
}
