package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/crypto/bcrypt"

	"github.com/fleetgate/fleetgate/auth"
)

// hashPassword runs cmdHashPassword with input on stdin. Tests that call it
// must not be parallel: stdin is a package variable.
func hashPassword(t *testing.T, input string, args ...string) (stdout string, err error) {
	t.Helper()
	old := stdin
	stdin = strings.NewReader(input)
	t.Cleanup(func() { stdin = old })
	var out, errb bytes.Buffer
	err = cmdHashPassword(context.Background(), args, &out, &errb)
	return out.String(), err
}

func TestHashPassword(t *testing.T) {
	cases := []struct {
		name, input, password string
	}{
		{"newline", "s3cret pass\n", "s3cret pass"},
		{"crlf and more lines", "s3cret\r\nsecond line\n", "s3cret"},
		{"no newline", "s3cret", "s3cret"},
		{"spaces kept", "  s3cret  \n", "  s3cret  "},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			out, err := hashPassword(t, c.input, "--cost", "4")
			if err != nil {
				t.Fatal(err)
			}
			hash, ok := strings.CutSuffix(out, "\n")
			if !ok || strings.Contains(hash, "\n") {
				t.Fatalf("output %q is not one line", out)
			}
			if err := bcrypt.CompareHashAndPassword([]byte(hash), []byte(c.password)); err != nil {
				t.Fatalf("hash %q does not match %q: %v", hash, c.password, err)
			}
			if cost, err := bcrypt.Cost([]byte(hash)); err != nil || cost != 4 {
				t.Fatalf("cost %d, %v; want 4", cost, err)
			}
			file := fmt.Sprintf("devices:\n  - id: d1\n    password_bcrypt: %q\n", hash)
			d, err := auth.Parse("devices.yaml", []byte(file))
			if err != nil {
				t.Fatalf("the devices file refuses the hash: %v", err)
			}
			if err := d.CheckPassword("d1", []byte(c.password)); err != nil {
				t.Fatalf("CheckPassword: %v", err)
			}
		})
	}
}

func TestHashPasswordDefaultCost(t *testing.T) {
	out, err := hashPassword(t, "s3cret\n")
	if err != nil {
		t.Fatal(err)
	}
	if cost, err := bcrypt.Cost([]byte(strings.TrimSpace(out))); err != nil || cost != defaultHashCost {
		t.Fatalf("cost %d, %v; want %d", cost, err, defaultHashCost)
	}
}

// The default cost is what docs/operations.md advises for the secrets
// devices should have.
func TestHashPasswordDefaultCostIsTheAdvice(t *testing.T) {
	ops, err := os.ReadFile("../../docs/operations.md")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`use cost (\d+)–(\d+) for machine secrets`).FindSubmatch(ops)
	if m == nil {
		t.Fatal("docs/operations.md no longer advises a cost for machine secrets")
	}
	lo, _ := strconv.Atoi(string(m[1]))
	hi, _ := strconv.Atoi(string(m[2]))
	if defaultHashCost < lo || defaultHashCost > hi {
		t.Fatalf("hash-password's default cost %d is outside the advised %d–%d", defaultHashCost, lo, hi)
	}
}

func TestHashPasswordRefuses(t *testing.T) {
	long := strings.Repeat("p", auth.MaxPasswordLen+1)
	huge := strings.Repeat("q", 1000)
	cases := []struct {
		name  string
		input string
		args  []string
		usage bool
		want  string
	}{
		{"empty input", "", nil, false, "no password: the first line of standard input is empty"},
		{"empty line", "\nsecond\n", nil, false, "no password: the first line of standard input is empty"},
		{"crlf only", "\r\n", nil, false, "no password: the first line of standard input is empty"},
		{"over 72 bytes", long + "\n", nil, false, "hash password: the password is 73 bytes, bcrypt takes at most 72"},
		{"huge line", huge, nil, false, "the first line of standard input is longer than 256 bytes; a password has at most 72"},
		{"cost too low", "pw\n", []string{"--cost", "3"}, true, "usage: --cost 3 is not in 4..31"},
		{"cost too high", "pw\n", []string{"--cost", "32"}, true, "usage: --cost 32 is not in 4..31"},
		{"argument", "pw\n", []string{"pw"}, true, "usage: unexpected arguments: pw"},
		{"bad flag", "pw\n", []string{"--rounds", "4"}, true, "usage: flag provided but not defined: -rounds"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			out, err := hashPassword(t, c.input, c.args...)
			if err == nil {
				t.Fatalf("no error; printed %q", out)
			}
			if out != "" {
				t.Errorf("printed %q on a refusal", out)
			}
			if got := err.Error(); got != c.want {
				t.Errorf("error %q, want %q", got, c.want)
			}
			if errors.Is(err, errUsage) != c.usage {
				t.Errorf("usage error: %v, want %v", errors.Is(err, errUsage), c.usage)
			}
		})
	}
}

