package mqtt

import (
	"bytes"
	"errors"
	"strings"
	"time"

	mochi "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/packets"

	"github.com/fleetgate/fleetgate/gateway"
	"github.com/fleetgate/fleetgate/internal/ratelimit"
)

// presence is the one mochi hook of the front end. It admits or refuses
// CONNECT (device ID, credentials, limits), clamps the keep-alive, keeps
// devices inside their topic subtree, and turns the connection's life
// into evidence (docs/design.md §6.8):
//
//   - an admitted CONNECT is a Connect of a new session
//     (gateway.ConnectionSessionID, one per connection), or of the
//     client's persistent presence session when it asks the broker to
//     keep its session (a sleepy device, sleepy.go);
//   - every later packet read is a Renew;
//   - a DISCONNECT with a reason code below 0x80 (normal, or "with will
//     message") is a Leave once the connection has ended, unless the
//     client keeps a persistent session (then it is a Renew: a sleepy
//     device going to sleep, which its lease covers);
//   - a dropped connection, a keep-alive timeout, a DISCONNECT carrying an
//     error code, a server shutdown and a session taken over by a new
//     connection of the same client are nothing: the old session stops
//     renewing and its lease decides.
//
// It also carries the data path: a device's PUBLISH to the DataSink
// (data.go), commands to connected devices (commands.go), and the local
// clients' admission and access (local.go).
type presence struct {
	mochi.HookBase
	srv *Server
}

var _ mochi.Hook = (*presence)(nil)

func (h *presence) ID() string { return "fleetgate-presence" }

var provided = []byte{
	mochi.OnConnectAuthenticate,
	mochi.OnACLCheck,
	mochi.OnConnect,
	mochi.OnDisconnect,
	mochi.OnPacketRead,
	mochi.OnPublishDropped,
	mochi.OnPublish,
	mochi.OnWill,
	mochi.OnRetainedExpired,
	mochi.OnSessionEstablished,
	mochi.OnSubscribed,
	mochi.OnQosPublish,
	mochi.OnQosComplete,
	mochi.OnQosDropped,
	mochi.OnClientExpired,
}

func (h *presence) Provides(b byte) bool { return bytes.IndexByte(provided, b) >= 0 }

// errRefused ends a connection whose CONNECT the hook answered with a
// refusal CONNACK itself.
var errRefused = errors.New("connect refused")

// errTooSlow ends a client whose pending writes overflowed.
var errTooSlow = errors.New("client too slow: pending writes exceeded")

