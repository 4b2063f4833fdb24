package coap

import (
	"context"
	"math/rand/v2"
	"net"
	"net/netip"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/plgd-dev/go-coap/v3/dtls"
	"github.com/plgd-dev/go-coap/v3/message"
	"github.com/plgd-dev/go-coap/v3/message/codes"
	"github.com/plgd-dev/go-coap/v3/options"
	"github.com/plgd-dev/go-coap/v3/pkg/runner/periodic"
	"github.com/plgd-dev/go-coap/v3/udp/coder"
	"go.uber.org/goleak"

	"github.com/fleetgate/fleetgate/gateway"
	"github.com/fleetgate/fleetgate/gateway/clocktest"
	"github.com/fleetgate/fleetgate/gateway/gatewaytest"
)

// hostileDatagrams returns random bytes, every truncation of valid CON
// and NON requests, and valid requests with random bytes flipped.
func hostileDatagrams(t testing.TB, seed uint64) [][]byte {
	t.Helper()
	rng := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	var out [][]byte
	for range 1500 {
		b := make([]byte, rng.IntN(300))
		for i := range b {
			b[i] = byte(rng.Uint32())
		}
		if len(b) > 0 && rng.IntN(2) == 0 {
			b[0] = b[0]&0x3f | 0x40 // CoAP version 1, so it gets past the first check
		}
		out = append(out, b)
	}
	valid := [][]byte{
		datagram(t, message.Confirmable, codes.POST, 7, "/hb", "d=dev-1", "s=radio2"),
		datagram(t, message.NonConfirmable, codes.DELETE, 8, "/hb", "d=dev-1"),
		append(datagram(t, message.Confirmable, codes.POST, 9, "/d/telemetry/temp", "d=dev-1", "a=1"), 0xff, '2', '1'),
	}
	for _, v := range valid {
		for n := range len(v) {
			out = append(out, v[:n])
		}
		for range 300 {
			b := append([]byte(nil), v...)
			for range 1 + rng.IntN(3) {
				b[rng.IntN(len(b))] = byte(rng.Uint32())
			}
			out = append(out, b)
		}
	}
	// Oversized and empty datagrams.
	out = append(out, make([]byte, 8000), nil)
	return out
}

