package adapter_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/fleetgate/fleetgate/gateway"
	"github.com/fleetgate/fleetgate/gateway/gatewaytest"
	"github.com/fleetgate/fleetgate/internal/buildtest"
	"github.com/fleetgate/fleetgate/protocols/adapter"
)

// TestDataReachesTheSink: udpline's heartbeats with data become messages
// of their devices for the data sink (source: the adapter's name), and
// evidence of their sessions, in the order the lines came: dev-1's data
// renews its session before its leave ends it.
func TestDataReachesTheSink(t *testing.T) {
	sink := &gatewaytest.DataSink{}
	e := newHost(t, func(o *adapter.Options) { o.Data = sink })
	addr := freeUDP(t)
	if err := e.host.Apply(ctx(t), []adapter.Spec{udpSpec("legacy", addr)}); err != nil {
		t.Fatal(err)
	}
	sendLine(t, addr, "hb dev-1 radio1 >telemetry/temp 21.5 C\nbye dev-1 radio1\nhb dev-2 > on\n")
	waitFor(t, 5*time.Second, "two messages", func() bool { return len(sink.Messages()) == 2 })
	now := e.clock.Now()
	got := map[gateway.DeviceID]gateway.Message{}
	for _, m := range sink.Messages() {
		got[m.Device] = m
	}
	if m := got["dev-1"]; m.Topic != "telemetry/temp" || string(m.Payload) != "21.5 C" || m.QoS != 0 || m.Source != "legacy" ||
		m.ContentType != "" || now.Sub(m.Received) > time.Second || m.Received.After(now) {
		t.Errorf("dev-1's message = %+v", m)
	}
	if m := got["dev-2"]; m.Topic != "" || string(m.Payload) != "on" {
		t.Errorf("dev-2's message = %+v", m)
	}
	evs := e.rec.Evidence()
	if len(evs) != 3 || evs[0].Device != "dev-1" || evs[0].Kind != gateway.Renew || evs[0].Session != "legacy/radio1" ||
		evs[1].Kind != gateway.Leave || evs[2].Device != "dev-2" || evs[2].Kind != gateway.Renew {
		t.Fatalf("evidence %+v: want dev-1's renewal, its leave, dev-2's renewal", evs)
	}
	if st := e.status(t, "legacy"); st.DataPublished != 2 || st.Accepted != 3 {
		t.Fatalf("status %+v: want 2 published, 3 accepted", st)
	}
}

