package bridge_test

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/autopaho"
	"github.com/eclipse/paho.golang/paho"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/fleetgate/fleetgate/bridge"
	"github.com/fleetgate/fleetgate/gateway"
	"github.com/fleetgate/fleetgate/gateway/clocktest"
	"github.com/fleetgate/fleetgate/queue/diskq"
)

// publish publishes payload on topic at QoS 1 from pub.
func publish(t testing.TB, pub *autopaho.ConnectionManager, topic, payload string, props ...paho.UserProperty) {
	t.Helper()
	p := &paho.Publish{Topic: topic, QoS: 1, Payload: []byte(payload)}
	if len(props) > 0 {
		p.Properties = &paho.PublishProperties{ContentType: "application/json", User: props}
	}
	if _, err := pub.Publish(t.Context(), p); err != nil {
		t.Fatal(err)
	}
}

// payloads lists the topics and payloads of commands.
func payloads(cmds []gateway.Command) []string {
	var out []string
	for _, c := range cmds {
		out = append(out, c.Topic+":"+string(c.Payload))
	}
	return out
}

// Commands down end to end: a command published upstream on
// <prefix>/devices/<id>/cmd/... wakes the device's Wait and is pending
// (MQTT 5: with its content type and user properties) until a front end
// acknowledges it, which removes it from the queue. A command whose
// device ID is invalid is dropped and counted, not redelivered.
func TestCommandsFromUpstream(t *testing.T) {
	for _, version := range []byte{5, 4} {
		t.Run("v"+string('0'+version), func(t *testing.T) {
			br := startBroker(t)
			reg := prometheus.NewRegistry()
			commands := diskQueue(t, t.TempDir(), "commands")
			b := startBridge(t, bridge.Options{URL: brokerURL(br), ClientID: "c", TopicPrefix: "fg", Down: true,
				ProtocolVersion: version, Registerer: reg,
				Durable: memQueue(t, nil), Memory: memQueue(t, nil), Commands: commands})
			await(t, 10*time.Second, "subscribed", func() bool { return b.Status().Upstream.Subscribed })
			wait := b.Wait("d1")
			pub := publisher(t, br)
			publish(t, pub, "fg/devices/bad*id/cmd", "x")
			publish(t, pub, "fg/devices/d1/cmd/reboot", `{"in":5}`, paho.UserProperty{Key: "k", Value: "v"})
			publish(t, pub, "fg/devices/d1/cmd", "bare")
			select {
			case <-wait:
			case <-time.After(10 * time.Second):
				t.Fatal("Wait did not fire")
			}
			await(t, 10*time.Second, "both pending", func() bool { return len(b.Pending("d1", time.Now(), 10)) == 2 })
			p := b.Pending("d1", time.Now(), 10)
			if got := payloads(p); !slices.Equal(got, []string{`cmd/reboot:{"in":5}`, "cmd:bare"}) {
				t.Fatalf("pending %v", got)
			}
			c := p[0]
			if c.Source != "upstream" || c.QoS != 1 || c.ID >= p[1].ID || !c.Expires.Equal(c.Received.Add(bridge.DefaultCommandTTL)) {
				t.Errorf("command %+v", c)
			}
			if version == 5 && (c.ContentType != "application/json" || !slices.Equal(c.Properties, []gateway.Property{{Key: "k", Value: "v"}})) {
				t.Errorf("MQTT 5 properties not kept: %q %v", c.ContentType, c.Properties)
			}
			if got := b.Pending("d1", time.Now(), 1); len(got) != 1 || got[0].ID != c.ID {
				t.Errorf("Pending(n=1) = %v", payloads(got))
			}
			if err := b.Ack("d1", c.ID); err != nil {
				t.Fatal(err)
			}
			if err := b.Ack("d2", p[1].ID); err != nil { // another device's: ignored
				t.Fatal(err)
			}
			if got := payloads(b.Pending("d1", time.Now(), 10)); !slices.Equal(got, []string{"cmd:bare"}) {
				t.Errorf("after Ack pending %v", got)
			}
			if n := commands.Stats().Messages; n != 1 {
				t.Errorf("commands queue holds %d, want 1", n)
			}
			if v := metric(t, reg, "fleetgate_bridge_dropped_total", "queue", "commands", "reason", "invalid"); v != 1 {
				t.Errorf("dropped invalid = %v, want 1", v)
			}
			if v := metric(t, reg, "fleetgate_bridge_messages_in_total", "direction", "down", "source", "upstream"); v != 2 {
				t.Errorf("messages in (down) = %v, want 2", v)
			}
			if v := metric(t, reg, "fleetgate_bridge_messages_out_total", "direction", "down", "source", "upstream"); v != 1 {
				t.Errorf("messages out (down) = %v, want 1", v)
			}
			if s := b.Status(); s.PendingCommands != 1 || s.PendingDevices != 1 {
				t.Errorf("Status: %d pending for %d devices", s.PendingCommands, s.PendingDevices)
			}
		})
	}
}

