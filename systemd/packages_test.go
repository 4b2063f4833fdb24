//go:build packages

package systemd

import (
	"archive/tar"
	"bufio"
	"bytes"
	"compress/gzip"
	"debug/buildinfo"
	"debug/elf"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
)

// These tests build the packages (make deb rpm) and install them in a
// scratch Debian root; they take minutes and run in `make test-packages`.

// makeIn runs make in the repository root with args.
func makeIn(t *testing.T, args ...string) {
	t.Helper()
	cmd := exec.Command("make", append([]string{"-C", ".."}, args...)...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("make %v: %v\n%s", args, err, out)
	}
}

func mustRun(t *testing.T, name string, args ...string) string {
	t.Helper()
	out, err := run(t, name, args...)
	if err != nil {
		t.Fatalf("%s %v: %v\n%s", name, args, err, out)
	}
	return out
}

// entry is one line of dpkg-deb -c or rpm -qlv: mode and owner of a path.
type entry struct{ mode, owner string }

var debLine = regexp.MustCompile(`^(\S+)\s+(\S+)\s+\d+\s+\S+\s+\S+\s+\.(/\S*)`)

func debContents(t *testing.T, deb string) map[string]entry {
	t.Helper()
	m := map[string]entry{}
	for _, l := range strings.Split(mustRun(t, "dpkg-deb", "-c", deb), "\n") {
		if s := debLine.FindStringSubmatch(l); s != nil {
			m[strings.TrimSuffix(s[3], "/")] = entry{s[1], s[2]}
		}
	}
	return m
}

// The files every package holds, with their modes and owners.
var wantFiles = map[string]entry{
	"/usr/bin/fleetgate":                               {"-rwxr-xr-x", "root/root"},
	"/usr/lib/fleetgate/plugins":                       {"drwxr-xr-x", "root/root"},
	"/usr/lib/systemd/system/fleetgate.service":        {"-rw-r--r--", "root/root"},
	"/usr/lib/systemd/system/fleetgate-runner.service": {"-rw-r--r--", "root/root"},
	"/usr/lib/sysusers.d/fleetgate.conf":               {"-rw-r--r--", "root/root"},
	"/etc/fleetgate":                                   {"drwxr-x---", "root/fleetgate"},
	"/etc/fleetgate/fleetgate.yaml":                    {"-rw-r-----", "root/fleetgate"},
	"/etc/fleetgate/devices.yaml":                      {"-rw-r-----", "root/fleetgate"},
	"/usr/share/doc/fleetgate/operations.md":           {"-rw-r--r--", "root/root"},
	"/usr/share/doc/fleetgate/security.md":             {"-rw-r--r--", "root/root"},
	"/usr/share/doc/fleetgate/events.md":               {"-rw-r--r--", "root/root"},
	"/usr/share/doc/fleetgate/plugins/README.md":       {"-rw-r--r--", "root/root"},
	"/usr/share/doc/fleetgate/grafana/fleetgate.json":  {"-rw-r--r--", "root/root"},
	"/usr/share/doc/fleetgate/prometheus/alerts.yml":   {"-rw-r--r--", "root/root"},
	"/usr/share/doc/fleetgate/examples/fleetgate.yaml": {"-rw-r--r--", "root/root"},
	"/usr/share/doc/fleetgate/examples/dev.yaml":       {"-rw-r--r--", "root/root"},
	"/usr/share/doc/fleetgate/examples/devices.yaml":   {"-rw-r--r--", "root/root"},
	"/usr/share/doc/fleetgate/copyright":               {"-rw-r--r--", "root/root"},
	"/usr/share/man/man1/fleetgate.1.gz":               {"-rw-r--r--", "root/root"},
	"/usr/share/bash-completion/completions/fleetgate": {"-rw-r--r--", "root/root"},
}