func TestHashPasswordHelp(t *testing.T) {
	old := stdin
	stdin = strings.NewReader("pw\n")
	t.Cleanup(func() { stdin = old })
	var out, errb bytes.Buffer
	err := cmdHashPassword(context.Background(), []string{"--help"}, &out, &errb)
	var help *helpError
	if !errors.Is(err, flag.ErrHelp) || !errors.As(err, &help) || out.Len() != 0 || errb.Len() != 0 ||
		!strings.Contains(help.usage, "usage: fleetgate hash-password [--cost N]") || !strings.Contains(help.usage, "--cost N") {
		t.Fatalf("--help: %v, stdout %q, stderr %q", err, out.String(), errb.String())
	}
}

// The password is read from the first line only: the rest of standard
// input stays unread beyond the reader's buffer.
func TestHashPasswordReadsOneLine(t *testing.T) {
	r := &countingReader{r: strings.NewReader("pw\n" + strings.Repeat("x", 10000))}
	old := stdin
	stdin = r
	t.Cleanup(func() { stdin = old })
	if err := cmdHashPassword(context.Background(), []string{"--cost", "4"}, io.Discard, io.Discard); err != nil {
		t.Fatal(err)
	}
	if r.n > maxPasswordLine {
		t.Fatalf("read %d bytes, want at most %d", r.n, maxPasswordLine)
	}
}

type countingReader struct {
	r io.Reader
	n int
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += n
	return n, err
}

// On a terminal, hash-password prompts twice on stderr and the password
// never shows: the terminal does not echo it. The binary runs on a real
// pseudo-terminal.
func TestHashPasswordPromptsWithoutEcho(t *testing.T) {
	master, tty := openPTY(t)
	var stdout bytes.Buffer
	cmd := exec.Command(binary, "hash-password")
	cmd.Stdin, cmd.Stderr, cmd.Stdout = tty, tty, &stdout
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	screen := make(chan string, 1)
	go func() {
		var seen bytes.Buffer
		buf := make([]byte, 256)
		for {
			n, err := master.Read(buf)
			seen.Write(buf[:n])
			if err != nil || bytes.Contains(seen.Bytes(), []byte("Again: ")) && bytes.Count(seen.Bytes(), []byte("\n")) >= 2 {
				screen <- seen.String()
				return
			}
			if bytes.HasSuffix(seen.Bytes(), []byte("Password: ")) || bytes.HasSuffix(seen.Bytes(), []byte("Again: ")) {
				if _, err := master.Write([]byte("pty-secret-42\n")); err != nil {
					screen <- seen.String()
					return
				}
			}
		}
	}()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("hash-password: %v", err)
		}
	case <-time.After(20 * time.Second):
		_ = cmd.Process.Kill()
		t.Fatal("hash-password on a terminal did not finish")
	}
	tty.Close() // the reader sees the end
	var shown string
	select {
	case shown = <-screen:
	case <-time.After(5 * time.Second):
		t.Fatal("no terminal output")
	}
	if !strings.Contains(shown, "Password: ") || !strings.Contains(shown, "Again: ") {
		t.Fatalf("terminal showed %q, want both prompts", shown)
	}
	if strings.Contains(shown, "pty-secret-42") {
		t.Fatalf("the terminal echoed the password: %q", shown)
	}
	hash := strings.TrimSpace(stdout.String())
	if err := bcrypt.CompareHashAndPassword([]byte(hash), []byte("pty-secret-42")); err != nil {
		t.Fatalf("stdout %q is not the password's hash: %v", hash, err)
	}
}
