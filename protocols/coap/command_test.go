package coap

import (
	"bytes"
	"fmt"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/plgd-dev/go-coap/v3/message"
	"github.com/plgd-dev/go-coap/v3/message/codes"
	"github.com/plgd-dev/go-coap/v3/udp/coder"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/fleetgate/fleetgate/gateway"
	"github.com/fleetgate/fleetgate/gateway/clocktest"
	"github.com/fleetgate/fleetgate/gateway/gatewaytest"
)

// cmd is a command of device dev-1 with topic and payload.
func cmd(id uint64, topic string, payload []byte, expires time.Time) gateway.Command {
	return gateway.Command{ID: id, Message: gateway.Message{Device: "dev-1", Topic: topic, Payload: payload}, Expires: expires}
}

func TestPickCommand(t *testing.T) {
	now := start
	later := now.Add(time.Minute)
	big := make([]byte, DefaultMaxMessageSize)
	cases := []struct {
		name    string
		pending []gateway.Command
		pick    uint64   // 0: none
		drop    []uint64 // undeliverable
	}{
		{"none", nil, 0, nil},
		{"the oldest", []gateway.Command{cmd(1, "cmd", []byte("a"), later), cmd(2, "cmd", nil, later)}, 1, nil},
		{"expired passed over", []gateway.Command{cmd(1, "cmd", nil, now.Add(-time.Second)), cmd(2, "cmd", nil, later)}, 2, nil},
		{"expiring now is expired", []gateway.Command{cmd(1, "cmd", nil, now)}, 0, nil},
		{"no expiry", []gateway.Command{cmd(1, "cmd/a", nil, time.Time{})}, 1, nil},
		{"too large dropped, the next sent", []gateway.Command{cmd(1, "cmd", big, later), cmd(2, "cmd/b", []byte("b"), later)}, 2, []uint64{1}},
		{"a level longer than a Location-Path", []gateway.Command{cmd(1, "cmd/"+strings.Repeat("l", 256), nil, later)}, 0, []uint64{1}},
		{"a level of 255 bytes", []gateway.Command{cmd(1, "cmd/"+strings.Repeat("l", 255), nil, later)}, 1, nil},
		{"an expired large one is only passed over", []gateway.Command{cmd(1, "cmd", big, now), cmd(2, "cmd", big, later)}, 0, []uint64{2}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			pick, drop := pickCommand(tc.pending, now, DefaultMaxMessageSize)
			var got uint64
			if pick != nil {
				got = pick.ID
			}
			var dropped []uint64
			for _, c := range drop {
				dropped = append(dropped, c.ID)
			}
			if got != tc.pick || fmt.Sprint(dropped) != fmt.Sprint(tc.drop) {
				t.Fatalf("picked %d, dropped %v; want %d, %v", got, dropped, tc.pick, tc.drop)
			}
		})
	}
}

