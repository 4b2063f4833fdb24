package gateway

import (
	"errors"
	"fmt"
	"hash/fnv"
	"strings"
	"sync"
)

// MaxDeviceIDLen is the longest device ID accepted (docs/design.md §1).
const MaxDeviceIDLen = 128

// MaxSessionIDLen is the longest session ID accepted.
const MaxSessionIDLen = 200

// ErrInvalidDeviceID is returned (wrapped) for a device ID outside
// [A-Za-z0-9._:-]{1,128}. Front ends map it to CoAP 4.00 or the MQTT
// "client identifier not valid" CONNACK.
var ErrInvalidDeviceID = errors.New("invalid device id")

// ErrInvalidSessionID is returned (wrapped) for an empty, overlong or
// non-printable session ID.
var ErrInvalidSessionID = errors.New("invalid session id")

// DeviceID is a validated device identifier. Construct it with
// ParseDeviceID; a DeviceID converted from an unchecked string is a bug.
type DeviceID string

// ParseDeviceID validates s against [A-Za-z0-9._:-]{1,128}.
func ParseDeviceID(s string) (DeviceID, error) {
	if len(s) == 0 {
		return "", fmt.Errorf("%w: empty", ErrInvalidDeviceID)
	}
	if len(s) > MaxDeviceIDLen {
		return "", fmt.Errorf("%w: %d bytes, longest allowed is %d", ErrInvalidDeviceID, len(s), MaxDeviceIDLen)
	}
	for i := 0; i < len(s); i++ {
		if !deviceIDByte(s[i]) {
			return "", fmt.Errorf("%w: byte %d (%q) is not one of A-Z a-z 0-9 . _ : -", ErrInvalidDeviceID, i, s[i])
		}
	}
	return DeviceID(s), nil
}

func deviceIDByte(c byte) bool {
	switch {
	case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9':
		return true
	case c == '.', c == '_', c == ':', c == '-':
		return true
	}
	return false
}

// SessionID names one live attachment of a device: "<gateway>/<epoch>/<n>"
// for connection-oriented protocols, "<protocol>/<instance>" for
// connectionless ones (docs/design.md §1).
type SessionID string

// ParseSessionID accepts 1..MaxSessionIDLen printable ASCII bytes other
// than space and '|' (the stores' record separator).
func ParseSessionID(s string) (SessionID, error) {
	if len(s) == 0 || len(s) > MaxSessionIDLen {
		return "", fmt.Errorf("%w: length %d not in 1..%d", ErrInvalidSessionID, len(s), MaxSessionIDLen)
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; c <= ' ' || c >= 0x7f || c == '|' {
			return "", fmt.Errorf("%w: byte %d (%q) not allowed", ErrInvalidSessionID, i, c)
		}
	}
	return SessionID(s), nil
}

// ConnectionSessionID names the n-th connection accepted by a gateway
// process: "<gateway>/<epoch>/<n>".
func ConnectionSessionID(gw string, epoch uint64, n uint64) SessionID {
	return SessionID(fmt.Sprintf("%s/%d/%d", gw, epoch, n))
}

// InstanceSessionID names a connectionless session by protocol and a
// device-chosen instance ("coap/<instance>"); an empty instance is
// "default". The instance must itself be a valid device-ID-shaped token.
// The default session of a protocol is one string for every device, not
// one per message that the session table and the uplink would keep.
func InstanceSessionID(protocol, instance string) (SessionID, error) {
	if instance == "" {
		if id, ok := defaultSessions.Load(protocol); ok {
			return id.(SessionID), nil
		}
		id, err := ParseSessionID(protocol + "/default")
		if err == nil {
			defaultSessions.Store(protocol, id)
		}
		return id, err
	}
	if _, err := ParseDeviceID(instance); err != nil {
		return "", fmt.Errorf("%w: instance: %v", ErrInvalidSessionID, err)
	}
	return ParseSessionID(protocol + "/" + instance)
}

// defaultSessions holds, by protocol, its default session ID
// (InstanceSessionID): the protocols are the CoAP front end's and the
// configured adapters' names, a handful.
var defaultSessions sync.Map

// SessionProtocol names the protocol of a session by the form of its ID
// (docs/design.md §1): "mqtt" for "<gateway>/<epoch>/<n>" and
// "<gateway>/mqtt", "coap" for "coap/<instance>", the adapter's name for
// "<adapter>/<instance>"; "" for an ID of none of these forms. The
// stores keep no protocol (Evidence.Protocol never reaches them): this
// is all that tells a device's protocol from its record.
func SessionProtocol(id SessionID) string {
	p := strings.Split(string(id), "/")
	switch {
	case len(p) == 3 && isDigits(p[1]) && isDigits(p[2]):
		return "mqtt"
	case len(p) != 2 || p[0] == "" || p[1] == "":
		return ""
	case p[1] == "mqtt":
		return "mqtt"
	}
	return p[0]
}

func isDigits(s string) bool { return s != "" && strings.Trim(s, "0123456789") == "" }

// ValidGatewayID reports whether id can name a gateway: the device ID
// alphabet, so that it can be embedded in session IDs and Redis records,
// except "L" followed by digits only: the field of a lost gateway's
// marker in the Redis store's epochs hash (docs/design.md §3.3), which a
// gateway of that name would share with its epoch.
func ValidGatewayID(id string) error {
	if _, err := ParseDeviceID(id); err != nil {
		return fmt.Errorf("gateway id: %w", err)
	}
	if digits, ok := strings.CutPrefix(id, "L"); ok && digits != "" && strings.Trim(digits, "0123456789") == "" {
		return fmt.Errorf("gateway id %q: %w: \"L\" followed by digits names a lost gateway's marker in the store", id, ErrInvalidDeviceID)
	}
	return nil
}

// ShardOf maps a device to its shard: fnv1a32(device) mod shards
// (docs/design.md §3.1). shards must be ≥ 1.
func ShardOf(d DeviceID, shards int) int {
	h := fnv.New32a()
	h.Write([]byte(d))
	return int(h.Sum32() % uint32(shards))
}
