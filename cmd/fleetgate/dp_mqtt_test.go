package main

import (
	"bufio"
	wire "encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"time"
)

// rawMQTT is a lean MQTT 5 client for the data path's load: one TCP
// connection, no goroutine of its own, packets written and read by the
// caller. The devices of the data path's benchmarks and tests use it
// instead of paho.golang, whose client costs three goroutines per
// connection: 1,000 paho clients publishing 5,000 msg/s at QoS 1 spent
// 2.1–2.4× the test process's CPU of 1,000 raw ones (135–156 against
// 58–74 µs a message, BenchmarkDeviceClients), CPU that shares the 2
// cores with the processes measured.
type rawMQTT struct {
	c   net.Conn
	r   *bufio.Reader
	wmu sync.Mutex // serialises writes (a pinger beside the reader)
	wb  []byte
	id  uint16
	// keepAlive is the Server Keep Alive of the CONNACK, or what was
	// asked for.
	keepAlive time.Duration
}

// rawOptions is a CONNECT's.
type rawOptions struct {
	keepAlive     uint16 // seconds; 0 none
	persistent    bool   // clean start off, with sessionExpiry
	sessionExpiry uint32
	timeout       time.Duration // of the dial and the CONNACK (default 10s)
}

// errRefused is a CONNACK with a reason code of 0x80 or more.
type errRefused struct{ code byte }

func (e errRefused) Error() string { return fmt.Sprintf("connack reason 0x%02x", e.code) }

// dialRaw connects clientID to addr with MQTT 5 and waits for the
// CONNACK.
func dialRaw(addr, clientID string, o rawOptions) (*rawMQTT, error) {
	if o.timeout == 0 {
		o.timeout = 10 * time.Second
	}
	nc, err := net.DialTimeout("tcp", addr, o.timeout)
	if err != nil {
		return nil, err
	}
	c := &rawMQTT{c: nc, r: bufio.NewReaderSize(nc, 16<<10), keepAlive: time.Duration(o.keepAlive) * time.Second}
	var props []byte
	flags := byte(0x02) // clean start
	if o.persistent {
		flags = 0
		props = append(props, 0x11)
		props = wire.BigEndian.AppendUint32(props, o.sessionExpiry)
	}
	body := []byte{0, 4, 'M', 'Q', 'T', 'T', 5, flags, byte(o.keepAlive >> 8), byte(o.keepAlive)}
	body = appendVarint(body, len(props))
	body = append(body, props...)
	body = appendString(body, clientID)
	if err := c.write(0x10, body); err != nil {
		nc.Close()
		return nil, err
	}
	_ = nc.SetReadDeadline(time.Now().Add(o.timeout))
	typ, b, err := c.read()
	_ = nc.SetReadDeadline(time.Time{})
	if err != nil {
		nc.Close()
		return nil, fmt.Errorf("connack: %w", err)
	}
	if typ>>4 != 2 || len(b) < 2 {
		nc.Close()
		return nil, fmt.Errorf("connack: packet type %d", typ>>4)
	}
	if b[1] >= 0x80 {
		nc.Close()
		return nil, errRefused{b[1]}
	}
	// the properties: Server Keep Alive (0x13) overrides ours
	if n, k, ok := readVarint(b[2:]); ok {
		p := b[2+k:]
		if n <= len(p) {
			p = p[:n]
			for len(p) > 0 {
				id := p[0]
				if id == 0x13 && len(p) >= 3 {
					c.keepAlive = time.Duration(wire.BigEndian.Uint16(p[1:3])) * time.Second
				}
				skip := propLen(id, p[1:])
				if skip < 0 {
					break
				}
				p = p[1+skip:]
			}
		}
	}
	return c, nil
}

// propLen is the length of an MQTT 5 property's value in p, -1 when
// unknown or short.
func propLen(id byte, p []byte) int {
	switch id {
	case 0x01, 0x17, 0x19, 0x24, 0x25, 0x28, 0x29, 0x2A: // bytes
		return 1
	case 0x13, 0x21, 0x22, 0x23: // two-byte integers
		return 2
	case 0x02, 0x11, 0x18, 0x27: // four-byte integers
		return 4
	case 0x03, 0x08, 0x09, 0x12, 0x15, 0x16, 0x1A, 0x1C, 0x1F: // strings, binary
		if len(p) < 2 {
			return -1
		}
		return 2 + int(wire.BigEndian.Uint16(p))
	case 0x26: // user property: two strings
		if len(p) < 2 {
			return -1
		}
		n := 2 + int(wire.BigEndian.Uint16(p))
		if len(p) < n+2 {
			return -1
		}
		return n + 2 + int(wire.BigEndian.Uint16(p[n:]))
	case 0x0B: // subscription identifier
		_, k, ok := readVarint(p)
		if !ok {
			return -1
		}
		return k
	}
	return -1
}

func appendVarint(b []byte, n int) []byte {
	for {
		d := byte(n % 128)
		n /= 128
		if n > 0 {
			d |= 0x80
		}
		b = append(b, d)
		if n == 0 {
			return b
		}
	}
}