// TestAnswerBuild: an answer is fitted to its limit, leaving out the
// command (for its Size2 marker), then the marker or diagnostic, then the
// option; a request as large as the marker says has room for the
// command, with any token.
func TestAnswerBuild(t *testing.T) {
	c := gateway.Command{ID: 4711, Message: gateway.Message{Device: "dev-1", Topic: "cmd/led/set",
		Payload: []byte(`{"r":255}`), ContentType: "application/json"}}
	need := commandAnswerSize(&c)
	withCmd := answer{code: codes.Changed, opt: uintOption{message.MaxAge, 30}, cmd: &c}
	// The answer with this Max-Age is 3 bytes smaller than need, which
	// counts with the largest Max-Age.
	full := need - 3
	refused := answer{code: codes.BadRequest, diag: "query d=<device> required", opt: uintOption{message.Size1, 1152}}
	cases := []struct {
		name    string
		a       answer
		token   int
		limit   int
		carried carried
		opts    []message.OptionID
		payload string
	}{
		{"command", withCmd, 8, need, carriedCommand,
			[]message.OptionID{message.LocationPath, message.LocationPath, message.LocationPath, message.ContentFormat, message.MaxAge, message.LocationQuery},
			`{"r":255}`},
		{"command, no token, a little less room", withCmd, 0, need - 8, carriedCommand,
			[]message.OptionID{message.LocationPath, message.LocationPath, message.LocationPath, message.ContentFormat, message.MaxAge, message.LocationQuery},
			`{"r":255}`},
		{"command with room to spare", withCmd, 8, full, carriedCommand,
			[]message.OptionID{message.LocationPath, message.LocationPath, message.LocationPath, message.ContentFormat, message.MaxAge, message.LocationQuery},
			`{"r":255}`},
		{"marker", withCmd, 8, full - 1, carriedMarker, []message.OptionID{message.MaxAge, message.Size2}, ""},
		{"Max-Age only", withCmd, 0, 4 + 2 + 3, carriedNothing, []message.OptionID{message.MaxAge}, ""},
		{"nothing but the code", withCmd, 2, 4 + 2, carriedNothing, nil, ""},
		{"refusal", refused, 4, 200, carriedNothing, []message.OptionID{message.ContentFormat, message.Size1}, refused.diag},
		{"refusal without its diagnostic", refused, 4, 20, carriedNothing, []message.OptionID{message.Size1}, ""},
		{"refusal without its option", refused, 4, 9, carriedNothing, nil, ""},
	}
	sc := &scratch{}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			m := message.Message{Token: bytes.Repeat([]byte{7}, tc.token), Type: message.Acknowledgement}
			got := tc.a.build(&m, tc.limit, sc)
			b := make([]byte, 2048)
			n, err := coder.DefaultCoder.Encode(m, b)
			if err != nil || n > tc.limit {
				t.Fatalf("encoded %d bytes (%v), limit %d", n, err, tc.limit)
			}
			var ids []message.OptionID
			for _, o := range m.Options {
				ids = append(ids, o.ID)
			}
			if got != tc.carried || fmt.Sprint(ids) != fmt.Sprint(tc.opts) || string(m.Payload) != tc.payload {
				t.Fatalf("carried %v options %v payload %q; want %v %v %q", got, ids, m.Payload, tc.carried, tc.opts, tc.payload)
			}
			if got == carriedMarker {
				if v, err := m.Options.GetUint32(message.Size2); err != nil || int(v) != need {
					t.Fatalf("Size2 %d (%v), want %d", v, err, need)
				}
			}
			if got == carriedCommand {
				back, ok := readCommand(t, m)
				if !ok || back.ID != c.ID || back.Topic != c.Topic || !bytes.Equal(back.Payload, c.Payload) || back.ContentType != c.ContentType {
					t.Fatalf("read back %+v, want %+v", back, c)
				}
			}
		})
	}
}

// FuzzAnswerBuild: whatever the command and the limit, an answer fits
// its limit (or is the bare header and token), carries the command
// whole or its marker, and the marker's Size2 always makes room.
func FuzzAnswerBuild(f *testing.F) {
	f.Add("cmd/led/set", []byte(`{"r":255}`), "application/json", uint64(1), 8, 80)
	f.Add("cmd", []byte{}, "", uint64(1<<64-1), 0, 11)
	f.Add("cmd/a/b/c/d/e/f", bytes.Repeat([]byte{1}, 1000), "application/vnd.coap-cf.65000", uint64(77), 3, 1152)
	f.Fuzz(func(t *testing.T, topic string, payload []byte, contentType string, id uint64, token, limit int) {
		token, limit = min(max(token, 0), message.MaxTokenSize), min(max(limit, 0), 1<<16)
		c := gateway.Command{ID: id, Message: gateway.Message{Topic: topic, Payload: payload, ContentType: contentType}}
		need := commandAnswerSize(&c)
		if need == math.MaxInt {
			return // never sent (pickCommand)
		}
		a := answer{code: codes.Changed, opt: uintOption{message.MaxAge, 3540}, cmd: &c}
		m := message.Message{Token: bytes.Repeat([]byte{9}, token), Type: message.NonConfirmable}
		got := a.build(&m, limit, &scratch{})
		b := make([]byte, need+16)
		n, err := coder.DefaultCoder.Encode(m, b)
		if err != nil {
			t.Fatalf("encode: %v", err)
		}
		if n > limit && n > 4+token {
			t.Fatalf("%d bytes, limit %d", n, limit)
		}
		switch got {
		case carriedCommand:
			back, ok := readCommand(t, m)
			if !ok || back.ID != id || back.Topic != topic || !bytes.Equal(back.Payload, payload) {
				t.Fatalf("read back %+v", back)
			}
		case carriedMarker:
			if v, err := m.Options.GetUint32(message.Size2); err != nil || int(v) != need || need <= limit {
				t.Fatalf("marker Size2 %d (%v), need %d, limit %d", v, err, need, limit)
			}
		}
		if limit >= need && got != carriedCommand {
			t.Fatalf("limit %d ≥ Size2 %d and no command", limit, need)
		}
	})
}

