package mqtt

import (
	"errors"
	"fmt"

	mochi "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/packets"

	"github.com/fleetgate/fleetgate/gateway"
)

// Local clients (auth.clients) are MQTT clients of the site that are not
// devices: a flow engine, a metrics collector, a dashboard. They have no
// presence and no topic root; what they may do is two lists of topic
// filters.
//
//   - Recognition. A CONNECT whose user name is a local client's name is
//     that local client, whatever its client ID; its password is checked
//     against the client's bcrypt hash (Options.ClientPasswords, the
//     devices file's checks), never a device's, and a local client needs
//     one. A device whose ID is also a local client's name connects
//     without a user name (a device's user name is optional).
//   - Client ID. Free, and never a device: the broker keeps a local
//     client's session under "<name>/<client ID>" (no device ID holds a
//     "/"), so a local client can neither take over a device's session
//     nor be taken over by one, and two local clients only share a
//     session when they share a name and a client ID.
//   - Access. SUBSCRIBE to a filter every topic of which one of Read
//     matches (a shared subscription's filter is taken without
//     "$share/<group>/"); PUBLISH to a topic one of Write matches; a will
//     as a PUBLISH, but, with Commands, never in a device's command
//     subtree (the broker would publish it there as if it were a
//     command: CONNACK "not authorized"). Anything else is refused as for a device outside its
//     subtree (SUBACK 0x87 / 3.1.1 0x80; PUBACK 0x87, QoS 0 dropped, a
//     3.1.1 QoS 1/2 PUBLISH ends the connection) and counted.
//   - Commands. With Options.Commands, a PUBLISH to
//     "<prefix>/<device>/cmd[/...]" is a command: Commands.Submit, with
//     the local client's name as its Source, and a QoS 1 PUBACK once it
//     is durable. The broker does not route the PUBLISH itself: the
//     command reaches the device (and every reader of the topic) when the
//     front end delivers it, as it does commands from elsewhere, and
//     CoAP and adapter devices get it through their front ends.
//   - Other PUBLISHes are routed by the broker only (they are not a
//     device's messages: nothing goes to the DataSink). Their retained
//     messages are not held to the devices' retained quotas.
//   - No keep-alive clamp (it serves presence, which a local client does
//     not have); max_clients and the connect rate (per name) hold.
//   - Reload. SetClients replaces the list and ends the connections of
//     the local clients whose entry changed (password hash, Read, Write)
//     or went away.

// LocalClient is one local client (auth.clients[]).
type LocalClient struct {
	// Name is the MQTT user name the client connects with; a device ID
	// ([A-Za-z0-9._:-], 1 to 128 bytes), unique among the clients.
	Name string
	// Read and Write are MQTT topic filters: what the client may
	// subscribe to ("devices/#") and publish to ("devices/+/cmd/#").
	Read, Write []string
}

// localClient is a LocalClient checked.
type localClient struct {
	name        string
	read, write []string
	// lists identifies Read and Write, for the revision.
	lists string
}

// localSet is the local clients in force and the check of their
// passwords.
type localSet struct {
	byName    map[string]*localClient
	passwords *credentials
}

// newLocalSet checks clients and passwords (required when there are
// clients).
func newLocalSet(clients []LocalClient, passwords gateway.Credentials) (*localSet, error) {
	set := &localSet{byName: make(map[string]*localClient, len(clients)), passwords: &credentials{passwords}}
	if len(clients) > 0 && passwords == nil {
		return nil, errors.New("local clients without a password check")
	}
	for i, c := range clients {
		if _, err := gateway.ParseDeviceID(c.Name); err != nil {
			return nil, fmt.Errorf("local client %d: name: %w", i, err)
		}
		if set.byName[c.Name] != nil {
			return nil, fmt.Errorf("local client %q is listed twice", c.Name)
		}
		for _, f := range append(append([]string(nil), c.Read...), c.Write...) {
			if !gateway.ValidTopicFilter(f) {
				return nil, fmt.Errorf("local client %q: %q is not a topic filter", c.Name, f)
			}
		}
		set.byName[c.Name] = &localClient{
			name:  c.Name,
			read:  append([]string(nil), c.Read...),
			write: append([]string(nil), c.Write...),
			lists: fmt.Sprintf("%q %q", c.Read, c.Write),
		}
	}
	return set, nil
}

// revision changes with name's password and lists; "" when name is not a
// local client.
func (l *localSet) revision(name string) string {
	lc := l.byName[name]
	if lc == nil {
		return ""
	}
	return l.passwords.revision(gateway.DeviceID(name)) + " " + lc.lists
}