func TestPackages(t *testing.T) {
	dist := t.TempDir()
	makeIn(t, "deb", "rpm", "ARCHS=amd64 arm64", "DIST="+dist, "PKG_VERSION=1.0.0")
	deb := func(v, arch string) string { return filepath.Join(dist, "fleetgate_"+v+"_"+arch+".deb") }

	t.Run("deb info", func(t *testing.T) {
		for _, arch := range []string{"amd64", "arm64"} {
			info := mustRun(t, "dpkg-deb", "-I", deb("1.0.0", arch))
			for _, want := range []string{"Package: fleetgate", "Version: 1.0.0", "Architecture: " + arch,
				" preinst", " postinst", " prerm", " postrm", " conffiles"} {
				if !strings.Contains(info, want) {
					t.Errorf("%s: dpkg-deb -I lacks %q:\n%s", arch, want, info)
				}
			}
			conf := mustRun(t, "dpkg-deb", "-I", deb("1.0.0", arch), "conffiles")
			if strings.Fields(conf) == nil || strings.Join(strings.Fields(conf), " ") != "/etc/fleetgate/devices.yaml /etc/fleetgate/fleetgate.yaml" &&
				strings.Join(strings.Fields(conf), " ") != "/etc/fleetgate/fleetgate.yaml /etc/fleetgate/devices.yaml" {
				t.Errorf("%s: conffiles %q, want fleetgate.yaml and devices.yaml", arch, conf)
			}
		}
	})

	t.Run("deb contents", func(t *testing.T) {
		for _, arch := range []string{"amd64", "arm64"} {
			got := debContents(t, deb("1.0.0", arch))
			for path, want := range wantFiles {
				if got[path] != want {
					t.Errorf("%s %s: %v, want %v", arch, path, got[path], want)
				}
			}
			if e := got["/usr/share/zsh/vendor-completions/_fleetgate"]; e != (entry{"-rw-r--r--", "root/root"}) {
				t.Errorf("%s: zsh completion %v", arch, e)
			}
			checkManAndCompletion(t, arch, func(path string) []byte { return debFile(t, deb("1.0.0", arch), "."+path) })
			want := map[string]elf.Machine{"amd64": elf.EM_X86_64, "arm64": elf.EM_AARCH64}[arch]
			// The shipped adapters, built for the package's arch.
			for _, a := range []string{"udpline", "lorawan", "modbus"} {
				p := "/usr/lib/fleetgate/plugins/" + a
				if e := got[p]; e != (entry{"-rwxr-xr-x", "root/root"}) {
					t.Errorf("%s: %s %v, want 0755 root", arch, p, e)
					continue
				}
				if f, err := elf.NewFile(bytes.NewReader(debFile(t, deb("1.0.0", arch), "."+p))); err != nil || f.Machine != want {
					t.Errorf("%s: %s is not an executable for %v (%v)", arch, p, want, err)
				}
			}
			b, err := os.ReadFile("../configs/fleetgate.yaml")
			if err != nil {
				t.Fatal(err)
			}
			if shipped := debFile(t, deb("1.0.0", arch), "./etc/fleetgate/fleetgate.yaml"); !bytes.Equal(shipped, b) {
				t.Errorf("%s: /etc/fleetgate/fleetgate.yaml is not configs/fleetgate.yaml", arch)
			}
			f, err := elf.NewFile(bytes.NewReader(debFile(t, deb("1.0.0", arch), "./usr/bin/fleetgate")))
			if err != nil {
				t.Fatal(err)
			}
			if f.Machine != want {
				t.Errorf("%s: /usr/bin/fleetgate is for %v, want %v", arch, f.Machine, want)
			}
		}
	})

	t.Run("deb copyright", func(t *testing.T) {
		for _, arch := range []string{"amd64", "arm64"} {
			checkCopyright(t, arch, debFile(t, deb("1.0.0", arch), "./usr/share/doc/fleetgate/copyright"),
				debFile(t, deb("1.0.0", arch), "./usr/bin/fleetgate"))
		}
	})

	t.Run("rpm", func(t *testing.T) {
		for arch, rarch := range map[string]string{"amd64": "x86_64", "arm64": "aarch64"} {
			rpm := filepath.Join(dist, "fleetgate-1.0.0-1."+rarch+".rpm")
			if q := mustRun(t, "rpm", "-qp", "--qf", "%{NAME} %{VERSION} %{ARCH}", rpm); q != "fleetgate 1.0.0 "+rarch {
				t.Errorf("%s: rpm -qp: %q", arch, q)
			}
			// Modes, owners and paths, unabridged (rpm -qlv cuts names at 8 bytes).
			got := map[string]entry{}
			for _, l := range strings.Split(mustRun(t, "rpm", "-qp", "--qf", "[%{FILEMODES:perms} %{FILEUSERNAME} %{FILEGROUPNAME} %{FILENAMES}\n]", rpm), "\n") {
				if f := strings.Fields(l); len(f) == 4 {
					got[f[3]] = entry{f[0], f[1] + "/" + f[2]}
				}
			}
			for path, want := range wantFiles {
				if got[path] != want {
					t.Errorf("%s: rpm %s: %v, want %v", arch, path, got[path], want)
				}
			}
			if e := got["/usr/share/zsh/site-functions/_fleetgate"]; e != (entry{"-rw-r--r--", "root/root"}) {
				t.Errorf("%s: rpm zsh completion %v", arch, e)
			}
			if c := strings.Fields(mustRun(t, "rpm", "-qcp", rpm)); strings.Join(c, " ") != "/etc/fleetgate/devices.yaml /etc/fleetgate/fleetgate.yaml" {
				t.Errorf("%s: config files %v", arch, c)
			}
			// The licenses: the copyright file and the Apache License 2.0
			// that it points to (Debian systems have it in common-licenses).
			if l := strings.Fields(mustRun(t, "rpm", "-qLp", rpm)); strings.Join(l, " ") != "/usr/share/doc/fleetgate/copyright /usr/share/licenses/fleetgate/LICENSE" {
				t.Errorf("%s: license files %v", arch, l)
			}
			if e := got["/usr/share/licenses/fleetgate/LICENSE"]; e != (entry{"-rw-r--r--", "root/root"}) {
				t.Errorf("%s: rpm /usr/share/licenses/fleetgate/LICENSE: %v", arch, e)
			}
			scripts := mustRun(t, "rpm", "-qp", "--scripts", rpm)
			for _, s := range []string{"preinstall", "postinstall", "preuninstall", "postuninstall", "/run/systemd/system"} {
				if !strings.Contains(scripts, s) {
					t.Errorf("%s: rpm scripts lack %q", arch, s)
				}
			}
		}
	})

	t.Run("lintian", func(t *testing.T) {
		for _, arch := range []string{"amd64", "arm64"} {
			out, err := run(t, "lintian", "--fail-on", "error,warning", "--display-level", ">=warning", deb("1.0.0", arch))
			if err != nil {
				t.Errorf("lintian %s: %v\n%s", arch, err, out)
			}
		}
	})

	t.Run("install upgrade remove purge", func(t *testing.T) {
		makeIn(t, "deb", "ARCHS=amd64", "DIST="+dist, "PKG_VERSION=1.0.1")
		// This machine's own root under a throwaway overlay: seconds, and
		// the preinst takes the systemd-sysusers path.
		t.Run("host overlay", func(t *testing.T) {
			scratchInstall(t, hostOverlay(t), deb("1.0.0", "amd64"), deb("1.0.1", "amd64"))
		})
		// A minbase Debian root (debootstrap, cached in build/rootfs):
		// no systemd at all, so the preinst falls back to useradd.
		t.Run("minbase", func(t *testing.T) {
			scratchInstall(t, minbaseRoot(t), deb("1.0.0", "amd64"), deb("1.0.1", "amd64"))
		})
	})
}

