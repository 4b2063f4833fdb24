package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fleetgate/fleetgate/admin"
	"github.com/fleetgate/fleetgate/internal/mosquittotest"
	"github.com/fleetgate/fleetgate/internal/redistest"
)

// gatewayStatesOf is `fleetgate gateways --json` through g, as id →
// lost.
func gatewayStatesOf(t *testing.T, g *gatewayProc) map[string]bool {
	t.Helper()
	code, out, _ := runCLI(t, "gateways", "--addr", g.admin, "--json")
	var l admin.GatewayList
	if code != 0 || json.Unmarshal([]byte(out), &l) != nil {
		return nil
	}
	m := map[string]bool{}
	for _, gw := range l.Gateways {
		m[gw.ID] = gw.Lost
	}
	return m
}

// lines collects the lines a reader writes, for tests to wait on.
type lines struct {
	mu  sync.Mutex
	all []string
}

func (l *lines) read(sc *bufio.Scanner) {
	for sc.Scan() {
		l.mu.Lock()
		l.all = append(l.all, sc.Text())
		l.mu.Unlock()
	}
}

// find is the first line holding every one of parts, and the line
// before it; "" when none does.
func (l *lines) find(parts ...string) (line, before string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for i, s := range l.all {
		ok := true
		for _, p := range parts {
			ok = ok && strings.Contains(s, p)
		}
		if ok {
			if i > 0 {
				before = l.all[i-1]
			}
			return s, before
		}
	}
	return "", ""
}

// watchSSE follows /v1/watch of g as Server-Sent Events until the test
// ends.
func watchSSE(t *testing.T, g *gatewayProc) *lines {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+g.admin+"/v1/watch", nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("watch: %s", resp.Status)
	}
	l := &lines{}
	go func() {
		defer resp.Body.Close()
		l.read(bufio.NewScanner(resp.Body))
	}()
	return l
}

// mosquittoSub runs mosquitto_sub on topic of broker until the test
// ends, its output lines ("topic payload") collected.
func mosquittoSub(t *testing.T, broker, topic string) *lines {
	t.Helper()
	host, port, _ := strings.Cut(broker, ":")
	ctx, cancel := context.WithCancel(context.Background())
	cmd := exec.CommandContext(ctx, "mosquitto_sub", "-h", host, "-p", port, "-q", "1", "-v", "-t", topic)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatalf("mosquitto_sub: %v", err)
	}
	l := &lines{}
	done := make(chan struct{})
	go func() {
		defer close(done)
		l.read(bufio.NewScanner(out))
	}()
	t.Cleanup(func() {
		cancel()
		<-done
		_ = cmd.Wait()
	})
	return l
}

