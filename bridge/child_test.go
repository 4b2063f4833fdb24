package bridge_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/fleetgate/fleetgate/bridge"
	"github.com/fleetgate/fleetgate/gateway"
	"github.com/fleetgate/fleetgate/queue/diskq"
	"github.com/fleetgate/fleetgate/queue/memq"
)

// The kill -9 tests re-execute the test binary as a bridge process;
// these variables tell the child what to do.
const (
	envChild   = "BRIDGE_CHILD"  // "up" or "down"
	envDir     = "BRIDGE_DIR"    // where its queue files are
	envBroker  = "BRIDGE_BROKER" // the upstream broker's URL
	childPer   = 150             // messages per device of the up child
	childDevs  = 20
	childTopic = "fg"
)

// diskQueue opens the durable queue name in dir, closed when the test
// ends. It commits every 10 ms at most, as the default configuration.
func diskQueue(t testing.TB, dir, name string) *diskq.Queue {
	t.Helper()
	q, err := openDisk(dir, name)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { q.Close() })
	return q
}

func openDisk(dir, name string) (*diskq.Queue, error) {
	return diskq.Open(diskq.Options{Path: filepath.Join(dir, name+".db"), MaxBytes: 256 << 20, CommitInterval: 10 * time.Millisecond})
}

// runChild is the child process: "up" publishes childDevs devices ×
// childPer messages at QoS 1 through a bridge on the durable queue in
// BRIDGE_DIR, printing "acked <device> <seq>" once Publish returned nil
// (the message is on disk); "down" runs a bridge taking commands into
// the commands queue in BRIDGE_DIR that holds the first command before
// it is durable, printing "ready" once subscribed and "holding <payload>"
// then. Both run until killed.
func runChild(mode string) int {
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	fail := func(err error) int {
		fmt.Fprintln(os.Stderr, "child:", err)
		return 2
	}
	mem := func() gateway.Queue {
		q, _ := memq.New(memq.Options{MaxBytes: 64 << 20})
		return q
	}
	o := bridge.Options{URL: os.Getenv(envBroker), TopicPrefix: childTopic, Memory: mem(), Logger: log}
	var out sync.Mutex
	say := func(format string, args ...any) {
		out.Lock()
		defer out.Unlock()
		fmt.Fprintf(os.Stdout, format+"\n", args...) // unbuffered: a line printed is in the pipe
	}
	switch mode {
	case "up":
		q, err := openDisk(os.Getenv(envDir), "durable")
		if err != nil {
			return fail(err)
		}
		o.ClientID, o.Durable, o.Commands = "child-up", q, mem()
	case "down":
		q, err := openDisk(os.Getenv(envDir), "commands")
		if err != nil {
			return fail(err)
		}
		o.ClientID, o.Durable, o.Commands, o.Down = "child-down", mem(), q, true
		bridge.SetBeforeDurable(&o, func(msgs []gateway.Message) {
			say("holding %s", msgs[0].Payload)
			select {}
		})
	}
	b, err := bridge.New(context.Background(), o)
	if err != nil {
		return fail(err)
	}
	if mode == "down" {
		for !b.Status().Upstream.Subscribed {
			time.Sleep(10 * time.Millisecond)
		}
		say("ready")
		select {}
	}
	var wg sync.WaitGroup
	for d := range childDevs {
		wg.Go(func() {
			device := fmt.Sprintf("d%d", d)
			for i := range childPer {
				if err := b.Publish(context.Background(), []gateway.Message{msg(device, "seq", strconv.Itoa(i), 1, "coap")}); err != nil {
					fmt.Fprintln(os.Stderr, "child: publish:", err)
					os.Exit(2)
				}
				say("acked %s %d", device, i)
			}
		})
	}
	wg.Wait()
	say("done")
	select {}
}

// child is a bridge process of the test binary, killed by the test's end.
type child struct {
	cmd   *exec.Cmd
	mu    sync.Mutex
	lines []string
}

func startChild(t *testing.T, mode, dir, broker string) *child {
	t.Helper()
	c := &child{cmd: exec.Command(os.Args[0], "-test.run=^$")}
	c.cmd.Env = append(os.Environ(), envChild+"="+mode, envDir+"="+dir, envBroker+"="+broker)
	c.cmd.Stderr = t.Output()
	c.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	stdout, err := c.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := c.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	read := make(chan struct{})
	go func() {
		defer close(read)
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			c.mu.Lock()
			c.lines = append(c.lines, sc.Text())
			c.mu.Unlock()
		}
		_, _ = io.Copy(io.Discard, stdout)
	}()
	t.Cleanup(func() {
		_ = c.cmd.Process.Kill()
		<-read
		_ = c.cmd.Wait()
	})
	return c
}

// output returns the lines the child printed with prefix.
func (c *child) output(prefix string) []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []string
	for _, l := range c.lines {
		if rest, ok := strings.CutPrefix(l, prefix); ok {
			out = append(out, rest)
		}
	}
	return out
}

// kill9 kills the child with SIGKILL and waits for it to exit.
func (c *child) kill9(t *testing.T) {
	t.Helper()
	if err := c.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_, _ = c.cmd.Process.Wait()
}
