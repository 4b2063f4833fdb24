package mqtt

import (
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/fleetgate/fleetgate/gateway"
)

// FuzzConnection plays a byte stream from a device through mochi and the
// presence hook (on a net.Pipe, without the listener), then checks that
// the connection ended without a panic, gave its max_clients slot back,
// and that the evidence is well-formed: a session's evidence starts with
// its Connect and nothing follows a Leave. The seed corpus is in
// testdata/fuzz/FuzzConnection.
func FuzzConnection(f *testing.F) {
	rec := &recorder{}
	s := startServer(f, rec, Options{AllowAnonymous: true, Credentials: testCreds(f), MaxPacketSize: 2048})
	f.Fuzz(func(t *testing.T, stream []byte) {
		rec.Take()

		server, device := net.Pipe()
		c := &conn{Conn: server}
		_ = server.SetDeadline(time.Now().Add(2 * time.Second))
		go func() {
			_, _ = device.Write(stream)
			_ = device.Close()
		}()
		drained := make(chan struct{})
		go func() {
			defer close(drained)
			_, _ = io.Copy(io.Discard, device)
		}()
		_ = s.broker.EstablishConnection("tcp", c)
		s.release(c)
		_ = server.Close()
		<-drained

		if n := s.conns.Load(); n != 0 {
			t.Fatalf("%d slots held after the connection ended", n)
		}
		evs := rec.Evidence()
		checkEvidence(t, evs)
		state := map[gateway.SessionID]gateway.Kind{}
		for _, ev := range evs {
			last, seen := state[ev.Session]
			switch {
			case !seen && ev.Kind != gateway.Connect:
				t.Fatalf("%v before Connect: %+v", ev.Kind, evs)
			case seen && (ev.Kind == gateway.Connect || last == gateway.Leave):
				t.Fatalf("%v after %v: %+v", ev.Kind, last, evs)
			}
			state[ev.Session] = ev.Kind
		}
	})
}

// FuzzSplitTopic: splitTopic and restBelow parse what they are given
// back into it, never take a topic that is not a device ID's root or
// below it, and isCommand is the command subtree. The seeds run as an
// ordinary test.
func FuzzSplitTopic(f *testing.F) {
	for _, seed := range [][2]string{
		{"devices", "devices/dev-1"},
		{"devices", "devices/dev-1/telemetry/temp"},
		{"devices", "devices/dev-1/cmd"},
		{"devices", "devices/dev-1/cmd/reboot"},
		{"devices", "devices/dev-1/cmdline"},
		{"devices", "devices/dev-1/"},
		{"devices", "devices/dev 1/x"},
		{"devices", "devices//x"},
		{"devices", "devicesX/dev-1"},
		{"devices", "devices"},
		{"site/a", "site/a/m:0042/x//y"},
		{"", "dev-1/cmd/x"},
		{"", "/dev-1"},
		{"", "$SYS/broker"},
	} {
		f.Add(seed[0], seed[1])
	}
	f.Fuzz(func(t *testing.T, prefix, topic string) {
		device, rest, ok := splitTopic(prefix, topic)
		if !ok {
			return
		}
		if _, err := gateway.ParseDeviceID(string(device)); err != nil {
			t.Fatalf("splitTopic(%q, %q) took device %q: %v", prefix, topic, device, err)
		}
		root := string(device)
		if prefix != "" {
			root = prefix + "/" + root
		}
		rebuilt := root
		if rest != "" {
			rebuilt += "/" + rest
		}
		if rebuilt != topic {
			t.Fatalf("splitTopic(%q, %q) = %q, %q: rebuilds %q", prefix, topic, device, rest, rebuilt)
		}
		if r, ok := restBelow(topic, root); !ok || r != rest {
			t.Fatalf("restBelow(%q, %q) = %q, %v; splitTopic said %q", topic, root, r, ok, rest)
		}
		if want := rest == "cmd" || strings.HasPrefix(rest, "cmd/"); isCommand(rest) != want {
			t.Fatalf("isCommand(%q) = %v", rest, !want)
		}
	})
}

// matches is MQTT's topic matching written from the specification, on
// split levels: the reference covers is checked against.
func matches(filter, topic string) bool {
	fl, tl := strings.Split(filter, "/"), strings.Split(topic, "/")
	if strings.HasPrefix(topic, "$") && (fl[0] == "+" || fl[0] == "#") {
		return false
	}
	for i, l := range fl {
		if l == "#" {
			return true
		}
		if i >= len(tl) || (l != "+" && l != tl[i]) {
			return false
		}
	}
	return len(fl) == len(tl)
}

// FuzzCovers: for a topic, covers is MQTT's matching; for two filters,
// covers(r, f) means that every topic f matches, r matches (checked on a
// third input topic). The seeds run as an ordinary test.
func FuzzCovers(f *testing.F) {
	for _, seed := range [][3]string{
		{"devices/#", "devices/+/telemetry/#", "devices/dev-1/telemetry/t"},
		{"devices/+/cmd/#", "devices/dev-1/cmd", "devices/dev-1/cmd"},
		{"devices/+/telemetry/#", "devices/#", "devices/dev-1/cmd/x"},
		{"a/#", "a", "a"},
		{"a/+", "a", "a"},
		{"#", "$SYS/#", "$SYS/broker"},
		{"+/x", "$a/x", "$a/x"},
		{"a//b", "a/+/b", "a//b"},
		{"+", "#", "a"},
		{"a/+/c", "a/+/c", "a/b/c"},
	} {
		f.Add(seed[0], seed[1], seed[2])
	}
	f.Fuzz(func(t *testing.T, r, flt, topic string) {
		if !gateway.ValidTopicFilter(r) || topic == "" || strings.ContainsAny(topic, "+#\x00") {
			return
		}
		if got, want := covers(r, topic), matches(r, topic); got != want {
			t.Fatalf("covers(%q, topic %q) = %v, MQTT says %v", r, topic, got, want)
		}
		if gateway.ValidTopicFilter(flt) && covers(r, flt) && matches(flt, topic) && !matches(r, topic) {
			t.Fatalf("covers(%q, %q), but %q matches %q and not %q", r, flt, topic, flt, r)
		}
	})
}