// rawFrame is the rawadapter's config for the items of a frame in
// protobuf JSON.
func rawFrame(t *testing.T, items ...string) []byte {
	t.Helper()
	b, err := json.Marshal(map[string]json.RawMessage{"frame": json.RawMessage(`{"evidence": [` + strings.Join(items, ",") + `]}`)})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestDataItemsCheckedAsAWhole runs an adapter that sends what the SDK
// never would: data with a wildcard topic, on a leave, of QoS 2, for a
// device outside its devices, and beyond its data_bytes_per_second. Each
// item is judged whole, counted, and its QoS 1 data settled with the
// outcome; data beyond the byte rate is dropped while its evidence
// counts; QoS 0 data is never settled.
func TestDataItemsCheckedAsAWhole(t *testing.T) {
	var path string
	if err := buildtest.Build(t.TempDir(), map[string]*string{"github.com/fleetgate/fleetgate/protocols/adapter/testdata/rawadapter": &path}); err != nil {
		t.Fatal(err)
	}
	config := rawFrame(t,
		`{"kind": "KIND_RENEW", "device": "raw-a", "data": {"id": 1, "qos": 1, "topic": "t/+"}}`,
		`{"kind": "KIND_LEAVE", "device": "raw-b", "data": {"id": 2, "qos": 1}}`,
		`{"kind": "KIND_RENEW", "device": "other-1", "data": {"id": 3, "qos": 1}}`,
		`{"kind": "KIND_RENEW", "device": "raw-c", "data": {"id": 4, "qos": 1, "payload": "b2s="}}`,
		`{"kind": "KIND_RENEW", "device": "raw-c", "data": {"payload": "emVybw=="}}`,
		`{"kind": "KIND_RENEW", "device": "raw-d", "data": {"id": 6, "qos": 2}}`,
		`{"kind": "KIND_CONNECT", "device": "raw-e", "data": {"id": 7, "qos": 1, "payload": "`+strings.Repeat("A", 136)+`"}}`,
	)
	spec := adapter.Spec{Name: "raw", Path: path, StartTimeout: 10 * time.Second, Devices: []string{"raw-*"}, Config: config,
		DataBytesPerSecond: 200}
	sink := &gatewaytest.DataSink{}
	e := newHost(t, func(o *adapter.Options) { o.Data = sink })
	if err := e.host.Apply(ctx(t), []adapter.Spec{spec}); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"settled 1 OUTCOME_REJECTED data: invalid message",
		"settled 2 OUTCOME_REJECTED data on a leave",
		"settled 3 OUTCOME_REFUSED the adapter may not speak for other-1",
		"settled 4 OUTCOME_DURABLE",
		"settled 6 OUTCOME_REJECTED data qos 2",
		"settled 7 OUTCOME_DROPPED beyond the adapter's data_bytes_per_second",
	} {
		waitFor(t, 5*time.Second, want, func() bool { return strings.Contains(e.logs.String(), want) })
	}
	if strings.Contains(e.logs.String(), "settled 0 ") {
		t.Error("a QoS 0 item was settled")
	}
	st := e.status(t, "raw")
	if st.Accepted != 3 || st.Rejected != 3 || st.Refused != 1 || st.DataPublished != 2 || st.DataRejected != 3 ||
		st.DataRefused != 1 || st.DataDropped != 1 {
		t.Fatalf("status %+v: want evidence 3 accepted, 3 rejected, 1 refused; data 2 published, 3 rejected, 1 refused, 1 dropped", st)
	}
	if e.count("raw-e", gateway.Connect) != 1 || len(sink.Messages()) != 2 {
		t.Fatalf("evidence %v, messages %v: want raw-e's connect counted without its data, raw-c's two messages", e.rec.Evidence(), sink.Messages())
	}

	// Without a data path: discarded, and settled so.
	e2 := newHost(t, nil)
	spec.Config = rawFrame(t, `{"kind": "KIND_RENEW", "device": "raw-c", "data": {"id": 9, "qos": 1, "payload": "b2s="}}`)
	if err := e2.host.Apply(ctx(t), []adapter.Spec{spec}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 5*time.Second, "the discarded settlement", func() bool {
		return strings.Contains(e2.logs.String(), "settled 9 OUTCOME_DISCARDED the gateway has no data path")
	})
	if st := e2.status(t, "raw"); st.DataDiscarded != 1 || st.Accepted != 1 {
		t.Fatalf("status %+v: want 1 discarded, its evidence accepted", st)
	}
}

// device is a UDP endpoint that speaks udpline's lines.
type device struct {
	t    *testing.T
	pc   net.PacketConn
	to   net.Addr
	name string
}

func newDevice(t *testing.T, name, adapterAddr string) *device {
	t.Helper()
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pc.Close() })
	to, err := net.ResolveUDPAddr("udp", adapterAddr)
	if err != nil {
		t.Fatal(err)
	}
	return &device{t: t, pc: pc, to: to, name: name}
}

func (d *device) say(line string) {
	d.t.Helper()
	if _, err := d.pc.WriteTo([]byte(line+"\n"), d.to); err != nil {
		d.t.Fatal(err)
	}
}

// next returns the next line the device gets within limit, "" if none.
func (d *device) next(limit time.Duration) string {
	d.t.Helper()
	buf := make([]byte, 65536)
	if err := d.pc.SetReadDeadline(time.Now().Add(limit)); err != nil {
		d.t.Fatal(err)
	}
	n, _, err := d.pc.ReadFrom(buf)
	if err != nil {
		return ""
	}
	return string(buf[:n])
}

func command(dev, topic, payload string) gateway.Message {
	return gateway.Message{Device: gateway.DeviceID(dev), Topic: topic, Payload: []byte(payload), QoS: 1, Source: "upstream"}
}