func TestHostileDatagrams(t *testing.T) {
	rec := &recorder{}
	s, k, cmds := startData(t, rec, Options{AllowAnonymous: true})
	cmds.Add(gateway.Message{Device: "dev-1", Topic: "cmd", Payload: []byte("x")}, time.Now().Add(time.Hour))
	const seed = 20261129
	t.Logf("seed %d", seed)

	// Several hostile peers, so that both new and existing peer state
	// see the garbage.
	peers := make([]*net.UDPConn, 4)
	for i := range peers {
		peers[i] = rawConn(t, s)
	}
	for i, b := range hostileDatagrams(t, seed) {
		if _, err := peers[i%len(peers)].Write(b); err != nil {
			t.Fatalf("write: %v", err)
		}
	}

	// The server still answers, on a fresh peer and on a hostile one.
	cc := dial(t, s)
	if r := request(t, cc, message.Confirmable, codes.POST, "/hb", "d=after-storm"); r.code != codes.Changed {
		t.Fatalf("after hostile input: %v %q", r.code, r.payload)
	}
	c := peers[0]
	want := datagram(t, message.Confirmable, codes.POST, 0x7777, "/hb", "d=after-storm")
	deadline := time.Now().Add(10 * time.Second)
	for {
		// Skip answers still queued for the garbage that happened to be valid.
		b, ok := exchange(t, c, want, 500*time.Millisecond)
		for ok && decode(t, b).MessageID() != 0x7777 {
			b, ok = readDatagram(t, c, 500*time.Millisecond)
		}
		if ok {
			if m := decode(t, b); m.Code() != codes.Changed {
				t.Fatalf("hostile peer's valid request: %v", m)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("hostile peer never answered again")
		}
	}
	// Garbage that happened to decode into a request was checked like
	// any other: whatever reached the Observer or the sink is well-formed.
	if bad := k.TakeInvalid(); len(bad) != 0 {
		t.Fatalf("invalid message published from garbage: %+v: %v", bad[0], gateway.ValidateMessage(bad[0]))
	}
	for _, ev := range rec.Evidence() {
		_, errD := gateway.ParseDeviceID(string(ev.Device))
		_, errS := gateway.ParseSessionID(string(ev.Session))
		if errD != nil || errS != nil || ev.Protocol != "coap" {
			t.Fatalf("malformed evidence from garbage: %+v", ev)
		}
	}
}

func TestMalformedConfirmableIsReset(t *testing.T) {
	s := startServer(t, &recorder{}, Options{AllowAnonymous: true})
	c := rawConn(t, s)
	// Version 1, CON, token length 8 but no token: the header parses, the
	// message does not. RFC 7252 §4.2: reject it with a Reset.
	b, ok := exchange(t, c, []byte{0x48, byte(codes.POST), 0x12, 0x34}, 5*time.Second)
	if !ok {
		t.Fatal("malformed CON silently dropped")
	}
	if m := decode(t, b); m.Type() != message.Reset || m.MessageID() != 0x1234 {
		t.Fatalf("answer %v, want RST 0x1234", m)
	}
	// An unknown critical option (here 9) in a CON request: 4.02 Bad Option.
	req := datagram(t, message.Confirmable, codes.POST, 0x1235, "/hb", "d=dev-1")
	m := decode(t, req)
	m.SetOptionBytes(9, []byte{1})
	req, err := m.MarshalWithEncoder(coder.DefaultCoder)
	if err != nil {
		t.Fatal(err)
	}
	if b, ok = exchange(t, c, req, 5*time.Second); !ok {
		t.Fatal("CON with unknown critical option silently dropped")
	}
	if m := decode(t, b); m.Code() != codes.BadOption || m.MessageID() != 0x1235 {
		t.Fatalf("answer %v, want 4.02", m)
	}
}

func TestNonRequestsGetNoAnswer(t *testing.T) {
	rec := &recorder{}
	s := startServer(t, rec, Options{AllowAnonymous: true})
	c := rawConn(t, s)
	// Nothing to answer: an ACK carrying a request code, stray responses.
	for i, typ := range []message.Type{message.Acknowledgement, message.Reset, message.NonConfirmable} {
		code := codes.Content
		if typ != message.NonConfirmable {
			code = codes.POST
		}
		if b, ok := exchange(t, c, datagram(t, typ, code, uint16(0x300+i), "/hb", "d=dev-1"), 300*time.Millisecond); ok {
			t.Fatalf("%v %v answered: %v", typ, code, decode(t, b))
		}
	}
	// A stray CON response is acknowledged, with an empty ACK.
	b, ok := exchange(t, c, datagram(t, message.Confirmable, codes.Content, 0x310, ""), 5*time.Second)
	if !ok {
		t.Fatal("stray CON response not acknowledged")
	}
	if m := decode(t, b); m.Type() != message.Acknowledgement || m.Code() != codes.Empty || m.MessageID() != 0x310 {
		t.Fatalf("answer %v, want an empty ACK", m)
	}
	if evs := rec.Evidence(); len(evs) != 0 {
		t.Fatalf("non-requests made evidence: %+v", evs)
	}
}

func TestNoGoroutineLeak(t *testing.T) {
	ignore := goleak.IgnoreCurrent()
	s, err := New(&recorder{}, Options{
		Addr: "127.0.0.1:0", DTLS: "127.0.0.1:0", Credentials: testDevices,
		AllowAnonymous: true, HeartbeatInterval: time.Second, RequestsPerSecond: 1_000_000,
		HandshakeTimeout: 500 * time.Millisecond,
	})
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- s.Serve(context.Background()) }()

	c, err := net.DialUDP("udp", nil, s.Addr().(*net.UDPAddr))
	if err != nil {
		t.Fatal(err)
	}
	for i, b := range hostileDatagrams(t, 7)[:200] {
		if _, err := c.Write(b); err != nil {
			t.Fatal(err)
		}
		if i%10 == 0 {
			if _, ok := exchange(t, c, datagram(t, message.NonConfirmable, codes.POST, uint16(i), "/hb", "d=dev-1"), 5*time.Second); !ok {
				t.Fatal("no answer")
			}
		}
	}
	// More peers, each with its own server-side state.
	for i := range 20 {
		p, err := net.DialUDP("udp", nil, s.Addr().(*net.UDPAddr))
		if err != nil {
			t.Fatal(err)
		}
		if _, ok := exchange(t, p, datagram(t, message.Confirmable, codes.POST, uint16(i), "/hb", "d=dev-2"), 5*time.Second); !ok {
			t.Fatal("no answer")
		}
		_ = p.Close()
	}
	_ = c.Close()

	// DTLS: garbage, a failed handshake, a session ended by the client,
	// and one left open for Close to end.
	d, err := net.DialUDP("udp", nil, s.DTLSAddr().(*net.UDPAddr))
	if err != nil {
		t.Fatal(err)
	}
	for _, b := range hostileDatagrams(t, 8)[:200] {
		if _, err := d.Write(b); err != nil {
			t.Fatal(err)
		}
	}
	_ = d.Close()
	if dc, err := handshake(t, s, "id-1", []byte("wrong"), time.Second); err == nil {
		_ = dc.Close()
		t.Fatal("handshake with a wrong key succeeded")
	}
	var closeKept func()
	for _, keep := range []bool{false, true} {
		dc, err := handshake(t, s, "id-2", testDevices["id-2"].key, 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		stop := make(chan struct{})
		cc := dtls.Client(dc, options.WithPeriodicRunner(periodic.New(stop, time.Second)),
			options.WithErrors(func(error) {}), options.WithCloseSocket())
		if r := request(t, cc, message.Confirmable, codes.POST, "/hb"); r.code != codes.Changed {
			t.Fatalf("dtls heartbeat: %v", r.code)
		}
		if keep {
			closeKept = func() { _ = cc.Close(); close(stop) }
			continue
		}
		_ = cc.Close()
		close(stop)
	}

	if err := s.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	select {
	case err := <-served:
		if err != nil {
			t.Fatalf("Serve: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Serve did not return after Close")
	}
	// The client side of the session Close ended (the test's own
	// goroutines) is not the server's to end.
	closeKept()
	goleak.VerifyNone(t, ignore)
}

// FuzzDatagram runs datagrams through the whole UDP request path but the
// socket (Server.handle: limits, codec, request, answer; a data path
// request is served as a data worker serves it) with the data path on:
// it never panics; an answer is a well-formed CoAP message no larger than
// its request that matches it (an ACK or RST of a CON with its Message
// ID, a NON for a NON, the request's token); only a 2.04 comes with
// evidence, which is well-formed; a published message is valid and the
// requesting device's; a command rides only on the answer to its own
// device, as it was submitted, unexpired; and only the requesting device's
// commands are acknowledged.
func FuzzDatagram(f *testing.F) {
	withPayload := func(b []byte, payload string) []byte { return append(b, append([]byte{0xff}, payload...)...) }
	for _, b := range [][]byte{
		datagram(f, message.Confirmable, codes.POST, 1, "/hb", "d=dev-1", "s=radio2"),
		datagram(f, message.NonConfirmable, codes.DELETE, 2, "/hb", "d=dev-1"),
		datagram(f, message.Confirmable, codes.GET, 3, "/other"),
		datagram(f, message.Confirmable, codes.Content, 4, ""),
		datagram(f, message.Acknowledgement, codes.Empty, 5, ""),
		{0x40, 0, 0, 6},                // ping
		{0x48, byte(codes.POST), 0, 7}, // token length 8, no token
		withPayload(datagram(f, message.Confirmable, codes.POST, 8, "/hb", "d=dev-1"), "x"),
		withPayload(datagram(f, message.Confirmable, codes.POST, 9, "/d/telemetry/temp", "d=dev-2"), "21.5"),
		withPayload(datagram(f, message.NonConfirmable, codes.POST, 10, "/d", "d=dev-2", "a=1"), "{}"),
		datagram(f, message.Confirmable, codes.POST, 11, "/d/a/+", "d=dev-2"),
		datagram(f, message.Confirmable, codes.POST, 12, "/hb", "d=dev-1", "pad="+strings.Repeat("p", 60)),
		datagram(f, message.Confirmable, codes.POST, 13, "/hb", "d=dev-1", "a=2", "pad="+strings.Repeat("p", 40)),
		datagram(f, message.Confirmable, codes.DELETE, 14, "/hb", "d=dev-2", "a=2"),
	} {
		f.Add(b)
	}
	cf := func(b []byte) []byte {
		m := decode(f, b)
		m.SetContentFormat(message.AppJSON)
		out, err := m.MarshalWithEncoder(coder.DefaultCoder)
		if err != nil {
			f.Fatal(err)
		}
		return out
	}
	f.Add(cf(withPayload(datagram(f, message.Confirmable, codes.POST, 15, "/d/j", "d=dev-1"), "[1]")))

	rec, k, cmds := &recorder{}, &gatewaytest.DataSink{}, &gatewaytest.Commands{}
	clock := clocktest.New(start)
	s, err := New(rec, Options{
		Addr: "127.0.0.1:0", AllowAnonymous: true, HeartbeatInterval: 30 * time.Second,
		MaxMessageSize: 128, RequestsPerSecond: 1_000_000, Clock: clock, Sink: k, Commands: cmds,
	})
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { _ = s.Close() })
	// 4 has expired (at start); 1, 3 and 5 never expire; 3 is too large
	// for any answer (MaxMessageSize 128): undeliverable.
	commands := []gateway.Command{
		{ID: 1, Message: gateway.Message{Device: "dev-1", Topic: "cmd", Payload: []byte("on")}},
		{ID: 2, Message: gateway.Message{Device: "dev-1", Topic: "cmd/led/set", Payload: []byte("{\"r\":255}"), ContentType: "application/json"},
			Expires: start.Add(time.Hour)},
		{ID: 3, Message: gateway.Message{Device: "dev-2", Topic: "cmd/big", Payload: make([]byte, 200)}},
		{ID: 4, Message: gateway.Message{Device: "dev-2", Topic: "cmd/old", Payload: []byte("late")}, Expires: start},
		{ID: 5, Message: gateway.Message{Device: "dev-2", Topic: "cmd/x"}},
	}
	byID := make(map[uint64]gateway.Command)
	for _, c := range commands {
		byID[c.ID] = c
	}
	w := s.newWorker()
	src := netip.MustParseAddrPort("127.0.0.1:5683")
	f.Fuzz(func(t *testing.T, b []byte) {
		cmds.Reset(commands)
		out, j := s.handle(w, src, b)
		if j != nil {
			// What the request's data worker does.
			out = s.encodeAnswer(w, j.ex, s.process(j))
		}
		evs := rec.Take()
		for _, ev := range evs {
			_, errD := gateway.ParseDeviceID(string(ev.Device))
			_, errS := gateway.ParseSessionID(string(ev.Session))
			if errD != nil || errS != nil || ev.Protocol != "coap" {
				t.Fatalf("malformed evidence %+v", ev)
			}
		}
		if len(evs) > 1 {
			t.Fatalf("%d pieces of evidence from one datagram", len(evs))
		}
		msgs := k.Take()
		if len(msgs) > 1 || (len(msgs) == 1 && (len(evs) != 1 || msgs[0].Device != evs[0].Device)) {
			t.Fatalf("published %+v with evidence %+v", msgs, evs)
		}
		if bad := k.TakeInvalid(); len(bad) != 0 {
			t.Fatalf("published %+v: %v", bad[0], gateway.ValidateMessage(bad[0]))
		}
		for _, m := range msgs {
			if m.Source != "coap" || !m.Received.Equal(clock.Now()) {
				t.Fatalf("published %+v", m)
			}
		}
		for _, a := range cmds.Acks() {
			if len(evs) != 1 || a.Device != evs[0].Device {
				t.Fatalf("command %d of %s acknowledged with evidence %+v", a.ID, a.Device, evs)
			}
		}
		if out == nil {
			return
		}
		if len(out) > len(b) {
			t.Fatalf("answer of %d bytes to a request of %d", len(out), len(b))
		}
		m := message.Message{Options: make(message.Options, 0, maxOptions)}
		if _, err := coder.DefaultCoder.Decode(out, &m); err != nil {
			t.Fatalf("answer %x does not decode: %v", out, err)
		}
		h := parseHeader(b)
		switch m.Type {
		case message.Acknowledgement, message.Reset:
			if h.typ != message.Confirmable || m.MessageID != int32(h.mid) {
				t.Fatalf("%v %d to a %v %d", m.Type, m.MessageID, h.typ, h.mid)
			}
		case message.NonConfirmable:
			if h.typ != message.NonConfirmable {
				t.Fatalf("NON answer to a %v", h.typ)
			}
		default:
			t.Fatalf("answer of type %v", m.Type)
		}
		if m.Code != codes.Empty && string(m.Token) != string(h.token) {
			t.Fatalf("token %x, request's %x", m.Token, h.token)
		}
		if len(evs) == 1 && m.Code != codes.Changed && m.Code != codes.Empty && m.Code != codes.ServiceUnavailable &&
			m.Code != codes.BadRequest && m.Code != codes.RequestEntityTooLarge {
			t.Fatalf("evidence with a %v answer", m.Code)
		}
		if m.Code == codes.Changed && len(evs) != 1 {
			t.Fatal("2.04 without evidence")
		}
		c, carries := readCommand(t, m)
		if !carries {
			return
		}
		want, ok := byID[c.ID]
		if !ok || m.Code != codes.Changed || want.Device != evs[0].Device || !want.Expires.IsZero() && !clock.Now().Before(want.Expires) ||
			c.Topic != want.Topic || string(c.Payload) != string(want.Payload) || c.ContentType != want.ContentType {
			t.Fatalf("answer %v to %s carries %+v", m.Code, evs[0].Device, c)
		}
	})
}

// readCommand reads the command an answer carries: its ID from the
// Location-Query c=, its topic from the Location-Path options, its
// payload and Content-Format; ok is false without a Location-Query.
func readCommand(t testing.TB, m message.Message) (c gateway.Command, ok bool) {
	t.Helper()
	q, err := m.Options.GetString(message.LocationQuery)
	if err != nil {
		return c, false
	}
	id, found := strings.CutPrefix(q, "c=")
	if c.ID, err = strconv.ParseUint(id, 10, 64); !found || err != nil {
		t.Fatalf("Location-Query %q", q)
	}
	var levels []string
	for _, o := range m.Options {
		if o.ID == message.LocationPath {
			levels = append(levels, string(o.Value))
		}
	}
	c.Topic, c.Payload = strings.Join(levels, "/"), m.Payload
	if cf, err := m.Options.GetUint32(message.ContentFormat); err == nil {
		c.ContentType = contentType(uint16(cf))
	}
	return c, true
}

// TestHostileSourcesBounded sends garbage and replayed DTLS ClientHellos
// from thousands of fresh sources to both ports: the server's goroutines
// come back to where they were once the stalled handshakes time out, and
// its heap does not grow with the number of sources.
func TestHostileSourcesBounded(t *testing.T) {
	s := startDTLS(t, &recorder{}, Options{AllowAnonymous: true, HandshakeTimeout: 200 * time.Millisecond, MaxDTLSPeers: 32})
	hello := pionClientHello(t)
	garbage := hostileDatagrams(t, 5)
	heap := func() uint64 {
		runtime.GC()
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		return ms.HeapAlloc
	}
	goroutines := runtime.NumGoroutine()
	round := func(r int) {
		for i := range 400 {
			for _, addr := range []net.Addr{s.Addr(), s.DTLSAddr()} {
				c, err := net.DialUDP("udp", nil, addr.(*net.UDPAddr))
				if err != nil {
					t.Fatal(err)
				}
				for j := range 3 {
					_, _ = c.Write(garbage[(r*1200+i*3+j)%len(garbage)])
				}
				_, _ = c.Write(hello)
				_ = c.Close()
			}
		}
	}
	round(0)
	round(1)
	base := heap()
	for r := 2; r < 10; r++ {
		round(r)
	}
	// Handshakes in progress are bounded by MaxDTLSPeers (a few
	// goroutines each), not by the 3,200 sources.
	if n := runtime.NumGoroutine(); n > goroutines+32*8 {
		t.Fatalf("%d goroutines after the rounds, %d before", n, goroutines)
	}
	// The last stalled handshakes end by the timeout.
	eventually(t, 10*time.Second, "stalled handshakes to end", func() bool {
		return runtime.NumGoroutine() <= goroutines+2
	})
	if grown := int64(heap()) - int64(base); grown > 2<<20 {
		t.Fatalf("heap grew by %d bytes over 3,200 hostile sources", grown)
	}
	// And a device still gets through.
	if r := request(t, dialDTLS(t, s, "id-1", testDevices["id-1"].key), message.Confirmable, codes.POST, "/hb"); r.code != codes.Changed {
		t.Fatalf("after hostile sources: %v", r.code)
	}
}
