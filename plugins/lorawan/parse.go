package main

import (
	"bytes"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"mime"
	"regexp"
	"strconv"
	"strings"
	"time"
)

// errIgnored marks a well-formed message that carries no presence (an
// event type the adapter does not use): answered 204.
var errIgnored = errors.New("event ignored")

// errBadRequest marks a message that cannot be used: answered 400.
var errBadRequest = errors.New("bad request")

// Message is what a network-server message says: presence, and the
// uplink's application payload.
type Message struct {
	// DevEUI is the device's EUI in lower-case hex (16 digits).
	DevEUI string
	// Join is true for a join (a connect), false for an uplink (a renew).
	Join bool
	// At is when the network server received it; zero when not given.
	At time.Time
	// FPort and FCnt are the uplink's port and frame counter (0 when not
	// given).
	FPort int
	FCnt  uint32
	// Payload is the uplink's raw application payload (empty when none).
	Payload []byte
	// Object is the payload as the network server's codec or payload
	// formatter decoded it (a JSON object), nil when it gave none.
	Object json.RawMessage
	// AppID and DevID are The Things Stack's application and device IDs
	// (its downlink push path needs them); "" for ChirpStack.
	AppID, DevID string
	// Profile names the device's class for uplink_intervals: ChirpStack's
	// device-profile name, The Things Stack's application ID ("" when not
	// given).
	Profile string
	// Interval is the device's configured uplink interval from its
	// ChirpStack tag uplink_interval (a duration, "15m", or seconds,
	// "900"); 0 when it has none, or one that does not parse.
	Interval time.Duration
}

// intervalTag is the ChirpStack tag that carries a device's uplink
// interval (deviceInfo.tags: the device profile's tags and the device's).
const intervalTag = "uplink_interval"

// ParseInterval reads an uplink interval: a Go duration ("15m") or whole
// seconds ("900", as ChirpStack's device profile counts it), above zero
// and at most a week (no lease is longer).
func ParseInterval(s string) (time.Duration, error) {
	d, err := time.ParseDuration(s)
	if err != nil {
		n, nerr := strconv.ParseUint(s, 10, 32)
		if nerr != nil {
			return 0, fmt.Errorf("%q is neither a duration (15m) nor seconds (900)", truncate(s))
		}
		d = time.Duration(n) * time.Second
	}
	if d <= 0 || d > 7*24*time.Hour {
		return 0, fmt.Errorf("%s: want above zero and at most 168h", d)
	}
	return d, nil
}

// chirpStackEvent is the part of a ChirpStack v4 integration event
// (protobuf JSON: UplinkEvent, JoinEvent) the adapter reads.
type chirpStackEvent struct {
	Time       string `json:"time"`
	DeviceInfo *struct {
		DevEUI            string            `json:"devEui"`
		DeviceProfileName string            `json:"deviceProfileName"`
		Tags              map[string]string `json:"tags"`
	} `json:"deviceInfo"`
	FPort  int             `json:"fPort"`
	FCnt   uint32          `json:"fCnt"`
	Data   string          `json:"data"`
	Object json.RawMessage `json:"object"`
}

// ParseChirpStack parses the body of a ChirpStack v4 HTTP integration
// POST whose query says event (up, join, status, ack, ...). Events other
// than up and join are errIgnored.
func ParseChirpStack(event string, body []byte) (Message, error) {
	var join bool
	switch event {
	case "up":
	case "join":
		join = true
	default:
		return Message{}, fmt.Errorf("%w: chirpstack event %q", errIgnored, truncate(event))
	}
	var e chirpStackEvent
	if err := json.Unmarshal(body, &e); err != nil {
		return Message{}, fmt.Errorf("%w: chirpstack %s event: %v", errBadRequest, event, err)
	}
	if e.DeviceInfo == nil {
		return Message{}, fmt.Errorf("%w: chirpstack %s event without deviceInfo", errBadRequest, event)
	}
	eui, err := parseEUI(e.DeviceInfo.DevEUI)
	if err != nil {
		return Message{}, fmt.Errorf("%w: deviceInfo.devEui: %v", errBadRequest, err)
	}
	m := Message{DevEUI: eui, Join: join, At: parseTime(e.Time), Profile: e.DeviceInfo.DeviceProfileName}
	if tag, ok := e.DeviceInfo.Tags[intervalTag]; ok {
		m.Interval, _ = ParseInterval(tag) // a tag that does not parse is none
	}
	if !join {
		if err := m.setPayload(e.FPort, e.FCnt, e.Data, e.Object); err != nil {
			return Message{}, fmt.Errorf("%w: chirpstack up event: %v", errBadRequest, err)
		}
	}
	return m, nil
}

