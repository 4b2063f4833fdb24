package gateway

import (
	"context"
	"errors"
	"strings"
	"time"
)

// The data path (docs/design.md §6.14): what devices say goes up to an
// upstream broker through a store-and-forward queue, and commands come
// down to them. The front ends hand device messages to a DataSink and
// take commands from Commands; the bridge implements both over
// Queues. This file is the contract; queue/queuetest is the conformance
// suite every Queue passes.

// Errors of the data path's contracts, wrapped by implementations.
var (
	// ErrTooLarge: a message larger than a queue can ever hold (its
	// max_bytes), or than the data path accepts (MaxMessageBytes).
	ErrTooLarge = errors.New("message too large")
	// ErrQueueClosed: the queue was closed.
	ErrQueueClosed = errors.New("queue closed")
	// ErrInvalidMessage: a message the data path refuses (an invalid
	// device ID or topic, a QoS other than 0 or 1).
	ErrInvalidMessage = errors.New("invalid message")
)

// MaxMessageBytes bounds a message's payload, topic, content type and
// properties together (the MQTT front end's maximum packet size is
// smaller by default).
const MaxMessageBytes = 1 << 20

// Message is one message of a device: up, what the device said (its
// topic below the device's root <auth.topic_prefix>/<device>); down, a
// command to it (Topic "cmd" or "cmd/<rest>").
type Message struct {
	Device DeviceID
	// Topic is the topic below the device's root: "" for the root
	// itself, else topic levels with no wildcard ("telemetry/temp").
	Topic string
	// Payload is the message's bytes, kept as they are.
	Payload []byte
	// ContentType is the MIME type (MQTT 5 content type, the CoAP
	// Content-Format's name), "" when none was given.
	ContentType string
	// Properties are MQTT 5 user properties, in order.
	Properties []Property
	// QoS is 0 (best effort: a bounded memory queue) or 1 (at least once:
	// acknowledged to the sender only once the message is durable).
	QoS byte
	// Received is when the gateway read it (store time of the gateway's
	// clock, ms precision is kept).
	Received time.Time
	// Source names what it came through: "mqtt", "coap", an adapter's
	// name, or "upstream" / a local client's name for a command.
	Source string
}

// Property is one MQTT 5 user property.
type Property struct{ Key, Value string }

// Size is what a message counts against a queue's byte bound: payload,
// device, topic, content type, source and properties, plus a fixed 64
// bytes for its header.
func (m Message) Size() int {
	n := 64 + len(m.Payload) + len(m.Device) + len(m.Topic) + len(m.ContentType) + len(m.Source)
	for _, p := range m.Properties {
		n += len(p.Key) + len(p.Value) + 4
	}
	return n
}

// ValidateMessage checks what the data path requires of a message: a
// valid device ID, a topic of non-empty levels without wildcards, "$",
// NUL or a leading "/", QoS 0 or 1, and Size at most MaxMessageBytes.
// Its errors wrap ErrInvalidMessage or ErrTooLarge.
func ValidateMessage(m Message) error {
	if _, err := ParseDeviceID(string(m.Device)); err != nil {
		return errors.Join(ErrInvalidMessage, err)
	}
	if !ValidTopicRest(m.Topic) {
		return errors.Join(ErrInvalidMessage, errors.New("topic "+quoteTopic(m.Topic)+": want levels without wildcards, $ or empty levels"))
	}
	if m.QoS > 1 {
		return errors.Join(ErrInvalidMessage, errors.New("qos must be 0 or 1"))
	}
	if m.Size() > MaxMessageBytes {
		return ErrTooLarge
	}
	return nil
}

// ValidTopicRest reports whether rest may follow a device's root: ""
// or "/"-separated non-empty levels without "+", "#", NUL, and not
// starting with "$".
func ValidTopicRest(rest string) bool {
	if rest == "" {
		return true
	}
	if len(rest) > 1024 || rest[0] == '$' {
		return false
	}
	level := 0
	for i := 0; i < len(rest); i++ {
		switch c := rest[i]; c {
		case '/':
			if level == 0 {
				return false
			}
			level = 0
		case '+', '#', 0:
			return false
		default:
			level++
		}
	}
	return level > 0
}

// ValidTopicFilter reports whether f is an MQTT topic filter: "/"
// separated levels, "+" only as a whole level, "#" only as the whole last
// level, no NUL, at most 1024 bytes.
func ValidTopicFilter(f string) bool {
	if f == "" || len(f) > 1024 || strings.IndexByte(f, 0) >= 0 {
		return false
	}
	for {
		level, after, more := strings.Cut(f, "/")
		switch {
		case level == "#" && more:
			return false
		case level != "#" && level != "+" && strings.ContainsAny(level, "+#"):
			return false
		case !more:
			return true
		}
		f = after
	}
}

func quoteTopic(s string) string {
	if len(s) > 64 {
		s = s[:64] + "…"
	}
	return "\"" + s + "\""
}

// QueuedMessage is a message in a Queue with its ID.
type QueuedMessage struct {
	ID uint64
	Message
}

// DropReason says why a queue dropped a message it had taken.
type DropReason string

// Reasons a queue drops a message (QueueStats.Dropped).
const (
	// DropFull: the oldest message made room for a newer one.
	DropFull DropReason = "full"
	// DropExpired: the message was older than the queue's max age.
	DropExpired DropReason = "expired"
	// DropCorrupt: the message as stored did not decode (a damaged
	// disk); a durable queue drops it when it comes to it.
	DropCorrupt DropReason = "corrupt"
)