// Two gateways on one real Redis, both publishing to a real mosquitto:
// each lists both; one is killed, and the other reports it lost (its
// `fleetgate gateways`, a `lost` gateway event on its /v1/watch, and the
// retained <prefix>/gateways/<id> that mosquitto_sub reads, also when it
// subscribes afterwards), then back once it runs again.
func TestE2EGatewaysLostAndBack(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	broker := mosquittotest.Start(t, mosquittotest.Options{}).Addr
	tm := fastTiming
	a := newGateway(t, "gw-la", srv.Addr, tm)
	b := newGateway(t, "gw-lb", srv.Addr, tm)
	for _, g := range []*gatewayProc{a, b} {
		appendConfig(t, g.config, fmt.Sprintf("events:\n  mqtt: { url: \"mqtt://%s\", topic_prefix: site-g }\n", broker))
		g.start()
	}
	heard := func(id string, lost bool) func() bool {
		return func() bool {
			m := gatewayStatesOf(t, b)
			l, ok := m[id]
			return ok && l == lost && len(m) == 2
		}
	}
	waitFor(t, 10*time.Second, "both gateways heard", func() bool { return heard("gw-la", false)() && heard("gw-lb", false)() })
	watch := watchSSE(t, b)
	sub := mosquittoSub(t, broker, "site-g/gateways/+")

	a.kill()
	// the lease, the runner's interval; and the publisher's lease of
	// shard 0 (15 s) when gw-la held it
	limit := 15*time.Second + 3*tm.lease + 10*time.Second
	waitFor(t, limit, "gw-la lost", heard("gw-la", true))
	code, out, errs := runCLI(t, "gateways", "--addr", b.admin)
	if code != 0 || !regexpMatch(`(?m)^gw-la\s+lost\s+\d+\s+\d+\s+\S+ ago$`, out) || !regexpMatch(`(?m)^gw-lb\s+heard\s`, out) || !regexpMatch(`(?m)^2 gateways: 1 lost$`, out) {
		t.Fatalf("gateways: exit %d %s\n%s", code, errs, out)
	}
	waitFor(t, limit, "gw-la's lost event on /v1/watch", func() bool {
		line, before := watch.find(`"state":"lost"`, `"gateway":"gw-la"`)
		return line != "" && before == "event: gateway"
	})
	if line, _ := watch.find(`"state":"lost"`, `"gateway":"gw-la"`); strings.Contains(line, `"device"`) || !strings.Contains(line, `"contact":`) {
		t.Fatalf("gateway event on /v1/watch: %s", line)
	}
	waitFor(t, limit, "gw-la lost on the broker", func() bool {
		line, _ := sub.find(`site-g/gateways/gw-la {`, `"state":"lost"`)
		return line != ""
	})
	late := mosquittoSub(t, broker, "site-g/gateways/+")
	waitFor(t, 10*time.Second, "gw-la lost, retained", func() bool {
		line, _ := late.find(`site-g/gateways/gw-la {`, `"state":"lost"`)
		return line != ""
	})

	a.start()
	waitFor(t, limit, "gw-la back", heard("gw-la", false))
	waitFor(t, limit, "gw-la's back event on /v1/watch and the broker", func() bool {
		w, _ := watch.find(`"state":"back"`, `"gateway":"gw-la"`)
		m, _ := sub.find(`site-g/gateways/gw-la {`, `"state":"back"`)
		return w != "" && m != ""
	})
}

// The same on the embedded store, whose file only its own gateway
// writes: a gateway.id renamed between two runs on one state directory
// leaves the old ID unheard, and a lease after the store's opening the
// gateway reports it lost (`fleetgate gateways`, a `lost` gateway event
// on /v1/watch, the retained <prefix>/gateways/<id> on a real mosquitto)
// while it lists itself heard.
func TestE2EGatewaysLostEmbedded(t *testing.T) {
	t.Parallel()
	broker := mosquittotest.Start(t, mosquittotest.Options{}).Addr
	tm := fastTiming
	g := newGateway(t, "gw-eo", "", tm)
	appendConfig(t, g.config, fmt.Sprintf("events:\n  mqtt: { url: \"mqtt://%s\", topic_prefix: site-e }\n", broker))
	g.start()
	waitFor(t, 10*time.Second, "gw-eo heard", func() bool {
		m := gatewayStatesOf(t, g)
		lost, ok := m["gw-eo"]
		return ok && !lost
	})
	g.stop()
	b, err := os.ReadFile(g.config)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(g.config, []byte(strings.Replace(string(b), "id: gw-eo,", "id: gw-en,", 1)), 0o600); err != nil {
		t.Fatal(err)
	}
	g.start()
	watch := watchSSE(t, g)
	sub := mosquittoSub(t, broker, "site-e/gateways/+")
	limit := 3*tm.lease + 10*time.Second
	waitFor(t, limit, "gw-eo lost, gw-en heard", func() bool {
		m := gatewayStatesOf(t, g)
		eo, ok1 := m["gw-eo"]
		en, ok2 := m["gw-en"]
		return len(m) == 2 && ok1 && eo && ok2 && !en
	})
	code, out, errs := runCLI(t, "gateways", "--addr", g.admin)
	if code != 0 || !regexpMatch(`(?m)^gw-eo\s+lost\s`, out) || !regexpMatch(`(?m)^gw-en\s+heard\s`, out) || !regexpMatch(`(?m)^2 gateways: 1 lost$`, out) {
		t.Fatalf("gateways: exit %d %s\n%s", code, errs, out)
	}
	waitFor(t, limit, "gw-eo's lost event on /v1/watch and the broker", func() bool {
		w, before := watch.find(`"state":"lost"`, `"gateway":"gw-eo"`)
		m, _ := sub.find(`site-e/gateways/gw-eo {`, `"state":"lost"`)
		return w != "" && before == "event: gateway" && m != ""
	})
	if line, _ := watch.find(`"gateway":"gw-en"`); line != "" {
		t.Fatalf("a gateway event of the running gateway: %s", line)
	}
}