var start = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

// A command expires CommandTTL after it was received: Pending leaves it
// out from then, and the bridge removes it from the queue then, on its
// clock.
func TestCommandsExpire(t *testing.T) {
	clock := clocktest.New(start)
	commands := memQueue(t, clock)
	reg := prometheus.NewRegistry()
	b := startBridge(t, bridge.Options{Commands: commands, CommandTTL: time.Hour, Clock: clock, Registerer: reg})
	c1, err := b.Submit(t.Context(), gateway.Message{Device: "d1", Topic: "cmd/a", Source: "local-client"})
	if err != nil {
		t.Fatal(err)
	}
	if !c1.Received.Equal(start) || !c1.Expires.Equal(start.Add(time.Hour)) {
		t.Errorf("command received %v expires %v", c1.Received, c1.Expires)
	}
	clock.Advance(30 * time.Minute)
	if _, err := b.Submit(t.Context(), gateway.Message{Device: "d1", Topic: "cmd/b", Received: clock.Now()}); err != nil {
		t.Fatal(err)
	}
	if got := payloads(b.Pending("d1", start.Add(time.Hour-time.Millisecond), 10)); !slices.Equal(got, []string{"cmd/a:", "cmd/b:"}) {
		t.Errorf("pending before the first's expiry: %v", got)
	}
	if got := payloads(b.Pending("d1", start.Add(time.Hour), 10)); !slices.Equal(got, []string{"cmd/b:"}) {
		t.Errorf("pending at the first's expiry: %v", got)
	}
	clock.Advance(30 * time.Minute)
	await(t, 5*time.Second, "the expired command removed from the queue", func() bool { return commands.Stats().Messages == 1 })
	clock.Advance(30 * time.Minute)
	await(t, 5*time.Second, "both removed", func() bool { return commands.Stats().Messages == 0 })
	if s := b.Status(); s.PendingCommands != 0 {
		t.Errorf("%d pending", s.PendingCommands)
	}
	if v := metric(t, reg, "fleetgate_bridge_dropped_total", "queue", "commands", "reason", "expired"); v != 2 {
		t.Errorf("dropped expired = %v, want 2", v)
	}
	if v := metric(t, reg, "fleetgate_bridge_messages_in_total", "direction", "down", "source", "local"); v != 2 {
		t.Errorf("messages in (down, local) = %v, want 2", v)
	}
}

// A device's pending commands are bounded: the oldest is dropped to make
// room (and removed from the queue), counted; other devices keep theirs.
func TestCommandsBoundPerDevice(t *testing.T) {
	commands := memQueue(t, nil)
	reg := prometheus.NewRegistry()
	b := startBridge(t, bridge.Options{Commands: commands, MaxPendingPerDevice: 4, Registerer: reg})
	if _, err := b.Submit(t.Context(), gateway.Message{Device: "d2", Topic: "cmd", Payload: []byte("kept")}); err != nil {
		t.Fatal(err)
	}
	for i := range 6 {
		if _, err := b.Submit(t.Context(), gateway.Message{Device: "d1", Topic: "cmd", Payload: []byte{'0' + byte(i)}}); err != nil {
			t.Fatal(err)
		}
	}
	if got := payloads(b.Pending("d1", time.Now(), 10)); !slices.Equal(got, []string{"cmd:2", "cmd:3", "cmd:4", "cmd:5"}) {
		t.Errorf("d1 pending %v", got)
	}
	if got := payloads(b.Pending("d2", time.Now(), 10)); !slices.Equal(got, []string{"cmd:kept"}) {
		t.Errorf("d2 pending %v", got)
	}
	if n := commands.Stats().Messages; n != 5 {
		t.Errorf("queue holds %d, want 5", n)
	}
	if v := metric(t, reg, "fleetgate_bridge_dropped_total", "queue", "commands", "reason", "device_full"); v != 2 {
		t.Errorf("dropped device_full = %v, want 2", v)
	}
}

