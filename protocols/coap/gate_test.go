package coap

import (
	"bytes"
	"encoding/binary"
	"testing"
)

// record builds an epoch-0 DTLS handshake record of one unfragmented
// message of type typ with body.
func record(typ byte, body []byte) []byte {
	b := []byte{contentHandshake, 0xfe, 0xfd, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0}
	binary.BigEndian.PutUint16(b[11:], uint16(handshakeHeaderLen+len(body)))
	n := len(body)
	h := []byte{typ, byte(n >> 16), byte(n >> 8), byte(n), 0, 1, 0, 0, 0, byte(n >> 16), byte(n >> 8), byte(n)}
	return append(append(b, h...), body...)
}

func clientHelloBody(sessionID, cookie []byte) []byte {
	body := append([]byte{0xfe, 0xfd}, make([]byte, 32)...)
	body = append(body, byte(len(sessionID)))
	body = append(body, sessionID...)
	body = append(body, byte(len(cookie)))
	body = append(body, cookie...)
	return append(body, 0, 2, 0xc0, 0xa8, 1, 0) // cipher suites, compression
}

// The gate reads the cookies of a HelloVerifyRequest and a ClientHello
// from the records pion writes and reads.
func TestGateParsesCookies(t *testing.T) {
	cookie := []byte("0123456789abcdef0123")
	ch := record(typeClientHello, clientHelloBody([]byte{1, 2, 3}, cookie))
	if got, ok := clientHelloCookie(ch); !ok || !bytes.Equal(got, cookie) {
		t.Fatalf("ClientHello cookie %x %v", got, ok)
	}
	if !isClientHello(ch) {
		t.Fatal("not seen as a ClientHello")
	}
	if got, ok := clientHelloCookie(record(typeClientHello, clientHelloBody(nil, nil))); !ok || len(got) != 0 {
		t.Fatalf("first ClientHello: cookie %x %v", got, ok)
	}
	hvr := record(typeHelloVerify, append([]byte{0xfe, 0xff, byte(len(cookie))}, cookie...))
	if got, ok := helloVerifyCookie(hvr); !ok || !bytes.Equal(got, cookie) {
		t.Fatalf("HelloVerifyRequest cookie %x %v", got, ok)
	}
	if _, ok := helloVerifyCookie(ch); ok {
		t.Fatal("a ClientHello read as a HelloVerifyRequest")
	}
	// Truncations, another epoch, another content type.
	for i := range len(ch) {
		if c, ok := clientHelloCookie(ch[:i]); ok && !bytes.Equal(c, cookie) {
			t.Fatalf("truncated to %d: cookie %x", i, c)
		}
	}
	epoch1 := bytes.Clone(ch)
	epoch1[4] = 1
	alert := bytes.Clone(ch)
	alert[0] = 21
	for _, b := range [][]byte{epoch1, alert, nil, {22}} {
		if isClientHello(b) {
			t.Fatalf("%x taken for a ClientHello", b)
		}
	}
}

// FuzzGateRecords: the gate's parsers never panic and never read beyond
// the datagram, whatever a peer sends.
func FuzzGateRecords(f *testing.F) {
	f.Add(record(typeClientHello, clientHelloBody([]byte{1}, []byte("cookie"))))
	f.Add(record(typeHelloVerify, []byte{0xfe, 0xff, 3, 'a', 'b', 'c'}))
	f.Add(record(typeClientHello, []byte{0xfe, 0xfd}))
	f.Add([]byte{22, 0xfe, 0xfd, 0, 0, 0, 0, 0, 0, 0, 0, 0, 12, 1, 0, 0, 255, 0, 0, 0, 0, 0, 0, 0, 255})
	f.Fuzz(func(t *testing.T, b []byte) {
		if c, ok := clientHelloCookie(b); ok && len(c) > len(b) {
			t.Fatal("cookie longer than the datagram")
		}
		if c, ok := helloVerifyCookie(b); ok && len(c) > len(b) {
			t.Fatal("cookie longer than the datagram")
		}
		_ = isClientHello(b)
	})
}
