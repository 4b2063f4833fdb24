package main

import (
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/fleetgate/fleetgate/canary"
	"github.com/fleetgate/fleetgate/configs"
)

// adapterView is the part of /v1/status's adapters the tests read.
type adapterView struct {
	Name     string `json:"name"`
	State    string `json:"state"`
	PID      int    `json:"pid"`
	Restarts int    `json:"restarts"`
	Sessions int    `json:"sessions"`
	Accepted uint64 `json:"evidence_accepted"`
	Rejected uint64 `json:"evidence_rejected"`
	Refused  uint64 `json:"evidence_refused"`
	Dropped  uint64 `json:"evidence_dropped"`
}

// statusView is the part of /v1/status the tests read.
type statusView struct {
	Sessions int            `json:"sessions"`
	Adapters []adapterView  `json:"adapters"`
	Canary   *canary.Status `json:"canary"`
}

func (g *gatewayProc) status(t *testing.T) statusView {
	t.Helper()
	resp, err := http.Get("http://" + g.admin + "/v1/status")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var st statusView
	if err := json.NewDecoder(resp.Body).Decode(&st); err != nil {
		t.Fatal(err)
	}
	return st
}

func (g *gatewayProc) adapters(t *testing.T) map[string]adapterView {
	t.Helper()
	out := map[string]adapterView{}
	for _, a := range g.status(t).Adapters {
		out[a.Name] = a
	}
	return out
}

// deviceView is the part of /v1/devices/{id} the tests read.
type deviceView struct {
	State string    `json:"state"`
	Ver   uint64    `json:"ver"`
	Since time.Time `json:"since"`
}

func (g *gatewayProc) device(t *testing.T, id string) deviceView {
	t.Helper()
	resp, err := http.Get("http://" + g.admin + "/v1/devices/" + id)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var d deviceView
	if resp.StatusCode == http.StatusOK {
		_ = json.NewDecoder(resp.Body).Decode(&d)
	}
	return d
}

// setAdapters rewrites the plugins section of the gateway's config.
func (g *gatewayProc) setAdapters(t *testing.T, dir string, adapters map[string]string) {
	t.Helper()
	b, err := os.ReadFile(g.config)
	if err != nil {
		t.Fatal(err)
	}
	cfg, _, _ := strings.Cut(string(b), "plugins:\n")
	cfg += fmt.Sprintf("plugins:\n  dir: %q\n  adapters:\n", dir)
	if len(adapters) == 0 {
		cfg += "    []\n"
	}
	for name, addr := range adapters {
		cfg += fmt.Sprintf("    - name: %s\n      path: udpline\n      start_timeout: 20s\n      config: { listen: %q }\n", name, addr)
	}
	if err := os.WriteFile(g.config, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
}

func alivePID(pid int) bool {
	if pid <= 0 || syscall.Kill(pid, 0) != nil {
		return false
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	return i < 0 || i+2 >= len(s) || s[i+2] != 'Z'
}

// heartbeats sends "hb <dev>" to addr every interval until stop.
func heartbeats(addr func() string, dev string, interval time.Duration) (stop func()) {
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		t := time.NewTicker(interval)
		defer t.Stop()
		for i := 0; i < 10_000; i++ {
			if c, err := net.Dial("udp", addr()); err == nil {
				_, _ = c.Write([]byte("hb " + dev + "\n"))
				c.Close()
			}
			select {
			case <-done:
				return
			case <-t.C:
			}
		}
	})
	return func() { close(done); wg.Wait() }
}

// TestE2EAdapters runs the gateway with the udpline adapter: evidence
// reaches the store; kill -9 of the adapter restarts it while its device
// keeps sending and gets no offline event; SIGHUP adds and removes an
// adapter; `fleetgate status` lists them; kill -9 of the gateway leaves no
// adapter process.
func TestE2EAdapters(t *testing.T) {
	dir := filepath.Dir(udpline)
	tm := fastTiming
	tm.lease = 6 * time.Second // covers the first restart's backoff (≤ 1.25 s) and start
	g := newGateway(t, "gw-adapters", "", tm)
	first := fmt.Sprintf("127.0.0.1:%d", freeUDPPort(t))
	g.setAdapters(t, dir, map[string]string{"legacy": first})
	g.start()

	// Sessions exist before ready: the adapter is running already.
	a := g.adapters(t)["legacy"]
	if a.State != "running" || !alivePID(a.PID) {
		t.Fatalf("at ready: legacy = %+v, want running", a)
	}
	stop := heartbeats(func() string { return first }, "legacy-dev-1", 300*time.Millisecond)
	defer stop()
	waitFor(t, 10*time.Second, "legacy-dev-1 online in the store", func() bool { return g.device(t, "legacy-dev-1").State == "online" })

	if err := syscall.Kill(a.PID, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 15*time.Second, "legacy restarted", func() bool {
		b := g.adapters(t)["legacy"]
		return b.State == "running" && b.PID != a.PID && b.Restarts == 1
	})
	// Keep sending past a whole lease after the crash: no offline event
	// (ver stays at the first online event's).
	scenario(tm.lease)
	if d := g.device(t, "legacy-dev-1"); d.State != "online" || d.Ver != uint64(d.Since.UnixMilli()) {
		t.Fatalf("legacy-dev-1 after the adapter's crash = %+v, want online at its first ver (no offline event)", d)
	}

	// SIGHUP: add "second", then remove "legacy".
	second := fmt.Sprintf("127.0.0.1:%d", freeUDPPort(t))
	g.setAdapters(t, dir, map[string]string{"legacy": first, "second": second})
	legacyPID := g.adapters(t)["legacy"].PID
	g.signal(syscall.SIGHUP)
	waitFor(t, 20*time.Second, "second running", func() bool { return g.adapters(t)["second"].State == "running" })
	if got := g.adapters(t)["legacy"].PID; got != legacyPID {
		t.Fatalf("legacy restarted by an unrelated reload (pid %d → %d)", legacyPID, got)
	}
	stop2 := heartbeats(func() string { return second }, "second-dev-2", 300*time.Millisecond)
	defer stop2()
	waitFor(t, 10*time.Second, "second-dev-2 online", func() bool { return g.device(t, "second-dev-2").State == "online" })

	g.setAdapters(t, dir, map[string]string{"second": second})
	g.signal(syscall.SIGHUP)
	waitFor(t, 20*time.Second, "legacy removed", func() bool {
		_, ok := g.adapters(t)["legacy"]
		return !ok && !alivePID(legacyPID)
	})

	out, err := exec.Command(binary, "status", "--addr", g.admin).CombinedOutput()
	if err != nil || !strings.Contains(string(out), "second") || !strings.Contains(string(out), "running") || !strings.Contains(string(out), "restarts") {
		t.Fatalf("fleetgate status: %v\n%s", err, out)
	}

	// kill -9 of the gateway leaves no adapter process.
	pid := g.adapters(t)["second"].PID
	g.kill()
	waitFor(t, 5*time.Second, "the adapter gone with the gateway", func() bool { return !alivePID(pid) })
}

