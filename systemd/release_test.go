//go:build packages

package systemd

import (
	"archive/tar"
	"bufio"
	"bytes"
	"compress/gzip"
	"debug/buildinfo"
	"debug/elf"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/fleetgate/fleetgate/internal/redistest"
)

// An arch of the release: its names, its ELF machine and the qemu-user
// command that runs its binaries ("" for the host's).
type relArch struct {
	name, deb, rpm, goarch string
	machine                elf.Machine
	qemu                   string
}

var relArchs = []relArch{
	{"amd64", "amd64", "x86_64", "amd64", elf.EM_X86_64, ""},
	{"arm64", "arm64", "aarch64", "arm64", elf.EM_AARCH64, "qemu-aarch64"},
	{"armv7", "armhf", "armv7hl", "arm", elf.EM_ARM, "qemu-arm"},
	{"riscv64", "riscv64", "riscv64", "riscv64", elf.EM_RISCV, "qemu-riscv64"},
}

// cloneAt clones this repository into a new directory, sharing its
// objects, and checks out commit: a tree that is the commit's, at another
// path.
func cloneAt(t *testing.T, commit string) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "fleetgate")
	mustRun(t, "git", "clone", "-q", "--shared", "--no-checkout", "..", dir)
	mustRun(t, "git", "-C", dir, "checkout", "-q", "--detach", commit)
	return dir
}

// newestVersion is the version of CHANGELOG.md's first section.
func newestVersion(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile("../CHANGELOG.md")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^## (\d+\.\d+\.\d+\S*)$`).FindSubmatch(b)
	if m == nil {
		t.Fatal("CHANGELOG.md has no section ## x.y.z")
	}
	return string(m[1])
}

func makeAt(t *testing.T, dir string, args ...string) {
	t.Helper()
	out, err := exec.Command("make", append([]string{"-C", dir}, args...)...).CombinedOutput()
	if err != nil {
		t.Fatalf("make %v in %s: %v\n%s", args, dir, err, out)
	}
}

// tarFiles reads a gzipped tar: the content of each regular file and
// the mode of every entry, by name.
func tarFiles(t *testing.T, path string) (files map[string][]byte, modes map[string]int64) {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	zr, err := gzip.NewReader(f)
	if err != nil {
		t.Fatal(err)
	}
	files, modes = map[string][]byte{}, map[string]int64{}
	tr := tar.NewReader(zr)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return files, modes
		}
		if err != nil {
			t.Fatal(err)
		}
		modes[h.Name] = h.Mode
		if h.Uid != 0 || h.Gid != 0 {
			t.Errorf("%s: %s owned by %d:%d", path, h.Name, h.Uid, h.Gid)
		}
		if h.Typeflag == tar.TypeReg {
			if files[h.Name], err = io.ReadAll(tr); err != nil {
				t.Fatal(err)
			}
		}
	}
}

