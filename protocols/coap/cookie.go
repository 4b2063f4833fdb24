package coap

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"time"
)

// The stateless DTLS cookie exchange (RFC 6347 §4.2.1), done by the gate
// in front of pion: a ClientHello from an address without a session is
// answered with a HelloVerifyRequest whose cookie is an HMAC of the
// client's address and port and of the ClientHello's fixed fields, under
// a secret that changes every cookieRotation. The server keeps nothing for
// it. Only a ClientHello that comes back with a cookie that verifies under
// the current or the previous secret reaches pion.

// DTLS record and handshake framing (RFC 6347 §4.1, §4.2.2).
const (
	recordHeaderLen    = 13
	handshakeHeaderLen = 12
	contentHandshake   = 22
	typeClientHello    = 1
	typeHelloVerify    = 3
	// maxRecordSeq is the largest record sequence number (48 bits).
	maxRecordSeq = 1<<48 - 1
)

const (
	// cookieLen is the length of the gate's cookies (as pion's own).
	cookieLen = 20
	// cookieRotation is how long a cookie secret is current; a cookie
	// verifies for one to two of them.
	cookieRotation = time.Minute
)

// dtls10 is the version of a HelloVerifyRequest: DTLS 1.0, whatever
// version is negotiated (RFC 6347 §4.2.1).
var dtls10 = [2]byte{0xfe, 0xff}

// clientHello is a parsed ClientHello datagram: one epoch-0 record that
// holds one unfragmented ClientHello. The slices point into the datagram.
type clientHello struct {
	recordVersion [2]byte
	recordSeq     uint64
	messageSeq    uint16
	// body is the ClientHello message without its handshake header;
	// cookieAt is the offset in it of the cookie's length byte.
	body     []byte
	cookieAt int
	// version, random, sessionID, cipherSuites and compression are the
	// fields that must not change between the two ClientHellos.
	version      []byte
	random       []byte
	sessionID    []byte
	cookie       []byte
	cipherSuites []byte
	compression  []byte
}

var errNotClientHello = errors.New("dtls: not a ClientHello record")

// parseClientHello parses datagram b as a ClientHello. It reads only the
// first record, and takes the ClientHello only whole in it (a PSK
// ClientHello is far smaller than any MTU).
func parseClientHello(b []byte) (clientHello, error) {
	var h clientHello
	if len(b) < recordHeaderLen+handshakeHeaderLen || b[0] != contentHandshake {
		return h, errNotClientHello
	}
	if b[3] != 0 || b[4] != 0 {
		return h, fmt.Errorf("%w: epoch %d", errNotClientHello, binary.BigEndian.Uint16(b[3:5]))
	}
	recLen := int(binary.BigEndian.Uint16(b[11:13]))
	if recLen > len(b)-recordHeaderLen {
		return h, fmt.Errorf("%w: record of %d bytes in %d", errNotClientHello, recLen, len(b)-recordHeaderLen)
	}
	rec := b[recordHeaderLen : recordHeaderLen+recLen]
	if len(rec) < handshakeHeaderLen || rec[0] != typeClientHello {
		return h, errNotClientHello
	}
	n := uint24(rec[1:4])
	off, frag := uint24(rec[6:9]), uint24(rec[9:12])
	if off != 0 || frag != n || n > len(rec)-handshakeHeaderLen {
		return h, fmt.Errorf("%w: fragmented or truncated", errNotClientHello)
	}
	copy(h.recordVersion[:], b[1:3])
	h.recordSeq = uint64(binary.BigEndian.Uint16(b[5:7]))<<32 | uint64(binary.BigEndian.Uint32(b[7:11]))
	h.messageSeq = binary.BigEndian.Uint16(rec[4:6])
	h.body = rec[handshakeHeaderLen : handshakeHeaderLen+n]

	r := reader{b: h.body}
	h.version = r.next(2)
	h.random = r.next(32)
	h.sessionID = r.vector(1, 32)
	h.cookieAt = r.i
	h.cookie = r.vector(1, 255)
	h.cipherSuites = r.vector(2, 1<<16-2)
	h.compression = r.vector(1, 255)
	switch {
	case r.err != nil:
		return h, fmt.Errorf("%w: %v", errNotClientHello, r.err)
	case len(h.cipherSuites) == 0 || len(h.cipherSuites)%2 != 0:
		return h, fmt.Errorf("%w: %d bytes of cipher suites", errNotClientHello, len(h.cipherSuites))
	case len(h.compression) == 0:
		return h, fmt.Errorf("%w: no compression method", errNotClientHello)
	}
	return h, nil
}

func uint24(b []byte) int { return int(b[0])<<16 | int(b[1])<<8 | int(b[2]) }

// reader reads the fields of a handshake message; the first error sticks.
type reader struct {
	b   []byte
	i   int
	err error
}

// next is the next n bytes.
func (r *reader) next(n int) []byte {
	if r.err != nil {
		return nil
	}
	if n > len(r.b)-r.i {
		r.err = fmt.Errorf("%d bytes at %d of %d", n, r.i, len(r.b))
		return nil
	}
	v := r.b[r.i : r.i+n]
	r.i += n
	return v
}

// vector is the next vector with a length prefix of size bytes, at most
// limit long.
func (r *reader) vector(size, limit int) []byte {
	l := r.next(size)
	if r.err != nil {
		return nil
	}
	n := int(l[0])
	if size == 2 {
		n = int(binary.BigEndian.Uint16(l))
	}
	if n > limit {
		r.err = fmt.Errorf("vector of %d bytes at %d, at most %d", n, r.i, limit)
		return nil
	}
	return r.next(n)
}

