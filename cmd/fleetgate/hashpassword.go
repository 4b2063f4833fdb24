package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"

	"github.com/fleetgate/fleetgate/auth"
)

// stdin is where hash-password reads the password; tests replace it.
var stdin io.Reader = os.Stdin

// maxPasswordLine bounds the line hash-password reads: anything longer is
// not a password bcrypt can take.
const maxPasswordLine = 256

// cmdHashPassword reads a password from the first line of standard input
// and prints its bcrypt hash, for password_bcrypt in the devices file.
func cmdHashPassword(_ context.Context, args []string, stdout, stderr io.Writer) error {
	fs, _ := newFlags("hash-password", "hash-password [--cost N] < file-with-the-password", stderr)
	cost := fs.Int("cost", auth.DefaultCost, fmt.Sprintf("bcrypt cost, %d to %d (each step doubles the work of every MQTT login)", auth.MinCost, auth.MaxCost))
	if err := parse(fs, args); err != nil {
		return err
	}
	if err := noArgs(fs); err != nil {
		return err
	}
	if *cost < auth.MinCost || *cost > auth.MaxCost {
		return fmt.Errorf("%w: --cost %d is not in %d..%d", errUsage, *cost, auth.MinCost, auth.MaxCost)
	}
	line, err := bufio.NewReaderSize(stdin, maxPasswordLine).ReadSlice('\n')
	defer clear(line)
	switch {
	case errors.Is(err, bufio.ErrBufferFull):
		return fmt.Errorf("the first line of standard input is longer than %d bytes; a password has at most %d", maxPasswordLine, auth.MaxPasswordLen)
	case err != nil && !errors.Is(err, io.EOF):
		return fmt.Errorf("read password: %w", err)
	}
	password := trimEOL(line)
	if len(password) == 0 {
		return errors.New("no password: the first line of standard input is empty")
	}
	hash, err := auth.HashPassword(password, *cost)
	if err != nil {
		return err
	}
	fmt.Fprintln(stdout, hash)
	return nil
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