// maxFPort is the highest application port.
const maxFPort = 223

// setPayload sets the uplink's port, counter, raw payload (base64 data)
// and decoded object (a JSON object, or null for none).
func (m *Message) setPayload(fPort int, fCnt uint32, data string, object json.RawMessage) error {
	if fPort < 0 || fPort > maxFPort {
		return fmt.Errorf("port %d: want 0..%d", fPort, maxFPort)
	}
	m.FPort, m.FCnt = fPort, fCnt
	if data != "" {
		b, err := base64.StdEncoding.DecodeString(data)
		if err != nil {
			return fmt.Errorf("payload is not base64: %v", err)
		}
		m.Payload = b
	}
	if o := bytes.TrimSpace(object); len(o) > 0 && string(o) != "null" {
		if o[0] != '{' {
			return errors.New("decoded payload is not a JSON object")
		}
		var compact bytes.Buffer
		if err := json.Compact(&compact, o); err != nil {
			return fmt.Errorf("decoded payload: %v", err)
		}
		m.Object = compact.Bytes()
	}
	return nil
}

// HasData reports whether the message carries application data: a
// decoded object or raw payload bytes.
func (m Message) HasData() bool { return m.Object != nil || len(m.Payload) > 0 }

// Topic is the data's topic below the device's root: "up/<fPort>".
func (m Message) Topic() string { return "up/" + strconv.Itoa(m.FPort) }

// Data returns the data's payload and content type: the decoded object
// as application/json when there is one, else the raw bytes as
// application/octet-stream.
func (m Message) Data() ([]byte, string) {
	if m.Object != nil {
		return m.Object, "application/json"
	}
	return m.Payload, "application/octet-stream"
}

// ttsMessage is the part of a The Things Stack v3 application-up message
// (webhook body) the adapter reads.
type ttsMessage struct {
	EndDeviceIDs *struct {
		DevEUI         string `json:"dev_eui"`
		DeviceID       string `json:"device_id"`
		ApplicationIDs struct {
			ApplicationID string `json:"application_id"`
		} `json:"application_ids"`
	} `json:"end_device_ids"`
	ReceivedAt    string          `json:"received_at"`
	UplinkMessage json.RawMessage `json:"uplink_message"`
	JoinAccept    json.RawMessage `json:"join_accept"`
}

// ttsUplink is the part of uplink_message the adapter reads.
type ttsUplink struct {
	FPort          int             `json:"f_port"`
	FCnt           uint32          `json:"f_cnt"`
	FRMPayload     string          `json:"frm_payload"`
	DecodedPayload json.RawMessage `json:"decoded_payload"`
}

// ttsID is the form of The Things Stack's application and device IDs.
var ttsID = regexp.MustCompile(`^[a-z0-9](?:[-]?[a-z0-9]){1,35}$`)

// ParseTTS parses the body of a The Things Stack v3 webhook. Uplink
// messages (uplink_message) are renewals, join-accepts (join_accept)
// connects; other message types (downlink events, service data, ...)
// are errIgnored.
func ParseTTS(body []byte) (Message, error) {
	var m ttsMessage
	if err := json.Unmarshal(body, &m); err != nil {
		return Message{}, fmt.Errorf("%w: tts message: %v", errBadRequest, err)
	}
	var join bool
	switch {
	case len(m.UplinkMessage) > 0 && string(m.UplinkMessage) != "null":
	case len(m.JoinAccept) > 0 && string(m.JoinAccept) != "null":
		join = true
	default:
		return Message{}, fmt.Errorf("%w: tts message is neither uplink_message nor join_accept", errIgnored)
	}
	if m.EndDeviceIDs == nil {
		return Message{}, fmt.Errorf("%w: tts message without end_device_ids", errBadRequest)
	}
	eui, err := parseEUI(m.EndDeviceIDs.DevEUI)
	if err != nil {
		return Message{}, fmt.Errorf("%w: end_device_ids.dev_eui: %v", errBadRequest, err)
	}
	out := Message{DevEUI: eui, Join: join, At: parseTime(m.ReceivedAt)}
	if app, dev := m.EndDeviceIDs.ApplicationIDs.ApplicationID, m.EndDeviceIDs.DeviceID; ttsID.MatchString(app) && ttsID.MatchString(dev) {
		out.AppID, out.DevID, out.Profile = app, dev, app
	}
	if !join {
		var up ttsUplink
		if err := json.Unmarshal(m.UplinkMessage, &up); err != nil {
			return Message{}, fmt.Errorf("%w: tts uplink_message: %v", errBadRequest, err)
		}
		if err := out.setPayload(up.FPort, up.FCnt, up.FRMPayload, up.DecodedPayload); err != nil {
			return Message{}, fmt.Errorf("%w: tts uplink_message: %v", errBadRequest, err)
		}
	}
	return out, nil
}