// The pending commands outlive a restart of the bridge on the same
// durable queue: same IDs, topics, payloads and expiries; a new command
// gets a higher ID.
func TestCommandsSurviveRestart(t *testing.T) {
	dir := t.TempDir()
	q, err := openDisk(dir, "commands")
	if err != nil {
		t.Fatal(err)
	}
	b, err := bridge.New(t.Context(), bridge.Options{Commands: q, Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	var want []gateway.Command
	for i, d := range []gateway.DeviceID{"d1", "d1", "d2", "d1"} {
		c, err := b.Submit(t.Context(), gateway.Message{Device: d, Topic: "cmd/x", Payload: []byte{'a' + byte(i)}, QoS: 1})
		if err != nil {
			t.Fatal(err)
		}
		want = append(want, c)
	}
	if err := b.Ack("d1", want[1].ID); err != nil {
		t.Fatal(err)
	}
	b.Close()
	q.Close()

	q2 := diskQueue(t, dir, "commands")
	b2 := startBridge(t, bridge.Options{Commands: q2})
	for _, tc := range []struct {
		device gateway.DeviceID
		want   []gateway.Command
	}{{"d1", []gateway.Command{want[0], want[3]}}, {"d2", want[2:3]}} {
		got := b2.Pending(tc.device, time.Now(), 10)
		if len(got) != len(tc.want) {
			t.Fatalf("%s after the restart: %v, want %v", tc.device, payloads(got), payloads(tc.want))
		}
		for i := range got {
			g, w := got[i], tc.want[i]
			if g.ID != w.ID || g.Topic != w.Topic || string(g.Payload) != string(w.Payload) || !g.Expires.Equal(w.Expires) || g.QoS != 1 {
				t.Errorf("%s after the restart: %+v, want %+v", tc.device, g, w)
			}
		}
	}
	c, err := b2.Submit(t.Context(), gateway.Message{Device: "d1", Topic: "cmd"})
	if err != nil {
		t.Fatal(err)
	}
	if c.ID <= want[3].ID {
		t.Errorf("new command's ID %d not above %d", c.ID, want[3].ID)
	}
}

// Submit takes only commands; Wait fires for a command submitted after
// the call, not for one before.
func TestSubmitAndWait(t *testing.T) {
	b := startBridge(t, bridge.Options{Commands: memQueue(t, nil)})
	for _, m := range []gateway.Message{
		{Device: "d1", Topic: "telemetry"},
		{Device: "d1", Topic: "cmdx"},
		{Device: "bad id", Topic: "cmd"},
		{Device: "d1", Topic: "cmd", QoS: 2},
	} {
		if _, err := b.Submit(t.Context(), m); !errors.Is(err, gateway.ErrInvalidMessage) {
			t.Errorf("Submit(%+v) = %v, want ErrInvalidMessage", m, err)
		}
	}
	w := b.Wait("d1")
	if _, err := b.Submit(t.Context(), gateway.Message{Device: "d1", Topic: "cmd"}); err != nil {
		t.Fatal(err)
	}
	select {
	case <-w:
	default:
		t.Error("Wait did not fire on a command submitted after it")
	}
	select {
	case <-b.Wait("d1"):
		t.Error("a Wait after the command fired")
	default:
	}
}

// hookQueue is a commands queue whose Put calls before (when set) first,
// failing with its error, and after (when set) once the Put returned.
type hookQueue struct {
	gateway.Queue
	before func() error
	after  func(ids []uint64)
}

func (q *hookQueue) Put(ctx context.Context, msgs []gateway.Message) ([]uint64, error) {
	if q.before != nil {
		if err := q.before(); err != nil {
			return nil, err
		}
	}
	ids, err := q.Queue.Put(ctx, msgs)
	if q.after != nil {
		q.after(ids)
	}
	return ids, err
}

// Concurrent Submits do not wait for each other: all of them are in the
// queue's Put at once (they may share its commits), and each gets its
// own ID, the one the queue holds its command under and Pending returns
// it with, a device's in ID order.
func TestConcurrentSubmits(t *testing.T) {
	const devices, per = 4, 4
	const n = devices * per
	commands := diskQueue(t, t.TempDir(), "commands")
	var inside atomic.Int32
	all := make(chan struct{})
	giveUp := time.After(10 * time.Second) // received once: then closed
	gaveUp := make(chan struct{})
	go func() {
		select {
		case <-giveUp:
			close(gaveUp)
		case <-all:
		}
	}()
	q := &hookQueue{Queue: commands, before: func() error {
		if inside.Add(1) == n {
			close(all)
		}
		select {
		case <-all:
			return nil
		case <-gaveUp:
			return fmt.Errorf("only %d of %d Puts at once", inside.Load(), n)
		}
	}}
	b := startBridge(t, bridge.Options{Commands: q})
	got := make([]gateway.Command, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			got[i], errs[i] = b.Submit(t.Context(), gateway.Message{Device: gateway.DeviceID(fmt.Sprintf("d%d", i%devices)),
				Topic: "cmd", Payload: []byte(strconv.Itoa(i))})
		})
	}
	wg.Wait()
	byID := map[uint64]gateway.Command{}
	for i, c := range got {
		if errs[i] != nil {
			t.Fatalf("Submit %d: %v", i, errs[i])
		}
		if c.ID == 0 || string(c.Payload) != strconv.Itoa(i) || c.Device != gateway.DeviceID(fmt.Sprintf("d%d", i%devices)) {
			t.Fatalf("Submit %d returned %+v", i, c)
		}
		if o, ok := byID[c.ID]; ok {
			t.Fatalf("Submits of %s and %s both got ID %d", o.Payload, c.Payload, c.ID)
		}
		byID[c.ID] = c
	}
	held, err := commands.Read(t.Context(), 0, 2*n)
	if err != nil || len(held) != n {
		t.Fatalf("the commands queue holds %d, %v; want %d", len(held), err, n)
	}
	for _, m := range held {
		if c, ok := byID[m.ID]; !ok || string(c.Payload) != string(m.Payload) {
			t.Errorf("the queue holds %s under ID %d, Submit returned %+v for it", m.Payload, m.ID, c)
		}
	}
	for d := range devices {
		device := gateway.DeviceID(fmt.Sprintf("d%d", d))
		pending := b.Pending(device, time.Now(), 2*n)
		if len(pending) != per {
			t.Fatalf("%s: %d pending, want %d", device, len(pending), per)
		}
		for i, p := range pending {
			c := byID[p.ID]
			if c.Device != device || string(c.Payload) != string(p.Payload) || !c.Expires.Equal(p.Expires) {
				t.Errorf("%s: pending %+v, Submit returned %+v for its ID", device, p, c)
			}
			if i > 0 && p.ID <= pending[i-1].ID {
				t.Errorf("%s: pending IDs not increasing: %d after %d", device, p.ID, pending[i-1].ID)
			}
		}
	}
}

