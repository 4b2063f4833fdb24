package coap

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"encoding/gob"
	"errors"
	"fmt"

	piondtls "github.com/pion/dtls/v3"
	"github.com/pion/dtls/v3/pkg/crypto/ciphersuite"
	"github.com/pion/dtls/v3/pkg/crypto/prf"
	"github.com/pion/dtls/v3/pkg/protocol"
	"github.com/pion/dtls/v3/pkg/protocol/recordlayer"
)

// The record layer of parked sessions (park.go): a parked session
// answers a heartbeat itself, with the session's keys, instead of
// rebuilding a pion connection for it. It reads one application-data
// record of the session's epoch per datagram and writes one, with the
// AEAD ciphers of pion's exported packages (the same code pion's own
// cipher suites run), under the two suites the server allows.

// sessionState is a parked session's state: pion's exported state,
// decoded. It mirrors pion's serializedState (state.go of pion/dtls v3)
// field by field, because gob matches fields by name: State.MarshalBinary
// decodes into it, and its gob encoding is what State.UnmarshalBinary
// takes back (TestSessionStateRoundTrip checks both ways, so a pion
// release that adds a field fails the tests instead of losing it).
// RemoteSequenceNumber is one above the highest record number received
// (pion refuses any record below it after a resumption); SequenceNumber
// is the server's next record number.
type sessionState struct {
	RemoteSequenceNumber  uint64
	HandshakeComplete     bool
	LocalEpoch            uint16
	RemoteEpoch           uint16
	LocalRandom           [32]byte
	RemoteRandom          [32]byte
	CipherSuiteID         uint16
	MasterSecret          []byte
	SequenceNumber        uint64
	SRTPProtectionProfile uint16
	PeerCertificates      [][]byte
	IdentityHint          []byte
	SessionID             []byte
	LocalConnectionID     []byte
	RemoteConnectionID    []byte
	IsClient              bool
	NegotiatedProtocol    string
}

// decodeState decodes pion's exported state st.
func decodeState(st *piondtls.State) (sessionState, error) {
	b, err := st.MarshalBinary()
	if err != nil {
		return sessionState{}, err
	}
	var s sessionState
	if err := gob.NewDecoder(bytes.NewReader(b)).Decode(&s); err != nil {
		return sessionState{}, fmt.Errorf("decode dtls state: %w", err)
	}
	return s, nil
}

// pion is s as pion's state, for a resumption.
func (s *sessionState) pion() (*piondtls.State, error) {
	var b bytes.Buffer
	if err := gob.NewEncoder(&b).Encode(s); err != nil {
		return nil, err
	}
	st := &piondtls.State{}
	if err := st.UnmarshalBinary(b.Bytes()); err != nil {
		return nil, err
	}
	return st, nil
}

// recordKeys are a parked session's traffic keys (the server's and the
// client's write key and implicit IV), derived once when it is parked:
// 40 bytes, from which each record builds its ciphers (two AES key
// schedules) rather than keeping them expanded for every parked session.
type recordKeys struct {
	suite               piondtls.CipherSuiteID
	localKey, remoteKey [16]byte
	localIV, remoteIV   [4]byte
}

// Key block sizes of both suites (RFC 6655, RFC 5487): no MAC key, a
// 16-byte AES key and a 4-byte implicit IV per direction, SHA-256 PRF.
const (
	aeadKeyLen = 16
	aeadIVLen  = 4
)

// deriveKeys expands the master secret of server-side session s into its
// traffic keys, as pion's cipherSuite.Init does for a server (the client
// random is the remote one; the server writes with the server's key).
// Only the two suites the server allows, without connection IDs, are
// answered by the record layer.
func deriveKeys(s *sessionState) (recordKeys, error) {
	suite := piondtls.CipherSuiteID(s.CipherSuiteID)
	switch {
	case suite != piondtls.TLS_PSK_WITH_AES_128_CCM_8 && suite != piondtls.TLS_PSK_WITH_AES_128_GCM_SHA256:
		return recordKeys{}, fmt.Errorf("dtls record layer: cipher suite %v", suite)
	case s.IsClient || !s.HandshakeComplete || len(s.LocalConnectionID) > 0 || len(s.RemoteConnectionID) > 0:
		return recordKeys{}, errors.New("dtls record layer: not a completed server session without connection IDs")
	}
	keys, err := prf.GenerateEncryptionKeys(s.MasterSecret, s.RemoteRandom[:], s.LocalRandom[:], 0, aeadKeyLen, aeadIVLen, sha256.New)
	if err != nil {
		return recordKeys{}, err
	}
	k := recordKeys{suite: suite}
	copy(k.localKey[:], keys.ServerWriteKey)
	copy(k.remoteKey[:], keys.ClientWriteKey)
	copy(k.localIV[:], keys.ServerWriteIV)
	copy(k.remoteIV[:], keys.ClientWriteIV)
	return k, nil
}

