//go:build packages

package systemd

import (
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/fleetgate/fleetgate/internal/redistest"
)

// previousRelease is the commit that stands for the release before this
// tree while the repository has no release tag: main before the fleet's
// counts (the ~on fields) and forgetting devices (forget.lua, the ver
// floor) came in, both of which docs/operations.md's upgrade notes cover.
// With a tag v* before HEAD, the newest such tag is the previous release.
const previousRelease = "a149fe33eb676ed3f29c07ddd57861c514c4c91d"

// buildPrevious builds the previous release's fleetgate from its commit:
// the commit's tree (git archive), built with the module cache (the Go
// module proxy only for what the cache lacks).
func buildPrevious(t *testing.T) (bin, rev string) {
	t.Helper()
	rev = previousRelease
	if tag, err := exec.Command("git", "-C", "..", "describe", "--tags", "--match", "v[0-9]*", "--abbrev=0", "HEAD^").Output(); err == nil {
		rev = strings.TrimSpace(string(tag))
	}
	if out, err := exec.Command("git", "-C", "..", "cat-file", "-e", rev+"^{commit}").CombinedOutput(); err != nil {
		t.Fatalf("the previous release %s is not in this clone (a shallow clone?): %v %s", rev, err, out)
	}
	src := filepath.Join(t.TempDir(), "src")
	if err := os.Mkdir(src, 0o755); err != nil {
		t.Fatal(err)
	}
	mustRun(t, "sh", "-c", `git -C .. archive "$1" | tar -x -C "$2"`, "sh", rev, src)
	bin = filepath.Join(t.TempDir(), "fleetgate-previous")
	cmd := exec.Command("go", "build", "-trimpath", "-o", bin, "./cmd/fleetgate")
	cmd.Dir = src
	cmd.Env = append(os.Environ(), "GOFLAGS=-buildvcs=false", "CGO_ENABLED=0")
	start := time.Now()
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("building the previous release %s: %v\n%s", rev, err, out)
	}
	t.Logf("built the previous release %s in %v", rev, time.Since(start).Round(time.Second))
	return bin, rev
}

// sideGateway is a `fleetgate run` of some release on the shared Redis.
type sideGateway struct {
	t                    *testing.T
	id, config, stateDir string
	coap, admin          string
	cmd                  *exec.Cmd
	logs                 *syncBuf
}

func newSideGateway(t *testing.T, id, redisAddr string) *sideGateway {
	dir := t.TempDir()
	g := &sideGateway{t: t, id: id, config: filepath.Join(dir, "fleetgate.yaml"), stateDir: filepath.Join(dir, "state"),
		coap: fmt.Sprintf("127.0.0.1:%d", redistest.FreePort(t)), admin: fmt.Sprintf("127.0.0.1:%d", redistest.FreePort(t))}
	cfg := fmt.Sprintf(`gateway: { id: %s, state_dir: %q }
presence: { lease: 4s, heartbeat_interval: 1s, renew_every: 1s, suspect_after: 2s, shards: 4, gateway_grace: 2s }
store:
  backend: redis
  redis: { addrs: [%q] }
uplink: { flush_interval: 100ms, max_batch: 1000 }
runner: { enabled: true, interval: 100ms, batch: 500, lock_ttl: 1s }
listen:
  coap: { udp: %q }
  mqtt: { tcp: "" }
  admin: { http: %q }
auth: { allow_anonymous: true, devices_file: "" }
`, id, g.stateDir, redisAddr, g.coap, g.admin)
	if err := os.WriteFile(g.config, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	return g
}

// start runs bin on the gateway's configuration and waits for /readyz.
func (g *sideGateway) start(bin string) {
	g.t.Helper()
	g.logs = &syncBuf{}
	g.cmd = exec.Command(bin, "run", "-c", g.config)
	g.cmd.Stdout, g.cmd.Stderr = g.logs, g.logs
	g.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := g.cmd.Start(); err != nil {
		g.t.Fatal(err)
	}
	cmd, logs := g.cmd, g.logs
	g.t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		if g.t.Failed() {
			g.t.Logf("%s (%s) log:\n%s", g.id, cmd.Path, logs.String())
		}
	})
	g.waitFor(30*time.Second, "ready", func() bool { code, _ := g.get("/readyz"); return code == 200 })
}

// stop sends SIGTERM and waits for the process to end.
func (g *sideGateway) stop() {
	g.t.Helper()
	_ = g.cmd.Process.Signal(syscall.SIGTERM)
	done := make(chan error, 1)
	go func() { done <- g.cmd.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			g.t.Fatalf("%s: stopped with %v\n%s", g.id, err, g.logs.String())
		}
	case <-time.After(30 * time.Second):
		g.t.Fatalf("%s did not stop on SIGTERM", g.id)
	}
}

