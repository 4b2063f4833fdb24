package coap

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/binary"
	"net"
	"net/netip"
	"reflect"
	"testing"
	"time"
	"unsafe"

	piondtls "github.com/pion/dtls/v3"
	dtlsnet "github.com/pion/dtls/v3/pkg/net"
	"github.com/prometheus/client_golang/prometheus"
)

// withCookie is what a client sends after a HelloVerifyRequest: its
// ClientHello h with cookie, as message 1 in record recordSeq.
func withCookie(h clientHello, cookie []byte, recordSeq uint64) []byte {
	body := append([]byte{}, h.body[:h.cookieAt]...)
	body = append(body, byte(len(cookie)))
	body = append(body, cookie...)
	body = append(body, h.body[h.cookieAt+1+len(h.cookie):]...)
	return handshakeRecord(h.recordVersion, recordSeq, typeClientHello, 1, body)
}

// A real pion ClientHello parses; the first ClientHello rebuilt from its
// second one (withoutCookie) is the first one again; what is not a whole
// epoch-0 ClientHello is refused.
func TestParseClientHello(t *testing.T) {
	first := pionClientHello(t)
	h, err := parseClientHello(first)
	if err != nil {
		t.Fatal(err)
	}
	if len(h.random) != 32 || len(h.cookie) != 0 || h.messageSeq != 0 || len(h.cipherSuites) == 0 || len(h.compression) == 0 {
		t.Fatalf("parsed %+v", h)
	}
	cookie := bytes.Repeat([]byte{7}, cookieLen)
	second, err := parseClientHello(withCookie(h, cookie, 1))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(second.cookie, cookie) || second.messageSeq != 1 || second.recordSeq != 1 ||
		!bytes.Equal(second.random, h.random) || !bytes.Equal(second.cipherSuites, h.cipherSuites) {
		t.Fatalf("second ClientHello %+v", second)
	}
	if again := withoutCookie(second, h.recordSeq); !bytes.Equal(again, first[:len(again)]) || len(again) != len(first) {
		t.Fatalf("ClientHello without cookie\n%x\nwant\n%x", again, first)
	}

	hvr := helloVerifyRequest(h, cookie)
	if !isHelloVerifyRequest(hvr) || isHelloVerifyRequest(first) {
		t.Fatal("HelloVerifyRequest not told from a ClientHello")
	}
	epoch1 := bytes.Clone(first)
	epoch1[4] = 1
	alert := bytes.Clone(first)
	alert[0] = 21
	fragmented := bytes.Clone(first)
	fragmented[recordHeaderLen+11]-- // fragment length
	for name, b := range map[string][]byte{
		"HelloVerifyRequest": hvr, "epoch 1": epoch1, "alert": alert, "fragmented": fragmented,
		"empty": nil, "one byte": {22},
	} {
		if _, err := parseClientHello(b); err == nil {
			t.Errorf("%s taken for a ClientHello", name)
		}
	}
	for i := range len(first) {
		if _, err := parseClientHello(first[:i]); err == nil {
			t.Fatalf("ClientHello truncated to %d bytes parsed", i)
		}
	}
}

// A cookie verifies for its address and port and ClientHello, under the
// current and the previous secret, and not after two rotations.
func TestHelloCookie(t *testing.T) {
	h, err := parseClientHello(pionClientHello(t))
	if err != nil {
		t.Fatal(err)
	}
	from := netip.MustParseAddrPort("127.0.0.1:40000")
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	var k cookieKeys
	if err := k.rotate(now, rand.Reader); err != nil {
		t.Fatal(err)
	}
	if k.prev == ([32]byte{}) || k.cur == k.prev {
		t.Fatal("first secrets not random")
	}
	cookie := helloCookie(k.cur[:], from, h)
	back := func(c []byte) clientHello {
		h2, err := parseClientHello(withCookie(h, c, 1))
		if err != nil {
			t.Fatal(err)
		}
		return h2
	}
	if !k.verify(from, back(cookie)) {
		t.Fatal("own cookie refused")
	}
	if k.verify(netip.MustParseAddrPort("127.0.0.1:40001"), back(cookie)) ||
		k.verify(netip.MustParseAddrPort("127.0.0.2:40000"), back(cookie)) {
		t.Fatal("cookie accepted from another port or address")
	}
	other := back(cookie)
	other.random = bytes.Repeat([]byte{1}, 32)
	if k.verify(from, other) {
		t.Fatal("cookie accepted for another ClientHello")
	}
	if k.verify(from, back(cookie[:cookieLen-1])) || k.verify(from, back(nil)) {
		t.Fatal("short cookie accepted")
	}
	forged := bytes.Clone(cookie)
	forged[0] ^= 1
	if k.verify(from, back(forged)) {
		t.Fatal("forged cookie accepted")
	}

	cur := k.cur
	_ = k.rotate(now.Add(cookieRotation-time.Second), rand.Reader)
	if k.cur != cur {
		t.Fatal("rotated before cookieRotation")
	}
	_ = k.rotate(now.Add(cookieRotation), rand.Reader)
	if !k.verify(from, back(cookie)) {
		t.Fatal("cookie of the previous secret refused")
	}
	_ = k.rotate(now.Add(2*cookieRotation), rand.Reader)
	if k.verify(from, back(cookie)) {
		t.Fatal("cookie accepted two rotations later")
	}
}

