package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	bolt "go.etcd.io/bbolt"
	"golang.org/x/sys/unix"

	"github.com/fleetgate/fleetgate/admin"
	"github.com/fleetgate/fleetgate/gateway"
	"github.com/fleetgate/fleetgate/internal/redistest"
	"github.com/fleetgate/fleetgate/store/embedded"
)

// runBackground runs `fleetgate args...` in the background until the returned
// stop is called; out collects its stdout.
func runBackground(t *testing.T, args ...string) (out *syncBuffer, stop func() int) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	out, errs := &syncBuffer{}, &syncBuffer{}
	done := make(chan int, 1)
	go func() { done <- dispatch(ctx, args, out, errs) }()
	var code *int
	stop = func() int {
		if code == nil {
			cancel()
			select {
			case c := <-done:
				code = &c
			case <-time.After(10 * time.Second):
				t.Fatalf("fleetgate %v did not end within 10s of its context", args)
			}
			if *code != 0 {
				t.Errorf("fleetgate %v: exit %d\n%s", args, *code, errs.String())
			}
		}
		return *code
	}
	t.Cleanup(func() { stop() })
	return out, stop
}

// fleetgate watch prints a snapshot, then the changes; with a cursor file
// it resumes after a restart of the gateway and of itself, and events
// tail --follow streams from the same API.
func TestWatchCommand(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	gw := newGateway(t, "gw-w", srv.Addr, fastTiming)
	gw.start()
	device{t: t, id: "dev-a"}.heartbeat(gw.coapAddr)
	waitFor(t, 10*time.Second, "dev-a online", func() bool {
		code, out, _ := runCLI(t, "devices", "get", "--addr", gw.admin, "--json", "dev-a")
		return code == 0 && strings.Contains(out, `"state": "online"`)
	})
	cursorFile := filepath.Join(t.TempDir(), "cursor")
	out, stop := runBackground(t, "watch", "--addr", gw.admin, "--json", "--cursor-file", cursorFile)
	waitFor(t, 10*time.Second, "dev-a in the snapshot", func() bool {
		return strings.Contains(out.String(), `"device":"dev-a","state":"online","ver":1`) && strings.Contains(out.String(), `"reason":"snapshot"`)
	})
	device{t: t, id: "dev-b"}.heartbeat(gw.coapAddr)
	waitFor(t, 10*time.Second, "dev-b's online event", func() bool {
		return strings.Contains(out.String(), `"device":"dev-b","state":"online","ver":1`)
	})
	stop()
	saved, err := os.ReadFile(cursorFile)
	if err != nil || !strings.HasPrefix(string(saved), "v1:") {
		t.Fatalf("cursor file: %q, %v", saved, err)
	}
	// the gateway restarts and dev-c connects while watch is not running
	gw.stop()
	gw.start()
	device{t: t, id: "dev-c"}.heartbeat(gw.coapAddr)
	out2, stop2 := runBackground(t, "watch", "--addr", gw.admin, "--json", "--cursor-file", cursorFile)
	waitFor(t, 10*time.Second, "dev-c's online event after the restarts", func() bool {
		return strings.Contains(out2.String(), `"device":"dev-c","state":"online","ver":1`)
	})
	stop2()
	if s := out2.String(); strings.Contains(s, `"reason":"snapshot"`) || strings.Contains(s, `"device":"dev-b"`) {
		t.Errorf("resumed watch printed the snapshot or dev-b again:\n%s", s)
	}
	// events tail --follow
	tail, stop3 := runBackground(t, "events", "tail", "--addr", gw.admin, "--json", "--since", "1m", "--follow")
	waitFor(t, 10*time.Second, "the past events", func() bool { return strings.Contains(tail.String(), `"device":"dev-c"`) })
	device{t: t, id: "dev-d"}.heartbeat(gw.coapAddr)
	waitFor(t, 10*time.Second, "dev-d followed", func() bool { return strings.Contains(tail.String(), `"device":"dev-d"`) })
	stop3()
}

