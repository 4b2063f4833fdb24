package coap

import (
	"bytes"
	"context"
	"errors"
	"testing"
	"time"

	piondtls "github.com/pion/dtls/v3"
	"github.com/plgd-dev/go-coap/v3/message"
	"github.com/plgd-dev/go-coap/v3/message/codes"
)

// testSession is a parked server session with fixed secrets under suite,
// and the client's keys of the same session (the server's, mirrored).
func testSession(t testing.TB, suite piondtls.CipherSuiteID) (sessionState, recordKeys, recordKeys) {
	t.Helper()
	s := sessionState{
		HandshakeComplete: true, LocalEpoch: 1, RemoteEpoch: 1, CipherSuiteID: uint16(suite),
		MasterSecret:         bytes.Repeat([]byte{7}, 48),
		RemoteSequenceNumber: 5, SequenceNumber: 9, IdentityHint: []byte("id-1"),
	}
	for i := range s.LocalRandom {
		s.LocalRandom[i], s.RemoteRandom[i] = byte(i), byte(100+i)
	}
	server, err := deriveKeys(&s)
	if err != nil {
		t.Fatal(err)
	}
	client := recordKeys{suite: suite, localKey: server.remoteKey, remoteKey: server.localKey, localIV: server.remoteIV, remoteIV: server.localIV}
	return s, server, client
}

// A record the client seals opens with the parked server's keys, under
// both suites the server allows; and the other way round.
func TestRecordRoundTrip(t *testing.T) {
	for _, suite := range []piondtls.CipherSuiteID{piondtls.TLS_PSK_WITH_AES_128_CCM_8, piondtls.TLS_PSK_WITH_AES_128_GCM_SHA256} {
		s, server, client := testSession(t, suite)
		rec, err := sealRecord(&client, 1, 5, []byte("heartbeat"))
		if err != nil {
			t.Fatal(err)
		}
		seq, plain, err := openRecord(&server, &s, rec)
		if err != nil || seq != 5 || string(plain) != "heartbeat" {
			t.Fatalf("%v: open %d %q %v", suite, seq, plain, err)
		}
		answer, err := sealRecord(&server, 1, 9, []byte("2.04"))
		if err != nil {
			t.Fatal(err)
		}
		clientView := sessionState{RemoteEpoch: 1}
		if _, plain, err := openRecord(&client, &clientView, answer); err != nil || string(plain) != "2.04" {
			t.Fatalf("%v: the client cannot open the answer: %q %v", suite, plain, err)
		}
	}
}

// What the record layer refuses, and what it leaves to a resumption.
func TestOpenRecordRefuses(t *testing.T) {
	s, server, client := testSession(t, piondtls.TLS_PSK_WITH_AES_128_CCM_8)
	seal := func(epoch uint16, seq uint64) []byte {
		b, err := sealRecord(&client, epoch, seq, []byte("heartbeat"))
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	good := seal(1, 6)
	flipped := bytes.Clone(good)
	flipped[len(flipped)-1] ^= 1
	alert := bytes.Clone(good)
	alert[0] = contentAlert
	for _, c := range []struct {
		name string
		b    []byte
		want error
	}{
		{"forged tag", flipped, errUnauthenticRecord},
		{"truncated", good[:len(good)-1], errUnauthenticRecord},
		{"below the highest received", seal(1, 4), errReplayedRecord},
		{"other keys", func() []byte { b, _ := sealRecord(&server, 1, 6, []byte("x")); return b }(), errUnauthenticRecord},
		{"two records", append(bytes.Clone(good), good...), errForeignRecord},
		{"epoch 0", seal(0, 6), errForeignRecord},
		{"an alert", alert, errForeignRecord},
		{"short", good[:5], errForeignRecord},
	} {
		if _, _, err := openRecord(&server, &s, c.b); !errors.Is(err, c.want) {
			t.Errorf("%s: %v, want %v", c.name, err, c.want)
		}
	}
	if _, _, err := openRecord(&server, &s, good); err != nil {
		t.Fatalf("the good record after the refusals: %v", err)
	}
}

// The parked state decodes pion's exported state and encodes back to
// exactly it: a pion release that adds or renames a field fails here
// rather than losing it in a resumption.
func TestSessionStateRoundTrip(t *testing.T) {
	s := startDTLS(t, &recorder{}, Options{})
	cc, _ := keptSession(t, s, "id-1")
	if r := request(t, cc, message.Confirmable, codes.POST, "/hb"); r.code != codes.Changed {
		t.Fatalf("heartbeat: %v", r.code)
	}
	dc, ok := cc.NetConn().(*piondtls.Conn)
	if !ok {
		t.Fatalf("client connection %T", cc.NetConn())
	}
	st, ok := dc.ConnectionState()
	if !ok {
		t.Fatal("no connection state")
	}
	want, err := st.MarshalBinary()
	if err != nil {
		t.Fatal(err)
	}
	mirror, err := decodeState(&st)
	if err != nil {
		t.Fatal(err)
	}
	if len(mirror.MasterSecret) != 48 || mirror.LocalEpoch != 1 || mirror.SequenceNumber == 0 {
		t.Fatalf("decoded state %+v", mirror)
	}
	back, err := mirror.pion()
	if err != nil {
		t.Fatal(err)
	}
	got, err := back.MarshalBinary()
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("state changed through the mirror:\n got % x\nwant % x", got, want)
	}
}

// Keys are derived only for a completed server session under a suite the
// record layer serves; another session is not parked.
func TestDeriveKeysRefuses(t *testing.T) {
	s, _, _ := testSession(t, piondtls.TLS_PSK_WITH_AES_128_GCM_SHA256)
	if _, err := deriveKeys(&sessionState{CipherSuiteID: uint16(piondtls.TLS_PSK_WITH_AES_128_CBC_SHA256), HandshakeComplete: true}); err == nil {
		t.Fatal("keys derived for a suite the record layer does not serve")
	}
	client := s
	client.IsClient = true
	if _, err := deriveKeys(&client); err == nil {
		t.Fatal("keys derived for a client's state")
	}
}

// FuzzParkedRecord feeds outside input to what reads a parked session's
// datagram: openRecord, then, for what opens, parkedRequest. Neither may
// panic; only a record sealed with the client's keys opens. The seed
// corpus (testdata/fuzz/FuzzParkedRecord) holds a sealed heartbeat and
// damaged copies, and runs as an ordinary test.
func FuzzParkedRecord(f *testing.F) {
	s, server, client := testSession(f, piondtls.TLS_PSK_WITH_AES_128_CCM_8)
	hb := datagram(f, message.Confirmable, codes.POST, 1, "/hb")
	good, err := sealRecord(&client, 1, 5, hb)
	if err != nil {
		f.Fatal(err)
	}
	f.Add(good)
	f.Fuzz(func(t *testing.T, b []byte) {
		seq, plain, err := openRecord(&server, &s, b)
		if err != nil {
			return
		}
		if seq < s.RemoteSequenceNumber {
			t.Fatalf("record %d opened below the cutoff %d", seq, s.RemoteSequenceNumber)
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		if m, ok := parkedRequest(ctx, plain, DefaultMaxMessageSize); ok && m.Code() != codes.POST {
			t.Fatalf("answered parked: %v", m.Code())
		}
	})
}
