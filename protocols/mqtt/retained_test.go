package mqtt

import (
	"fmt"
	"runtime"
	"testing"
	"time"

	"github.com/mochi-mqtt/server/v2/packets"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/fleetgate/fleetgate/gateway"
)

// publish sends a PUBLISH of MQTT 5 (version 5) or 3.1.1 (4).
func (r *raw) publish(version byte, qos byte, retain bool, id uint16, topic string, payload []byte) {
	r.t.Helper()
	r.send(encode(r.t, packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Publish, Qos: qos, Retain: retain},
		ProtocolVersion: version, PacketID: id, TopicName: topic, Payload: payload}))
}

// ack reads packets until one of type typ (skipping others) and returns
// its MQTT 5 reason code (0 when the packet carries none): the byte after
// the packet ID, or the first of a DISCONNECT; ok is false when the
// connection ended first.
func (r *raw) ack(typ byte) (code byte, ok bool) {
	r.t.Helper()
	for {
		got, body, ok := r.readPacket(10 * time.Second)
		switch {
		case !ok:
			return 0, false
		case got != typ:
			continue
		case typ == packets.Disconnect && len(body) > 0:
			return body[0], true
		case len(body) > 2:
			return body[2], true
		}
		return 0, true
	}
}

// heapAfterGC is the live heap, in bytes, after a collection.
func heapAfterGC() uint64 {
	var m runtime.MemStats
	runtime.GC()
	runtime.GC()
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}

// Attack: 2,000 retained 16 KiB PUBLISHes from one anonymous device. The
// broker kept every one for 24 h: the heap grew by about the 33 MB of
// payloads, and stayed so after the device left. Now the device's
// messages are bounded (limits.mqtt_max_retained_bytes_per_device, 64 KiB
// by default: three of them), the others get PUBACK "quota exceeded", and
// the heap after the device left has grown by far less than the flood.
func TestRetainedFloodBounded(t *testing.T) {
	s := startServer(t, &recorder{}, Options{AllowAnonymous: true, Registerer: prometheus.NewRegistry()})
	before := heapAfterGC()
	r := dialRaw(t, tcpAddr(s))
	if code := r.connack(connectPacket(t, 5, "flood", "", 30)); code != 0 {
		t.Fatalf("connack %#x", code)
	}
	payload := make([]byte, 16<<10)
	accepted, refused := 0, 0
	for i := range 2000 {
		r.publish(5, 1, true, uint16(i%60000+1), fmt.Sprintf("devices/flood/t%d", i), payload)
		code, ok := r.ack(packets.Puback)
		switch {
		case !ok:
			t.Fatalf("connection ended at publish %d", i)
		case code == 0:
			accepted++
		case code == packets.ErrQuotaExceeded.Code:
			refused++
		default:
			t.Fatalf("publish %d: PUBACK %#x", i, code)
		}
	}
	_ = r.Close()
	eventually(t, 5*time.Second, "the device gone", func() bool { return s.conns.Load() == 0 })
	after := heapAfterGC()
	kept, _ := devicesRetained(s)
	t.Logf("2,000 retained 16 KiB publishes: %d accepted, %d refused; %d kept; heap %.1f MB before, %.1f MB after the device left",
		accepted, refused, kept, float64(before)/1e6, float64(after)/1e6)
	if want := DefaultRetainedBytesPerDevice / (16<<10 + retainedOverhead + len("devices/flood/t0")); accepted != want || kept != want {
		t.Fatalf("%d accepted, %d kept, want %d", accepted, kept, want)
	}
	if grew := int64(after) - int64(before); grew > 4<<20 {
		t.Fatalf("heap grew by %d bytes, want at most 4 MiB", grew)
	}
	if n := value(t, s.metrics.retainedRefused); n != float64(refused) {
		t.Fatalf("retained refusals counted %v, want %d", n, refused)
	}
}