func TestContentFormats(t *testing.T) {
	for cf, name := range contentFormats {
		if back, ok := contentFormat(name); !ok || back != cf || contentType(cf) != name {
			t.Errorf("%d → %q → %d, %v", cf, name, back, ok)
		}
	}
	cases := []struct {
		in string
		cf uint16
		ok bool
	}{
		{"text/plain; charset=UTF-8", 0, true},
		{"Application/JSON", 50, true},
		{"application/vnd.coap-cf.12345", 12345, true},
		{"application/vnd.coap-cf.65535", 65535, true},
		{"application/vnd.coap-cf.65536", 0, false},
		{"application/vnd.coap-cf.012", 0, false},
		{"application/vnd.coap-cf.", 0, false},
		{"application/x-protobuf", 0, false},
		{"", 0, false},
	}
	for _, tc := range cases {
		if cf, ok := contentFormat(tc.in); cf != tc.cf || ok != tc.ok {
			t.Errorf("contentFormat(%q) = %d, %v; want %d, %v", tc.in, cf, ok, tc.cf, tc.ok)
		}
	}
	if got := contentType(12345); got != "application/vnd.coap-cf.12345" {
		t.Errorf("contentType(12345) = %q", got)
	}
}

// TestCommandsDelivered: a device's pending commands ride on the 2.04 of
// its renewals, oldest first, each sent again until the device
// acknowledges it (at least once); an acknowledgement removes only the
// device's own command and is answered 2.04 whatever its ID.
func TestCommandsDelivered(t *testing.T) {
	clock := clocktest.New(start)
	rec := &recorder{}
	reg := prometheus.NewRegistry()
	s, k, cmds := startData(t, rec, Options{AllowAnonymous: true, Clock: clock, Registerer: reg})
	cc := dial(t, s)
	hour := start.Add(time.Hour)
	c1 := cmds.Add(gateway.Message{Device: "dev-1", Topic: "cmd/led/set", Payload: []byte(`{"r":255}`), ContentType: "application/json"}, hour)
	c2 := cmds.Add(gateway.Message{Device: "dev-1", Topic: "cmd", Payload: []byte("reboot"), ContentType: "text/plain; charset=utf-8"}, hour)
	other := cmds.Add(gateway.Message{Device: "dev-2", Topic: "cmd/x", Payload: []byte("x")}, hour)
	gone := cmds.Add(gateway.Message{Device: "dev-1", Topic: "cmd/late", Payload: []byte("late")}, start.Add(time.Second))
	clock.Advance(time.Second) // gone has expired

	carries := func(a answered, want *gateway.Command) {
		t.Helper()
		got, ok := a.command(t)
		switch {
		case a.code != codes.Changed || a.maxAge() != 30:
			t.Fatalf("answer %v Max-Age %d, want 2.04 Max-Age 30", a.code, a.maxAge())
		case want == nil && ok:
			t.Fatalf("answer carries %+v, want none", got)
		case want == nil:
		case !ok || got.ID != want.ID || got.Topic != want.Topic || !bytes.Equal(got.Payload, want.Payload):
			t.Fatalf("answer carries %+v (%v), want %+v", got, ok, *want)
		}
	}
	con, non := message.Confirmable, message.NonConfirmable
	a := post(t, cc, con, codes.POST, "/hb", nil, noCF, "d=dev-1", padding)
	carries(a, &c1)
	if cf, _ := a.opts.GetUint32(message.ContentFormat); cf != 50 {
		t.Fatalf("Content-Format %d, want 50", cf)
	}
	// Not acknowledged: sent again, also on a NON and on a POST /d.
	carries(post(t, cc, non, codes.POST, "/hb", nil, noCF, "d=dev-1", padding), &c1)
	carries(post(t, cc, con, codes.POST, "/d/t", []byte("1"), noCF, "d=dev-1", padding), &c1)
	// Acknowledged: removed, and the next one comes.
	a = post(t, cc, con, codes.POST, "/hb", nil, noCF, "d=dev-1", "a=1", padding)
	carries(a, &c2)
	if cf, _ := a.opts.GetUint32(message.ContentFormat); cf != 0 || !a.opts.HasOption(message.ContentFormat) {
		t.Fatalf("Content-Format %d, want 0 (text/plain)", cf)
	}
	// Another device's command, an unknown one, one acknowledged already:
	// 2.04, nothing removed, and the device's own command comes.
	carries(post(t, cc, con, codes.POST, "/hb", nil, noCF, "d=dev-2", fmt.Sprintf("a=%d", c2.ID), padding), &other)
	carries(post(t, cc, con, codes.POST, "/hb", nil, noCF, "d=dev-2", "a=999", padding), &other)
	carries(post(t, cc, con, codes.POST, "/hb", nil, noCF, "d=dev-1", "a=1", padding), &c2)
	// Acknowledged on a POST /d: the message is published too.
	carries(post(t, cc, con, codes.POST, "/d/t", []byte("2"), noCF, "d=dev-1", fmt.Sprintf("a=%d", c2.ID), padding), nil)
	// A leave acknowledges and carries nothing.
	carries(post(t, cc, con, codes.DELETE, "/hb", nil, noCF, "d=dev-2", fmt.Sprintf("a=%d", other.ID), padding), nil)

	if left := append(cmds.Held("dev-1"), cmds.Held("dev-2")...); len(left) != 1 || left[0].ID != gone.ID {
		t.Fatalf("pending %+v, want only the expired one", left)
	}
	want := []gatewaytest.AckCall{{Device: "dev-1", ID: 1}, {Device: "dev-2", ID: c2.ID}, {Device: "dev-2", ID: 999},
		{Device: "dev-1", ID: 1}, {Device: "dev-1", ID: c2.ID}, {Device: "dev-2", ID: other.ID}}
	if got := cmds.Acks(); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("Ack calls %v, want %v", got, want)
	}
	if msgs := k.Messages(); len(msgs) != 2 {
		t.Fatalf("published %+v", msgs)
	}
	got := gather(t, reg)
	for result, n := range map[string]float64{"delivered": 7, "acknowledged": 6, "waiting": 0, "undeliverable": 0} {
		if key := `fleetgate_coap_commands_total{result="` + result + `"}`; got[key] != n {
			t.Errorf("%s = %v, want %v", key, got[key], n)
		}
	}
}