// allows reports whether the local client may publish to topic (write)
// or subscribe to filter topic / be sent a message on it (read).
func (lc *localClient) allows(topic string, write bool) bool {
	filters := lc.write
	if !write {
		filters, topic = lc.read, unshared(topic)
	}
	for _, f := range filters {
		if covers(f, topic) {
			return true
		}
	}
	return false
}

// localClientOf is the local client CONNECT pk names with its user name,
// nil for a device, with the set it is from.
func (s *Server) localClientOf(pk packets.Packet) (*localClient, *localSet) {
	set := s.local.Load()
	if !pk.Connect.UsernameFlag || len(set.byName) == 0 {
		return nil, set
	}
	return set.byName[string(pk.Connect.Username)], set
}

// connectLocal decides on the CONNECT of local client lc from set (see
// the top of this file). Refusals are the devices' CONNACKs.
func (s *Server) connectLocal(cl *mochi.Client, c *conn, pk packets.Packet, lc *localClient, set *localSet) error {
	name := gateway.DeviceID(lc.name)
	if ok, _ := s.devRate.Allow(name, s.clock.Now()); !ok {
		s.metrics.refuse(reasonRate)
		s.log.Debug("connect refused: local client connect rate", "client", lc.name)
		return refuse(cl, packets.ErrConnectionRateExceeded, packets.Err3ServerUnavailable)
	}
	if !s.reserve() {
		s.metrics.refuse(reasonMaxClients)
		s.log.Debug("connect refused: max clients", "client", lc.name)
		return refuse(cl, packets.ErrServerBusy, packets.Err3ServerUnavailable)
	}
	c.admitted = true
	err := errNotAuthorized
	if pk.Connect.PasswordFlag {
		err = set.passwords.checkPassword(name, c.ip, pk.Connect.Password)
	}
	if err == nil && pk.Connect.WillFlag && (!lc.allows(pk.Connect.WillTopic, true) || s.commandTopic(pk.Connect.WillTopic)) {
		err = errNotAuthorized
	}
	rev := set.revision(lc.name)
	if err == nil && !s.admitLocal(c, cl, lc.name, rev, set) {
		err = errNotAuthorized // revoked by a reload during the check
	}
	switch {
	case errors.Is(err, gateway.ErrOverloaded):
		s.metrics.refuse(reasonOverloaded)
		s.log.Debug("connect refused: overloaded", "client", lc.name, "err", err)
		return refuse(cl, packets.ErrServerBusy, packets.Err3ServerUnavailable)
	case err != nil:
		s.metrics.refuse(reasonNotAuthorized)
		s.log.Debug("connect refused: not authorized", "client", lc.name, "remote", c.RemoteAddr().String())
		return refuse(cl, packets.ErrNotAuthorized, packets.Err3NotAuthorized)
	}
	cl.ID = lc.name + "/" + cl.ID
	c.local = lc
	s.metrics.localClients.Inc()
	return nil
}

// admitLocal records c as local client name admitted at revision rev of
// set, and reports false when a reload replaced set meanwhile and
// revoked it (SetClients did not see c yet).
func (s *Server) admitLocal(c *conn, cl *mochi.Client, name, rev string, set *localSet) bool {
	s.liveMu.Lock()
	s.live[c] = admission{client: cl, device: gateway.DeviceID(name), rev: rev, local: true}
	s.liveMu.Unlock()
	if cur := s.local.Load(); cur != set && cur.revision(name) != rev {
		return false
	}
	return true
}

// SetClients replaces the local clients for later CONNECTs (a reload of
// auth.clients; passwords may be the same auth.Reloadable as before,
// reloaded) and disconnects the connected local clients whose entry
// changed (password hash, Read, Write) or went away; MQTT 5 clients are
// told "not authorized". Invalid clients are refused with an error and
// the ones in force kept.
func (s *Server) SetClients(clients []LocalClient, passwords gateway.Credentials) error {
	set, err := newLocalSet(clients, passwords)
	if err != nil {
		return fmt.Errorf("mqtt: %w", err)
	}
	s.local.Store(set)
	s.liveMu.Lock()
	var revoked []*mochi.Client
	for _, a := range s.live {
		if a.local && set.revision(string(a.device)) != a.rev {
			revoked = append(revoked, a.client)
		}
	}
	s.liveMu.Unlock()
	for _, cl := range revoked {
		s.revoke(cl, "local clients")
	}
	return nil
}

// commandTopic reports whether there are Commands and topic is in a
// device's command subtree.
func (s *Server) commandTopic(topic string) bool {
	_, rest, ok := splitTopic(s.prefix, topic)
	return s.cmds != nil && ok && isCommand(rest)
}
