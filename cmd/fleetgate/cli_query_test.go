package main

import (
	"flag"
	"io"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"testing"

	"github.com/fleetgate/fleetgate/internal/redistest"
	"os"
	"os/exec"
	"strings"
	"syscall"
)

func TestFlagsBeforeOrAfterArguments(t *testing.T) {
	for _, args := range [][]string{
		{"--json", "-c", "f.yaml", "a", "b"},
		{"a", "--json", "b", "-c", "f.yaml"},
		{"a", "b", "--json", "-c=f.yaml"},
	} {
		fs := flag.NewFlagSet("t", flag.ContinueOnError)
		fs.SetOutput(io.Discard)
		j := fs.Bool("json", false, "")
		c := fs.String("c", "", "")
		if err := parse(fs, args); err != nil {
			t.Fatalf("parse(%q): %v", args, err)
		}
		if !*j || *c != "f.yaml" || !slices.Equal(fs.Args(), []string{"a", "b"}) {
			t.Fatalf("parse(%q): json %v, c %q, args %q", args, *j, *c, fs.Args())
		}
	}
	fs := flag.NewFlagSet("t", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	j := fs.Bool("json", false, "")
	if err := parse(fs, []string{"a", "--", "--json", "-x"}); err != nil || *j || !slices.Equal(fs.Args(), []string{"a", "--json", "-x"}) {
		t.Fatalf("after --: %v, json %v, args %q", err, *j, fs.Args())
	}
}

// Without a configuration file the query commands use the default admin
// address; a file named with -c must exist.
func TestQueryAddressWithoutConfig(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "fleetgate.yaml")
	q := newQueryFlags("status", "status")
	*q.config = missing // as the default path is when absent
	if addr, err := q.adminAddr(); err != nil || addr != "127.0.0.1:9180" {
		t.Fatalf("no config file: %q, %v; want the default 127.0.0.1:9180", addr, err)
	}
	q = newQueryFlags("status", "status")
	if err := parse(q.fs, []string{"-c", missing}); err != nil {
		t.Fatal(err)
	}
	if _, err := q.adminAddr(); err == nil {
		t.Fatal("a missing file named with -c was ignored")
	}
}

// When nothing answers, the command says where it looked (exit 1), with
// its flags after its argument.
func TestQueryNothingAnswers(t *testing.T) {
	addr := "127.0.0.1:" + itoa(redistest.FreePort(t))
	want := "fleetgate devices get: no gateway answers at " + addr + "; is 'fleetgate run' running? (use --addr or -c)\n"
	code, out, errs := runCLI(t, "devices", "get", "dev-1", "--addr", addr)
	if code != 1 || out != "" || errs != want {
		t.Fatalf("exit %d, stdout %q, stderr %q; want exit 1 and %q", code, out, errs, want)
	}
	for _, args := range [][]string{{"status", "--addr", addr}, {"devices", "list", "--addr", addr}, {"events", "tail", "--addr", addr}} {
		code, _, errs := runCLI(t, args...)
		if code != 1 || !regexpMatch(`no gateway answers at `+addr+`; is 'fleetgate run' running\?`, errs) {
			t.Fatalf("%v: exit %d, stderr %q", args, code, errs)
		}
	}
}

func itoa(n int) string { return strconv.Itoa(n) }

func regexpMatch(pattern, s string) bool { return regexp.MustCompile(pattern).MatchString(s) }

// A query command that cannot read the configuration (the service's
// file, readable by root and the service only) says what to do: sudo, or
// --addr. The binary runs as nobody.
func TestQueryUnreadableConfigSaysWhatToDo(t *testing.T) {
	dir := t.TempDir()
	for _, d := range []string{filepath.Dir(dir), dir} { // the test's directory and its own
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	cfg := filepath.Join(dir, "fleetgate.yaml")
	if err := os.WriteFile(cfg, []byte("listen: { admin: { http: \"127.0.0.1:9\" } }\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	// A copy of the binary nobody may run (the test binary's directory
	// is root's).
	bin := filepath.Join(dir, "fleetgate")
	data, err := os.ReadFile(binary)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(bin, data, 0o755); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "devices", "list", "-c", cfg)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
	out, err := cmd.CombinedOutput()
	if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 1 {
		t.Fatalf("exit %v, want 1\n%s", err, out)
	}
	for _, want := range []string{"permission denied", "run with sudo", "--addr HOST:PORT"} {
		if !strings.Contains(string(out), want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
}