func (g *sideGateway) get(path string) (int, string) {
	r, err := http.Get("http://" + g.admin + path)
	if err != nil {
		return 0, err.Error()
	}
	defer r.Body.Close()
	b, _ := io.ReadAll(r.Body)
	return r.StatusCode, string(b)
}

func (g *sideGateway) waitFor(limit time.Duration, what string, cond func() bool) {
	g.t.Helper()
	deadline := time.Now().Add(limit)
	for !cond() {
		if time.Now().After(deadline) {
			g.t.Fatalf("%s: not %s after %v", g.id, what, limit)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// state is the device's stored state as the gateway's admin API reports
// it ("" when unknown).
func (g *sideGateway) state(device string) string {
	code, body := g.get("/v1/devices/" + device)
	if code != 200 {
		return ""
	}
	if m := regexp.MustCompile(`"state":\s*"(\w+)"`).FindStringSubmatch(body); m != nil {
		return m[1]
	}
	return ""
}

// ver is the ver of a device's record in an admin API answer (0: none).
func ver(code int, body string) uint64 {
	m := regexp.MustCompile(`"ver":\s*(\d+)`).FindStringSubmatch(body)
	if code != 200 || m == nil {
		return 0
	}
	v, _ := strconv.ParseUint(m[1], 10, 64)
	return v
}

func (g *sideGateway) heartbeat(device string) {
	g.t.Helper()
	if out, err := run(g.t, "coap-client-notls", "-m", "post", "-B", "5", "coap://"+g.coap+"/hb?d="+device); err != nil {
		g.t.Fatalf("heartbeat of %s to %s: %v\n%s", device, g.id, err, out)
	}
}

// TestPackageUpgradeSideBySide runs the previous release's gateway and
// this tree's on one Redis (docs/operations.md, "Upgrade": a rolling
// upgrade of a site's gateways): both start on the store the other
// writes, each sees the devices of the other, either runner ends the
// sessions of either with offline events, a device roams between them;
// then the previous release's gateway is upgraded in place (its state
// file migrated) and carries on.
func TestPackageUpgradeSideBySide(t *testing.T) {
	prev, rev := buildPrevious(t)
	srv := redistest.Start(t)
	old := newSideGateway(t, "gw-old", srv.Addr)
	cur := newSideGateway(t, "gw-new", srv.Addr)
	old.start(prev)
	cur.start(binary)

	old.heartbeat("dev-a")
	cur.heartbeat("dev-b")
	for _, g := range []*sideGateway{old, cur} {
		for _, d := range []string{"dev-a", "dev-b"} {
			g.waitFor(10*time.Second, d+" online", func() bool { return g.state(d) == "online" })
		}
	}
	// A device that moves from the previous release's gateway to this one.
	old.heartbeat("dev-c")
	cur.waitFor(10*time.Second, "dev-c online", func() bool { return cur.state("dev-c") == "online" })
	onlineVer := ver(cur.get("/v1/devices/dev-c"))
	cur.heartbeat("dev-c")
	cur.waitFor(10*time.Second, "dev-c's record written by gw-new", func() bool {
		_, body := cur.get("/v1/devices/dev-c")
		return regexp.MustCompile(`"gw":\s*"gw-new"`).MatchString(body)
	})
	// Silent, every device goes offline within the bound (lease 4 s),
	// whichever runner holds its shard.
	for _, d := range []string{"dev-a", "dev-b", "dev-c"} {
		for _, g := range []*sideGateway{old, cur} {
			g.waitFor(20*time.Second, d+" offline", func() bool { return g.state(d) == "offline" })
		}
	}
	if v := ver(cur.get("/v1/devices/dev-c")); onlineVer == 0 || v <= onlineVer {
		t.Errorf("dev-c: ver %d when offline, %d when online: want it to rise", v, onlineVer)
	}

	// The in-place upgrade: the previous release stops, this release
	// starts on its state file and configuration.
	old.stop()
	old.start(binary)
	if l := old.logs.String(); !strings.Contains(l, "state file migrated") {
		t.Errorf("the upgraded gateway did not migrate %s's state file:\n%s", rev, l)
	}
	old.heartbeat("dev-a")
	cur.waitFor(10*time.Second, "dev-a online again", func() bool { return cur.state("dev-a") == "online" })
	for _, g := range []*sideGateway{old, cur} {
		if l := g.logs.String(); strings.Contains(l, "panic") || strings.Contains(l, "ERROR") {
			t.Errorf("%s logged an error:\n%s", g.id, l)
		}
	}
}
