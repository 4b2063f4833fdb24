package adapter

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"syscall"
	"time"

	plugin "github.com/hashicorp/go-plugin"

	pb "github.com/fleetgate/fleetgate/plugins/proto"
)

// DefaultEnv is an adapter's whole environment besides what go-plugin
// adds (the magic cookie, the protocol versions, the mTLS certificate):
// the gateway's own environment is not passed on (SkipHostEnv), so that
// neither NOTIFY_SOCKET nor a secret reaches an adapter.
var DefaultEnv = []string{"PATH=/usr/local/bin:/usr/bin:/bin"}

// checkSum compares the sha256 of the file at path with want (hex, any
// case); an empty want checks nothing.
func checkSum(path, want string) error {
	if want == "" {
		return nil
	}
	f, err := os.Open(path)
	if err != nil {
		return fmt.Errorf("checksum: %w", err)
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return fmt.Errorf("checksum: read %s: %w", path, err)
	}
	got := hex.EncodeToString(h.Sum(nil))
	if !strings.EqualFold(got, want) {
		return fmt.Errorf("checksum mismatch: %s has sha256 %s, the configuration wants %s; refusing to start it", path, got, strings.ToLower(want))
	}
	return nil
}

// process is one started adapter process.
type process struct {
	client  *plugin.Client
	adapter pb.AdapterClient
	pid     int
	// release ends the process: it kills it (if it still runs) and frees
	// the OS thread that started it. It waits until the process is gone.
	release func()
}

// launch starts the adapter executable under go-plugin and completes the
// handshake.
//
// The process gets PR_SET_PDEATHSIG = SIGKILL, so that it dies with the
// gateway even after kill -9. The kernel sends that signal when the
// *thread* that forked the child exits, not the process, and the Go
// runtime may end an idle thread. So the fork (go-plugin's Client.Start,
// which calls exec.Cmd.Start on the calling goroutine, with the Cmd we
// give it in ClientConfig.Cmd) runs on a goroutine locked to its OS
// thread with runtime.LockOSThread, and that goroutine stays locked until
// the process is gone: only then does it unlock the thread.
func launch(spec Spec, env []string, logger *slogLogger) (*process, error) {
	type result struct {
		p   *process
		err error
	}
	res := make(chan result, 1)
	release := make(chan struct{})
	done := make(chan struct{})
	go func() {
		runtime.LockOSThread()
		defer close(done)
		cmd := exec.Command(spec.Path)
		cmd.Env = append([]string(nil), env...)
		cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
		client := plugin.NewClient(&plugin.ClientConfig{
			HandshakeConfig:  pb.Handshake,
			VersionedPlugins: pb.VersionedPlugins(nil),
			Cmd:              cmd,
			SkipHostEnv:      true,
			AllowedProtocols: []plugin.Protocol{plugin.ProtocolGRPC},
			AutoMTLS:         true,
			Managed:          true,
			StartTimeout:     spec.StartTimeout,
			Logger:           logger,
			SyncStdout: &lineLogger{l: logger.l, level: slog.LevelWarn,
				msg: "the adapter wrote to stdout, which is not its log; log with sdk.Logger"},
			SyncStderr: &lineLogger{l: logger.l, level: slog.LevelInfo, msg: "adapter stderr"},
		})
		p, err := dispense(client, spec)
		if err != nil {
			client.Kill()
			runtime.UnlockOSThread()
			res <- result{err: err}
			return
		}
		p.release = func() {
			select {
			case <-release:
			default:
				close(release)
			}
			// go-plugin's Kill asks the process to exit over gRPC and waits
			// for that answer without a deadline: a hung process gets
			// SIGKILL after the grace.
			t := time.NewTimer(stopGrace)
			defer t.Stop()
			select {
			case <-done:
			case <-t.C:
				_ = syscall.Kill(p.pid, syscall.SIGKILL)
				<-done
			}
		}
		res <- result{p: p}
		<-release
		client.Kill()
		// The process is gone: the thread may be reused or ended.
		runtime.UnlockOSThread()
	}()
	r := <-res
	return r.p, r.err
}

func dispense(client *plugin.Client, spec Spec) (*process, error) {
	rpc, err := client.Client()
	if err != nil {
		return nil, handshakeError(spec, err)
	}
	raw, err := rpc.Dispense(pb.PluginName)
	if err != nil {
		return nil, fmt.Errorf("dispense: %w", err)
	}
	a, ok := raw.(pb.AdapterClient)
	if !ok {
		return nil, fmt.Errorf("dispense: got %T, want an adapter client", raw)
	}
	p := &process{client: client, adapter: a}
	if rc := client.ReattachConfig(); rc != nil {
		p.pid = rc.Pid
	}
	return p, nil
}

// handshakeError says in plain words why the handshake failed.
func handshakeError(spec Spec, err error) error {
	msg := err.Error()
	switch {
	case strings.Contains(msg, "timeout while waiting for plugin to start"):
		return fmt.Errorf("%s did not complete the plugin handshake within start_timeout %s: is it a fleetgate adapter built with plugins/sdk? (%w)", spec.Path, spec.StartTimeout, err)
	case strings.Contains(msg, "Failed to read any lines from plugin's stdout"):
		return fmt.Errorf("%s exited before the plugin handshake (see its log lines above), or closed its stdout", spec.Path)
	case strings.HasPrefix(msg, "Unrecognized remote plugin message: "):
		line, _, _ := strings.Cut(strings.TrimPrefix(msg, "Unrecognized remote plugin message: "), "\n")
		return fmt.Errorf("%s printed %q on stdout before the plugin handshake: stdout belongs to the handshake, an adapter must log to stderr (sdk.Logger)", spec.Path, line)
	case strings.Contains(msg, "plugin exited before we could connect"):
		return fmt.Errorf("%s exited before the plugin handshake (see its log lines above): %w", spec.Path, err)
	case strings.Contains(msg, "Incompatible API version") || strings.Contains(msg, "incompatible"):
		return fmt.Errorf("%s speaks another adapter contract version than this gateway (%d): %w", spec.Path, pb.ProtocolVersion, err)
	}
	return fmt.Errorf("start %s: %w", spec.Path, err)
}