// OnConnect decides on a CONNECT. Mochi calls it before authentication
// and sends no CONNACK when it fails, so every refusal writes its own
// CONNACK with the code of the client's protocol version.
func (h *presence) OnConnect(cl *mochi.Client, pk packets.Packet) error {
	s := h.srv
	c, ok := cl.Net.Conn.(*conn)
	if !ok {
		return refuse(cl, packets.ErrUnspecifiedError, packets.Err3ServerUnavailable)
	}
	s.pend.done(c) // CONNECT arrived
	if lc, set := s.localClientOf(pk); lc != nil {
		return s.connectLocal(cl, c, pk, lc, set)
	}
	remote := c.RemoteAddr().String()
	claimed := claimedID(pk)
	device, err := gateway.ParseDeviceID(claimed)
	if err != nil {
		s.refused(reasonInvalidClientID, "", claimed, remote, "the user name (without one, the client ID) is not a device ID: "+err.Error())
		return refuse(cl, packets.ErrClientIdentifierNotValid, packets.Err3ClientIdentifierNotValid)
	}
	if ok, _ := s.devRate.Allow(device, s.clock.Now()); !ok {
		s.refused(reasonRate, "", string(device), remote, "CONNECTs beyond limits.mqtt_connects_per_second")
		return refuse(cl, packets.ErrConnectionRateExceeded, packets.Err3ServerUnavailable)
	}
	if !s.reserve() {
		s.refused(reasonMaxClients, "", string(device), remote, "limits.mqtt_max_clients reached")
		return refuse(cl, packets.ErrServerBusy, packets.Err3ServerUnavailable)
	}
	c.admitted = true // the slot is released when the connection ends
	root := s.topicRoot(device)
	rev, box, err := s.authorize(device, c.ip, pk)
	if err == nil && pk.Connect.WillFlag && !s.willAllowed(pk.Connect.WillTopic, root) {
		err = deniedWill
	}
	if err == nil && !s.admit(c, cl, device, rev, box) {
		err = deniedRevokedRace
	}
	if errors.Is(err, gateway.ErrOverloaded) {
		s.refused(reasonOverloaded, "", string(device), remote, "no password check slot: "+err.Error())
		return refuse(cl, packets.ErrServerBusy, packets.Err3ServerUnavailable)
	}
	if err != nil {
		d := deniedOf(err)
		s.refused(reasonNotAuthorized, d.reason, string(device), remote, d.detail)
		return refuse(cl, packets.ErrNotAuthorized, packets.Err3NotAuthorized)
	}

	c.keepAlive, c.lease = pk.Connect.Keepalive, time.Duration(s.lease.Load())
	if ka := uint16(s.keepAlive.Load()); pk.Connect.Keepalive == 0 || pk.Connect.Keepalive > ka {
		cl.State.Keepalive = ka
		cl.State.ServerKeepalive = true // sent as Server Keep Alive to MQTT 5 clients
		c.keepAlive = ka
	}

	persistent := persistentSession(cl, pk)
	session := s.sessionFor(persistent)
	anon := rev == ""
	if anon {
		if ok, _ := s.anonRate.Allow(ratelimit.Prefix(c.ip), s.clock.Now()); !ok {
			s.refused(reasonAnonymousRate, "", string(device), remote, "anonymous CONNECTs from its network beyond limits.anonymous_connects_per_second")
			return refuse(cl, packets.ErrConnectionRateExceeded, packets.Err3ServerUnavailable)
		}
	}
	c.device, c.anon = device, anon // leaseOf's
	err = s.observe(device, session, gateway.Connect, s.leaseOf(c), anon)
	switch {
	case err == nil:
	case errors.Is(err, gateway.ErrInvalidDeviceID):
		s.refused(reasonInvalidClientID, "", string(device), remote, err.Error())
		return refuse(cl, packets.ErrClientIdentifierNotValid, packets.Err3ClientIdentifierNotValid)
	case errors.Is(err, gateway.ErrAnonymousLimit):
		s.refused(reasonAnonymousLimit, "", string(device), remote, "limits.anonymous_max_devices reached")
		return refuse(cl, packets.ErrQuotaExceeded, packets.Err3ServerUnavailable)
	case errors.Is(err, gateway.ErrSessionLimit):
		s.refused(reasonSessionLimit, "", string(device), remote, "limits.max_sessions_per_device reached")
		return refuse(cl, packets.ErrQuotaExceeded, packets.Err3ServerUnavailable)
	case errors.Is(err, gateway.ErrOverloaded):
		s.refused(reasonOverloaded, "", string(device), remote, err.Error())
		return refuse(cl, packets.ErrServerBusy, packets.Err3ServerUnavailable)
	default:
		s.refused(reasonError, "", string(device), remote, err.Error())
		s.log.Warn("connect refused: observe", "device", string(device), "session", string(session), "err", err)
		return refuse(cl, packets.ErrUnspecifiedError, packets.Err3ServerUnavailable)
	}
	c.device, c.session, c.root, c.anon = device, session, root, anon
	nameClient(cl, pk, device)
	c.persistent.Store(persistent)
	if !persistent {
		s.endPersistent(device)
	}
	return nil
}

// claimedID is the device ID a device's CONNECT claims: its user name
// when it sends one, else its client ID. Clients fill the client ID in
// many ways (mosquitto_pub -u ID without -i sends a generated "mosq-…",
// MQTT 5 clients and paho an empty one, mqtt.js "mqttjs_…"), so with a
// user name the client ID is not looked at.
func claimedID(pk packets.Packet) string {
	if pk.Connect.UsernameFlag && len(pk.Connect.Username) > 0 {
		return string(pk.Connect.Username)
	}
	return pk.Connect.ClientIdentifier
}

// nameClient makes an admitted device's client ID its device ID: the
// broker keys sessions by it, so a device holds one connection at a time
// (a new one takes the old one over) and a persistent session is found
// again whatever client ID the client sent. An MQTT 5 client that sent
// none is told its ID (Assigned Client Identifier); one that sent
// another ID keeps using it, which MQTT never reads again.
func nameClient(cl *mochi.Client, pk packets.Packet, device gateway.DeviceID) {
	cl.ID = string(device)
	cl.Properties.Props.AssignedClientID = ""
	if pk.Connect.ClientIdentifier == "" {
		cl.Properties.Props.AssignedClientID = cl.ID
	}
}

// refuse answers CONNECT with v5 (MQTT 5) or v3 (3.1.1 and older) and
// returns the error that makes mochi close the connection.
func refuse(cl *mochi.Client, v5, v3 packets.Code) error {
	ack := packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Connack}}
	if cl.Properties.ProtocolVersion == 5 {
		ack.ReasonCode = v5.Code
		ack.Properties.ReasonString = v5.Reason
	} else {
		ack.ReasonCode = v3.Code
	}
	if err := cl.WritePacket(ack); err != nil {
		return errors.Join(errRefused, err)
	}
	return errRefused
}