// checkCopyright checks the copyright file of the arch's package: in the
// Debian format, fleetgate's paragraph under Apache-2.0, and one paragraph
// for the standard library and for each module that the package's
// binary (bin) says it was built with.
func checkCopyright(t *testing.T, arch string, copyright, bin []byte) {
	t.Helper()
	paras := map[string][]string{} // by first line
	for _, p := range strings.Split(string(copyright), "\n\n") {
		first, _, _ := strings.Cut(p, "\n")
		paras[first] = append(paras[first], p+"\n")
	}
	one := func(first string) string {
		t.Helper()
		if len(paras[first]) != 1 {
			t.Errorf("%s: %d paragraphs %q in the copyright file, want 1", arch, len(paras[first]), first)
			return ""
		}
		return paras[first][0]
	}
	if !strings.HasPrefix(string(copyright), "Format: https://www.debian.org/doc/packaging-manuals/copyright-format/1.0/\n") {
		t.Errorf("%s: the copyright file is not in the Debian format 1.0", arch)
	}
	if p := one("Files: *"); !strings.Contains(p, "\nCopyright: 2026 the fleetgate authors\nLicense: Apache-2.0\n") {
		t.Errorf("%s: fleetgate's paragraph:\n%s", arch, p)
	}
	if p := one("License: Apache-2.0"); !strings.Contains(p, "/usr/share/common-licenses/Apache-2.0") {
		t.Errorf("%s: the Apache-2.0 paragraph:\n%s", arch, p)
	}
	info, err := buildinfo.Read(bytes.NewReader(bin))
	if err != nil {
		t.Fatalf("%s: /usr/bin/fleetgate: %v", arch, err)
	}
	if p := one("Files: GOROOT/src/*"); !strings.Contains(p, "The standard library of "+info.GoVersion+",") {
		t.Errorf("%s: the standard library's paragraph (%s):\n%s", arch, info.GoVersion, p)
	}
	if len(info.Deps) < 20 {
		t.Errorf("%s: /usr/bin/fleetgate was built with %d modules only", arch, len(info.Deps))
	}
	for _, d := range info.Deps {
		if p := one("Files: " + d.Path + "/*"); !strings.Contains(p, "Go module "+d.Path+" "+d.Version+",") || !strings.Contains(p, "\nLicense: ") {
			t.Errorf("%s: the paragraph of %s %s:\n%s", arch, d.Path, d.Version, p)
		}
	}
}