// TestCommandMarker: over plain UDP a command whose answer is larger than
// the request is not sent; the 2.04 carries Size2 = the size a request
// must reach, and a request padded to it gets the command.
func TestCommandMarker(t *testing.T) {
	rec := &recorder{}
	reg := prometheus.NewRegistry()
	s, _, cmds := startData(t, rec, Options{AllowAnonymous: true, Registerer: reg})
	c := cmds.Add(gateway.Message{Device: "dev-1", Topic: "cmd/config", Payload: bytes.Repeat([]byte("c"), 300)}, time.Now().Add(time.Hour))
	conn := rawConn(t, s)
	ask := func(req []byte) *message.Message {
		t.Helper()
		b, ok := exchange(t, conn, req, 5*time.Second)
		if !ok {
			t.Fatal("no answer")
		}
		if len(b) > len(req) {
			t.Fatalf("answer of %d bytes to a request of %d", len(b), len(req))
		}
		m := decode(t, b)
		body, _ := m.ReadBody()
		return &message.Message{Code: m.Code(), Options: m.Options(), Payload: body}
	}
	small := datagram(t, message.Confirmable, codes.POST, 1, "/hb", "d=dev-1")
	m := ask(small)
	size2, err := m.Options.GetUint32(message.Size2)
	if m.Code != codes.Changed || err != nil || len(m.Payload) != 0 || m.Options.HasOption(message.LocationQuery) {
		t.Fatalf("small request: %v Size2 %d (%v) payload %d bytes", m.Code, size2, err, len(m.Payload))
	}
	if maxAge, err := m.Options.GetUint32(message.MaxAge); err != nil || maxAge != 30 {
		t.Fatalf("marker without Max-Age 30: %d %v", maxAge, err)
	}
	t.Logf("a %d-byte request: 2.04 with Size2 %d", len(small), size2)
	// Padded to exactly Size2 with a query the server ignores.
	base := datagram(t, message.Confirmable, codes.POST, 2, "/hb", "d=dev-1", "pad=")
	padded := datagram(t, message.Confirmable, codes.POST, 2, "/hb", "d=dev-1", "pad="+strings.Repeat("x", int(size2)-len(base)-2))
	for len(padded) < int(size2) {
		padded = datagram(t, message.Confirmable, codes.POST, 2, "/hb", "d=dev-1", "pad="+strings.Repeat("x", int(size2)-len(base)-2+int(size2)-len(padded)))
	}
	m = ask(padded)
	got, ok := readCommand(t, *m)
	if m.Code != codes.Changed || !ok || got.ID != c.ID || !bytes.Equal(got.Payload, c.Payload) {
		t.Fatalf("a %d-byte request: %v carries %+v (%v)", len(padded), m.Code, got, ok)
	}
	t.Logf("a %d-byte request: the command", len(padded))
	metrics := gather(t, reg)
	if metrics[`fleetgate_coap_commands_total{result="waiting"}`] != 1 || metrics[`fleetgate_coap_commands_total{result="delivered"}`] != 1 {
		t.Fatalf("metrics %v", metrics)
	}
}

