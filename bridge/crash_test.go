package bridge_test

import (
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/fleetgate/fleetgate/bridge"
)

// A bridge process killed with SIGKILL while its devices publish (and
// its link to the upstream broker is down), then started again on the same durable
// queue file: every message Publish had acknowledged (on disk) reaches
// the upstream broker, and each device's first occurrences come in
// order with no gap.
func TestBridgeKilled(t *testing.T) {
	br := startBroker(t)
	sub := subscribe(t, br, childTopic+"/#")
	dir := t.TempDir()
	link := startProxy(t, br.Addr)
	c := startChild(t, "up", dir, link.url())
	await(t, 30*time.Second, "a third of the messages acknowledged", func() bool {
		return len(c.output("acked ")) >= childDevs*childPer/3
	})
	// then its link to the broker fails, so that the messages
	// acknowledged after are only on disk at the kill (the broker stays:
	// a broker stopped while it takes messages may lose some it
	// acknowledged, mosquitto 2.0.11 did)
	link.cut()
	await(t, 30*time.Second, "two thirds of the messages acknowledged", func() bool {
		return len(c.output("acked ")) >= 2*childDevs*childPer/3
	})
	c.kill9(t)
	acked := c.output("acked ")
	forwarded := len(sub.snapshot())

	durable := diskQueue(t, dir, "durable")
	held := durable.Stats().Messages
	startBridge(t, bridge.Options{URL: brokerURL(br), ClientID: "restarted", TopicPrefix: childTopic,
		Durable: durable, Memory: memQueue(t, nil), Commands: memQueue(t, nil)})
	missing := func(msgs []upMsg) []string {
		seen := map[string]bool{}
		for _, m := range msgs {
			seen[m.topic+" "+m.payload] = true
		}
		var out []string
		for _, a := range acked {
			device, seq, _ := strings.Cut(a, " ")
			if !seen[childTopic+"/devices/"+device+"/seq "+seq] {
				out = append(out, a)
			}
		}
		return out
	}
	deadline := time.Now().Add(30 * time.Second)
	for len(missing(sub.snapshot())) > 0 {
		if time.Now().After(deadline) {
			m := missing(sub.snapshot())
			t.Fatalf("%d acknowledged messages never forwarded, such as %v", len(m), m[:min(10, len(m))])
		}
		time.Sleep(20 * time.Millisecond)
	}
	await(t, 10*time.Second, "the durable queue empty", func() bool { return durable.Stats().Messages == 0 })
	// first occurrences: 0, 1, 2, ... per device
	next := map[string]int{}
	seen := map[string]bool{}
	dups := 0
	for _, m := range sub.snapshot() {
		if seen[m.topic+" "+m.payload] {
			dups++
			continue
		}
		seen[m.topic+" "+m.payload] = true
		if n, _ := strconv.Atoi(m.payload); n != next[m.topic] {
			t.Errorf("%s: %d read first after %d", m.topic, n, next[m.topic]-1)
		}
		next[m.topic]++
	}
	t.Logf("%d acknowledged by the killed bridge, %d forwarded by it, %d in its queue file, %d read upstream in all, %d duplicates",
		len(acked), forwarded, held, len(sub.snapshot()), dups)
}

// A command from upstream is acknowledged to the broker only once it is
// durable: the bridge killed (SIGKILL) while it holds one before the
// commands queue gets it, a bridge started again on the same file and
// client ID gets it from the broker again, and it is pending then.
func TestCommandAckedUpstreamOnlyWhenDurable(t *testing.T) {
	br := startBroker(t)
	dir := t.TempDir()
	c := startChild(t, "down", dir, brokerURL(br))
	await(t, 20*time.Second, "the child subscribed", func() bool { return len(c.output("ready")) == 1 })
	pub := publisher(t, br)
	publish(t, pub, childTopic+"/devices/d1/cmd/reboot", "held")
	await(t, 10*time.Second, "the child holding the command", func() bool { return slices.Equal(c.output("holding "), []string{"held"}) })
	c.kill9(t)

	commands := diskQueue(t, dir, "commands")
	if n := commands.Stats().Messages; n != 0 {
		t.Fatalf("the commands queue holds %d messages before the restart; the hold came before Put", n)
	}
	b := startBridge(t, bridge.Options{URL: brokerURL(br), ClientID: "child-down", TopicPrefix: childTopic, Down: true,
		Durable: memQueue(t, nil), Memory: memQueue(t, nil), Commands: commands})
	await(t, 10*time.Second, "the command delivered again and pending", func() bool {
		p := b.Pending("d1", time.Now(), 10)
		return len(p) == 1 && string(p[0].Payload) == "held" && p[0].Topic == "cmd/reboot"
	})
	if n := commands.Stats().Messages; n != 1 {
		t.Errorf("commands queue holds %d, want 1", n)
	}
}
