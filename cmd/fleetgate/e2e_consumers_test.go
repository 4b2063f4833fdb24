package main

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/fleetgate/fleetgate/internal/mosquittotest"
)

// example returns the code block of docs/events.md marked
// <!-- example: name -->.
func example(t *testing.T, name string) string {
	t.Helper()
	b, err := os.ReadFile("../../docs/events.md")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile("(?s)<!-- example: " + regexp.QuoteMeta(name) + " -->\n```[a-z]*\n(.*?)```").FindStringSubmatch(string(b))
	if m == nil {
		t.Fatalf("docs/events.md has no example %q", name)
	}
	return m[1]
}

// consumer is a consumer process of the examples, its output collected.
type consumer struct {
	name string
	out  *syncBuffer
}

func startConsumer(t *testing.T, ctx context.Context, name string, argv ...string) *consumer {
	t.Helper()
	c := &consumer{name: name, out: &syncBuffer{}}
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	cmd.Stdout, cmd.Stderr = c.out, c.out
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		if t.Failed() {
			t.Logf("%s output:\n%s", name, c.out.String())
		}
	})
	return c
}

// The consumers of docs/events.md, run as written (addresses replaced):
// curl on /v1/watch, mosquitto_sub on the upstream topics, the Python
// (paho-mqtt), the Node (fetch) and the mqtt.js consumers, which print each device's
// state once per ver whatever topic or page brought it.
func TestEventsDocConsumers(t *testing.T) {
	t.Parallel()
	broker := mosquittotest.Start(t, mosquittotest.Options{})
	gw := newGateway(t, "gw-ex", "", fastTiming)
	gw.env = append(gw.env, "FLEETGATE_EVENTS_MQTT_URL=mqtt://"+broker.Addr)
	gw.start()
	device{t: t, id: "dev-a"}.heartbeat(gw.coapAddr) // in the snapshot and the retained presence

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	dir := t.TempDir()
	host, port, _ := strings.Cut(broker.Addr, ":")
	sh := func(name string) []string {
		cmd := strings.NewReplacer("127.0.0.1:9180", gw.admin, "-h 127.0.0.1 -p 1883", "-h "+host+" -p "+port).Replace(example(t, name))
		return []string{"sh", "-c", "exec " + strings.TrimSpace(cmd)}
	}
	write := func(name, file string) string {
		path := filepath.Join(dir, file)
		if err := os.WriteFile(path, []byte(example(t, name)), 0o600); err != nil {
			t.Fatal(err)
		}
		return path
	}
	curl := startConsumer(t, ctx, "curl", sh("curl")...)
	sub := startConsumer(t, ctx, "mosquitto_sub", sh("mosquitto_sub")...)
	// Debian's python3 (python3-paho-mqtt, make deps), whatever else is on PATH
	py := startConsumer(t, ctx, "python", "/usr/bin/python3", write("python", "consumer.py"), broker.Addr)
	node := startConsumer(t, ctx, "node", "node", write("node", "watch.mjs"), "http://"+gw.admin)
	// Debian's node-mqtt (make deps) lives outside node's own search path
	mqttjs := startConsumer(t, ctx, "mqtt.js", "env", "NODE_PATH=/usr/share/nodejs",
		"node", write("mqtt.js", "consumer.cjs"), "mqtt://"+broker.Addr)

	has := func(c *consumer, s string) bool { return strings.Contains(c.out.String(), s) }
	waitFor(t, 20*time.Second, "dev-a's state in the MQTT and snapshot consumers", func() bool {
		return has(sub, "fleetgate/presence/dev-a ") && has(py, "dev-a online ") && has(node, "dev-a online ") &&
			has(mqttjs, "dev-a online ")
	})
	time.Sleep(500 * time.Millisecond) // curl's stream is open by now
	device{t: t, id: "dev-b"}.heartbeat(gw.coapAddr)
	waitFor(t, 20*time.Second, "dev-b online in every consumer", func() bool {
		return has(curl, `"device":"dev-b","state":"online"`) && has(sub, "fleetgate/events/dev-b ") &&
			has(sub, "fleetgate/presence/dev-b ") && has(py, "dev-b online ") && has(node, "dev-b online ") &&
			has(mqttjs, "dev-b online ")
	})
	time.Sleep(time.Second) // a duplicate would have come by now
	for _, c := range []*consumer{py, node, mqttjs} {
		if n := strings.Count(c.out.String(), "dev-b online "); n != 1 {
			t.Errorf("%s printed dev-b online %d times, want once (the ver rule)", c.name, n)
		}
		if !regexp.MustCompile(`(?m)^dev-b online \d+ connect$`).MatchString(c.out.String()) {
			t.Errorf("%s: no line \"dev-b online <ver> connect\"", c.name)
		}
	}
}