// A command that no answer can hold (beyond the largest message) is
// dropped, counted, and the next one delivered.
func TestCommandUndeliverable(t *testing.T) {
	rec := &recorder{}
	reg := prometheus.NewRegistry()
	s, _, cmds := startData(t, rec, Options{AllowAnonymous: true, Registerer: reg, MaxMessageSize: 512})
	big := cmds.Add(gateway.Message{Device: "dev-1", Topic: "cmd/firmware", Payload: make([]byte, 600)}, time.Now().Add(time.Hour))
	next := cmds.Add(gateway.Message{Device: "dev-1", Topic: "cmd/led", Payload: []byte("on")}, time.Now().Add(time.Hour))
	a := post(t, dial(t, s), message.Confirmable, codes.POST, "/hb", nil, noCF, "d=dev-1", padding)
	if got, ok := a.command(t); a.code != codes.Changed || !ok || got.ID != next.ID {
		t.Fatalf("answer %v carries %+v (%v), want command %d", a.code, got, ok, next.ID)
	}
	if acks := cmds.Acks(); len(acks) != 1 || acks[0] != (gatewaytest.AckCall{Device: "dev-1", ID: big.ID}) {
		t.Fatalf("Ack calls %v, want the undeliverable command's", acks)
	}
	if n := gather(t, reg)[`fleetgate_coap_commands_total{result="undeliverable"}`]; n != 1 {
		t.Fatalf("undeliverable counted %v times", n)
	}
}

// An acknowledgement that Commands cannot take (its disk) gets 5.03: the
// device sends it again.
func TestCommandAckFails(t *testing.T) {
	rec := &recorder{}
	s, _, cmds := startData(t, rec, Options{AllowAnonymous: true})
	cmds.Add(gateway.Message{Device: "dev-1", Topic: "cmd", Payload: []byte("x")}, time.Now().Add(time.Hour))
	cmds.FailAck(gateway.ErrQueueClosed)
	a := post(t, dial(t, s), message.Confirmable, codes.POST, "/hb", nil, noCF, "d=dev-1", "a=1", padding)
	if a.code != codes.ServiceUnavailable || a.maxAge() != retryAfterSeconds {
		t.Fatalf("answer %v Max-Age %d, want 5.03 Max-Age %d", a.code, a.maxAge(), retryAfterSeconds)
	}
	if len(cmds.Held("dev-1")) != 1 {
		t.Fatal("command gone")
	}
}