// TestE2EAdapterClaimsOnlyItsDevices sends the spoofable datagram "hb
// alpha" to the udpline adapter (shipped defaults but its loopback test
// port) of a gateway whose devices file lists alpha: alpha does not come
// online, neither while listed nor after a reload that removes it (it is
// outside the adapter's devices, "udpline-*"), while a device of the
// adapter's own prefix sent in the same datagram does. Then 50,000
// random IDs of that prefix from the adapter open at most max_devices
// sessions; the test logs the sessions and the heap in use (the figure
// of docs/security.md §11).
func TestE2EAdapterClaimsOnlyItsDevices(t *testing.T) {
	g := newGateway(t, "gw-claims", "", fastTiming)
	devicesFile := filepath.Join(t.TempDir(), "devices.yaml")
	psk := "00112233445566778899aabbccddeeff"
	writeDevices(t, devicesFile, "pw-1", psk, "  - id: alpha\n    psk: \"hex:"+psk+"\"\n")
	g.useDevicesFile(devicesFile)
	addr := fmt.Sprintf("127.0.0.1:%d", freeUDPPort(t))
	g.setAdapters(t, filepath.Dir(udpline), map[string]string{"udpline": addr})
	g.start()
	conn, err := net.Dial("udp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	send := func(text string) {
		t.Helper()
		if _, err := conn.Write([]byte(text)); err != nil {
			t.Fatal(err)
		}
	}

	claim := func(control string) {
		t.Helper()
		waitFor(t, 10*time.Second, control+" online", func() bool {
			send("hb alpha\nhb " + control + "\n")
			return g.device(t, control).State == "online"
		})
		scenario(5 * fastTiming.flush) // alpha's evidence came first: flushed by now
		if d := g.device(t, "alpha"); d.State != "" {
			t.Fatalf("alpha = %+v after \"hb alpha\" to udpline: an adapter spoke for it", d)
		}
	}
	claim("udpline-ok-1")
	if a := g.adapters(t)["udpline"]; a.Refused == 0 {
		t.Fatalf("udpline = %+v, want the refused evidence counted", a)
	}

	writeDevices(t, devicesFile, "pw-1", psk, "")
	g.signal(syscall.SIGHUP)
	waitFor(t, 10*time.Second, "devices file reloaded", func() bool { return strings.Contains(g.logs(), "devices file reloaded") })
	claim("udpline-ok-2")

	before := g.adapters(t)["udpline"]
	seen := before.Accepted + before.Rejected + before.Refused + before.Dropped
	heap := func() float64 {
		return scrapeCounter(t, "http://"+g.admin+"/metrics", "go_memstats_heap_inuse_bytes") / 1e6
	}
	heapBefore := heap()
	const flood, perDatagram = 50_000, 250
	for i := 0; i < flood; i += perDatagram {
		var b strings.Builder
		for j := i; j < i+perDatagram; j++ {
			fmt.Fprintf(&b, "hb udpline-r%d\n", j)
		}
		send(b.String())
		scenario(10 * time.Millisecond) // pace the datagrams: the socket buffer keeps them all
	}
	waitFor(t, 30*time.Second, "the flood taken", func() bool {
		a := g.adapters(t)["udpline"]
		return a.Accepted+a.Rejected+a.Refused+a.Dropped-seen == flood
	})
	a := g.adapters(t)["udpline"]
	n := g.status(t).Sessions
	t.Logf("%d random IDs: %d sessions in the gateway (udpline: %d accepted, %d dropped); heap in use %.1f MB → %.1f MB",
		flood, n, a.Accepted, a.Dropped, heapBefore, heap())
	if n > configs.DefaultAdapterMaxDevices+2 || a.Dropped == 0 {
		t.Fatalf("after %d random IDs: %d sessions in the gateway, udpline %+v; want at most max_devices (%d) + 2 and the rest dropped",
			flood, n, a, configs.DefaultAdapterMaxDevices)
	}
}
