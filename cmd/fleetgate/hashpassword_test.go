package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"
	"testing"

	"github.com/fleetgate/fleetgate/auth"
	"golang.org/x/crypto/bcrypt"
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
	if cost, err := bcrypt.Cost([]byte(strings.TrimSpace(out))); err != nil || cost != auth.DefaultCost {
		t.Fatalf("cost %d, %v; want %d", cost, err, auth.DefaultCost)
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
	if !errors.Is(err, flag.ErrHelp) || out.Len() != 0 || !strings.Contains(errb.String(), "usage: fleetgate hash-password [--cost N]") || !strings.Contains(errb.String(), "-cost") {
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