// TestPackageRelease builds a whole release (make release) from a clone
// of HEAD and checks every artifact; then builds the whole release again
// in another clone, at another path, and compares bytes.
func TestPackageRelease(t *testing.T) {
	v := newestVersion(t)
	commit := strings.TrimSpace(mustRun(t, "git", "-C", "..", "rev-parse", "HEAD"))
	src := cloneAt(t, commit)
	epoch := strings.TrimSpace(mustRun(t, "git", "-C", src, "log", "-1", "--format=%ct"))
	built := strings.TrimSpace(mustRun(t, "date", "-u", "-d", "@"+epoch, "+%Y-%m-%dT%H:%M:%SZ"))
	dist := t.TempDir()
	start := time.Now()
	makeAt(t, src, "release", "VERSION="+v, "DIST="+dist)
	t.Logf("make release VERSION=%s: %v", v, time.Since(start).Round(time.Second))

	var want []string
	for _, a := range relArchs {
		want = append(want, "fleetgate_"+v+"_linux_"+a.name+".tar.gz", "fleetgate_"+v+"_"+a.deb+".deb",
			"fleetgate-"+v+"-1."+a.rpm+".rpm", "fleetgate_"+v+"_linux_"+a.name+".cdx.json")
	}
	want = append(want, "fleetgate_"+v+"_oci.tar", "fleetgate_"+v+"_notes.md", "SHA256SUMS")
	sort.Strings(want)
	ents, err := os.ReadDir(dist)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, e := range ents {
		got = append(got, e.Name())
	}
	if !slices.Equal(got, want) {
		t.Fatalf("dist holds\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}

	t.Run("checksums", func(t *testing.T) {
		cmd := exec.Command("sha256sum", "--strict", "-c", "SHA256SUMS")
		cmd.Dir = dist
		out, err := cmd.CombinedOutput()
		if err != nil || strings.Count(string(out), ": OK\n") != len(want)-1 {
			t.Errorf("sha256sum -c: %v\n%s", err, out)
		}
	})

	t.Run("notes", func(t *testing.T) {
		notes, _ := os.ReadFile(filepath.Join(dist, "fleetgate_"+v+"_notes.md"))
		changelog, _ := os.ReadFile("../CHANGELOG.md")
		if !bytes.HasPrefix(notes, []byte("## "+v+"\n")) || !bytes.Contains(changelog, notes) || !bytes.Contains(notes, []byte("### Upgrading")) {
			t.Errorf("release notes are not CHANGELOG.md's section ## %s:\n%s", v, notes)
		}
	})

	for _, a := range relArchs {
		t.Run(a.name, func(t *testing.T) {
			top := "fleetgate_" + v + "_linux_" + a.name + "/"
			files, modes := tarFiles(t, filepath.Join(dist, "fleetgate_"+v+"_linux_"+a.name+".tar.gz"))
			for _, name := range []string{"fleetgate", "plugins/udpline", "plugins/lorawan", "plugins/modbus"} {
				if modes[top+name] != 0o755 {
					t.Errorf("%s%s: mode %o, want 0755", top, name, modes[top+name])
				}
				f, err := elf.NewFile(bytes.NewReader(files[top+name]))
				if err != nil || f.Machine != a.machine {
					t.Errorf("%s%s: not an executable for %v (%v)", top, name, a.machine, err)
					continue
				}
				// Static: no interpreter (the C loader) to find at run time.
				for _, p := range f.Progs {
					if p.Type == elf.PT_INTERP {
						t.Errorf("%s%s: has an interpreter (PT_INTERP): not a static executable", top, name)
					}
				}
			}
			for _, name := range []string{"LICENSE", "README.md", "CHANGELOG.md", "copyright", "examples/fleetgate.yaml", "examples/dev.yaml",
				"examples/devices.yaml", "systemd/fleetgate.service", "systemd/fleetgate-runner.service", "systemd/fleetgate.sysusers",
				"docs/operations.md", "docs/security.md", "docs/events.md", "docs/design.md", "docs/fleetgate.1", "docs/plugins/README.md",
				"docs/grafana/fleetgate.json", "docs/prometheus/alerts.yml", "docs/completion.bash"} {
				if modes[top+name] != 0o644 || len(files[top+name]) == 0 {
					t.Errorf("%s%s: mode %o, %d bytes; want 0644, not empty", top, name, modes[top+name], len(files[top+name]))
				}
			}
			if shipped, _ := os.ReadFile("../configs/fleetgate.yaml"); !bytes.Equal(files[top+"examples/fleetgate.yaml"], shipped) {
				t.Error("examples/fleetgate.yaml is not configs/fleetgate.yaml")
			}
			// The binary runs (under qemu-user for another arch) and says
			// what the release stamped.
			dir := t.TempDir()
			bin := filepath.Join(dir, "fleetgate")
			if err := os.WriteFile(bin, files[top+"fleetgate"], 0o755); err != nil {
				t.Fatal(err)
			}
			argv := func(args ...string) []string {
				if a.qemu != "" {
					return append([]string{a.qemu, bin}, args...)
				}
				return append([]string{bin}, args...)
			}
			var info struct{ Version, Commit, Built string }
			if err := json.Unmarshal([]byte(mustRun(t, argv("version", "--json")[0], argv("version", "--json")[1:]...)), &info); err != nil {
				t.Fatal(err)
			}
			if info.Version != v || info.Commit != commit || info.Built != built {
				t.Errorf("version --json: %+v, want %s %s %s", info, v, commit, built)
			}
			devYAML := filepath.Join(dir, "dev.yaml")
			if err := os.WriteFile(devYAML, files[top+"examples/dev.yaml"], 0o644); err != nil {
				t.Fatal(err)
			}
			out := mustRun(t, argv("check-config", "-c", devYAML)[0], argv("check-config", "-c", devYAML)[1:]...)
			if !strings.Contains(out, "worst-case detection") {
				t.Errorf("check-config:\n%s", out)
			}
			// The 32-bit build serves a heartbeat: bbolt, atomics and the
			// CoAP path on arm.
			if a.name == "armv7" {
				serveHeartbeat(t, argv("run", "-c", devYAML), nil, dir)
			}

			// Each package holds this arch's binary and adapters.
			deb := filepath.Join(dist, "fleetgate_"+v+"_"+a.deb+".deb")
			if info := mustRun(t, "dpkg-deb", "-f", deb, "Architecture", "Version"); info != "Architecture: "+a.deb+"\nVersion: "+v+"\n" {
				t.Errorf("%s: %q", deb, info)
			}
			if out, err := run(t, "lintian", "--fail-on", "error,warning", "--display-level", ">=warning", deb); err != nil {
				t.Errorf("lintian %s: %v\n%s", deb, err, out)
			}
			for _, name := range []string{"fleetgate", "plugins/udpline", "plugins/lorawan", "plugins/modbus"} {
				p := map[bool]string{true: "./usr/bin/fleetgate", false: "./usr/lib/fleetgate/" + name}[name == "fleetgate"]
				if !bytes.Equal(debFile(t, deb, p), files[top+name]) {
					t.Errorf("%s: %s is not the tarball's %s", deb, p, name)
				}
			}
			rpm := filepath.Join(dist, "fleetgate-"+v+"-1."+a.rpm+".rpm")
			if q := mustRun(t, "rpm", "-qp", "--qf", "%{ARCH} %{VERSION}", rpm); q != a.rpm+" "+v {
				t.Errorf("%s: rpm -qp: %q", rpm, q)
			}
			if l := mustRun(t, "rpm", "-qlp", rpm); !strings.Contains(l, "/usr/lib/fleetgate/plugins/modbus\n") {
				t.Errorf("%s: no adapters:\n%s", rpm, l)
			}

			// The SBOM names exactly the modules the executables were built with.
			checkSBOM(t, filepath.Join(dist, "fleetgate_"+v+"_linux_"+a.name+".cdx.json"), v, a.goarch,
				files[top+"fleetgate"], files[top+"plugins/udpline"], files[top+"plugins/lorawan"], files[top+"plugins/modbus"])
		})
	}

	t.Run("image", func(t *testing.T) {
		checkImage(t, filepath.Join(dist, "fleetgate_"+v+"_oci.tar"), v, commit, dist)
	})

	// Reproducible: the whole release again from another clone, at
	// another path, gives the same bytes: every arch's tarball, packages
	// and SBOM, the image and the notes (SHA256SUMS names them all).
	t.Run("reproducible", func(t *testing.T) {
		again := cloneAt(t, commit)
		dist2 := t.TempDir()
		makeAt(t, again, "release", "VERSION="+v, "DIST="+dist2)
		a, _ := os.ReadFile(filepath.Join(dist, "SHA256SUMS"))
		b, err := os.ReadFile(filepath.Join(dist2, "SHA256SUMS"))
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(a, b) {
			t.Errorf("two builds of %s differ; SHA256SUMS:\n%s\nand\n%s", commit, a, b)
		}
	})
}

// checkSBOM checks that the CycloneDX document names the modules, with
// their versions, that the executables' build information records, and
// no other, for the arch.
func checkSBOM(t *testing.T, path, v, goarch string, bins ...[]byte) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		BOMFormat, SpecVersion string
		Metadata               struct {
			Timestamp string
			Component struct{ Name, Version, Purl string }
		}
		Components []struct{ Type, Name, Version, Purl string }
	}
	if err := json.Unmarshal(b, &doc); err != nil {
		t.Fatal(err)
	}
	if doc.BOMFormat != "CycloneDX" || doc.SpecVersion != "1.6" || doc.Metadata.Component.Version != "v"+v ||
		!strings.Contains(doc.Metadata.Component.Purl, "goarch="+goarch) {
		t.Errorf("%s: %+v", path, doc.Metadata)
	}
	want := map[string]string{}
	for _, bin := range bins {
		info, err := buildinfo.Read(bytes.NewReader(bin))
		if err != nil {
			t.Fatal(err)
		}
		want["std"] = info.GoVersion
		for _, d := range info.Deps {
			want[d.Path] = d.Version
		}
	}
	got := map[string]string{}
	for _, c := range doc.Components {
		if c.Name != "github.com/fleetgate/fleetgate" {
			got[c.Name] = c.Version
		}
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("%s: components\n%v\nwant\n%v", path, got, want)
	}
}