// OnConnectAuthenticate admits every client that OnConnect let through;
// mochi refuses a CONNECT when no hook answers true.
func (h *presence) OnConnectAuthenticate(*mochi.Client, packets.Packet) bool { return true }

// OnACLCheck lets a device publish and subscribe under its own subtree
// only: "<prefix>/<device>" and "<prefix>/<device>/...", and, with
// Commands, not publish to its command subtree "<root>/cmd[/...]" (where
// its commands arrive). A local client may do what its lists allow
// (local.go). A refusal is counted; mochi answers it (SUBACK 0x87, 3.1.1
// 0x80; PUBACK 0x87; a QoS 0 PUBLISH is dropped; a 3.1.1 QoS 1/2 PUBLISH
// ends the connection). A message routed to a client is checked as a
// SUBSCRIBE, and is always allowed where its subscription was.
func (h *presence) OnACLCheck(cl *mochi.Client, topic string, write bool) bool {
	c, ok := cl.Net.Conn.(*conn)
	if !ok {
		return false
	}
	var allowed bool
	switch {
	case c.local != nil:
		allowed = c.local.allows(topic, write)
	case c.session != "":
		allowed = underRoot(topic, c.root)
		if rest, ok := restBelow(topic, c.root); ok && write && h.srv.cmds != nil && isCommand(rest) {
			h.srv.metrics.messageRefused(reasonCommandTopic)
			h.srv.aclRefused(cl, c, "PUBLISH to its own command subtree")
			return false
		}
	}
	if !allowed {
		if write {
			h.srv.metrics.messageRefused(reasonPublishDenied)
			h.srv.aclRefused(cl, c, "PUBLISH outside its topic subtree")
		} else {
			h.srv.metrics.messageRefused(reasonSubscribeDenied)
			h.srv.aclRefused(cl, c, "SUBSCRIBE outside its topic subtree")
		}
	}
	return allowed
}

// underRoot reports whether topic (or filter) is root or below it.
func underRoot(topic, root string) bool {
	rest, ok := strings.CutPrefix(topic, root)
	return ok && (rest == "" || rest[0] == '/')
}

// OnPacketRead turns every packet after CONNECT into evidence.
func (h *presence) OnPacketRead(cl *mochi.Client, pk packets.Packet) (packets.Packet, error) {
	c, ok := cl.Net.Conn.(*conn)
	if !ok || c.session == "" {
		return pk, nil // CONNECT itself: OnConnect has not run yet
	}
	if pk.FixedHeader.Type == packets.Disconnect && pk.ReasonCode < packets.ErrUnspecifiedError.Code &&
		(!c.persistent.Load() || endsSession(pk)) {
		c.leaving = true // the Leave is sent once the connection has ended
		return pk, nil
	}
	if err := h.srv.observe(c.device, c.session, gateway.Renew, h.srv.leaseOf(c), c.anon); err != nil {
		h.srv.log.Debug("renew refused", "device", string(c.device), "session", string(c.session), "err", err)
	}
	return pk, nil
}

// OnDisconnect sends the Leave of a connection that ended with a normal
// DISCONNECT; any other end leaves the session to its lease.
func (h *presence) OnDisconnect(cl *mochi.Client, _ error, _ bool) {
	c, ok := cl.Net.Conn.(*conn)
	if !ok {
		return
	}
	h.srv.stopDelivery(c)
	if !c.leaving || c.session == "" {
		return
	}
	if err := h.srv.observe(c.device, c.session, gateway.Leave, h.srv.leaseOf(c), c.anon); err != nil {
		h.srv.log.Debug("leave refused", "device", string(c.device), "session", string(c.session), "err", err)
	}
}

// OnPublishDropped ends a client whose pending writes overflowed
// (limits.mqtt_max_pending_writes): it is not reading fast enough. A
// command dropped so was not taken (commands.go).
func (h *presence) OnPublishDropped(cl *mochi.Client, pk packets.Packet) {
	if d := deliveryOf(cl); d != nil && pk.Origin == commandsClientID {
		d.dropped.Store(true)
	}
	if !cl.Closed() {
		device := ""
		if c, ok := cl.Net.Conn.(*conn); ok && c.local == nil {
			device = string(c.device)
		}
		if device != "" {
			h.srv.refused(reasonTooSlow, "", device, cl.Net.Remote, "its pending writes overflowed limits.mqtt_max_pending_writes")
		} else {
			h.srv.metrics.refuse(reasonTooSlow)
		}
		cl.Stop(errTooSlow)
	}
}

