package sdk

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/hashicorp/go-hclog"
	plugin "github.com/hashicorp/go-plugin"
	"golang.org/x/sys/unix"

	pb "github.com/fleetgate/fleetgate/plugins/proto"
)

// parentPoll is how often the adapter checks that the gateway that started
// it is still its parent.
const parentPoll = 500 * time.Millisecond

// Serve runs adapter a as a fleetgate plugin and returns when the gateway
// ends it; call it from main and return. It never returns an error: a
// problem is logged on stderr and the process exits non-zero.
//
// Besides the contract (plugins/proto), Serve:
//   - keeps stdout for the go-plugin handshake: from Serve on, anything
//     else written to file descriptor 1 is refused and logged as an error
//     (log with Logger(ctx), which writes to stderr);
//   - stops Run and exits on SIGTERM;
//   - exits when its parent process changes (the gateway died and the
//     adapter was re-parented), a second layer under the host's
//     parent-death signal, so that no adapter outlives its gateway.
func Serve(info Info, a Adapter) {
	log := hclog.New(&hclog.LoggerOptions{
		Name:       info.Name,
		Level:      hclog.Trace,
		Output:     os.Stderr,
		JSONFormat: true,
	})
	ppid := os.Getppid()
	handshake, err := guardStdout(log)
	if err != nil {
		log.Error("cannot guard stdout", "error", err)
		os.Exit(1)
	}
	srv := NewServer(info, a, log)
	go watchParent(ppid, log)
	go onSIGTERM(srv, log)

	os.Stdout = handshake // go-plugin prints the handshake line to os.Stdout
	plugin.Serve(&plugin.ServeConfig{
		HandshakeConfig:  pb.Handshake,
		VersionedPlugins: pb.VersionedPlugins(srv),
		GRPCServer:       plugin.DefaultGRPCServer,
		Logger:           log,
	})
}

// guardStdout moves the real stdout to a new descriptor, returned for the
// handshake, and points descriptor 1 at a pipe whose lines are logged as
// refused writes.
func guardStdout(log hclog.Logger) (*os.File, error) {
	fd, err := unix.Dup(1)
	if err != nil {
		return nil, fmt.Errorf("dup stdout: %w", err)
	}
	unix.CloseOnExec(fd)
	real := os.NewFile(uintptr(fd), "handshake")
	r, w, err := os.Pipe()
	if err != nil {
		return nil, fmt.Errorf("stdout pipe: %w", err)
	}
	if err := unix.Dup3(int(w.Fd()), 1, 0); err != nil {
		return nil, fmt.Errorf("redirect stdout: %w", err)
	}
	go func() {
		sc := bufio.NewScanner(r)
		for sc.Scan() {
			log.Error("refused a write to stdout, which carries the plugin handshake; log with sdk.Logger instead", "text", sc.Text())
		}
	}()
	return real, nil
}

// watchParent exits the process when its parent changes (it was
// re-parented: the gateway died).
func watchParent(ppid int, log hclog.Logger) {
	t := time.NewTicker(parentPoll)
	defer t.Stop()
	for {
		if p := os.Getppid(); p != ppid {
			log.Error("the gateway that started this adapter is gone; exiting", "parent", ppid, "now", p)
			os.Exit(2)
		}
		<-t.C
	}
}

// onSIGTERM stops Run (flushing what is pending) and exits.
func onSIGTERM(srv *Server, log hclog.Logger) {
	ch := make(chan os.Signal, 1)
	signal.Notify(ch, syscall.SIGTERM)
	<-ch
	log.Info("SIGTERM: stopping")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, _ = srv.Shutdown(ctx, &pb.ShutdownRequest{})
	os.Exit(0)
}