// openPTY opens a pseudo-terminal: what fleetgate watch writes to tty
// can be read from pt.
func openPTY(t *testing.T) (pt, tty *os.File) {
	t.Helper()
	pt, err := os.OpenFile("/dev/ptmx", os.O_RDWR|syscall.O_NOCTTY, 0)
	if err != nil {
		t.Fatalf("open /dev/ptmx: %v", err)
	}
	t.Cleanup(func() { pt.Close() })
	if err := unix.IoctlSetPointerInt(int(pt.Fd()), unix.TIOCSPTLCK, 0); err != nil {
		t.Fatalf("unlock pty: %v", err)
	}
	n, err := unix.IoctlGetInt(int(pt.Fd()), unix.TIOCGPTN)
	if err != nil {
		t.Fatalf("pty number: %v", err)
	}
	tty, err = os.OpenFile(fmt.Sprintf("/dev/pts/%d", n), os.O_RDWR|syscall.O_NOCTTY, 0)
	if err != nil {
		t.Fatalf("open the pty's terminal: %v", err)
	}
	t.Cleanup(func() { tty.Close() })
	return pt, tty
}

// On a terminal fleetgate watch shows a table updated in place: the
// snapshot's counts, then each change, the latest device first.
func TestWatchTableOnTerminal(t *testing.T) {
	t.Parallel()
	store, addr := serveEmbeddedAdmin(t, "")
	write := func(kind gateway.Kind, devs ...gateway.DeviceID) {
		t.Helper()
		for _, d := range devs {
			b := gateway.Batch{Gateway: "gw-t", Epoch: 1, Lease: time.Hour, Writes: []gateway.Write{{Device: d, Session: "s", Kind: kind}}}
			if _, err := store.Apply(context.Background(), gateway.ShardOf(d, 4), b); err != nil {
				t.Fatal(err)
			}
		}
	}
	write(gateway.Connect, "tty-a", "tty-b")
	write(gateway.Leave, "tty-b")

	pt, tty := openPTY(t)
	screen := &syncBuffer{}
	go func() { _, _ = io.Copy(screen, pt) }() // ends when the test closes pt
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan int, 1)
	go func() { done <- dispatch(ctx, []string{"watch", "--addr", addr}, tty, io.Discard) }()
	t.Cleanup(func() {
		cancel()
		select {
		case code := <-done:
			if code != 0 {
				t.Errorf("fleetgate watch: exit %d", code)
			}
		case <-time.After(10 * time.Second):
			t.Errorf("fleetgate watch did not end within 10s of its context")
		}
	})
	waitFor(t, 10*time.Second, "the snapshot's counts in the table", func() bool {
		return strings.Contains(screen.String(), "devices 2  online 1  offline 1  events 0")
	})
	// the last drawing, without any event after it to trigger one
	lastTable := func() string {
		s := screen.String()
		return s[max(0, strings.LastIndex(s, "\x1b[H\x1b[2J")):]
	}
	write(gateway.Connect, "tty-b")
	waitFor(t, 10*time.Second, "tty-b's change in the table", func() bool {
		return strings.Contains(lastTable(), "devices 2  online 2  offline 0  events 1")
	})
	write(gateway.Connect, "tty-c")
	waitFor(t, 10*time.Second, "tty-c's change in the table, above tty-b's", func() bool {
		last := lastTable()
		c, b := strings.Index(last, "tty-c "), strings.Index(last, "tty-b ")
		return strings.Contains(last, "devices 3  online 3  offline 0  events 2") && c > 0 && b > c
	})
	if s := screen.String(); strings.Contains(s, `{"device"`) {
		t.Errorf("a terminal got JSON lines:\n%s", s)
	}
}

