package mqtt

import (
	mochi "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/packets"

	"github.com/fleetgate/fleetgate/gateway"
)

// Sleepy devices. A client that asks the broker to keep its session (MQTT
// 5 Session Expiry Interval > 0, MQTT 3.1.1 clean session = 0) is a device
// that sleeps between connections: its normal DISCONNECT is not a leave
// (docs/design.md §6.8). Its presence lasts until its lease runs out (the lease, not
// the MQTT session expiry: presence is what the device proved recently,
// and the gateway's heartbeat contract already bounds how long that is
// trusted; the broker may keep subscriptions longer, up to
// maxSessionExpiry). To wake within the lease, such a device connects at
// least every heartbeat interval, as any other.
//
// Its presence session is named per gateway and client rather than per
// connection: "<gateway>/mqtt" (the client ID is the device). Every
// connection of the client, including after a restart of the gateway,
// renews that one session, so a later CONNECT continues the same presence
// (no new online event while the lease runs) and the store holds one
// session per sleepy device, not one per wake-up. Per-connection sessions
// ("<gateway>/<epoch>/<n>") stay for clients without a persistent session.
//
// The presence session ends (a Leave) when the client says its MQTT
// session ends: an MQTT 5 DISCONNECT that sets the Session Expiry Interval
// to 0, or a later CONNECT of the same client without a persistent
// session while the broker still holds the old one.

// persistentSession reports whether CONNECT pk asks for a session that
// outlives the connection.
func persistentSession(cl *mochi.Client, pk packets.Packet) bool {
	if cl.Properties.ProtocolVersion == 5 {
		return pk.Properties.SessionExpiryInterval > 0
	}
	return !pk.Connect.Clean
}

// endsSession reports whether an MQTT 5 DISCONNECT ends the client's
// persistent session (Session Expiry Interval set to 0).
func endsSession(pk packets.Packet) bool {
	return pk.Properties.SessionExpiryIntervalFlag && pk.Properties.SessionExpiryInterval == 0
}

// persistentSessionID names the presence session of a client with a
// persistent session on gateway gw.
func persistentSessionID(gw string) gateway.SessionID {
	return gateway.SessionID(gw + "/mqtt")
}

// sessionFor names the presence session of a new connection.
func (s *Server) sessionFor(persistent bool) gateway.SessionID {
	if persistent {
		return persistentSessionID(s.gatewayID)
	}
	return gateway.ConnectionSessionID(s.gatewayID, s.epoch, s.connSeq.Add(1))
}

// endPersistent sends the Leave of device's persistent presence session
// when the broker still holds a persistent session of the client (called
// for a CONNECT without one, which discards it).
func (s *Server) endPersistent(device gateway.DeviceID) {
	old, ok := s.broker.Clients.Get(string(device))
	if !ok {
		return
	}
	if oc, ok := old.Net.Conn.(*conn); !ok || !oc.persistent.Load() {
		return
	}
	sess := persistentSessionID(s.gatewayID)
	if err := s.observe(device, sess, gateway.Leave, 0, false); err != nil {
		s.log.Debug("leave refused", "device", string(device), "session", string(sess), "err", err)
	}
}
