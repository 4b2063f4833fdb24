//go:build packages

package systemd

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// booted is this machine's root under a throwaway overlay, the root of a
// mount namespace, booted by its own systemd as PID 1 of a PID namespace,
// in a network namespace of its own (its loopback only): units, the
// journal and systemctl as on a host.
type booted struct {
	pid   string // systemd's, in this machine's PID namespace
	files string // the root, seen from here
}

// bootOverlay boots the overlay and waits (bounded) for systemd to finish
// starting up; the test's end kills every process in it.
func bootOverlay(t *testing.T) booted {
	t.Helper()
	dir := t.TempDir()
	script := `set -e
mount -t tmpfs tmpfs "$1"
mkdir "$1/upper" "$1/work" "$1/root"
mount -t overlay overlay -o lowerdir=/,upperdir="$1/upper",workdir="$1/work" "$1/root"
r="$1/root"
mount -t tmpfs tmpfs "$r/run"
mount -t tmpfs tmpfs "$r/tmp"
mount --rbind /dev "$r/dev"
mount -t sysfs sysfs "$r/sys"
ip link set lo up
# The overlay becomes the namespace's root (pivot_root, not chroot: the
# kernel refuses user namespaces, PrivateUsers=, to a chrooted process).
cd "$r"
mkdir -p .oldroot
pivot_root . .oldroot
cd /
mount -t proc proc /proc
umount -l /.oldroot
echo mounted
exec unshare --pid --fork --mount-proc=/proc env container=fleetgate-test /lib/systemd/systemd --system --unit=multi-user.target`
	cmd := exec.Command("unshare", "--mount", "--net", "--propagation", "private", "sh", "-c", script, "sh", dir)
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
	line, _ := bufio.NewReader(out).ReadString('\n')
	if line != "mounted\n" {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		t.Fatalf("overlay of / not mounted: %s", errb.String())
	}
	// unshare --fork's child is systemd (PID 1 inside).
	var pid string
	deadline := time.Now().Add(10 * time.Second)
	for pid == "" && time.Now().Before(deadline) {
		b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/task/%d/children", cmd.Process.Pid, cmd.Process.Pid))
		pid = strings.TrimSpace(string(b))
		time.Sleep(50 * time.Millisecond)
	}
	if pid == "" {
		t.Fatal("systemd did not start in the overlay")
	}
	t.Cleanup(func() {
		if p, err := strconv.Atoi(pid); err == nil {
			_ = syscall.Kill(p, syscall.SIGKILL) // the PID namespace's init: every process in it goes
		}
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	b := booted{pid: pid, files: filepath.Join("/proc", pid, "root")}
	// systemctl talks to systemd once its private socket exists.
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		if _, err := os.Stat(filepath.Join(b.files, "run/systemd/private")); err == nil {
			break
		}
	}
	state, _ := b.run(t, 90*time.Second, "", "systemctl", "is-system-running", "--wait")
	if s := strings.TrimSpace(state); s != "running" && s != "degraded" {
		t.Fatalf("systemd in the overlay: %q", state)
	}
	return b
}

// run runs a command inside with stdin (bounded by limit) and returns its
// combined output and error.
func (b booted) run(t *testing.T, limit time.Duration, stdin string, args ...string) (string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), limit)
	defer cancel()
	cmd := exec.CommandContext(ctx, "nsenter", append([]string{"-t", b.pid, "-m", "-n", "-p", "-r", "-w", "--"}, args...)...)
	cmd.Stdin = strings.NewReader(stdin)
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// must runs a command inside and fails the test if it fails.
func (b booted) must(t *testing.T, args ...string) string {
	t.Helper()
	out, err := b.run(t, time.Minute, "", args...)
	if err != nil {
		if args[0] == "systemctl" {
			j, _ := b.run(t, time.Minute, "", "journalctl", "-u", "fleetgate", "--no-pager", "-n", "30")
			out += "\njournalctl -u fleetgate:\n" + j
		}
		t.Fatalf("%s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return out
}

// start starts a long-running command inside and returns its stdin; the
// command ends when stdin is closed or the test ends.
func (b booted) start(t *testing.T, args ...string) (io.WriteCloser, *bytes.Buffer) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	cmd := exec.CommandContext(ctx, "nsenter", append([]string{"-t", b.pid, "-m", "-n", "-p", "-r", "-w", "--"}, args...)...)
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { in.Close(); cancel(); _ = cmd.Wait() })
	return in, &out
}