// serveEmbeddedAdmin serves the admin API (with token, when set) over an
// embedded store of 4 shards until the test ends; it returns the store
// and the address.
func serveEmbeddedAdmin(t *testing.T, token string) (*embedded.Store, string) {
	t.Helper()
	db, err := bolt.Open(filepath.Join(t.TempDir(), "state.db"), 0o600, &bolt.Options{NoSync: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	store, err := embedded.Open(db, embedded.Options{Shards: 4})
	if err != nil {
		t.Fatal(err)
	}
	srv, err := admin.Listen(admin.Options{Addr: "127.0.0.1:0", Store: store, Gatherer: prometheus.NewRegistry(), Token: token,
		Status: func() admin.Status { return admin.Status{} },
		Timing: func() (time.Duration, time.Duration) { return time.Hour, time.Hour }})
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = srv.Serve() }()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(ctx)
	})
	return store, srv.Addr().String()
}

// With a token on the admin API, watch and events tail --follow send it
// (from -c's listen.admin.token_file or --token-file) and follow the
// changes; without the token, or with a wrong one, watch ends at once
// with an error that says where the token comes from, instead of
// retrying for ever.
func TestWatchAndTailSendTheToken(t *testing.T) {
	t.Parallel()
	const token = "0123456789abcdef-cli-token"
	store, addr := serveEmbeddedAdmin(t, token)
	dir := t.TempDir()
	tokenFile := filepath.Join(dir, "token")
	wrongFile := filepath.Join(dir, "wrong")
	cfg := filepath.Join(dir, "fleetgate.yaml")
	for path, body := range map[string]string{
		tokenFile: token + "\n",
		wrongFile: "0123456789abcdef-wrong\n",
		cfg: fmt.Sprintf("gateway: { state_dir: %q }\nauth: { allow_anonymous: true, devices_file: \"\" }\nlisten: { admin: { http: %q, token_file: %q } }\n",
			dir, addr, tokenFile),
	} {
		if err := os.WriteFile(path, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	connect := func(d gateway.DeviceID) {
		t.Helper()
		b := gateway.Batch{Gateway: "gw-t", Epoch: 1, Lease: time.Hour, Writes: []gateway.Write{{Device: d, Session: "s", Kind: gateway.Connect}}}
		if _, err := store.Apply(context.Background(), gateway.ShardOf(d, 4), b); err != nil {
			t.Fatal(err)
		}
	}
	connect("tok-a")
	for i, args := range [][]string{
		{"watch", "-c", cfg, "--json"},
		{"watch", "--addr", addr, "--token-file", tokenFile, "--json"},
		{"events", "tail", "--addr", addr, "--token-file", tokenFile, "--since", "1h", "--follow", "--json"},
	} {
		out, stop := runBackground(t, args...)
		waitFor(t, 10*time.Second, fmt.Sprintf("tok-a from %v", args), func() bool { return strings.Contains(out.String(), `"device":"tok-a"`) })
		d := gateway.DeviceID(fmt.Sprintf("tok-%d", i))
		connect(d)
		waitFor(t, 10*time.Second, fmt.Sprintf("%s followed by %v", d, args), func() bool {
			return strings.Contains(out.String(), `"device":"`+string(d)+`"`)
		})
		stop()
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"watch", "--addr", addr, "--json"}, "the admin API wants a bearer token (401: a bearer token is required (listen.admin.token_file)): give it with --token-file FILE"},
		{[]string{"watch", "--addr", addr, "--token-file", wrongFile, "--json"}, "the admin API refused the bearer token (401: "},
		{[]string{"events", "tail", "--addr", addr, "--follow"}, "the admin API wants a bearer token (401: "},
	} {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		var out, errs syncBuffer
		code := dispatch(ctx, c.args, &out, &errs)
		ended := ctx.Err() == nil
		cancel()
		if !ended || code != 1 || !strings.Contains(errs.String(), c.want) {
			t.Errorf("%v: exit %d, ended by itself within 10s: %v; stderr:\n%s\nwant ∋ %q", c.args, code, ended, errs.String(), c.want)
		}
	}
}
