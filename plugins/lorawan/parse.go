package main

import (
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"
)

// errIgnored marks a well-formed message that carries no presence (an
// event type the adapter does not use): answered 204.
var errIgnored = errors.New("event ignored")

// errBadRequest marks a message that cannot be used: answered 400.
var errBadRequest = errors.New("bad request")

// Message is what a network-server message says about presence.
type Message struct {
	// DevEUI is the device's EUI in lower-case hex (16 digits).
	DevEUI string
	// Join is true for a join (a connect), false for an uplink (a renew).
	Join bool
	// At is when the network server received it; zero when not given.
	At time.Time
}

// chirpStackEvent is the part of a ChirpStack v4 integration event
// (protobuf JSON: UplinkEvent, JoinEvent) the adapter reads.
type chirpStackEvent struct {
	Time       string `json:"time"`
	DeviceInfo *struct {
		DevEUI string `json:"devEui"`
	} `json:"deviceInfo"`
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
	return Message{DevEUI: eui, Join: join, At: parseTime(e.Time)}, nil
}

// ttsMessage is the part of a The Things Stack v3 application-up message
// (webhook body) the adapter reads.
type ttsMessage struct {
	EndDeviceIDs *struct {
		DevEUI string `json:"dev_eui"`
	} `json:"end_device_ids"`
	ReceivedAt    string          `json:"received_at"`
	UplinkMessage json.RawMessage `json:"uplink_message"`
	JoinAccept    json.RawMessage `json:"join_accept"`
}

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
	return Message{DevEUI: eui, Join: join, At: parseTime(m.ReceivedAt)}, nil
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