// serveHeartbeat runs `fleetgate run` (argv; env added to this process's),
// with the development configuration's listeners moved to free loopback
// ports and its state in dir, sends a CoAP heartbeat with coap-client and
// waits until the admin API reports the device online.
func serveHeartbeat(t *testing.T, argv, env []string, dir string) {
	t.Helper()
	coap := fmt.Sprintf("127.0.0.1:%d", redistest.FreePort(t))
	admin := fmt.Sprintf("127.0.0.1:%d", redistest.FreePort(t))
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Env = append(append(os.Environ(), env...),
		"FLEETGATE_LISTEN_COAP_UDP="+coap, "FLEETGATE_LISTEN_MQTT_TCP=", "FLEETGATE_LISTEN_ADMIN_HTTP="+admin,
		"FLEETGATE_AUTH_ALLOW_ANONYMOUS=true", "FLEETGATE_GATEWAY_STATE_DIR="+dir)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL, Setpgid: true}
	var logs syncBuf
	cmd.Stdout, cmd.Stderr = &logs, &logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		_ = cmd.Wait()
		if t.Failed() {
			t.Logf("fleetgate run:\n%s", logs.String())
		}
	}()
	deadline := time.Now().Add(60 * time.Second)
	for time.Now().Before(deadline) {
		if r, err := http.Get("http://" + admin + "/healthz"); err == nil {
			r.Body.Close()
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	out, err := run(t, "coap-client-notls", "-m", "post", "-B", "10", "coap://"+coap+"/hb?d=dev-image")
	if err != nil {
		t.Fatalf("coap-client: %v\n%s", err, out)
	}
	for time.Now().Before(deadline) {
		r, err := http.Get("http://" + admin + "/v1/devices/dev-image")
		if err == nil {
			b, _ := io.ReadAll(r.Body)
			r.Body.Close()
			if r.StatusCode == 200 && regexp.MustCompile(`"state":\s*"online"`).Match(b) {
				return
			}
		}
		time.Sleep(200 * time.Millisecond)
	}
	t.Fatalf("dev-image never online in %s's admin API", admin)
}

type syncBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuf) Write(p []byte) (int, error) { s.mu.Lock(); defer s.mu.Unlock(); return s.b.Write(p) }
func (s *syncBuf) String() string              { s.mu.Lock(); defer s.mu.Unlock(); return s.b.String() }

