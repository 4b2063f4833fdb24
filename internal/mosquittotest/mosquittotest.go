// Package mosquittotest starts real mosquitto brokers for tests: on a
// free loopback port, with the configuration, persistence and log in the
// test's temporary directory, killed by t.Cleanup. A missing mosquitto
// fails the test (make deps installs it); it never skips.
package mosquittotest

import (
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/fleetgate/fleetgate/internal/redistest"
	"github.com/fleetgate/fleetgate/internal/testcert"
)

// Options configure a broker.
type Options struct {
	// User and Password, when User is set, are the one account of the
	// broker (a password file written by mosquitto_passwd), and anonymous
	// clients are refused. Without User anonymous clients are allowed.
	User, Password string
	// TLS makes the listener TLS, with a self-signed certificate for
	// 127.0.0.1 that Broker.TLS trusts.
	TLS bool
	// Config holds more lines of mosquitto.conf, such as
	// "max_queued_messages 100000".
	Config []string
}

// Broker is one mosquitto child process.
type Broker struct {
	// Addr is the listener's address, "127.0.0.1:<port>".
	Addr string
	// Dir holds mosquitto.conf, the persistence file and mosquitto.log.
	Dir string
	// TLS, for a TLS listener (Options.TLS), is a client configuration
	// that trusts the broker's certificate; nil otherwise.
	TLS *tls.Config

	t      testing.TB
	bin    string
	cmd    *exec.Cmd
	exited chan struct{} // closed when cmd has been waited for
}

// startTimeout bounds how long a broker may take to listen.
const startTimeout = 10 * time.Second

// Binary returns the path of mosquitto, which Debian installs in
// /usr/sbin (often not in a user's PATH), failing the test if absent.
func Binary(t testing.TB) string {
	t.Helper()
	if p, err := exec.LookPath("mosquitto"); err == nil {
		return p
	}
	for _, p := range []string{"/usr/sbin/mosquitto", "/usr/local/sbin/mosquitto"} {
		if _, err := os.Stat(p); err == nil {
			return p
		}
	}
	t.Fatal("mosquitto not found in PATH, /usr/sbin or /usr/local/sbin (make deps installs it: apt-get install -y mosquitto)")
	return ""
}

// Start runs a broker on a free loopback port until the test ends. It
// keeps its retained messages and sessions in Dir, so that Stop and Start
// keep them. When the test fails, the tail of the broker's log is logged.
func Start(t testing.TB, o Options) *Broker {
	t.Helper()
	b := &Broker{Dir: t.TempDir(), t: t, bin: Binary(t)}
	conf := []string{
		"persistence true",
		"persistence_location " + b.Dir + "/",
		"log_dest file " + b.logFile(),
	}
	if os.Geteuid() == 0 {
		// as root mosquitto would switch to the user mosquitto, which
		// cannot read the test's private directory
		conf = append(conf, "user root")
	}
	if o.User != "" {
		pw := filepath.Join(b.Dir, "passwd")
		passwd, err := exec.LookPath("mosquitto_passwd")
		if err != nil {
			t.Fatalf("mosquitto_passwd not found (make deps installs mosquitto, which brings it): %v", err)
		}
		if out, err := exec.Command(passwd, "-b", "-c", pw, o.User, o.Password).CombinedOutput(); err != nil {
			t.Fatalf("mosquitto_passwd: %v\n%s", err, out)
		}
		conf = append(conf, "password_file "+pw, "allow_anonymous false")
	} else {
		conf = append(conf, "allow_anonymous true")
	}
	if o.TLS {
		cert := testcert.New(t)
		certFile, keyFile := cert.Write(t, b.Dir)
		conf = append(conf, "certfile "+certFile, "keyfile "+keyFile)
		b.TLS = cert.Client
	}
	conf = append(conf, o.Config...)
	var err error
	for range 5 { // another process may take the free port first
		port := redistest.FreePort(t)
		b.Addr = net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
		listener := fmt.Sprintf("listener %d 127.0.0.1", port)
		text := strings.Join(append([]string{listener}, conf...), "\n") + "\n"
		if err := os.WriteFile(b.confFile(), []byte(text), 0o600); err != nil {
			t.Fatal(err)
		}
		if err = b.run(); err == nil {
			t.Cleanup(func() {
				b.Kill()
				if t.Failed() {
					t.Logf("mosquitto log (%s):\n%s", b.Addr, b.Log())
				}
			})
			return b
		}
	}
	t.Fatalf("start mosquitto: %v\n%s", err, b.Log())
	return nil
}

func (b *Broker) confFile() string { return filepath.Join(b.Dir, "mosquitto.conf") }
func (b *Broker) logFile() string  { return filepath.Join(b.Dir, "mosquitto.log") }

// run starts the process and waits until it listens.
func (b *Broker) run() error {
	cmd := exec.Command(b.bin, "-c", b.confFile())
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return err
	}
	exited := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		close(exited)
	}()
	b.cmd, b.exited = cmd, exited
	deadline := time.Now().Add(startTimeout)
	for {
		c, err := net.DialTimeout("tcp", b.Addr, 100*time.Millisecond)
		if err == nil {
			c.Close()
			return nil
		}
		if time.Now().After(deadline) {
			b.Kill()
			return fmt.Errorf("mosquitto not listening on %s after %v: %w", b.Addr, startTimeout, err)
		}
		select {
		case <-exited:
			b.cmd = nil
			return fmt.Errorf("mosquitto on %s exited: %v", b.Addr, cmd.ProcessState)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// Stop ends the broker cleanly with SIGTERM (it saves its retained
// messages and sessions), killing it if it takes more than 10 seconds.
// Stopping a stopped broker does nothing.
func (b *Broker) Stop() {
	if b.cmd == nil {
		return
	}
	_ = b.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-b.exited:
		b.cmd = nil
	case <-time.After(10 * time.Second):
		b.Kill()
	}
}

// Start starts a stopped broker again, on the same address and with the
// same directory, and waits until it listens.
func (b *Broker) Start() {
	b.t.Helper()
	if b.cmd != nil {
		b.t.Fatal("mosquitto: Start of a running broker")
	}
	if err := b.run(); err != nil {
		b.t.Fatalf("restart mosquitto: %v\n%s", err, b.Log())
	}
}

// Kill ends the broker with SIGKILL and waits for it; killing a stopped
// broker does nothing.
func (b *Broker) Kill() {
	if b.cmd == nil {
		return
	}
	_ = b.cmd.Process.Kill()
	<-b.exited
	b.cmd = nil
}

// Log returns the tail of the broker's log file.
func (b *Broker) Log() string {
	out, err := os.ReadFile(b.logFile())
	if errors.Is(err, os.ErrNotExist) {
		return "(no log)"
	}
	if len(out) > 4000 {
		out = out[len(out)-4000:]
	}
	return string(out)
}