// edit replaces old by new in the file at path inside, once.
func (b booted) edit(t *testing.T, path, old, new string) {
	t.Helper()
	p := filepath.Join(b.files, path)
	body, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Contains(body, []byte(old)) {
		t.Fatalf("%s has no %q", path, old)
	}
	if err := os.WriteFile(p, bytes.Replace(body, []byte(old), []byte(new), 1), 0); err != nil {
		t.Fatal(err)
	}
}

// A site's first day, as docs/operations.md tells it, on a host that runs
// systemd and mosquitto: install the package (it does not start, and says
// which port is taken), open DTLS and TLS, generate the certificate and a
// PSK and a password device, start, connect them with coap-client and
// mosquitto_pub, see them online, break a key and read why in the
// journal, reload a bad devices file and see the refusal.
func TestPackageFirstDay(t *testing.T) {
	dist := t.TempDir()
	makeIn(t, "deb", "ARCHS=amd64", "DIST="+dist, "PKG_VERSION=1.0.0")
	deb, err := os.ReadFile(filepath.Join(dist, "fleetgate_1.0.0_amd64.deb"))
	if err != nil {
		t.Fatal(err)
	}
	b := bootOverlay(t)
	b.must(t, "systemctl", "start", "mosquitto.service")
	if err := os.WriteFile(filepath.Join(b.files, "tmp/fleetgate.deb"), deb, 0o644); err != nil {
		t.Fatal(err)
	}

	// Install beside mosquitto: enabled, not started, and the terminal
	// and the journal say why.
	out := b.must(t, "dpkg", "-i", "/tmp/fleetgate.deb")
	const busy = "fleetgate.service not started: listen.mqtt.tcp 127.0.0.1:1883 cannot be bound (address already in use)"
	if !strings.Contains(out, busy) {
		t.Fatalf("dpkg -i beside mosquitto:\n%s\nwant ∋ %q", out, busy)
	}
	if j := b.must(t, "journalctl", "-t", "fleetgate-postinst", "--no-pager", "-o", "cat"); !strings.Contains(j, busy) {
		t.Errorf("the journal lacks %q:\n%s", busy, j)
	}
	if st, _ := b.run(t, 10*time.Second, "", "systemctl", "is-active", "fleetgate"); strings.TrimSpace(st) != "inactive" {
		t.Errorf("fleetgate.service %q after an install beside mosquitto, want inactive", st)
	}
	if en := b.must(t, "systemctl", "is-enabled", "fleetgate"); strings.TrimSpace(en) != "enabled" {
		t.Errorf("fleetgate.service %q, want enabled", en)
	}

	// The operator's first day: one line each for DTLS and TLS, plain
	// MQTT off (mosquitto has the port), a certificate, two devices.
	const config = "/etc/fleetgate/fleetgate.yaml"
	b.edit(t, config, `    tcp: "127.0.0.1:1883"`, `    tcp: ""`)
	b.edit(t, config, `    dtls: ""`, `    dtls: "127.0.0.1:5684"`)
	b.edit(t, config, `    tls: ""`+"\n    # PEM certificate", `    tls: "127.0.0.1:8883"`+"\n    # PEM certificate")
	cert := b.must(t, "fleetgate", "gen-cert")
	fp := regexp.MustCompile(`(?m)^SHA-256 fingerprint: ([0-9A-F:]{95})$`).FindStringSubmatch(cert)
	if fp == nil || !strings.Contains(b.must(t, "openssl", "x509", "-in", "/etc/fleetgate/mqtt.crt", "-noout", "-fingerprint", "-sha256"), fp[1]) {
		t.Fatalf("gen-cert:\n%s", cert)
	}
	if st := b.must(t, "stat", "-c", "%a %U %G", "/etc/fleetgate/mqtt.key"); st != "640 root fleetgate\n" {
		t.Errorf("the certificate's key: %s, want 640 root fleetgate", st)
	}
	key := strings.TrimSpace(b.must(t, "openssl", "rand", "-hex", "16"))
	password := strings.TrimSpace(b.must(t, "openssl", "rand", "-base64", "18"))
	hash, err := b.run(t, time.Minute, password+"\n", "fleetgate", "hash-password")
	if err != nil {
		t.Fatalf("hash-password: %v\n%s", err, hash)
	}
	devices := fmt.Sprintf("devices:\n  - id: sensor-0001\n    psk: \"text:%s\"\n  - id: meter-0002\n    password_bcrypt: %q\n", key, strings.TrimSpace(hash))
	b.edit(t, "/etc/fleetgate/devices.yaml", "devices: []\n", devices)
	b.must(t, "systemctl", "start", "fleetgate")
	journal := b.must(t, "journalctl", "-u", "fleetgate", "--no-pager", "-o", "cat")
	if strings.Count(journal, "configuration "+config+" is valid: ") != 1 || strings.Contains(journal, "# effective configuration") {
		t.Errorf("the start's journal, want one summary line of check-config:\n%s", journal)
	}
	if strings.Contains(journal, "warning:") || strings.Contains(journal, "level=WARN") {
		t.Errorf("warnings at the start of the shipped set-up:\n%s", journal)
	}

	// The devices connect, and are online.
	if o := b.must(t, "coap-client-openssl", "-m", "post", "-B", "5", "-u", "sensor-0001", "-k", key, "coaps://127.0.0.1:5684/hb"); strings.Contains(o, "4.") {
		t.Fatalf("coap-client over DTLS:\n%s", o)
	}
	in, pubOut := b.start(t, "mosquitto_pub", "--cafile", "/etc/fleetgate/mqtt.crt", "-h", "localhost", "-p", "8883",
		"-u", "meter-0002", "-P", password, "-t", "devices/meter-0002/hello", "-l")
	if _, err := in.Write([]byte("hello\n")); err != nil {
		t.Fatal(err)
	}
	online := func() string {
		out, _ := b.run(t, 30*time.Second, "", "fleetgate", "devices", "list", "--state", "online")
		return out
	}
	var list string
	for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline); time.Sleep(500 * time.Millisecond) {
		if list = online(); strings.Contains(list, "sensor-0001") && strings.Contains(list, "meter-0002") {
			break
		}
	}
	if !strings.Contains(list, "2 devices: 2 online") {
		t.Fatalf("fleetgate devices list --state online:\n%s\nmosquitto_pub: %s", list, pubOut)
	}

	// A broken key: the device is refused, and the journal says why.
	if o, err := b.run(t, 30*time.Second, "", "mosquitto_pub", "--cafile", "/etc/fleetgate/mqtt.crt", "-h", "localhost", "-p", "8883",
		"-u", "meter-0002", "-P", "not-"+password, "-t", "devices/meter-0002/hello", "-m", "x"); err == nil {
		t.Errorf("mosquitto_pub with a wrong password was admitted:\n%s", o)
	}
	refused := regexp.MustCompile(`msg="device refused".*device=meter-0002.*reason=bad_credentials`)
	var j string
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(300 * time.Millisecond) {
		if j = b.must(t, "journalctl", "-u", "fleetgate", "--no-pager", "-o", "cat"); refused.MatchString(j) {
			break
		}
	}
	if !refused.MatchString(j) {
		t.Errorf("the journal does not say why meter-0002 was refused (want %s)", refused)
	}

	// A bad devices file: the reload fails and says why, in systemctl
	// status too; the gateway keeps its devices.
	b.edit(t, "/etc/fleetgate/devices.yaml", "\n  - id: meter-0002\n    password_bcrypt", "\n  - id: sensor-0001\n    password_bcrypt")
	if o, err := b.run(t, time.Minute, "", "systemctl", "reload", "fleetgate"); err == nil {
		t.Fatalf("systemctl reload with a duplicate device succeeded:\n%s", o)
	}
	status, _ := b.run(t, 30*time.Second, "", "systemctl", "status", "--no-pager", "-n", "20", "fleetgate")
	if !strings.Contains(status, `device "sensor-0001" is already listed at line`) || !strings.Contains(status, "active (running)") {
		t.Errorf("systemctl status after the refused reload:\n%s", status)
	}
	if list := online(); !strings.Contains(list, "meter-0002") {
		t.Errorf("meter-0002 not online after the refused reload:\n%s", list)
	}
	b.edit(t, "/etc/fleetgate/devices.yaml", "\n  - id: sensor-0001\n    password_bcrypt", "\n  - id: meter-0002\n    password_bcrypt")
	b.must(t, "systemctl", "reload", "fleetgate")
}