// checkImage inspects the OCI archive with skopeo, checks each
// platform's configuration and layers (the user, the entry point, no
// shell, nothing but what the Containerfile copies, the tarball's
// binary), then unpacks the amd64 image into a root and runs its binary
// there as the image's user: check-config, and a heartbeat served; then
// the same under podman (runInPodman).
func checkImage(t *testing.T, archive, v, commit, dist string) {
	ref := "oci-archive:" + archive + ":" + v
	if raw := mustRun(t, "skopeo", "inspect", "--raw", ref); !strings.Contains(raw, `"variant":"v7"`) || strings.Count(raw, `"platform"`) != 3 {
		t.Errorf("the image index:\n%s", raw)
	}
	// The CA certificates are the roots go.mod pins, not the build host's.
	caBundle := filepath.Join(t.TempDir(), "ca-certificates.crt")
	mustRun(t, "go", "run", "../internal/cabundle", "-o", caBundle)
	wantCA, err := os.ReadFile(caBundle)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range []struct{ arch, variant, name string }{{"amd64", "", "amd64"}, {"arm64", "", "arm64"}, {"arm", "v7", "armv7"}} {
		args := []string{"--override-arch", p.arch}
		if p.variant != "" {
			args = append(args, "--override-variant", p.variant)
		}
		var cfg struct {
			Architecture, Variant string
			Config                struct {
				User         string
				Entrypoint   []string
				Cmd          []string
				Env          []string
				ExposedPorts map[string]struct{}
				Volumes      map[string]struct{}
				Labels       map[string]string
			}
		}
		if err := json.Unmarshal([]byte(mustRun(t, "skopeo", append(args, "inspect", "--config", ref)...)), &cfg); err != nil {
			t.Fatal(err)
		}
		c := cfg.Config
		if cfg.Architecture != p.arch || cfg.Variant != p.variant || c.User != "65532:65532" ||
			strings.Join(c.Entrypoint, " ") != "/usr/bin/fleetgate" || strings.Join(c.Cmd, " ") != "run -c /etc/fleetgate/fleetgate.yaml" ||
			len(c.Volumes) != 1 || len(c.ExposedPorts) != 5 || c.Labels["org.opencontainers.image.version"] != v ||
			c.Labels["org.opencontainers.image.revision"] != commit || !slices.Contains(c.Env, "FLEETGATE_LISTEN_COAP_UDP=:5683") {
			t.Errorf("%s: config %+v", p.name, cfg)
		}
		if _, ok := c.Volumes["/var/lib/fleetgate"]; !ok {
			t.Errorf("%s: volumes %v", p.name, c.Volumes)
		}
		// The layers, through skopeo: an OCI layout with the platform's image.
		layout := filepath.Join(t.TempDir(), "layout")
		mustRun(t, "skopeo", append(args, "copy", "-q", ref, "oci:"+layout+":x")...)
		root := filepath.Join(t.TempDir(), "root")
		entries := unpackLayout(t, layout, root)
		want := []string{"etc/", "etc/fleetgate/", "etc/fleetgate/devices.yaml", "etc/fleetgate/fleetgate.yaml", "etc/group", "etc/passwd",
			"etc/ssl/", "etc/ssl/certs/", "etc/ssl/certs/ca-certificates.crt", "tmp/", "usr/", "usr/bin/", "usr/bin/fleetgate", "usr/lib/",
			"usr/lib/fleetgate/", "usr/lib/fleetgate/plugins/", "usr/lib/fleetgate/plugins/lorawan", "usr/lib/fleetgate/plugins/modbus",
			"usr/lib/fleetgate/plugins/udpline", "var/", "var/lib/", "var/lib/fleetgate/"}
		if !slices.Equal(entries, want) {
			t.Errorf("%s: the layers hold\n%s\nwant (no shell, nothing else)\n%s", p.name, strings.Join(entries, "\n"), strings.Join(want, "\n"))
		}
		files, _ := tarFiles(t, filepath.Join(dist, "fleetgate_"+v+"_linux_"+p.name+".tar.gz"))
		if b, _ := os.ReadFile(filepath.Join(root, "usr/bin/fleetgate")); !bytes.Equal(b, files["fleetgate_"+v+"_linux_"+p.name+"/fleetgate"]) {
			t.Errorf("%s: the image's /usr/bin/fleetgate is not the tarball's", p.name)
		}
		if b, _ := os.ReadFile(filepath.Join(root, "etc/ssl/certs/ca-certificates.crt")); !bytes.Equal(b, wantCA) {
			t.Errorf("%s: the image's CA certificates are not internal/cabundle's", p.name)
		}
		st := mustRun(t, "stat", "-c", "%a %u:%g", filepath.Join(root, "var/lib/fleetgate"), filepath.Join(root, "tmp"))
		if st != "750 65532:65532\n1777 0:0\n" {
			t.Errorf("%s: /var/lib/fleetgate and /tmp: %s", p.name, st)
		}
		if p.name != "amd64" {
			continue
		}
		// Run it as the container would: in the unpacked root, as the
		// image's user, with its environment, /proc and /dev mounted.
		for _, d := range []string{"proc", "dev"} {
			if err := os.Mkdir(filepath.Join(root, d), 0o755); err != nil {
				t.Fatal(err)
			}
		}
		inRoot := func(args ...string) []string {
			script := `mount -t proc proc "$1/proc" && mount --rbind /dev "$1/dev" && r="$1" && shift && exec chroot --userspec=65532:65532 "$r" "$@"`
			return append([]string{"unshare", "--mount", "--pid", "--fork", "--kill-child", "--propagation", "private", "sh", "-c", script, "sh", root, "/usr/bin/fleetgate"}, args...)
		}
		env := append(os.Environ(), c.Env...)
		cc := exec.Command(inRoot("check-config", "-c", "/etc/fleetgate/fleetgate.yaml")[0], inRoot("check-config", "-c", "/etc/fleetgate/fleetgate.yaml")[1:]...)
		cc.Env = env
		if out, err := cc.CombinedOutput(); err != nil || !strings.Contains(string(out), "worst-case detection") {
			t.Errorf("check-config in the image: %v\n%s", err, out)
		}
		serveHeartbeat(t, inRoot("run", "-c", "/etc/fleetgate/fleetgate.yaml"), c.Env, "/var/lib/fleetgate")
		if _, err := os.Stat(filepath.Join(root, "var/lib/fleetgate/fleetgate.db")); err != nil {
			t.Errorf("no state file in the volume: %v", err)
		}
		runInPodman(t, ref)
	}
}

