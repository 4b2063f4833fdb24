//go:build faults && soak

package faults

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"regexp"
	"sync"
	"time"
)

// soakMonitor is SOAK_MONITOR=regexp (with SOAK_DUMP): every Redis
// server of the run is watched with MONITOR, and the commands it runs
// that match the regexp (a device's ID, say), the ones scripts run
// included, are written to dump/monitor.log with the server's address,
// beside every command that loses or moves state (FLUSHALL, SHUTDOWN,
// REPLICAOF, FAILOVER, DEBUG, CLUSTER). What a record went through
// between two events is then on the servers' own word. MONITOR costs
// the servers CPU (every command is formatted for it): a run with it is
// for finding a cause, not for the figures.
var soakMonitor = os.Getenv("SOAK_MONITOR")

// stateCommands are the commands that lose or move a server's state.
var stateCommands = regexp.MustCompile(`(?i)\] "(flushall|flushdb|shutdown|replicaof|slaveof|failover|debug|cluster)"`)

// soakTap taps Redis servers with MONITOR until its context ends,
// writing the lines that match re (or stateCommands) to w, each
// prefixed with the server's address. A server that is down, stopped
// or restarting is dialled again every 200 ms. A nil tap watches
// nothing.
type soakTap struct {
	ctx  context.Context
	re   *regexp.Regexp
	mu   sync.Mutex // w and seen
	w    io.Writer
	seen map[string]bool
	wg   sync.WaitGroup
}

// watch taps addr, once however often it is named (a server restarted
// on its port is dialled again by the tap already there).
func (t *soakTap) watch(addr string) {
	if t == nil {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.seen[addr] {
		return
	}
	t.seen[addr] = true
	t.wg.Add(1)
	go func() {
		defer t.wg.Done()
		for t.ctx.Err() == nil {
			monitorOnce(t.ctx, addr, func(line string) {
				if t.re.MatchString(line) || stateCommands.MatchString(line) {
					t.mu.Lock()
					fmt.Fprintf(t.w, "%s %s\n", addr, line)
					t.mu.Unlock()
				}
			})
			select {
			case <-t.ctx.Done():
			case <-time.After(200 * time.Millisecond):
			}
		}
	}()
}

// monitorOnce runs one MONITOR connection to addr until it breaks or
// ctx ends, passing each line to out.
func monitorOnce(ctx context.Context, addr string, out func(string)) {
	c, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		return
	}
	stop := context.AfterFunc(ctx, func() { c.Close() })
	defer stop()
	defer c.Close()
	if _, err := io.WriteString(c, "*1\r\n$7\r\nMONITOR\r\n"); err != nil {
		return
	}
	sc := bufio.NewScanner(c)
	sc.Buffer(make([]byte, 64<<10), 16<<20)
	for sc.Scan() {
		line := sc.Text()
		if len(line) > 0 && line[0] == '+' { // +OK, then "+<ts> [db addr] cmd..."
			out(line[1:])
		}
	}
}
