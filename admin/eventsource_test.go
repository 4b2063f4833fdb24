package admin_test

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/fleetgate/fleetgate/admin"
	"github.com/fleetgate/fleetgate/gateway"
)

// eventSourceVersion is the npm eventsource package the tests run: a
// WHATWG EventSource for node (reconnects to the URL it was opened with,
// sending the Last-Event-ID header).
const eventSourceVersion = "4.1.1"

// eventSourceScript opens an EventSource on process.argv[2], sending the
// bearer token of $TOKEN through the fetch it is given (an EventSource
// has no option for headers), and prints one JSON line per open,
// presence event and error.
const eventSourceScript = `import { EventSource } from 'eventsource'
const token = process.env.TOKEN
const es = new EventSource(process.argv[2], {
  fetch: (input, init) => fetch(input, { ...init, headers: { ...init.headers, Authorization: 'Bearer ' + token } }),
})
const say = (o) => console.log(JSON.stringify(o))
es.onopen = () => say({ type: 'open' })
es.onerror = (e) => say({ type: 'error', code: e.code ?? 0, message: e.message ?? '', closed: es.readyState === es.CLOSED })
es.addEventListener('presence', (e) => say({ type: 'presence', device: JSON.parse(e.data).device, id: e.lastEventId }))
`

// eventSource installs the npm eventsource package into a temporary
// directory (npm's cache serves it after the first time) and returns
// the directory, holding es.mjs.
func eventSource(t *testing.T) string {
	t.Helper()
	for _, tool := range []string{"node", "npm"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Fatalf("%s missing: the EventSource test runs the npm eventsource package under node (apt-get install -y nodejs npm)", tool)
		}
	}
	dir := t.TempDir()
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "npm", "install", "--prefer-offline", "--no-audit", "--no-fund", "--no-save", "--prefix", dir, "eventsource@"+eventSourceVersion)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("npm install eventsource@%s: %v\n%s", eventSourceVersion, err, out)
	}
	if err := os.WriteFile(filepath.Join(dir, "es.mjs"), []byte(eventSourceScript), 0o600); err != nil {
		t.Fatal(err)
	}
	return dir
}

// esLine is one line of eventSourceScript.
type esLine struct {
	Type    string `json:"type"`
	Device  string `json:"device"`
	ID      string `json:"id"`
	Code    int    `json:"code"`
	Message string `json:"message"`
	Closed  bool   `json:"closed"`
}

// runEventSource runs es.mjs of dir against url until the test ends,
// handing its lines over the channel.
func runEventSource(t *testing.T, dir, url, token string) <-chan esLine {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	cmd := exec.CommandContext(ctx, "node", filepath.Join(dir, "es.mjs"), url)
	cmd.Env = append(os.Environ(), "TOKEN="+token)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	lines := make(chan esLine, 1000)
	go func() {
		defer close(lines)
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			var l esLine
			if err := json.Unmarshal(sc.Bytes(), &l); err != nil {
				l = esLine{Type: "unparsed", Message: sc.Text()}
			}
			lines <- l
		}
	}()
	t.Cleanup(func() {
		cancel()
		_ = cmd.Wait()
		if t.Failed() && stderr.Len() > 0 {
			t.Logf("node stderr:\n%s", stderr.String())
		}
	})
	return lines
}

// A real EventSource (npm eventsource, under node) opened on
// /v1/watch?cursor=<snapshot cursor>, as docs/events.md says, goes on
// after a restart of the gateway from the last event it got: it
// reconnects to the same URL with Last-Event-ID, and the header wins
// over the query. It gets no event twice ("restart"), and when the
// snapshot's position was trimmed from the log meanwhile, it is not
// refused ("trimmed").
func TestEventSourceResumesAfterRestart(t *testing.T) {
	dir := eventSource(t)
	t.Run("restart", func(t *testing.T) { eventSourceRestart(t, dir, 0, 3) })
	t.Run("trimmed", func(t *testing.T) { eventSourceRestart(t, dir, 10, 40) })
}

// eventSourceRestart runs the EventSource of dir against a gateway
// whose store keeps maxLen events a shard (0: the default), while r1
// and fill devices connect, then restarts the gateway and connects r2.
func eventSourceRestart(t *testing.T, dir string, maxLen int64, fill int) {
	const token = "0123456789abcdef-es-token"
	store := embeddedStore(t, maxLen)
	first, err := admin.Listen(admin.Options{Addr: "127.0.0.1:0", Store: store, Token: token, Gatherer: prometheus.NewRegistry(),
		Status: func() admin.Status { return admin.Status{} }, Timing: func() (time.Duration, time.Duration) { return lease, suspect }})
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- first.Serve() }()
	addr := first.Addr().String()
	c := admin.NewClient(addr).WithAuth(token, nil)
	cursor, err := c.SnapshotAll(t.Context(), func(gateway.Envelope) {})
	if err != nil {
		t.Fatal(err)
	}
	lines := runEventSource(t, dir, "http://"+addr+"/v1/watch?cursor="+cursor, token)
	seen := map[string]int{}
	next := func(what string) esLine {
		t.Helper()
		select {
		case l, ok := <-lines:
			if !ok {
				t.Fatalf("node ended waiting for %s", what)
			}
			if l.Type == "presence" {
				seen[l.Device]++
			}
			return l
		case <-time.After(20 * time.Second):
			t.Fatalf("nothing from the EventSource for 20s, waiting for %s", what)
		}
		return esLine{}
	}
	await := func(device string) {
		t.Helper()
		for i := 0; i < 100; i++ {
			l := next(device)
			switch {
			case l.Type == "presence" && l.Device == device:
				return
			case l.Type == "error" && l.Closed:
				t.Fatalf("the EventSource closed for good waiting for %s: %d %s", device, l.Code, l.Message)
			}
		}
		t.Fatalf("%s not among 100 lines", device)
	}
	if l := next("open"); l.Type != "open" {
		t.Fatalf("first line %+v, want open", l)
	}
	connect(t, store, "gw", "r1")
	await("r1")
	for _, d := range ids("fill", fill) {
		connect(t, store, "gw", d)
		await(string(d))
	}
	if maxLen > 0 {
		var re *admin.ErrResync
		if err := c.Watch(t.Context(), cursor, 0, func(gateway.Envelope) error { return nil }); !errors.As(err, &re) {
			t.Fatalf("the snapshot's cursor is still served (%v): the test trims nothing", err)
		}
	}
	// the gateway restarts on the same address
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	if err := first.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-served; err != nil {
		t.Fatal(err)
	}
	serveAdminWith(t, admin.Options{Addr: addr, Store: store, Token: token})
	connect(t, store, "gw", "r2")
	await("r2")
	for d, n := range seen {
		if n != 1 {
			t.Errorf("%s delivered %d times", d, n)
		}
	}
	if seen["r1"] != 1 || len(seen) != fill+2 {
		t.Errorf("delivered %d devices (r1 %d times), want %d once each", len(seen), seen["r1"], fill+2)
	}
}