// A Submit whose Put returns after a later one's (both for one device)
// is indexed in ID order: Pending lists the device's commands oldest
// first, and its bound drops the oldest, here the one indexed last.
func TestSubmitsIndexedInIDOrder(t *testing.T) {
	for _, max := range []int{4, 1} {
		t.Run(fmt.Sprintf("max%d", max), func(t *testing.T) {
			commands := memQueue(t, nil)
			var puts atomic.Int32
			committed, held := make(chan struct{}), make(chan struct{})
			release := sync.OnceFunc(func() { close(held) })
			q := &hookQueue{Queue: commands, after: func([]uint64) {
				if puts.Add(1) == 1 {
					close(committed)
					<-held
				}
			}}
			reg := prometheus.NewRegistry()
			b := startBridge(t, bridge.Options{Commands: q, MaxPendingPerDevice: max, Registerer: reg})
			t.Cleanup(release) // before the bridge's Close
			type result struct {
				c   gateway.Command
				err error
			}
			submit := func(payload string) <-chan result {
				res := make(chan result, 1)
				go func() {
					c, err := b.Submit(t.Context(), gateway.Message{Device: "d1", Topic: "cmd", Payload: []byte(payload)})
					res <- result{c, err}
				}()
				return res
			}
			first := submit("a")
			<-committed
			var second gateway.Command
			select {
			case r := <-submit("b"):
				if r.err != nil {
					t.Fatal(r.err)
				}
				second = r.c
			case <-time.After(10 * time.Second):
				t.Fatal("a Submit waits for another's Put to return")
			}
			release()
			r := <-first
			if r.err != nil {
				t.Fatal(r.err)
			}
			if r.c.ID >= second.ID {
				t.Fatalf("the first Put's ID %d, the second's %d", r.c.ID, second.ID)
			}
			want, ids := []string{"cmd:a", "cmd:b"}, []uint64{r.c.ID, second.ID}
			if max == 1 {
				want, ids = want[1:], ids[1:]
				if v := metric(t, reg, "fleetgate_bridge_dropped_total", "queue", "commands", "reason", "device_full"); v != 1 {
					t.Errorf("dropped device_full = %v, want 1", v)
				}
			}
			p := b.Pending("d1", time.Now(), 10)
			if got := payloads(p); !slices.Equal(got, want) {
				t.Fatalf("pending %v, want %v", got, want)
			}
			for i, c := range p {
				if c.ID != ids[i] {
					t.Errorf("pending %d has ID %d, Submit returned %d", i, c.ID, ids[i])
				}
			}
			if n := commands.Stats().Messages; n != len(want) {
				t.Errorf("the commands queue holds %d, want %d", n, len(want))
			}
		})
	}
}