// Each protocol and QoS is told "quota exceeded" its own way; a replaced
// or deleted message frees its place; other devices are not affected;
// anonymous devices together hold at most a quarter of all; a retained
// will beyond the quota is sent but not retained.
func TestRetainedQuotaAnswers(t *testing.T) {
	creds := testCreds(t)
	s := startServer(t, &recorder{}, Options{Credentials: creds, AllowAnonymous: true, Registerer: prometheus.NewRegistry(),
		RetainedPerDevice: 2, RetainedBytesPerDevice: 4 * retainedOverhead, RetainedBytes: 9 * retainedOverhead})
	addr := tcpAddr(s)
	small := []byte("21.5")
	r := dialRaw(t, addr)
	if code := r.connack(connectPacket(t, 5, "dev-1", "secret-1", 30)); code != 0 {
		t.Fatalf("connack %#x", code)
	}
	for i := range 2 {
		r.publish(5, 1, true, uint16(i+1), fmt.Sprintf("devices/dev-1/t%d", i), small)
		if code, _ := r.ack(packets.Puback); code != 0 {
			t.Fatalf("retained %d: PUBACK %#x", i, code)
		}
	}
	r.publish(5, 1, true, 3, "devices/dev-1/t2", small)
	if code, _ := r.ack(packets.Puback); code != packets.ErrQuotaExceeded.Code {
		t.Fatalf("third retained, QoS 1: PUBACK %#x, want quota exceeded", code)
	}
	r.publish(5, 2, true, 4, "devices/dev-1/t2", small)
	if code, _ := r.ack(packets.Pubrec); code != packets.ErrQuotaExceeded.Code {
		t.Fatalf("third retained, QoS 2: PUBREC %#x, want quota exceeded", code)
	}
	r.publish(5, 1, true, 5, "devices/dev-1/t0", []byte("22.0")) // replaces: no new place
	if code, _ := r.ack(packets.Puback); code != 0 {
		t.Fatalf("replacing a retained message: PUBACK %#x", code)
	}
	r.publish(5, 1, true, 6, "devices/dev-1/t1", nil) // deletes
	r.publish(5, 1, true, 7, "devices/dev-1/t2", small)
	r.ack(packets.Puback)
	if code, _ := r.ack(packets.Puback); code != 0 {
		t.Fatalf("retained after a delete freed a place: PUBACK %#x", code)
	}
	r.publish(5, 1, false, 8, "devices/dev-1/t3", small) // not retained: no quota
	if code, _ := r.ack(packets.Puback); code != 0 {
		t.Fatalf("a message that is not retained: PUBACK %#x", code)
	}
	r.publish(5, 0, true, 0, "devices/dev-1/t3", small)
	if code, ok := r.ack(packets.Disconnect); !ok || code != packets.ErrQuotaExceeded.Code {
		t.Fatalf("third retained, QoS 0: DISCONNECT %#x (%v), want quota exceeded", code, ok)
	}

	// 3.1.1 cannot be told: the connection ends.
	r3 := dialRaw(t, addr)
	if code := r3.connack(connectPacket(t, 4, "dev-1", "secret-1", 30)); code != 0 {
		t.Fatalf("connack %#x", code)
	}
	r3.publish(4, 1, true, 1, "devices/dev-1/t3", small)
	if !r3.closedWithin(5 * time.Second) {
		t.Fatal("3.1.1 retained beyond the quota: the connection was kept")
	}

	// Another listed device has its own quota; anonymous devices share a
	// quarter of the total (two messages here), whatever their number.
	r2 := dialRaw(t, addr)
	if code := r2.connack(connectPacket(t, 5, "dev-2", "secret-2", 30)); code != 0 {
		t.Fatalf("connack %#x", code)
	}
	r2.publish(5, 1, true, 1, "devices/dev-2/t", small)
	if code, _ := r2.ack(packets.Puback); code != 0 {
		t.Fatalf("dev-2: PUBACK %#x", code)
	}
	for i, want := range []byte{0, 0, packets.ErrQuotaExceeded.Code} {
		a := dialRaw(t, addr)
		dev := fmt.Sprintf("anon-%d", i)
		if code := a.connack(connectPacket(t, 5, dev, "", 30)); code != 0 {
			t.Fatalf("connack %#x", code)
		}
		a.publish(5, 1, true, 1, "devices/"+dev+"/t", small)
		if code, _ := a.ack(packets.Puback); code != want {
			t.Fatalf("anonymous device %d: PUBACK %#x, want %#x", i, code, want)
		}
	}

	// A retained will beyond the quota is published, not retained.
	w := dialRaw(t, addr)
	will := packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Connect}, ProtocolVersion: 5,
		Connect: packets.ConnectParams{ProtocolName: []byte("MQTT"), Clean: true, Keepalive: 30, ClientIdentifier: "anon-3",
			WillFlag: true, WillRetain: true, WillTopic: "devices/anon-3/status", WillPayload: []byte("gone")}}
	if code := w.connack(encode(t, will)); code != 0 {
		t.Fatalf("connack %#x", code)
	}
	_ = w.Close()
	eventually(t, 5*time.Second, "the will counted as refused", func() bool { return value(t, s.metrics.retainedRefused) == 6 })
	if _, ok := s.broker.Topics.Retained.Get("devices/anon-3/status"); ok {
		t.Fatal("a retained will beyond the quota was retained")
	}
	if _, want := devicesRetained(s); s.retained.usage() != want {
		t.Fatalf("accounted %d bytes, the broker holds %d", s.retained.usage(), want)
	}
}

// devicesRetained counts the broker's retained messages of devices (not
// its own $SYS ones) and what they count against the quota.
func devicesRetained(s *Server) (n, bytes int) {
	for topic, pk := range s.broker.Topics.Retained.GetAll() {
		if s.deviceOf(topic) != "" {
			n++
			bytes += len(topic) + len(pk.Payload) + retainedOverhead
		}
	}
	return n, bytes
}

