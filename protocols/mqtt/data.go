package mqtt

import (
	"context"
	"errors"
	"time"

	mochi "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/packets"

	"github.com/fleetgate/fleetgate/gateway"
)

// The data path up (docs/design.md §6.8). With Options.Sink, a device's
// PUBLISH under its root becomes a gateway.Message (Source "mqtt", the
// topic below the root, the MQTT 5 content type and user properties) and
// is handed to DataSink.Publish in the hook, on the connection's read
// goroutine, before mochi acknowledges or routes it:
//
//   - QoS 1 is acknowledged (PUBACK) only once Publish returned nil: the
//     message is durable. QoS 2 is taken as QoS 1: the message goes up
//     with QoS 1 and PUBREC is sent only once it is durable (the
//     PUBREL/PUBCOMP exchange then follows as usual); a client that
//     sends it again after a lost PUBREC may have it go up twice (at
//     least once, as QoS 1).
//   - QoS 0 goes up best effort; the DataSink never makes it wait for a
//     disk.
//   - While Publish runs the client's next packets wait unread (its own
//     order is kept, and receive maximum 64 bounds what it has in
//     flight); other clients are served by their own goroutines. Publish
//     is bounded by sinkTimeout.
//   - The broker routes the message to local subscribers as before, after
//     Publish returned nil.
//
// A refused message (refuseMessage) is neither acknowledged nor routed:
//
//	the DataSink's error          MQTT 5 QoS 1 (QoS 2: PUBREC)  3.1.1 QoS 1/2
//	gateway.ErrInvalidMessage     0x90 topic name invalid       disconnected
//	gateway.ErrTooLarge           0x97 quota exceeded           disconnected
//	anything else (a disk, a      0x80 unspecified error        no PUBACK: the client
//	closed queue, sinkTimeout)                                  sends it again after
//	                                                            it reconnects
//
// The first two are for good (the client must not send the message
// again); a 3.1.1 client cannot be told, so it is disconnected, as the
// broker does for a PUBLISH its ACL refuses. The topics the data path
// refuses are those with an empty level or over 1024 bytes below the root
// (gateway.ValidTopicRest). A QoS 0 message the DataSink refuses is still
// routed to local subscribers, and counted.

// sinkTimeout bounds a DataSink.Publish or Commands.Submit call; beyond
// it the message is refused as for a failed queue.
const sinkTimeout = 10 * time.Second

// errInvalidForGood ends a 3.1.1 client whose PUBLISH the data path
// refuses for good (it cannot be told and would send it again).
var errInvalidForGood = errors.New("message refused for good by the data path")

// message is the gateway.Message of PUBLISH pk: device's, topic rest
// below its root, read at now, from source. The payload is the packet's
// own buffer, which mochi allocates per packet and never reuses.
func message(device gateway.DeviceID, rest string, pk packets.Packet, source string, now time.Time) gateway.Message {
	m := gateway.Message{
		Device:      device,
		Topic:       rest,
		Payload:     pk.Payload,
		ContentType: pk.Properties.ContentType,
		QoS:         min(pk.FixedHeader.Qos, 1),
		Received:    now,
		Source:      source,
	}
	if n := len(pk.Properties.User); n > 0 {
		m.Properties = make([]gateway.Property, n)
		for i, p := range pk.Properties.User {
			m.Properties[i] = gateway.Property{Key: p.Key, Value: p.Val}
		}
	}
	return m
}

// publishUp hands device c's PUBLISH pk to the DataSink and returns what
// OnPublish returns: nil to let mochi acknowledge and route it, else the
// refusal (refuseMessage).
func (s *Server) publishUp(cl *mochi.Client, c *conn, pk packets.Packet) error {
	var err error
	rest, ok := restBelow(pk.TopicName, c.root)
	m := message(c.device, rest, pk, "mqtt", s.clock.Now())
	if !ok {
		err = gateway.ErrInvalidMessage // "<root>/": an empty level
	} else {
		ctx, cancel := context.WithTimeout(s.ctx, sinkTimeout)
		err = s.sink.Publish(ctx, []gateway.Message{m})
		cancel()
	}
	if err == nil {
		s.metrics.up(m.QoS, len(m.Payload))
		return nil
	}
	if pk.FixedHeader.Qos == 0 {
		s.metrics.messageRefused(refusalReason(err))
		s.log.Debug("message not taken by the data path", "device", string(c.device), "topic", pk.TopicName, "err", err)
		return nil
	}
	return s.refuseMessage(cl, pk, err)
}

// publishLocal handles local client c's PUBLISH pk: a command when it is
// to a device's command subtree and there are Commands, else the broker
// routes it as it is.
func (s *Server) publishLocal(cl *mochi.Client, c *conn, pk packets.Packet) (packets.Packet, error) {
	if !s.commandTopic(pk.TopicName) {
		return pk, nil
	}
	device, rest, _ := splitTopic(s.prefix, pk.TopicName)
	ctx, cancel := context.WithTimeout(s.ctx, sinkTimeout)
	cmd, err := s.cmds.Submit(ctx, message(device, rest, pk, c.local.name, s.clock.Now()))
	cancel()
	if err != nil {
		if pk.FixedHeader.Qos == 0 {
			s.metrics.messageRefused(refusalReason(err))
			s.log.Debug("command refused", "client", c.local.name, "device", string(device), "err", err)
			return pk, packets.ErrRejectPacket
		}
		return pk, s.refuseMessage(cl, pk, err)
	}
	s.metrics.commandsSubmitted.Inc()
	s.log.Debug("command submitted", "client", c.local.name, "device", string(device), "id", cmd.ID)
	// Acknowledged as usual, routed by the command delivery only.
	pk.Ignore, pk.FixedHeader.Retain = true, false
	return pk, nil
}

// refusal is the MQTT 5 reason code of a data path error, and whether
// the refusal is for good.
func refusal(err error) (code packets.Code, forGood bool) {
	switch {
	case errors.Is(err, gateway.ErrInvalidMessage):
		return packets.ErrTopicNameInvalid, true
	case errors.Is(err, gateway.ErrTooLarge):
		return packets.ErrQuotaExceeded, true
	}
	return packets.ErrUnspecifiedError, false
}

// refusalReason is the label of a data path error in
// fleetgate_mqtt_messages_refused_total.
func refusalReason(err error) string {
	switch {
	case errors.Is(err, gateway.ErrInvalidMessage):
		return reasonInvalid
	case errors.Is(err, gateway.ErrTooLarge):
		return reasonTooLarge
	}
	return reasonFailed
}

// refuseMessage answers a QoS 1 or 2 PUBLISH whose message the DataSink
// or Commands refused with err (the table at the top of this file) and
// returns the error that tells mochi to go no further with it.
func (s *Server) refuseMessage(cl *mochi.Client, pk packets.Packet, err error) error {
	code, forGood := refusal(err)
	s.metrics.messageRefused(refusalReason(err))
	s.log.Debug("message refused by the data path", "client", cl.ID, "topic", pk.TopicName, "qos", pk.FixedHeader.Qos, "err", err)
	switch {
	case cl.Properties.ProtocolVersion < 5:
		if forGood {
			cl.Stop(errInvalidForGood)
		}
	case pk.FixedHeader.Qos == 1:
		return code // mochi sends the PUBACK
	default:
		_ = cl.WritePacket(packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Pubrec}, PacketID: pk.PacketID, ReasonCode: code.Code})
	}
	return packets.ErrRejectPacket
}