// OnPublish holds a device's retained messages to its quota
// (retained.go) and hands its message to the DataSink; a local client's
// PUBLISH may be a command (data.go). The ACL check has passed. Commands
// themselves (published by the front end's inline client) pass.
func (h *presence) OnPublish(cl *mochi.Client, pk packets.Packet) (packets.Packet, error) {
	s := h.srv
	c, ok := cl.Net.Conn.(*conn)
	switch {
	case !ok:
		return pk, nil
	case c.local != nil:
		return s.publishLocal(cl, c, pk)
	case c.session == "":
		return pk, nil
	}
	var undo func()
	if pk.FixedHeader.Retain {
		if undo, ok = s.retained.retain(c.device, c.anon, pk.TopicName, len(pk.Payload)); !ok {
			return pk, s.refuseRetained(cl, pk)
		}
	}
	if s.sink != nil {
		if err := s.publishUp(cl, c, pk); err != nil {
			if undo != nil {
				undo()
			}
			return pk, err
		}
	}
	return pk, nil
}

// OnWill sends a retained will beyond the device's quota without
// retaining it.
func (h *presence) OnWill(cl *mochi.Client, will mochi.Will) (mochi.Will, error) {
	c, ok := cl.Net.Conn.(*conn)
	if !will.Retain || !ok || c.session == "" {
		return will, nil
	}
	if _, kept := h.srv.retained.retain(c.device, c.anon, will.TopicName, len(will.Payload)); !kept {
		h.srv.metrics.retainedRefused.Inc()
		will.Retain = false
	}
	return will, nil
}

// OnRetainedExpired uncounts a retained message the broker dropped at
// its expiry.
func (h *presence) OnRetainedExpired(topic string) {
	h.srv.retained.expired(h.srv.deviceOf(topic), topic)
}

// OnSessionEstablished starts the command delivery to a device whose
// session is established (after CONNACK and the resend of a persistent
// session's messages).
func (h *presence) OnSessionEstablished(cl *mochi.Client, _ packets.Packet) {
	if c, ok := cl.Net.Conn.(*conn); ok && c.session != "" && h.srv.cmds != nil {
		h.srv.startDelivery(cl, c)
	}
}

// OnSubscribed delivers the commands a new subscription may take. The
// PUBLISHes may precede the SUBACK, which MQTT allows.
func (h *presence) OnSubscribed(cl *mochi.Client, _ packets.Packet, _ []byte) {
	if d := deliveryOf(cl); d != nil {
		d.trigger()
	}
}

// OnQosPublish notes that the broker placed a command in the session of
// the device being delivered to, where it waits for the device's PUBACK
// (commands.go).
func (h *presence) OnQosPublish(cl *mochi.Client, pk packets.Packet, _ int64, _ int) {
	if pk.Origin != commandsClientID {
		return
	}
	d := deliveryOf(cl)
	if d == nil {
		return
	}
	if id := d.offering.Load(); id != 0 {
		h.srv.inflight.add(cl.ID, pk.PacketID, inflightCmd{device: d.device, id: id, owner: d})
		d.takenID.Store(uint32(pk.PacketID))
		d.taken.Store(true)
	}
}

// OnQosComplete acknowledges to Commands a command the device
// acknowledged, and delivers more once a PUBACK made room for them.
func (h *presence) OnQosComplete(cl *mochi.Client, pk packets.Packet) {
	if c, ok := h.srv.inflight.take(cl.ID, pk.PacketID); ok {
		h.srv.ackCommand(c.device, c.id)
	}
	if d := deliveryOf(cl); d != nil && d.starved.Load() {
		d.trigger()
	}
}

// OnQosDropped makes a command the broker dropped from a session (its
// message expiry passed) pending again.
func (h *presence) OnQosDropped(cl *mochi.Client, pk packets.Packet) {
	if _, ok := h.srv.inflight.take(cl.ID, pk.PacketID); !ok {
		return
	}
	if d := deliveryOf(cl); d != nil {
		d.trigger()
	}
}

// OnClientExpired forgets the commands of a session that expired: they
// are pending for the device's next session.
func (h *presence) OnClientExpired(cl *mochi.Client) {
	h.srv.inflight.dropClient(cl.ID)
}

// deliveryOf is the command delivery to client cl, nil for none.
func deliveryOf(cl *mochi.Client) *delivery {
	if c, ok := cl.Net.Conn.(*conn); ok {
		return c.delivery.Load()
	}
	return nil
}

// willAllowed reports whether a device with root may leave a will on
// topic: under its root, and, with Commands, not in its command subtree
// (the broker would publish it there as if it were a command).
func (s *Server) willAllowed(topic, root string) bool {
	if !underRoot(topic, root) {
		return false
	}
	rest, ok := restBelow(topic, root)
	return !ok || s.cmds == nil || !isCommand(rest)
}