// A device removed from the devices file loses its retained messages at
// the reload, and so does an anonymous device that became listed (a
// stranger's messages must not greet the real device); the others keep
// theirs. DropRetained drops them for a command that forgets a device.
func TestRetainedDroppedWithTheDevice(t *testing.T) {
	creds := testCreds(t)
	s := startServer(t, &recorder{}, Options{Credentials: creds, AllowAnonymous: true, Registerer: prometheus.NewRegistry()})
	for _, d := range []struct{ device, password string }{{"dev-1", "secret-1"}, {"dev-2", "secret-2"}, {"anon", ""}, {"other", ""}} {
		r := dialRaw(t, tcpAddr(s))
		if code := r.connack(connectPacket(t, 5, d.device, d.password, 30)); code != 0 {
			t.Fatalf("%s: connack %#x", d.device, code)
		}
		for i := range 2 {
			r.publish(5, 1, true, uint16(i+1), fmt.Sprintf("devices/%s/t%d", d.device, i), []byte("x"))
			if code, _ := r.ack(packets.Puback); code != 0 {
				t.Fatalf("%s: PUBACK %#x", d.device, code)
			}
		}
		_ = r.Close()
	}
	next := bcryptCreds{"dev-2": creds["dev-2"], "anon": newCreds(t, map[gateway.DeviceID]string{"anon": "now-listed"})["anon"]}
	s.SetCredentials(next)
	for device, want := range map[string]bool{"dev-1": false, "dev-2": true, "anon": false, "other": true} {
		if _, ok := s.broker.Topics.Retained.Get("devices/" + device + "/t0"); ok != want {
			t.Errorf("%s: retained kept %v, want %v", device, ok, want)
		}
	}
	if n := s.DropRetained("other"); n != 2 {
		t.Fatalf("DropRetained(other) = %d, want 2", n)
	}
	if n, bytes := devicesRetained(s); n != 2 || s.retained.usage() != bytes {
		t.Fatalf("%d retained left (%d bytes accounted, %d held), want dev-2's 2", n, s.retained.usage(), bytes)
	}
}

// Attack: a device subscribed to its own subtree publishes QoS 1 to it
// and never acknowledges what the broker sends back. The broker held up
// to 256 such messages for it (each up to limits.mqtt_max_packet_size),
// also for a persistent session while its client was away. Now it holds
// at most limits.mqtt_max_inflight (32 by default).
func TestInflightBounded(t *testing.T) {
	s := startServer(t, &recorder{}, Options{AllowAnonymous: true, Registerer: prometheus.NewRegistry()})
	r := dialRaw(t, tcpAddr(s))
	if code := r.connack(connectPacket(t, 5, "hoarder", "", 30)); code != 0 {
		t.Fatalf("connack %#x", code)
	}
	r.send(encode(t, packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Subscribe, Qos: 1}, ProtocolVersion: 5, PacketID: 1,
		Filters: packets.Subscriptions{{Filter: "devices/hoarder/#", Qos: 1}}}))
	r.ack(packets.Suback)
	for i := range 300 {
		r.publish(5, 1, false, uint16(i+2), "devices/hoarder/t", []byte("x"))
		r.ack(packets.Puback) // the broker's PUBLISHes to it are read and never acknowledged
	}
	cl, ok := s.broker.Clients.Get("hoarder")
	if !ok {
		t.Fatal("client gone")
	}
	// mochi holds the PUBACK of the client's last publish in the same
	// store for a moment after sending it: wait for it to go (what is held
	// for a client that never acknowledges stays)
	n := cl.State.Inflight.Len()
	for i := 0; n > DefaultMaxInflight && i < 100; i++ {
		time.Sleep(10 * time.Millisecond)
		n = cl.State.Inflight.Len()
	}
	if n > DefaultMaxInflight {
		t.Fatalf("%d messages held for one client, want at most %d", n, DefaultMaxInflight)
	}
}

// The quota's arithmetic: per device by count and bytes, in all, and the
// anonymous devices' share of all.
func TestRetainedQuotaBounds(t *testing.T) {
	const msg = 1 + 1 + retainedOverhead // topic "t" and one byte
	q := newRetainedQuota(2, 3*msg, 5*msg)
	for i, c := range []struct {
		device gateway.DeviceID
		anon   bool
		topic  string
		n      int
		want   bool
	}{
		{"a", false, "t", 1, true},
		{"a", false, "u", 1, true},
		{"a", false, "v", 1, false}, // a's count
		{"a", false, "t", 1 + msg, true},
		{"a", false, "u", 1 + msg, false}, // a's bytes
		{"b", false, "t", 1, true},
		{"c", true, "t", 1, true},
		{"d", true, "t", 1, false},  // the anonymous share: 5*msg/4
		{"b", false, "u", 1, false}, // all: 2*msg + msg + msg + msg
		{"a", false, "t", 0, true},  // deleted
		{"b", false, "u", 1, true},
	} {
		if _, got := q.retain(c.device, c.anon, c.topic, c.n); got != c.want {
			t.Fatalf("step %d: retain(%s, %s, %d) = %v, want %v", i, c.device, c.topic, c.n, got, c.want)
		}
	}
	if q.usage() != 4*msg {
		t.Fatalf("usage %d, want %d", q.usage(), 4*msg)
	}
	q.expired("b", "t")
	if topics := q.forget("a"); len(topics) != 1 || topics[0] != "u" || q.usage() != 2*msg {
		t.Fatalf("forget(a) = %v, usage %d, want [u] and %d", topics, q.usage(), 2*msg)
	}
}