// TestCommandsReachTheDevice: commands pending for a device udpline has
// heard reach it as lines at its address and are acknowledged; a command
// submitted before its device is heard goes once it is; one the adapter
// refuses stays pending, is tried again CommandRetry later (on the
// host's clock) and not after it expired; a device that left, and one of
// the devices file, get none.
func TestCommandsReachTheDevice(t *testing.T) {
	cmds := &gatewaytest.Commands{}
	e := newHost(t, func(o *adapter.Options) {
		o.HealthInterval = time.Hour // only the retry timer runs on the clock
		o.Commands = cmds
	})
	addr := freeUDP(t)
	if err := e.host.Apply(ctx(t), []adapter.Spec{udpSpec("legacy", addr)}); err != nil {
		t.Fatal(err)
	}
	d1 := newDevice(t, "dev-1", addr)
	d1.say("hb dev-1")
	waitFor(t, 5*time.Second, "dev-1's heartbeat", func() bool { return e.count("dev-1", gateway.Renew) == 1 })
	c1 := cmds.Add(command("dev-1", "cmd/reboot", "now"), time.Time{})
	if got := d1.next(5 * time.Second); got != "cmd dev-1 >cmd/reboot now\n" {
		t.Fatalf("dev-1 got %q", got)
	}
	waitFor(t, 5*time.Second, "the acknowledgement", func() bool { return slices.Equal(cmds.Acks(), []gatewaytest.AckCall{{Device: "dev-1", ID: c1.ID}}) })

	// Submitted before dev-2 is heard: delivered when it is.
	c2 := cmds.Add(command("dev-2", "cmd", "hello"), time.Time{})
	d2 := newDevice(t, "dev-2", addr)
	d2.say("hb dev-2")
	if got := d2.next(5 * time.Second); got != "cmd dev-2 >cmd hello\n" {
		t.Fatalf("dev-2 got %q", got)
	}
	waitFor(t, 5*time.Second, "the acknowledgement", func() bool { return len(cmds.Acks()) == 2 && cmds.Acks()[1].ID == c2.ID })

	// Refused (a line break): pending, tried again, until it expires.
	cmds.Add(command("dev-1", "cmd", "two\nlines"), e.clock.Now().Add(15*time.Second))
	waitFor(t, 5*time.Second, "the refusal", func() bool { return e.status(t, "legacy").CommandsRefused == 1 })
	waitFor(t, 5*time.Second, "the retry timer", func() bool { return e.clock.Timers() == 2 }) // health and retry
	e.clock.Advance(adapter.CommandRetry)
	waitFor(t, 5*time.Second, "the second refusal", func() bool { return e.status(t, "legacy").CommandsRefused == 2 })
	if len(cmds.Held("dev-1")) != 1 {
		t.Fatal("the refused command is not pending")
	}
	waitFor(t, 5*time.Second, "the retry timer", func() bool { return e.clock.Timers() == 2 })
	e.clock.Advance(adapter.CommandRetry) // past its expiry
	waitFor(t, 5*time.Second, "the retry timer to fire", func() bool { return e.clock.Timers() == 1 })
	if st := e.status(t, "legacy"); st.CommandsRefused != 2 || st.CommandsDelivered != 2 || st.CommandsFailed != 0 {
		t.Fatalf("status %+v: want 2 delivered, 2 refused (none after the expiry)", st)
	}

	// dev-2 leaves: its commands wait.
	d2.say("bye dev-2")
	waitFor(t, 5*time.Second, "dev-2's leave", func() bool { return e.count("dev-2", gateway.Leave) == 1 })
	cmds.Add(command("dev-2", "cmd", "late"), time.Time{})
	if got := d2.next(500 * time.Millisecond); got != "" || len(cmds.Held("dev-2")) != 1 {
		t.Fatalf("dev-2 got %q after its leave (pending %d)", got, len(cmds.Held("dev-2")))
	}

	// dev-1 joins the devices file: no adapter speaks for it.
	e.host.SetCredentials(gatewaytest.NewCredentials(devicesFile(t, "dev-1")))
	cmds.Add(command("dev-1", "cmd", "mine?"), time.Time{})
	if got := d1.next(500 * time.Millisecond); got != "" {
		t.Fatalf("dev-1 got %q while the devices file lists it", got)
	}
}

// lorawanSpec runs lorawan on addr for devices "lora-*".
func lorawanSpec(addr string) adapter.Spec {
	return adapter.Spec{Name: "lora", Path: lorawan, StartTimeout: 10 * time.Second, Devices: []string{"lora-*"},
		Config: []byte(fmt.Sprintf(`{"listen": %q, "secret": "k", "prefix": "lora-"}`, addr))}
}

// postUplink posts a ChirpStack uplink of port 1 with payload 0x04 for
// lora-<eui> and returns the answer's status, or an error.
func postUplink(addr, eui string) (int, error) {
	body := `{"deviceInfo": {"devEui": "` + eui + `"}, "fPort": 1, "fCnt": 4, "data": "BA=="}`
	req, err := http.NewRequest("POST", "http://"+addr+"/chirpstack?event=up", strings.NewReader(body))
	if err != nil {
		return 0, err
	}
	req.Header.Set("X-Fleetgate-Secret", "k")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, err
	}
	resp.Body.Close()
	return resp.StatusCode, nil
}

