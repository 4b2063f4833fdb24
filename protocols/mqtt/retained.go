package mqtt

import (
	"errors"
	"strings"
	"sync"

	mochi "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/packets"

	"github.com/fleetgate/fleetgate/gateway"
)

// Retained messages. The broker keeps a retained message until it is
// replaced, deleted (an empty retained payload) or older than its expiry
// (at most mochi's MaximumMessageExpiryInterval, 24 h), so without a
// bound one device could fill the gateway's memory with them. Each
// device may hold at most RetainedPerDevice messages of at most
// RetainedBytesPerDevice bytes together, and all devices together at
// most RetainedBytes; anonymous devices together at most a quarter of
// it, so that strangers cannot take what listed devices may retain. A
// message counts its topic, its payload and retainedOverhead. A retained
// PUBLISH beyond a bound is refused whole (neither retained nor
// delivered): MQTT 5 QoS 1 gets PUBACK "quota exceeded" (0x97), QoS 2
// PUBREC 0x97, QoS 0 DISCONNECT 0x97; a 3.1.1 client, which has no way
// to be told, is disconnected. A retained will beyond a bound is sent
// without being retained. A device forgotten (DropRetained: removed from
// the devices file, or anonymous and then listed) loses its retained
// messages.

// retainedOverhead is what one retained message costs the broker beyond
// its topic and payload (the stored packet is 800 bytes, plus its place
// in the topic tree).
const retainedOverhead = 1024

// anonymousShare is the part of RetainedBytes anonymous devices may use
// together: 1/anonymousShare.
const anonymousShare = 4

// errRetainedQuota ends a 3.1.1 client whose retained PUBLISH went beyond
// a bound.
var errRetainedQuota = errors.New("retained messages beyond the device's quota")

// retainedQuota accounts the retained messages of every device.
type retainedQuota struct {
	perDevice, perDeviceBytes, total int

	mu        sync.Mutex
	devices   map[gateway.DeviceID]*retainedUse
	bytes     int // all devices
	anonBytes int // anonymous devices
}

// retainedUse is one device's retained messages: topic → size.
type retainedUse struct {
	anon   bool
	bytes  int
	topics map[string]int
}

func newRetainedQuota(perDevice, perDeviceBytes, total int) *retainedQuota {
	return &retainedQuota{perDevice: perDevice, perDeviceBytes: perDeviceBytes, total: total, devices: make(map[gateway.DeviceID]*retainedUse)}
}

// retain accounts a retained message of size payload bytes that device
// (anon: admitted without a password) sends to topic, replacing the one
// there; an empty payload deletes it. It reports false, and changes
// nothing, when the message would go beyond a bound; else it returns
// undo, which puts back what topic held (the message was refused after
// all).
func (q *retainedQuota) retain(device gateway.DeviceID, anon bool, topic string, payload int) (undo func(), ok bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	u := q.devices[device]
	old, count, used := 0, 0, 0
	if u != nil {
		old, count, used = u.topics[topic], len(u.topics), u.bytes
	}
	size := 0
	if payload > 0 {
		size = len(topic) + payload + retainedOverhead
		grow := size - old
		if (old == 0 && count >= q.perDevice) || used+grow > q.perDeviceBytes || q.bytes+grow > q.total ||
			(anon && q.anonBytes+grow > q.total/anonymousShare) {
			return nil, false
		}
	}
	q.put(device, anon, topic, size)
	return func() {
		q.mu.Lock()
		defer q.mu.Unlock()
		q.put(device, anon, topic, old)
	}, true
}

// put makes device's message at topic count size bytes (0: none); the
// caller holds q.mu.
func (q *retainedQuota) put(device gateway.DeviceID, anon bool, topic string, size int) {
	u := q.devices[device]
	if u == nil {
		if size == 0 {
			return
		}
		u = &retainedUse{anon: anon, topics: make(map[string]int)}
		q.devices[device] = u
	}
	q.move(u, size-u.topics[topic])
	if size > 0 {
		u.topics[topic] = size
		return
	}
	delete(u.topics, topic)
	if len(u.topics) == 0 {
		delete(q.devices, device)
	}
}