// QueueStats is a queue's state for metrics and /v1/status.
type QueueStats struct {
	// Messages and Bytes (Message.Size) held, acknowledged ones not.
	Messages int
	Bytes    int64
	// Oldest is the Received time of the oldest message held (zero when
	// empty).
	Oldest time.Time
	// Dropped counts the messages dropped since the queue was opened, by
	// reason.
	Dropped map[DropReason]uint64
}

// Queue is the data path's store-and-forward queue: messages in, in
// order; read in that order by one reader; removed when acknowledged,
// when they expire, or to make room. The durable queue (bbolt) and the
// memory queue implement it with the same semantics, checked by
// queue/queuetest; the durable one also keeps everything across a crash.
//
//   - Put appends msgs in order, all or nothing, each with a new ID
//     higher than every ID the queue has handed out (also across a
//     restart of a durable queue); an ID is never 0. When its error is
//     nil they are in the queue, and for a durable queue on disk: a
//     crash after that loses none. Room is made by dropping the oldest
//     messages (DropFull), never by waiting for the reader; a message
//     larger than the whole queue fails the call with ErrTooLarge. Puts
//     from many goroutines may share one commit. ctx bounds the wait for
//     it (its error is returned; the messages may still be committed).
//   - Put's ids, with a nil error, are one per message in the order of
//     msgs (len(ids) == len(msgs)): the ID Read returns for it, until it
//     is acknowledged, expires or is dropped (a later Put that drops it,
//     also one sharing the commit, leaves its ID as returned). A message
//     the call itself dropped to make room (a batch larger than the
//     queue, below; they are the first of msgs) was never there to read:
//     its slot holds 0. The other IDs increase along msgs. With an error
//     ids is nil, also when ctx ended and the messages were committed
//     all the same.
//   - Read returns up to n messages with IDs above after, oldest first,
//     waiting until there is one or ctx ends (ctx's error). A message
//     older than the queue's max age at the time of reading is dropped
//     (DropExpired), not returned. after = 0 reads from the oldest.
//   - Ack removes the messages with these IDs (forwarded). IDs not in
//     the queue (acknowledged or dropped already) are ignored. A message
//     acknowledged is never read again, also after a restart.
//   - Edges, pinned by the suite: a batch larger than the whole queue
//     keeps its newest messages (the others count as DropFull and get 0
//     for an ID); a Put whose ctx ended before the call puts nothing; a
//     message's age is now − Received, and one exactly max age old is
//     kept; a Read whose ctx has ended still returns what is there (only
//     the wait ends), and n < 1 is an error.
//   - Stats reports what the queue holds and what it dropped; Oldest is
//     the Received of the message with the lowest ID.
//   - Close releases the queue; Put, Read and Ack then fail with
//     ErrQueueClosed, and a Read waiting returns it.
type Queue interface {
	Put(ctx context.Context, msgs []Message) (ids []uint64, err error)
	Read(ctx context.Context, after uint64, n int) ([]QueuedMessage, error)
	Ack(ids []uint64) error
	Stats() QueueStats
	Close() error
}

// DataSink takes device messages from the front ends (the bridge
// implements it).
//
// Publish takes one device's messages in order. It returns nil once
// every QoS 1 message among them is durable (the front end then
// acknowledges them to the device: PUBACK, CoAP 2.04 to a CON), or an
// error (the front end refuses them: MQTT 5 PUBACK 0x97/0x80, a CoAP
// 5.03; a 3.1.1 client gets no PUBACK and sends again): ErrInvalidMessage
// or ErrTooLarge for a message it will never take, ctx's error, or
// another for a queue that failed (its disk). QoS 0 messages never wait
// for a disk. It never waits for the upstream broker; a full queue drops
// its oldest messages instead.
type DataSink interface {
	Publish(ctx context.Context, msgs []Message) error
}

// Command is a command pending for a device: a Message with topic
// "cmd" or "cmd/<rest>", an ID (unique per gateway, increasing) and when
// it expires.
type Command struct {
	ID uint64
	Message
	Expires time.Time
}

// Commands holds the commands pending for devices (the bridge
// implements it over a durable Queue). A command stays pending until a
// front end acknowledges it (the device confirmed it; for MQTT, the
// local broker took it for the device's session) or it expires:
// delivery to the gateway is at least once, and to a CoAP device or an
// adapter too.
//
//   - Submit makes m (Topic "cmd" or "cmd/<rest>") a pending command of
//     m.Device and returns it once durable. A device's pending commands
//     are bounded (bridge.commands.max_pending_per_device): the oldest
//     is dropped to make room. Errors as DataSink.Publish's.
//   - Pending returns up to n of device's commands not acknowledged and
//     not expired at now, oldest first.
//   - Ack removes command id of device; an unknown id (expired,
//     acknowledged already, another device's) is ignored.
//   - Wait returns a channel closed when a command is submitted for
//     device after the call (a front end with an open connection to the
//     device delivers it then).
type Commands interface {
	Submit(ctx context.Context, m Message) (Command, error)
	Pending(device DeviceID, now time.Time, n int) []Command
	Ack(device DeviceID, id uint64) error
	Wait(device DeviceID) <-chan struct{}
}