// TestQoS1DataAnsweredAfterTheSink: lorawan answers a network server's
// uplink only once the host's data sink has taken its data (QoS 1): not
// while Publish waits for its disk; 204 after; 503 when the sink fails
// (the network server may send it again); 204 with no data path, the
// uplink counted as evidence.
func TestQoS1DataAnsweredAfterTheSink(t *testing.T) {
	sink := &gatewaytest.DataSink{}
	e := newHost(t, func(o *adapter.Options) { o.Data = sink })
	addr := freeTCP(t)
	if err := e.host.Apply(ctx(t), []adapter.Spec{lorawanSpec(addr)}); err != nil {
		t.Fatal(err)
	}
	release := sink.Hold()
	answer := make(chan int, 1)
	go func() {
		code, err := postUplink(addr, "0101010101010101")
		if err != nil {
			t.Error(err)
		}
		answer <- code
	}()
	select {
	case <-sink.Began():
	case <-time.After(5 * time.Second):
		t.Fatal("timed out after 5s waiting for the Publish call")
	}
	select {
	case code := <-answer:
		t.Fatalf("answered %d while the sink had not taken the data", code)
	case <-time.After(300 * time.Millisecond):
	}
	release()
	if code := <-answer; code != http.StatusNoContent {
		t.Fatalf("answered %d once taken, want 204", code)
	}
	msgs := sink.Messages()
	if len(msgs) != 1 || msgs[0].Device != "lora-0101010101010101" || msgs[0].Topic != "up/1" || string(msgs[0].Payload) != "\x04" ||
		msgs[0].QoS != 1 || msgs[0].ContentType != "application/octet-stream" || msgs[0].Source != "lora" ||
		len(msgs[0].Properties) != 1 || msgs[0].Properties[0] != (gateway.Property{Key: "f_cnt", Value: "4"}) {
		t.Fatalf("messages %+v", msgs)
	}
	if e.count("lora-0101010101010101", gateway.Renew) != 1 {
		t.Fatalf("evidence %v: want the uplink's renewal", e.rec.Evidence())
	}

	sink.Fail(errors.New("queue: disk full"))
	if code, err := postUplink(addr, "0101010101010101"); err != nil || code != http.StatusServiceUnavailable {
		t.Fatalf("with a failing sink: %d, %v; want 503", code, err)
	}
	if st := e.status(t, "lora"); st.DataPublished != 1 || st.DataFailed != 1 || st.Accepted != 2 {
		t.Fatalf("status %+v: want 1 published, 1 failed, both uplinks' evidence accepted", st)
	}

	e2 := newHost(t, nil)
	addr2 := freeTCP(t)
	if err := e2.host.Apply(ctx(t), []adapter.Spec{lorawanSpec(addr2)}); err != nil {
		t.Fatal(err)
	}
	if code, err := postUplink(addr2, "0101010101010101"); err != nil || code != http.StatusNoContent {
		t.Fatalf("without a data path: %d, %v; want 204", code, err)
	}
	if st := e2.status(t, "lora"); st.DataDiscarded != 1 || st.Accepted != 1 {
		t.Fatalf("status %+v: want 1 discarded, its evidence accepted", st)
	}
}

func freeTCP(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// TestCommandsBeyondMaxWatched: of more live devices than the host waits
// for, the ones beyond MaxWatched get their commands too, looked for
// every CommandRetry (on the host's clock).
func TestCommandsBeyondMaxWatched(t *testing.T) {
	cmds := &gatewaytest.Commands{}
	e := newHost(t, func(o *adapter.Options) {
		o.HealthInterval = time.Hour
		o.Commands = cmds
	})
	addr := freeUDP(t)
	if err := e.host.Apply(ctx(t), []adapter.Spec{udpSpec("legacy", addr)}); err != nil {
		t.Fatal(err)
	}
	const n = adapter.MaxWatched + 1
	e.renewMany(t, "legacy", addr, n)
	// The live devices are known to the delivery loop once the clock has
	// its look-again timer (health and poll).
	waitFor(t, 10*time.Second, "the poll timer", func() bool { return e.clock.Timers() == 2 })
	start := time.Now()
	for i := range n {
		cmds.Add(command(fmt.Sprintf("r-%d", i), "cmd", "x"), time.Time{})
	}
	waitFor(t, 30*time.Second, "the watched devices' commands", func() bool { return e.status(t, "legacy").CommandsDelivered == n-1 })
	t.Logf("%d commands, one per watched device, delivered in %s", n-1, time.Since(start).Round(time.Millisecond))
	time.Sleep(200 * time.Millisecond)
	if d := e.status(t, "legacy").CommandsDelivered; d != n-1 {
		t.Fatalf("%d delivered before the poll, want %d (one device is beyond MaxWatched)", d, n-1)
	}
	e.clock.Advance(adapter.CommandRetry)
	waitFor(t, 10*time.Second, "the polled device's command", func() bool { return e.status(t, "legacy").CommandsDelivered == n })
}
