package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"

	"golang.org/x/sys/unix"

	"github.com/fleetgate/fleetgate/auth"
)

// stdin is where hash-password reads the password; tests replace it.
var stdin io.Reader = os.Stdin

// maxPasswordLine bounds the line hash-password reads: anything longer is
// not a password bcrypt can take.
const maxPasswordLine = 256

// defaultHashCost is hash-password's bcrypt cost: enough for the random
// secrets devices should have (16 random bytes and more: `openssl rand
// -hex 16`), cheap at every MQTT login (docs/operations.md, "Size a
// site"). A password a person chose wants --cost 10 or more.
const defaultHashCost = 6

// cmdHashPassword reads a password (on a terminal: prompted twice,
// without echo; else the first line of standard input) and prints its
// bcrypt hash, for password_bcrypt in the devices file.
func cmdHashPassword(_ context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newBareFlags("hash-password", "hash-password [--cost N] [< file-with-the-password]")
	cost := fs.Int("cost", defaultHashCost, fmt.Sprintf("bcrypt cost, %d to %d (each step doubles the work of every MQTT login; 10 or more for a password a person chose)", auth.MinCost, auth.MaxCost))
	if err := parse(fs, args); err != nil {
		return err
	}
	if err := noArgs(fs); err != nil {
		return err
	}
	if *cost < auth.MinCost || *cost > auth.MaxCost {
		return fmt.Errorf("%w: --cost %d is not in %d..%d", errUsage, *cost, auth.MinCost, auth.MaxCost)
	}
	password, err := readPassword(stderr)
	defer clear(password)
	if err != nil {
		return err
	}
	hash, err := auth.HashPassword(password, *cost)
	if err != nil {
		return err
	}
	fmt.Fprintln(stdout, hash)
	return nil
}

// readPassword reads a password: on a terminal, prompted twice without
// echo (the prompts on stderr); else the first line of standard input.
// The caller clears it.
func readPassword(stderr io.Writer) ([]byte, error) {
	if f, ok := stdin.(*os.File); ok && isTerminal(f) {
		return promptPassword(f, stderr)
	}
	line, err := bufio.NewReaderSize(stdin, maxPasswordLine).ReadSlice('\n')
	defer clear(line)
	switch {
	case errors.Is(err, bufio.ErrBufferFull):
		return nil, fmt.Errorf("the first line of standard input is longer than %d bytes; a password has at most %d", maxPasswordLine, auth.MaxPasswordLen)
	case err != nil && !errors.Is(err, io.EOF):
		return nil, fmt.Errorf("read password: %w", err)
	}
	password := bytes.Clone(trimEOL(line))
	if len(password) == 0 {
		return nil, errors.New("no password: the first line of standard input is empty")
	}
	return password, nil
}

// trimEOL removes a trailing "\n" or "\r\n".
func trimEOL(line []byte) []byte {
	if n := len(line); n > 0 && line[n-1] == '\n' {
		line = line[:n-1]
	}
	if n := len(line); n > 0 && line[n-1] == '\r' {
		line = line[:n-1]
	}
	return line
}

// promptPassword asks for the password on terminal tty twice, with the
// terminal's echo off, writing the prompts to w.
func promptPassword(tty *os.File, w io.Writer) ([]byte, error) {
	fd := int(tty.Fd())
	old, err := unix.IoctlGetTermios(fd, unix.TCGETS)
	if err != nil {
		return nil, fmt.Errorf("read password: %w", err)
	}
	quiet := *old
	quiet.Lflag &^= unix.ECHO
	quiet.Lflag |= unix.ICANON
	if err := unix.IoctlSetTermios(fd, unix.TCSETS, &quiet); err != nil {
		return nil, fmt.Errorf("read password: %w", err)
	}
	defer func() { _ = unix.IoctlSetTermios(fd, unix.TCSETS, old) }()
	r := bufio.NewReaderSize(tty, maxPasswordLine)
	read := func(prompt string) ([]byte, error) {
		fmt.Fprint(w, prompt)
		line, err := r.ReadSlice('\n')
		fmt.Fprintln(w)
		switch {
		case errors.Is(err, bufio.ErrBufferFull):
			return nil, fmt.Errorf("the password is longer than %d bytes; a password has at most %d", maxPasswordLine, auth.MaxPasswordLen)
		case err != nil && !errors.Is(err, io.EOF):
			return nil, fmt.Errorf("read password: %w", err)
		}
		return bytes.Clone(trimEOL(line)), nil
	}
	first, err := read("Password: ")
	if err != nil {
		return nil, err
	}
	if len(first) == 0 {
		return nil, errors.New("no password: the line is empty")
	}
	again, err := read("Again: ")
	defer clear(again)
	if err != nil {
		clear(first)
		return nil, err
	}
	if !bytes.Equal(first, again) {
		clear(first)
		return nil, errors.New("the passwords differ")
	}
	return first, nil
}