// submitLeft starts a bridge on a durable commands queue that commits at
// most once a second, submits one command, and then another whose ctx
// ends (50 ms) while its Put waits for the next commit.
func submitLeft(t *testing.T) (*bridge.Bridge, *diskq.Queue) {
	t.Helper()
	commands, err := diskq.Open(diskq.Options{Path: filepath.Join(t.TempDir(), "commands.db"), MaxBytes: 1 << 20, CommitInterval: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { commands.Close() })
	b := startBridge(t, bridge.Options{Commands: commands})
	// the first commit is at once, the next a second after it
	if _, err := b.Submit(t.Context(), gateway.Message{Device: "d1", Topic: "cmd", Payload: []byte("first")}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 50*time.Millisecond)
	defer cancel()
	if _, err := b.Submit(ctx, gateway.Message{Device: "d1", Topic: "cmd", Payload: []byte("late")}); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Submit waiting for a commit a second away = %v, want context.DeadlineExceeded", err)
	}
	return b, commands
}

// A Submit whose ctx ends while its Put waits for the commit returns
// ctx's error; the Put goes on, and the command it commits is pending
// all the same. A Submit whose ctx ended before puts nothing.
func TestSubmitContextEnds(t *testing.T) {
	b, commands := submitLeft(t)
	await(t, 10*time.Second, "the late command pending", func() bool {
		return slices.Equal(payloads(b.Pending("d1", time.Now(), 10)), []string{"cmd:first", "cmd:late"})
	})
	ended, end := context.WithCancel(t.Context())
	end()
	if _, err := b.Submit(ended, gateway.Message{Device: "d1", Topic: "cmd"}); !errors.Is(err, context.Canceled) {
		t.Fatalf("Submit with a done ctx = %v, want context.Canceled", err)
	}
	if n := commands.Stats().Messages; n != 2 {
		t.Fatalf("the commands queue holds %d, want 2: a Submit with a done ctx put a command", n)
	}
}

// Close waits for a Put that outlived its Submit: when it returns, the
// command is in the queue (the caller may close the queue next).
func TestCloseWaitsForAPutItsSubmitLeft(t *testing.T) {
	b, commands := submitLeft(t)
	b.Close()
	if n := commands.Stats().Messages; n != 2 {
		t.Fatalf("after Close the commands queue holds %d, want 2", n)
	}
	if _, err := b.Submit(t.Context(), gateway.Message{Device: "d1", Topic: "cmd"}); !errors.Is(err, gateway.ErrQueueClosed) {
		t.Fatalf("Submit after Close = %v, want ErrQueueClosed", err)
	}
}