// readVarint decodes a variable byte integer: the value and its length.
func readVarint(b []byte) (int, int, bool) {
	n, mul := 0, 1
	for i := 0; i < 4 && i < len(b); i++ {
		n += int(b[i]&0x7F) * mul
		if b[i]&0x80 == 0 {
			return n, i + 1, true
		}
		mul *= 128
	}
	return 0, 0, false
}

func appendString(b []byte, s string) []byte {
	b = wire.BigEndian.AppendUint16(b, uint16(len(s)))
	return append(b, s...)
}

// write sends one packet of type-and-flags first and body.
func (c *rawMQTT) write(first byte, body []byte) error {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	c.wb = append(c.wb[:0], first)
	c.wb = appendVarint(c.wb, len(body))
	c.wb = append(c.wb, body...)
	_, err := c.c.Write(c.wb)
	return err
}

// read returns the next packet: its first byte and body.
func (c *rawMQTT) read() (byte, []byte, error) {
	first, err := c.r.ReadByte()
	if err != nil {
		return 0, nil, err
	}
	n, mul := 0, 1
	for i := 0; ; i++ {
		d, err := c.r.ReadByte()
		if err != nil {
			return 0, nil, err
		}
		n += int(d&0x7F) * mul
		if d&0x80 == 0 {
			break
		}
		if i == 3 {
			return 0, nil, errors.New("malformed remaining length")
		}
		mul *= 128
	}
	body := make([]byte, n)
	if _, err := io.ReadFull(c.r, body); err != nil {
		return 0, nil, err
	}
	return first, body, nil
}

// publish sends a PUBLISH (not retained) and returns its packet ID (0
// at QoS 0).
func (c *rawMQTT) publish(topic string, qos byte, payload []byte) (uint16, error) {
	body := make([]byte, 0, 2+len(topic)+3+len(payload))
	body = appendString(body, topic)
	var id uint16
	if qos > 0 {
		c.id++
		if c.id == 0 {
			c.id = 1
		}
		id = c.id
		body = wire.BigEndian.AppendUint16(body, id)
	}
	body = append(body, 0) // no properties
	body = append(body, payload...)
	return id, c.write(0x30|qos<<1, body)
}

// awaitPuback reads until the PUBACK of id and returns its reason code;
// other packets are skipped, a DISCONNECT is an error.
func (c *rawMQTT) awaitPuback(id uint16, timeout time.Duration) (byte, error) {
	_ = c.c.SetReadDeadline(time.Now().Add(timeout))
	defer c.c.SetReadDeadline(time.Time{})
	for {
		typ, b, err := c.read()
		if err != nil {
			return 0, err
		}
		switch typ >> 4 {
		case 4:
			if len(b) < 2 || wire.BigEndian.Uint16(b) != id {
				continue
			}
			if len(b) == 2 {
				return 0, nil
			}
			return b[2], nil
		case 14:
			reason := byte(0)
			if len(b) > 0 {
				reason = b[0]
			}
			return 0, fmt.Errorf("disconnected by the server, reason 0x%02x", reason)
		}
	}
}

// subscribe subscribes filter at qos and waits for the SUBACK.
func (c *rawMQTT) subscribe(filter string, qos byte) error {
	c.id++
	body := wire.BigEndian.AppendUint16(nil, c.id)
	body = append(body, 0)
	body = appendString(body, filter)
	body = append(body, qos)
	if err := c.write(0x82, body); err != nil {
		return err
	}
	_ = c.c.SetReadDeadline(time.Now().Add(10 * time.Second))
	defer c.c.SetReadDeadline(time.Time{})
	for {
		typ, b, err := c.read()
		if err != nil {
			return err
		}
		if typ>>4 == 9 {
			if len(b) < 3 || b[len(b)-1] >= 0x80 {
				return fmt.Errorf("suback %x", b)
			}
			return nil
		}
	}
}

// ping sends a PINGREQ (the PINGRESP is skipped by the readers).
func (c *rawMQTT) ping() error { return c.write(0xC0, nil) }

// puback acknowledges a received QoS 1 PUBLISH.
func (c *rawMQTT) puback(id uint16) error {
	return c.write(0x40, wire.BigEndian.AppendUint16(nil, id))
}

// disconnect sends a normal DISCONNECT and closes.
func (c *rawMQTT) disconnect() {
	_ = c.write(0xE0, nil)
	c.c.Close()
}

func (c *rawMQTT) close() { c.c.Close() }

// parsePublish splits a received PUBLISH (MQTT 5): topic, QoS, packet
// ID, payload.
func parsePublish(first byte, b []byte) (topic string, qos byte, id uint16, payload []byte, err error) {
	qos = first >> 1 & 3
	if len(b) < 2 {
		return "", 0, 0, nil, errors.New("short publish")
	}
	n := int(wire.BigEndian.Uint16(b))
	if len(b) < 2+n {
		return "", 0, 0, nil, errors.New("short topic")
	}
	topic, b = string(b[2:2+n]), b[2+n:]
	if qos > 0 {
		if len(b) < 2 {
			return "", 0, 0, nil, errors.New("short packet id")
		}
		id, b = wire.BigEndian.Uint16(b), b[2:]
	}
	pl, k, ok := readVarint(b)
	if !ok || len(b) < k+pl {
		return "", 0, 0, nil, errors.New("bad properties")
	}
	return topic, qos, id, b[k+pl:], nil
}