// debFile returns the content of path (./usr/...) in deb's data.
func debFile(t *testing.T, deb, path string) []byte {
	t.Helper()
	cmd := exec.Command("dpkg-deb", "--fsys-tarfile", deb)
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("dpkg-deb --fsys-tarfile %s: %v", deb, err)
	}
	tr := tar.NewReader(bytes.NewReader(out))
	for {
		h, err := tr.Next()
		if err != nil {
			t.Fatalf("%s: no %s in the package (%v)", deb, path, err)
		}
		if h.Name == path {
			b, err := io.ReadAll(tr)
			if err != nil {
				t.Fatal(err)
			}
			return b
		}
	}
}

// rootfsCache is a minbase Debian root made by debootstrap from this
// machine's apt sources, kept as a tarball in the build directory.
const rootfsCache = "../build/rootfs/bookworm-minbase.tar.gz"

// scratch is a root file system to install packages in: enter is the
// command prefix that runs a command inside it, files the directory
// through which the test reads and writes its files.
type scratch struct {
	enter []string
	files string
}

// minbaseRoot unpacks the cached minbase root (making it first if needed)
// into a fresh directory.
func minbaseRoot(t *testing.T) scratch {
	t.Helper()
	if _, err := os.Stat(rootfsCache); err != nil {
		makeRootfs(t)
	}
	root := t.TempDir()
	mustRun(t, "tar", "--numeric-owner", "-xzf", rootfsCache, "-C", root)
	return scratch{enter: []string{"chroot", root}, files: root}
}