// Downlink is a command as a LoRaWAN downlink.
type Downlink struct {
	FPort     int
	Confirmed bool
	// Object, when set, is a JSON object for the network server's codec
	// or payload formatter to encode; else Payload is the bytes.
	Object  json.RawMessage
	Payload []byte
}

// maxDownlink bounds a downlink's payload (the largest LoRaWAN
// application payload is 242 bytes; a decoded object takes more).
const maxDownlink = 4096

// ParseDownlink reads a command as a downlink: its topic is
// "cmd/<fPort>" or "cmd/<fPort>/confirmed" (fPort 1..223); a payload of
// content type application/json is a JSON object for the network
// server's codec, any other one the downlink's bytes (1 to 4096).
func ParseDownlink(topic, contentType string, payload []byte) (Downlink, error) {
	rest, ok := strings.CutPrefix(topic, "cmd/")
	if !ok {
		return Downlink{}, fmt.Errorf("topic %q: want cmd/<fPort> or cmd/<fPort>/confirmed", truncate(topic))
	}
	var d Downlink
	port, flag, _ := strings.Cut(rest, "/")
	switch flag {
	case "":
		if strings.HasSuffix(rest, "/") {
			return Downlink{}, fmt.Errorf("topic %q: want cmd/<fPort> or cmd/<fPort>/confirmed", truncate(topic))
		}
	case "confirmed":
		d.Confirmed = true
	default:
		return Downlink{}, fmt.Errorf("topic %q: want cmd/<fPort> or cmd/<fPort>/confirmed", truncate(topic))
	}
	n, err := strconv.Atoi(port)
	if err != nil || n < 1 || n > maxFPort || port != strconv.Itoa(n) {
		return Downlink{}, fmt.Errorf("topic %q: port %q, want 1..%d", truncate(topic), truncate(port), maxFPort)
	}
	d.FPort = n
	if len(payload) == 0 || len(payload) > maxDownlink {
		return Downlink{}, fmt.Errorf("payload of %d bytes, want 1 to %d", len(payload), maxDownlink)
	}
	if mt, _, err := mime.ParseMediaType(contentType); err == nil && mt == "application/json" {
		o := bytes.TrimSpace(payload)
		if len(o) == 0 || o[0] != '{' || !json.Valid(o) {
			return Downlink{}, errors.New("application/json payload: want a JSON object for the network server's codec")
		}
		d.Object = json.RawMessage(o)
		return d, nil
	}
	d.Payload = payload
	return d, nil
}

// parseEUI accepts 16 hex digits (any case) and returns them lower-case.
func parseEUI(s string) (string, error) {
	if len(s) != 16 {
		return "", fmt.Errorf("%q is not 16 hex digits", truncate(s))
	}
	if _, err := hex.DecodeString(s); err != nil {
		return "", fmt.Errorf("%q is not 16 hex digits", s)
	}
	return strings.ToLower(s), nil
}

// parseTime reads an RFC 3339 timestamp (ChirpStack writes nanoseconds
// and "+00:00"); anything else is the zero time (the adapter then uses
// its own clock).
func parseTime(s string) time.Time {
	t, err := time.Parse(time.RFC3339Nano, s)
	if err != nil {
		return time.Time{}
	}
	return t
}

func truncate(s string) string {
	if len(s) > 32 {
		return s[:32] + "…"
	}
	return s
}
