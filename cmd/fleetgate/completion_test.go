package main

import (
	"bytes"
	"context"
	"flag"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

var updateMan = flag.Bool("update-man", false, "write docs/man/fleetgate.1 from the help (make man)")

// completionScript writes `fleetgate completion SHELL` to a file.
func completionScript(t *testing.T, shell string) string {
	t.Helper()
	code, out, errs := runCLI(t, "completion", shell)
	if code != 0 {
		t.Fatalf("completion %s: exit %d: %s", shell, code, errs)
	}
	path := filepath.Join(t.TempDir(), "fleetgate."+shell)
	if err := os.WriteFile(path, []byte(out), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// TestBashCompletion sources the generated script in bash and asks it
// what it completes, as bash's programmable completion does.
func TestBashCompletion(t *testing.T) {
	script := completionScript(t, "bash")
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "site.yaml"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		words []string // the last is being completed
		want  string
	}{
		{[]string{"fleetgate", "dev"}, "devices"},
		{[]string{"fleetgate", "ver"}, "version"},
		{[]string{"fleetgate", "--v"}, "--version"},
		{[]string{"fleetgate", "devices", "l"}, "list"},
		{[]string{"fleetgate", "devices", "list", "--st"}, "--state"},
		{[]string{"fleetgate", "devices", "list", "--state", "o"}, "online offline"},
		{[]string{"fleetgate", "devices", "list", "--order", "c"}, "changed"},
		{[]string{"fleetgate", "devices", "list", "--addr", "h:1", "--li"}, "--limit"},
		{[]string{"fleetgate", "run", "--c"}, "--config"},
		{[]string{"fleetgate", "run", "-c", filepath.Join(dir, "si")}, filepath.Join(dir, "site.yaml")},
		{[]string{"fleetgate", "hash-password", "-"}, "--help --cost"},
		{[]string{"fleetgate", "version", "--j"}, "--json"},
		{[]string{"fleetgate", "completion", "z"}, "zsh"},
		{[]string{"fleetgate", "events", "tail", "--f"}, "--follow"},
	} {
		quoted := make([]string, len(c.words))
		for i, w := range c.words {
			quoted[i] = "'" + w + "'"
		}
		prog := "source " + script + "; COMP_WORDS=(" + strings.Join(quoted, " ") + "); COMP_CWORD=" +
			strconv.Itoa(len(c.words)-1) + `; _fleetgate; echo "${COMPREPLY[*]}"`
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		out, err := exec.CommandContext(ctx, "bash", "--norc", "--noprofile", "-c", prog).CombinedOutput()
		cancel()
		if got := strings.TrimSpace(string(out)); err != nil || got != c.want {
			t.Errorf("complete %q: %q, %v; want %q", c.words, got, err, c.want)
		}
	}
}

// TestZshCompletion checks that zsh parses the generated script, and
// that it names every command and the flags of their help.
func TestZshCompletion(t *testing.T) {
	script := completionScript(t, "zsh")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if out, err := exec.CommandContext(ctx, "zsh", "-n", script).CombinedOutput(); err != nil {
		t.Fatalf("zsh -n: %v\n%s", err, out)
	}
	body, err := os.ReadFile(script)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"#compdef fleetgate", "'devices list')", "{-c,--config}", "'--state[only devices in this STATE, online, suspect or offline]:STATE:(online suspect offline)'", "'--cost[bcrypt cost"} {
		if !bytes.Contains(body, []byte(want)) {
			t.Errorf("the zsh script lacks %q", want)
		}
	}
}

// TestManPageCurrent: docs/man/fleetgate.1 is what the help generates
// (make man writes it), and groff formats it without a warning.
func TestManPageCurrent(t *testing.T) {
	page := manPage(cliCommands())
	path := filepath.Join("..", "..", "docs", "man", "fleetgate.1")
	if *updateMan {
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(page), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	have, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v: run 'make man'", err)
	}
	if string(have) != page {
		t.Fatalf("%s is not what the help generates: run 'make man'", path)
	}
	for _, want := range []string{".SS devices list", `\fB\-\-state\fR \fISTATE\fR`, `\fB\-c, \-\-config\fR \fIFILE\fR`, ".SS completion bash"} {
		if !strings.Contains(page, want) {
			t.Errorf("the man page lacks %q", want)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, "groff", "-man", "-Tutf8", "-ww", "-z")
	cmd.Stdin = strings.NewReader(page)
	if out, err := cmd.CombinedOutput(); err != nil || len(out) > 0 {
		t.Fatalf("groff: %v\n%s", err, out)
	}
}