// hostOverlay mounts this machine's root file system under a tmpfs
// overlay in a private mount namespace, held by a sleeping process that
// the test ends; nothing reaches the real root.
func hostOverlay(t *testing.T) scratch {
	t.Helper()
	dir := t.TempDir()
	script := `set -e
mount -t tmpfs tmpfs "$1"
mkdir "$1/upper" "$1/work" "$1/root"
mount -t overlay overlay -o lowerdir=/,upperdir="$1/upper",workdir="$1/work" "$1/root"
echo mounted
exec sleep 600`
	cmd := exec.Command("unshare", "--mount", "--propagation", "private", "sh", "-c", script, "sh", dir)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var errb bytes.Buffer
	cmd.Stderr = &errb
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	line, _ := bufio.NewReader(out).ReadString('\n')
	if line != "mounted\n" {
		t.Fatalf("overlay of / not mounted: %s", errb.String())
	}
	pid := strconv.Itoa(cmd.Process.Pid)
	root := filepath.Join(dir, "root")
	return scratch{
		enter: []string{"nsenter", "--mount=/proc/" + pid + "/ns/mnt", "chroot", root},
		files: filepath.Join("/proc", pid, "root", root),
	}
}

func makeRootfs(t *testing.T) {
	t.Helper()
	suite, mirror := aptSource(t)
	dir := filepath.Join(t.TempDir(), "root")
	t.Logf("debootstrap --variant=minbase %s from %s (once; cached in %s)", suite, mirror, rootfsCache)
	mustRun(t, "debootstrap", "--variant=minbase", suite, dir, mirror)
	if err := os.MkdirAll(filepath.Dir(rootfsCache), 0o755); err != nil {
		t.Fatal(err)
	}
	tmp := rootfsCache + ".tmp"
	mustRun(t, "tar", "--numeric-owner", "-czf", tmp, "-C", dir, ".")
	if err := os.Rename(tmp, rootfsCache); err != nil {
		t.Fatal(err)
	}
}

// aptSource returns this machine's release code name and first Debian
// mirror, from /etc/os-release and the apt sources.
func aptSource(t *testing.T) (suite, mirror string) {
	t.Helper()
	osr, err := os.ReadFile("/etc/os-release")
	if err != nil {
		t.Fatal(err)
	}
	if m := regexp.MustCompile(`(?m)^VERSION_CODENAME=(\S+)`).FindSubmatch(osr); m != nil {
		suite = string(m[1])
	}
	files, _ := filepath.Glob("/etc/apt/sources.list.d/*.sources")
	files = append(files, "/etc/apt/sources.list")
	uri := regexp.MustCompile(`(?m)^(?:URIs:\s*|deb\s+(?:\[[^]]*\]\s+)?)(https?://\S+/debian)\s*$`)
	for _, f := range files {
		b, _ := os.ReadFile(f)
		if m := uri.FindSubmatch(b); m != nil {
			mirror = string(m[1])
			break
		}
	}
	if suite == "" || mirror == "" {
		t.Fatalf("no Debian release (%q) or mirror (%q) in this machine's apt configuration", suite, mirror)
	}
	return suite, mirror
}