// runInPodman runs the amd64 image of the OCI archive ref under podman,
// as a site runs it: loaded into podman's storage with skopeo (no
// registry), check-config, then the gateway with its state on a named
// volume, serving a heartbeat on the host's network. runc runs it:
// crun refuses a host with cgroup v1 and v2 controllers both mounted (as
// this suite's machines have). A container may not raise a limit above
// what its runtime may, and podman's defaults (nofile, nproc) are higher
// than a test's may be: small ones are given, enough for a gateway
// serving one device.
func runInPodman(t *testing.T, ref string) {
	t.Helper()
	name := fmt.Sprintf("fleetgate-test-%d", os.Getpid())
	image := "localhost/" + name + ":image"
	mustRun(t, "skopeo", "copy", "-q", "--override-arch", "amd64", ref, "containers-storage:"+image)
	t.Cleanup(func() {
		_, _ = run(t, "podman", "rm", "-f", "--ignore", name)
		_, _ = run(t, "podman", "volume", "rm", "-f", name)
		_, _ = run(t, "podman", "rmi", "-f", image)
	})
	podman := []string{"--runtime", "runc", "run", "--rm", "--network", "host", "--ulimit", "nofile=1024:1024", "--ulimit", "nproc=1024:1024"}
	out, err := run(t, "podman", slices.Concat(podman, []string{image, "check-config", "-c", "/etc/fleetgate/fleetgate.yaml"})...)
	if err != nil || !strings.Contains(out, "worst-case detection") {
		t.Errorf("check-config under podman: %v\n%s", err, out)
	}
	if out, err := run(t, "podman", slices.Concat(podman, []string{"--entrypoint", "/bin/sh", image, "-c", "true"})...); err == nil {
		t.Errorf("the image has a shell:\n%s", out)
	}
	// serveHeartbeat sets these in podman's environment; -e NAME passes
	// each on to the container.
	argv := slices.Concat([]string{"podman"}, podman, []string{"--name", name, "-v", name + ":/var/lib/fleetgate"})
	for _, k := range []string{"FLEETGATE_LISTEN_COAP_UDP", "FLEETGATE_LISTEN_MQTT_TCP", "FLEETGATE_LISTEN_ADMIN_HTTP", "FLEETGATE_AUTH_ALLOW_ANONYMOUS"} {
		argv = append(argv, "-e", k)
	}
	serveHeartbeat(t, append(argv, image), nil, "/var/lib/fleetgate")
	if _, err := run(t, "podman", "rm", "-f", name); err != nil {
		t.Error(err)
	}
	mp := strings.TrimSpace(mustRun(t, "podman", "volume", "inspect", "--format", "{{.Mountpoint}}", name))
	if st := mustRun(t, "stat", "-c", "%u:%g %a", filepath.Join(mp, "fleetgate.db")); st != "65532:65532 600\n" {
		t.Errorf("the state file on the volume: %q, want the image's user's, 0600", st)
	}
}