// move adds n bytes (negative: takes) to u and to the totals.
func (q *retainedQuota) move(u *retainedUse, n int) {
	u.bytes += n
	q.bytes += n
	if u.anon {
		q.anonBytes += n
	}
}

// expired forgets the message of topic, which the broker dropped, held
// by device.
func (q *retainedQuota) expired(device gateway.DeviceID, topic string) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if u := q.devices[device]; u != nil {
		q.put(device, u.anon, topic, 0)
	}
}

// forget drops device's account and returns the topics it held.
func (q *retainedQuota) forget(device gateway.DeviceID) []string {
	q.mu.Lock()
	defer q.mu.Unlock()
	u := q.devices[device]
	if u == nil {
		return nil
	}
	topics := make([]string, 0, len(u.topics))
	for topic := range u.topics {
		topics = append(topics, topic)
	}
	q.move(u, -u.bytes)
	delete(q.devices, device)
	return topics
}

// changed returns the devices whose retained messages were sent as
// anonymous while anon(device) now says otherwise, or the reverse.
func (q *retainedQuota) changed(anon func(gateway.DeviceID) bool) []gateway.DeviceID {
	q.mu.Lock()
	defer q.mu.Unlock()
	var out []gateway.DeviceID
	for d, u := range q.devices {
		if u.anon != anon(d) {
			out = append(out, d)
		}
	}
	return out
}

// usage is the bytes accounted to all devices.
func (q *retainedQuota) usage() int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.bytes
}

// DropRetained deletes every retained message of device from the broker
// and returns how many there were. SetCredentials calls it for a device
// removed from the devices file, and for one whose retained messages
// were sent anonymously before it became listed; a command that forgets
// a device (deletes its record) calls it too.
func (s *Server) DropRetained(device gateway.DeviceID) int {
	topics := s.retained.forget(device)
	for _, topic := range topics {
		s.broker.Topics.RetainMessage(packets.Packet{TopicName: topic})
	}
	return len(topics)
}

// dropChanged drops the retained messages of the devices box no longer
// covers as they were sent: listed ones now gone, anonymous ones now
// listed.
func (s *Server) dropChanged(box *credentials) {
	for _, d := range s.retained.changed(func(d gateway.DeviceID) bool { return box.revision(d) == "" }) {
		n := s.DropRetained(d)
		s.log.Info("retained messages dropped: the device's credentials went away or came", "device", string(d), "messages", n)
	}
}

// deviceOf is the device whose subtree topic is in, "" for none.
func (s *Server) deviceOf(topic string) gateway.DeviceID {
	if s.prefix != "" {
		rest, ok := strings.CutPrefix(topic, s.prefix+"/")
		if !ok {
			return ""
		}
		topic = rest
	}
	device, _, _ := strings.Cut(topic, "/")
	return gateway.DeviceID(device)
}

// refuseRetained answers a retained PUBLISH beyond the quota (see the
// top of this file) and returns the error that tells mochi to go no
// further with it.
func (s *Server) refuseRetained(cl *mochi.Client, pk packets.Packet) error {
	s.metrics.retainedRefused.Inc()
	s.log.Debug("retained message refused: quota", "device", cl.ID, "topic", pk.TopicName, "bytes", len(pk.Payload))
	switch {
	case cl.Properties.ProtocolVersion < 5:
		cl.Stop(errRetainedQuota)
	case pk.FixedHeader.Qos == 1:
		return packets.ErrQuotaExceeded // mochi sends the PUBACK
	case pk.FixedHeader.Qos == 2:
		_ = cl.WritePacket(packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Pubrec}, PacketID: pk.PacketID, ReasonCode: packets.ErrQuotaExceeded.Code})
	default:
		_ = s.broker.DisconnectClient(cl, packets.ErrQuotaExceeded)
	}
	return packets.ErrRejectPacket
}