// recordCipher is what both suites' AEAD ciphers offer.
type recordCipher interface {
	Encrypt(pkt *recordlayer.RecordLayer, raw []byte) ([]byte, error)
	Decrypt(h recordlayer.Header, in []byte) ([]byte, error)
}

var (
	_ recordCipher = (*ciphersuite.CCM)(nil)
	_ recordCipher = (*ciphersuite.GCM)(nil)
)

// cipher builds k's ciphers.
func (k *recordKeys) cipher() (recordCipher, error) {
	if k.suite == piondtls.TLS_PSK_WITH_AES_128_CCM_8 {
		return ciphersuite.NewCCM(ciphersuite.CCMTagLength8, k.localKey[:], k.localIV[:], k.remoteKey[:], k.remoteIV[:])
	}
	return ciphersuite.NewGCM(k.localKey[:], k.localIV[:], k.remoteKey[:], k.remoteIV[:])
}

var (
	// errForeignRecord: the datagram is not one application-data record
	// of the session's epoch (several records, an alert, another epoch);
	// the record layer leaves it to a resumption.
	errForeignRecord = errors.New("dtls record layer: not a single application-data record of the session")
	// errReplayedRecord: the record is numbered below the session's
	// highest received record plus one.
	errReplayedRecord = errors.New("dtls record layer: record replayed or reordered")
	// errUnauthenticRecord: the record does not authenticate under the
	// session's keys (forged, corrupted, truncated).
	errUnauthenticRecord = errors.New("dtls record layer: record does not authenticate")
)

// openRecord reads datagram b as one application-data record of parked
// session s under keys k, and returns its record number and plaintext.
// The replay rule is strict: a record is accepted only if it is numbered
// above every record the session has accepted (at or above
// s.RemoteSequenceNumber), without a window, so a record reordered behind
// a later one is refused like a replay; a device's next retransmission
// has a number of its own. b is not modified.
func openRecord(k *recordKeys, s *sessionState, b []byte) (uint64, []byte, error) {
	var h recordlayer.Header
	if len(b) < recordlayer.FixedHeaderSize || protocol.ContentType(b[0]) != protocol.ContentTypeApplicationData {
		return 0, nil, errForeignRecord
	}
	if err := h.Unmarshal(b); err != nil {
		return 0, nil, errUnauthenticRecord
	}
	// Header.Unmarshal leaves the length, the header's last two bytes.
	h.ContentLen = binary.BigEndian.Uint16(b[recordlayer.FixedHeaderSize-2:])
	switch end := recordlayer.FixedHeaderSize + int(h.ContentLen); {
	case h.Epoch != s.RemoteEpoch || end < len(b):
		return 0, nil, errForeignRecord
	case end > len(b):
		return 0, nil, errUnauthenticRecord
	case h.SequenceNumber < s.RemoteSequenceNumber:
		return 0, nil, errReplayedRecord
	}
	c, err := k.cipher()
	if err != nil {
		return 0, nil, err
	}
	out, err := c.Decrypt(h, bytes.Clone(b))
	if err != nil {
		return 0, nil, errUnauthenticRecord
	}
	return h.SequenceNumber, out[recordlayer.FixedHeaderSize:], nil
}

// sealRecord is payload as an application-data record of epoch numbered
// seq, encrypted under k.
func sealRecord(k *recordKeys, epoch uint16, seq uint64, payload []byte) ([]byte, error) {
	h := recordlayer.Header{
		ContentType:    protocol.ContentTypeApplicationData,
		ContentLen:     uint16(len(payload)), // a CoAP answer, bounded by the largest message
		Version:        protocol.Version1_2,
		Epoch:          epoch,
		SequenceNumber: seq,
	}
	raw, err := h.Marshal()
	if err != nil {
		return nil, err
	}
	c, err := k.cipher()
	if err != nil {
		return nil, err
	}
	return c.Encrypt(&recordlayer.RecordLayer{Header: h}, append(raw, payload...))
}