// helloCookie is the cookie of ClientHello h from addr under key: an HMAC
// of the address, the port and the fields that stay the same in the
// ClientHello that returns the cookie.
func helloCookie(key []byte, from netip.AddrPort, h clientHello) []byte {
	m := hmac.New(sha256.New, key)
	a := from.Addr().As16()
	var port [2]byte
	binary.BigEndian.PutUint16(port[:], from.Port())
	m.Write(a[:])
	m.Write(port[:])
	for _, f := range [][]byte{h.version, h.random, h.sessionID, h.cipherSuites, h.compression} {
		m.Write([]byte{byte(len(f) >> 8), byte(len(f))})
		m.Write(f)
	}
	return m.Sum(nil)[:cookieLen]
}

// helloVerifyRequest is the datagram that answers ClientHello h with
// cookie: it takes the ClientHello's record sequence number, and is the
// server's message 0 (RFC 6347 §4.2.1, §4.2.2).
func helloVerifyRequest(h clientHello, cookie []byte) []byte {
	body := make([]byte, 0, 3+len(cookie))
	body = append(body, dtls10[:]...)
	body = append(body, byte(len(cookie)))
	body = append(body, cookie...)
	return handshakeRecord(dtls10, h.recordSeq, typeHelloVerify, 0, body)
}

// withoutCookie is ClientHello h as the client's first one: without its
// cookie, message 0, in a record with sequence number recordSeq.
func withoutCookie(h clientHello, recordSeq uint64) []byte {
	body := make([]byte, 0, len(h.body)-len(h.cookie))
	body = append(body, h.body[:h.cookieAt]...)
	body = append(body, 0)
	body = append(body, h.body[h.cookieAt+1+len(h.cookie):]...)
	return handshakeRecord(h.recordVersion, recordSeq, typeClientHello, 0, body)
}

// handshakeRecord is an epoch-0 record of one unfragmented handshake
// message.
func handshakeRecord(version [2]byte, recordSeq uint64, typ byte, messageSeq uint16, body []byte) []byte {
	b := make([]byte, recordHeaderLen+handshakeHeaderLen, recordHeaderLen+handshakeHeaderLen+len(body))
	b[0] = contentHandshake
	copy(b[1:3], version[:])
	putRecordSeq(b, recordSeq)
	binary.BigEndian.PutUint16(b[11:13], uint16(handshakeHeaderLen+len(body)))
	h := b[recordHeaderLen:]
	h[0] = typ
	putUint24(h[1:4], len(body))
	binary.BigEndian.PutUint16(h[4:6], messageSeq)
	putUint24(h[9:12], len(body)) // fragment offset 0, fragment length = length
	return append(b, body...)
}

func putUint24(b []byte, n int) { b[0], b[1], b[2] = byte(n>>16), byte(n>>8), byte(n) }

// putRecordSeq sets the sequence number of the record at the start of b
// (epoch 0).
func putRecordSeq(b []byte, seq uint64) {
	binary.BigEndian.PutUint16(b[5:7], uint16(seq>>32))
	binary.BigEndian.PutUint32(b[7:11], uint32(seq))
}

// shiftRecordSeqs adds shift to the sequence number of every epoch-0
// record of datagram b, in place. Epoch-0 record numbers are neither
// encrypted nor part of the handshake transcript; later epochs are left
// alone. A malformed tail is left as it is.
func shiftRecordSeqs(b []byte, shift uint64) {
	for len(b) >= recordHeaderLen {
		if b[3] == 0 && b[4] == 0 {
			seq := uint64(binary.BigEndian.Uint16(b[5:7]))<<32 | uint64(binary.BigEndian.Uint32(b[7:11]))
			putRecordSeq(b, (seq+shift)&maxRecordSeq)
		}
		n := recordHeaderLen + int(binary.BigEndian.Uint16(b[11:13]))
		if n > len(b) {
			return
		}
		b = b[n:]
	}
}

// isHelloVerifyRequest reports whether datagram b starts with a
// HelloVerifyRequest record.
func isHelloVerifyRequest(b []byte) bool {
	return len(b) > recordHeaderLen && b[0] == contentHandshake && b[3] == 0 && b[4] == 0 && b[recordHeaderLen] == typeHelloVerify
}

// cookieKeys are the current and the previous cookie secret.
type cookieKeys struct {
	cur, prev [32]byte
	since     time.Time // when cur became current
}

// rotate makes a new secret from random current when the current one is
// older than cookieRotation at now.
func (k *cookieKeys) rotate(now time.Time, random io.Reader) error {
	if !k.since.IsZero() && now.Sub(k.since) < cookieRotation {
		return nil
	}
	var next [32]byte
	if _, err := io.ReadFull(random, next[:]); err != nil {
		return fmt.Errorf("dtls cookie secret: %w", err)
	}
	if k.since.IsZero() {
		// No previous secret yet: a random one, never the zero key.
		if _, err := io.ReadFull(random, k.cur[:]); err != nil {
			return fmt.Errorf("dtls cookie secret: %w", err)
		}
	}
	k.prev, k.cur, k.since = k.cur, next, now
	return nil
}

// verify reports whether h carries the cookie of h from addr under the
// current or the previous secret.
func (k *cookieKeys) verify(from netip.AddrPort, h clientHello) bool {
	if len(h.cookie) != cookieLen {
		return false
	}
	return hmac.Equal(h.cookie, helloCookie(k.cur[:], from, h)) ||
		hmac.Equal(h.cookie, helloCookie(k.prev[:], from, h))
}