// Only epoch-0 record numbers move, in every record of a datagram.
func TestShiftRecordSeqs(t *testing.T) {
	a := handshakeRecord([2]byte{0xfe, 0xfd}, 5, typeClientHello, 0, []byte{1, 2})
	b := bytes.Clone(a)
	b[4] = 1 // epoch 1
	c := handshakeRecord([2]byte{0xfe, 0xfd}, maxRecordSeq, typeClientHello, 0, nil)
	d := append(append(append([]byte{}, a...), b...), c...)
	shiftRecordSeqs(d, 3)
	seq := func(r []byte) uint64 {
		return uint64(binary.BigEndian.Uint16(r[5:7]))<<32 | uint64(binary.BigEndian.Uint32(r[7:11]))
	}
	if seq(d) != 8 || seq(d[len(a):]) != 5 || seq(d[2*len(a):]) != 2 {
		t.Fatalf("shifted %x", d)
	}
	shiftRecordSeqs(d[:len(a)+3], 1) // a truncated record is left alone
	shiftRecordSeqs(nil, 1)
}

// FuzzParseClientHello: parsing never panics nor reads beyond the
// datagram, and what parses is rebuilt without its cookie into a
// ClientHello with the same fields.
func FuzzParseClientHello(f *testing.F) {
	f.Fuzz(func(t *testing.T, b []byte) {
		h, err := parseClientHello(b)
		if err != nil {
			return
		}
		if len(h.cookie) > len(b) || len(h.body) > len(b) {
			t.Fatal("fields beyond the datagram")
		}
		first, err := parseClientHello(withoutCookie(h, 0))
		if err != nil {
			t.Fatalf("rebuilt ClientHello: %v", err)
		}
		if len(first.cookie) != 0 || !bytes.Equal(first.random, h.random) || !bytes.Equal(first.sessionID, h.sessionID) ||
			!bytes.Equal(first.cipherSuites, h.cipherSuites) || !bytes.Equal(first.compression, h.compression) {
			t.Fatalf("rebuilt %+v from %+v", first, h)
		}
		shiftRecordSeqs(b, 1)
		_ = isHelloVerifyRequest(b)
	})
}

// The gate's one write into pion (setPionCookie) finds the field it
// expects; a pion release that moves it fails here and in New.
func TestPionCookieLayout(t *testing.T) {
	if errPionLayout != nil {
		t.Fatalf("%v: the stateless cookie exchange needs a new way to set pion's expected cookie", errPionLayout)
	}
}

// fieldOffset takes only a struct's own field: a field moved into an
// embedded struct has its offset in that struct, so a write at it would
// land elsewhere in pion's Conn.
func TestFieldOffsetRefusesPromotedField(t *testing.T) {
	stateType := reflect.TypeFor[piondtls.State]()
	type inner struct {
		pad   [3]int64
		state piondtls.State
	}
	type moved struct {
		before int64
		inner
	}
	if off, err := fieldOffset(reflect.TypeFor[moved](), "state", stateType); err == nil {
		t.Fatalf("promoted field taken at offset %d; it is at %d", off, unsafe.Offsetof(moved{}.inner)+unsafe.Offsetof(inner{}.state))
	}
	type own struct {
		before int64
		state  piondtls.State
		cookie string
	}
	if off, err := fieldOffset(reflect.TypeFor[own](), "state", stateType); err != nil || off != unsafe.Offsetof(own{}.state) {
		t.Fatalf("own field: offset %d (%v), want %d", off, err, unsafe.Offsetof(own{}.state))
	}
	if _, err := fieldOffset(reflect.TypeFor[own](), "cookie", reflect.TypeFor[[]byte]()); err == nil {
		t.Fatal("field of another type taken")
	}
	if _, err := fieldOffset(reflect.TypeFor[own](), "missing", stateType); err == nil {
		t.Fatal("missing field taken")
	}
}

// A copy of the proven ClientHello that reaches the peer before pion has
// been fed the first one (a network duplicate, a quick retransmission)
// does not stall the handshake.
func TestDTLSGateDuplicateProvenHello(t *testing.T) {
	reg := prometheus.NewRegistry()
	s := startDTLS(t, &recorder{}, Options{Registerer: reg})
	c, err := net.DialUDP("udp", nil, s.DTLSAddr().(*net.UDPAddr))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	client, err := piondtls.Client(dtlsnet.PacketConnFromConn(&duplicating{Conn: c}), c.RemoteAddr(), &piondtls.Config{
		PSK:             func([]byte) ([]byte, error) { return testDevices["id-1"].key, nil },
		PSKIdentityHint: []byte("id-1"),
		CipherSuites:    []piondtls.CipherSuiteID{piondtls.TLS_PSK_WITH_AES_128_CCM_8},
		// No retransmission within the test's bound: only the duplicates.
		FlightInterval: 10 * time.Second,
	})
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	start := time.Now()
	if err := client.HandshakeContext(ctx); err != nil {
		t.Fatalf("handshake with every datagram sent three times: %v after %v", err, time.Since(start))
	}
}

// duplicating sends every datagram three times.
type duplicating struct{ net.Conn }

func (d *duplicating) Write(b []byte) (int, error) {
	for range 2 {
		if _, err := d.Conn.Write(b); err != nil {
			return 0, err
		}
	}
	return d.Conn.Write(b)
}

// Close releases the DTLS socket even with a session open: the port can
// be bound again.
func TestDTLSCloseReleasesSocket(t *testing.T) {
	s, err := New(&recorder{}, Options{DTLS: "127.0.0.1:0", Credentials: testDevices, Logger: testLogger(), HeartbeatInterval: 30 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- s.Serve(context.Background()) }()
	addr := s.DTLSAddr().(*net.UDPAddr)
	dc, err := handshake(t, s, "id-1", testDevices["id-1"].key, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer dc.Close()
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-served:
	case <-time.After(10 * time.Second):
		t.Fatal("Serve did not return after Close")
	}
	eventually(t, 5*time.Second, "the DTLS port to be free", func() bool {
		c, err := net.ListenUDP("udp", addr)
		if err != nil {
			return false
		}
		_ = c.Close()
		return true
	})
}
