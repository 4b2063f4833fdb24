package bridge

import (
	"bufio"
	"context"
	"crypto/tls"
	"net"
	"net/url"
	"sync"
	"time"
)

// packetConn is the upstream connection as paho.golang uses it, with
// fewer system calls than a bare net.Conn, each of which costs a wake on
// a loaded gateway:
//
//   - Reads are buffered. paho reads a packet a byte at a time for its
//     fixed header and then its body (three reads for a 4-byte PUBACK);
//     through a bufio.Reader one read takes all the PUBACKs the broker
//     sent since the last.
//   - Writes are combined. paho writes each packet holding the
//     connection's sync.Locker (Lock, a Write per part, Unlock). Here
//     Write only appends to a buffer, and Unlock writes the buffer unless
//     another writer is writing it already; that writer writes what
//     gathered meanwhile when its own write returns, so packets that
//     meet form one write instead of one each, and a lone packet is
//     written at once, by the goroutine that sent it. What gathers is
//     bounded by maxPending: a writer waits in Lock while the buffer is
//     that full (a broker that reads slowly slows the lanes rather than
//     growing the buffer).
//
// A failed write closes the connection: paho's reader then fails, and
// the connection is lost as if the broker had closed it (a packet that
// waited in the buffer is sent again by its lane).
type packetConn struct {
	net.Conn
	r *bufio.Reader

	mu       sync.Mutex
	drained  sync.Cond // signalled when a writer took the buffer
	pending  []byte    // written by paho, not yet to the connection
	spare    []byte    // the buffer the last write took, for reuse
	flushing bool      // a writer is writing; Unlock leaves pending to it
	err      error     // the first failed write's
}

// maxPending bounds the bytes that gather while one write runs.
const maxPending = 256 << 10

// readBuffer is the size of the read buffer: many PUBACKs, or one
// command of a usual size.
const readBuffer = 16 << 10

func newPacketConn(c net.Conn) *packetConn {
	pc := &packetConn{Conn: c, r: bufio.NewReaderSize(c, readBuffer)}
	pc.drained.L = &pc.mu
	return pc
}

// Read reads through the buffer; paho reads from one goroutine at a
// time.
func (c *packetConn) Read(p []byte) (int, error) { return c.r.Read(p) }

// Lock starts a packet: it waits while the buffer is full.
func (c *packetConn) Lock() {
	c.mu.Lock()
	for c.flushing && len(c.pending) >= maxPending && c.err == nil {
		c.drained.Wait()
	}
}

// Write appends p to the buffer; it must be called between Lock and
// Unlock, as paho's ControlPacket.WriteTo does.
func (c *packetConn) Write(p []byte) (int, error) {
	if c.err != nil {
		return 0, c.err
	}
	c.pending = append(c.pending, p...)
	return len(p), nil
}

// Unlock ends a packet: unless another writer is writing, it writes the
// buffer, and then what gathered while it did, until nothing is left.
func (c *packetConn) Unlock() {
	if c.flushing || len(c.pending) == 0 {
		c.mu.Unlock()
		return
	}
	c.flushing = true
	for len(c.pending) > 0 && c.err == nil {
		buf := c.pending
		c.pending = c.spare[:0]
		c.drained.Broadcast()
		c.mu.Unlock()
		_, err := c.Conn.Write(buf)
		if err != nil {
			_ = c.Conn.Close()
		}
		c.mu.Lock()
		c.spare = buf
		if err != nil {
			c.err = err
			c.pending = nil
		}
	}
	c.flushing = false
	c.drained.Broadcast()
	c.mu.Unlock()
}

// dialPacketConn dials u (scheme mqtt or tls) within timeout, for
// autopaho's AttemptConnection.
func dialPacketConn(ctx context.Context, u *url.URL, cfg *tls.Config, timeout time.Duration) (net.Conn, error) {
	if timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, timeout)
		defer cancel()
	}
	var c net.Conn
	var err error
	if u.Scheme == "tls" {
		c, err = (&tls.Dialer{Config: cfg}).DialContext(ctx, "tcp", u.Host)
	} else {
		c, err = (&net.Dialer{}).DialContext(ctx, "tcp", u.Host)
	}
	if err != nil {
		return nil, err
	}
	return newPacketConn(c), nil
}