// unpackLayout applies the layers of the one image of an OCI layout to
// root (as root: owners and modes as the layers say) and returns the
// entries' names, sorted.
func unpackLayout(t *testing.T, layout, root string) []string {
	t.Helper()
	var idx struct{ Manifests []struct{ Digest string } }
	readJSON := func(p string, v any) {
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		if err := json.Unmarshal(b, v); err != nil {
			t.Fatal(err)
		}
	}
	blob := func(d string) string { return filepath.Join(layout, "blobs", strings.Replace(d, ":", "/", 1)) }
	readJSON(filepath.Join(layout, "index.json"), &idx)
	if len(idx.Manifests) != 1 {
		t.Fatalf("%s: %d manifests", layout, len(idx.Manifests))
	}
	var m struct {
		Layers []struct{ Digest, MediaType string }
	}
	readJSON(blob(idx.Manifests[0].Digest), &m)
	var names []string
	for _, l := range m.Layers {
		f, err := os.Open(blob(l.Digest))
		if err != nil {
			t.Fatal(err)
		}
		zr, err := gzip.NewReader(bufio.NewReader(f))
		if err != nil {
			t.Fatal(err)
		}
		tr := tar.NewReader(zr)
		for {
			h, err := tr.Next()
			if err == io.EOF {
				break
			}
			if err != nil {
				t.Fatal(err)
			}
			names = append(names, h.Name)
			p := filepath.Join(root, h.Name)
			switch h.Typeflag {
			case tar.TypeDir:
				if err := os.MkdirAll(p, 0o755); err != nil {
					t.Fatal(err)
				}
			case tar.TypeReg:
				b, err := io.ReadAll(tr)
				if err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(p, b, 0o600); err != nil {
					t.Fatal(err)
				}
			default:
				t.Fatalf("%s: entry %s of type %c", l.Digest, h.Name, h.Typeflag)
			}
			if err := os.Lchown(p, h.Uid, h.Gid); err != nil {
				t.Fatal(err)
			}
			if err := os.Chmod(p, os.FileMode(h.Mode&0o777)|map[bool]os.FileMode{true: os.ModeSticky}[h.Mode&0o1000 != 0]); err != nil {
				t.Fatal(err)
			}
		}
		f.Close()
	}
	sort.Strings(names)
	return slices.Compact(names)
}