// scratchInstall installs v1 in a scratch root (no systemd running there:
// the maintainer scripts' guards are exercised), edits the conffile,
// upgrades to v2, removes and purges.
func scratchInstall(t *testing.T, root scratch, v1, v2 string) {
	at := func(p string) string { return filepath.Join(root.files, p) }
	for _, deb := range []string{v1, v2} {
		b, err := os.ReadFile(deb)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(at("/tmp/"+filepath.Base(deb)), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	in := func(args ...string) string {
		t.Helper()
		return mustRun(t, root.enter[0], append(root.enter[1:len(root.enter):len(root.enter)], args...)...)
	}
	exists := func(p string) bool { _, err := os.Lstat(at(p)); return err == nil }

	in("dpkg", "-i", "/tmp/"+filepath.Base(v1))
	if !strings.Contains(in("getent", "passwd", "fleetgate"), ":/var/lib/fleetgate:/usr/sbin/nologin") {
		t.Fatal("no fleetgate system user after install")
	}
	if st := in("stat", "-c", "%a %U %G", "/etc/fleetgate/devices.yaml", "/etc/fleetgate", "/var/lib/fleetgate"); st != "640 root fleetgate\n750 root fleetgate\n750 fleetgate fleetgate\n" {
		t.Errorf("modes and owners after install:\n%s", st)
	}
	// The service's user can read its configuration and devices file.
	in("chroot", "--userspec=fleetgate:fleetgate", "/", "/usr/bin/fleetgate", "check-config", "-c", "/etc/fleetgate/fleetgate.yaml")

	const edit = "\n# site edit: kept across upgrades\n"
	f, err := os.OpenFile(at("/etc/fleetgate/fleetgate.yaml"), os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteString(edit); err != nil {
		t.Fatal(err)
	}
	f.Close()
	if err := os.WriteFile(at("/var/lib/fleetgate/fleetgate.db"), []byte("state"), 0o600); err != nil {
		t.Fatal(err)
	}

	in("dpkg", "--force-confold", "-i", "/tmp/"+filepath.Base(v2))
	if v := in("dpkg-query", "-W", "-f", "${Version}", "fleetgate"); v != "1.0.1" {
		t.Fatalf("version %q after the upgrade, want 1.0.1", v)
	}
	if b, _ := os.ReadFile(at("/etc/fleetgate/fleetgate.yaml")); !strings.HasSuffix(string(b), edit) {
		t.Fatal("the operator's edit of fleetgate.yaml was lost by the upgrade")
	}

	in("dpkg", "-r", "fleetgate")
	if exists("/usr/bin/fleetgate") || !exists("/etc/fleetgate/fleetgate.yaml") || !exists("/var/lib/fleetgate/fleetgate.db") {
		t.Fatal("remove: want the binary gone, the configuration and the state kept")
	}
	in("dpkg", "-P", "fleetgate")
	for _, p := range []string{"/etc/fleetgate", "/var/lib/fleetgate", "/usr/lib/fleetgate"} {
		if exists(p) {
			t.Errorf("%s left after purge", p)
		}
	}
	// Purged: dpkg has forgotten the package.
	if out, err := exec.Command(root.enter[0], append(root.enter[1:len(root.enter):len(root.enter)], "dpkg-query", "-W", "fleetgate")...).CombinedOutput(); err == nil || !strings.Contains(string(out), "no packages found") {
		t.Errorf("dpkg still knows fleetgate after purge: %v %s", err, out)
	}
}

// checkManAndCompletion checks the man page (docs/man/fleetgate.1,
// gzipped) and the bash completion that a package holds.
func checkManAndCompletion(t *testing.T, arch string, file func(path string) []byte) {
	t.Helper()
	zr, err := gzip.NewReader(bytes.NewReader(file("/usr/share/man/man1/fleetgate.1.gz")))
	if err != nil {
		t.Fatalf("%s: man page: %v", arch, err)
	}
	man, err := io.ReadAll(zr)
	if err != nil {
		t.Fatalf("%s: man page: %v", arch, err)
	}
	want, err := os.ReadFile("../docs/man/fleetgate.1")
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(man, want) {
		t.Errorf("%s: the man page is not docs/man/fleetgate.1", arch)
	}
	if c := file("/usr/share/bash-completion/completions/fleetgate"); !bytes.Contains(c, []byte("complete -F _fleetgate fleetgate")) {
		t.Errorf("%s: the bash completion is not fleetgate's:\n%s", arch, c)
	}
}