// When its data worker's queue is full (a disk that does not commit), a
// heartbeat with an acknowledgement of a device with a pending command
// is served at once as a plain heartbeat: 2.04 without the command, the
// acknowledgement left for a later request.
func TestHeartbeatServedWhenItsWorkerIsBusy(t *testing.T) {
	rec := &recorder{}
	s, k, cmds := startData(t, rec, Options{AllowAnonymous: true})
	release := k.Hold()
	defer release()
	cmds.Add(gateway.Message{Device: "beat", Topic: "cmd", Payload: []byte("x")}, time.Now().Add(time.Hour))
	// Devices of beat's data worker fill its queue: one more each time it
	// is not full (one of the first may find it full before the worker
	// took the one it holds).
	c := rawConn(t, s)
	queue, i := s.shards[shardOf("beat")], 0
	eventually(t, 5*time.Second, "the worker's queue to fill", func() bool {
		if len(queue) == dataShardQueue {
			return true
		}
		for ; ; i++ {
			if dev := fmt.Sprintf("fill-%d", i); shardOf(gateway.DeviceID(dev)) == shardOf("beat") {
				if _, err := c.Write(append(datagram(t, message.Confirmable, codes.POST, uint16(i), "/d", "d="+dev), 0xff, 'x')); err != nil {
					t.Fatal(err)
				}
				i++
				return false
			}
		}
	})
	begin := time.Now()
	a := post(t, dial(t, s), message.Confirmable, codes.POST, "/hb", nil, noCF, "d=beat", "a=1", padding)
	if _, carries := a.command(t); a.code != codes.Changed || carries || time.Since(begin) > time.Second {
		t.Fatalf("answer %v after %v, carries a command %v", a.code, time.Since(begin), carries)
	}
	if acks := cmds.Acks(); len(acks) != 0 {
		t.Fatalf("acknowledged %v while the worker was busy", acks)
	}
}

// Over DTLS the device is its PSK identity, for /d and acknowledgements
// alike, and a proven peer gets a command whole however small its
// request: only the largest message bounds the answer.
func TestDataPathDTLS(t *testing.T) {
	rec := &recorder{}
	s, k, cmds := startData(t, rec, Options{DTLS: "127.0.0.1:0"})
	cc := dialDTLS(t, s, "id-1", testDevices["id-1"].key)
	a := post(t, cc, message.Confirmable, codes.POST, "/d/telemetry", []byte(`{"t":1}`), 50)
	if a.code != codes.Changed || a.maxAge() != 30 {
		t.Fatalf("POST /d over DTLS: %v Max-Age %d", a.code, a.maxAge())
	}
	if a = post(t, cc, message.NonConfirmable, codes.POST, "/d", []byte("x"), noCF); a.code != codes.Changed || a.typ != message.NonConfirmable {
		t.Fatalf("NON POST /d over DTLS: %v %v", a.code, a.typ)
	}
	msgs := k.Take()
	if len(msgs) != 2 || msgs[0].Device != "dev-1" || msgs[0].QoS != 1 || msgs[0].ContentType != "application/json" ||
		msgs[0].Topic != "telemetry" || msgs[1].QoS != 0 || msgs[1].Topic != "" {
		t.Fatalf("published %+v", msgs)
	}
	if evs := rec.Take(); len(evs) != 2 || evs[0].Anonymous || evs[0].Device != "dev-1" {
		t.Fatalf("evidence %+v", evs)
	}
	if a = post(t, cc, message.Confirmable, codes.POST, "/d/x", []byte("x"), noCF, "d=dev-2"); a.code != codes.Forbidden {
		t.Fatalf("d= of another device over DTLS: %v", a.code)
	}

	c := cmds.Add(gateway.Message{Device: "dev-1", Topic: "cmd/config", Payload: bytes.Repeat([]byte("c"), 700)}, time.Now().Add(time.Hour))
	a = post(t, cc, message.Confirmable, codes.POST, "/hb", nil, noCF)
	if got, ok := a.command(t); a.code != codes.Changed || !ok || got.ID != c.ID || len(got.Payload) != 700 {
		t.Fatalf("a small DTLS request: %v carries %d bytes of %d (%v)", a.code, len(got.Payload), got.ID, ok)
	}
	a = post(t, cc, message.Confirmable, codes.POST, "/hb", nil, noCF, fmt.Sprintf("a=%d", c.ID))
	if _, ok := a.command(t); a.code != codes.Changed || ok || len(cmds.Held("dev-1")) != 0 {
		t.Fatalf("acknowledged over DTLS: %v, still carries %v, pending %+v", a.code, ok, cmds.Held("dev-1"))
	}
}
