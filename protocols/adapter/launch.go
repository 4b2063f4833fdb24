package adapter

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"time"

	plugin "github.com/hashicorp/go-plugin"
	"golang.org/x/sys/unix"

	pb "github.com/fleetgate/fleetgate/plugins/proto"
)

// DefaultEnv is an adapter's whole environment besides what go-plugin
// adds (the magic cookie, the protocol versions, the mTLS certificate):
// the gateway's own environment is not passed on (SkipHostEnv), so that
// neither NOTIFY_SOCKET nor a secret reaches an adapter.
var DefaultEnv = []string{"PATH=/usr/local/bin:/usr/bin:/bin"}

// execFD is the descriptor under which an adapter process gets its own
// executable (exec.Cmd.ExtraFiles[0]); it runs /proc/self/fd/3.
const execFD = 3

// openExecutable opens the adapter executable at path and checks the open
// file: the host then executes that very file, through its descriptor
// (launch), so a swap of the path between the check and the exec cannot
// run another one. Checked: it is a regular file; neither it nor any
// directory on its path, as given and with symbolic links resolved, up to
// /, is writable by anyone but its owner (group- or world-writable, but a
// directory with the sticky bit such as /tmp), nor owned by anyone but
// root or the gateway's user; and its sha256 is want (hex, any case) when
// want is set.
func openExecutable(path, want string) (*os.File, error) {
	path, err := filepath.Abs(path)
	if err != nil {
		return nil, err
	}
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	if err := checkExecutable(f, path, want); err != nil {
		f.Close()
		return nil, err
	}
	return f, nil
}

func checkExecutable(f *os.File, path, want string) error {
	fi, err := f.Stat()
	if err != nil {
		return err
	}
	if !fi.Mode().IsRegular() {
		return fmt.Errorf("%s is not a regular file (%s); refusing to start it", path, fi.Mode())
	}
	if err := writableByOthers(path, fi); err != nil {
		return err
	}
	real, err := filepath.EvalSymlinks(path)
	if err != nil {
		return err
	}
	for _, p := range []string{path, real} {
		for d := filepath.Dir(p); ; d = filepath.Dir(d) {
			di, err := os.Stat(d)
			if err != nil {
				return err
			}
			if err := writableByOthers(d, di); err != nil {
				return err
			}
			if d == filepath.Dir(d) {
				break
			}
		}
	}
	if want == "" {
		return nil
	}
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

// writableByOthers refuses a file or directory that someone besides
// root and the gateway's user could change: one writable by its group or
// by others (a directory with the sticky bit excepted: nobody can rename
// or remove another's entries in it), or owned by another user.
func writableByOthers(name string, fi os.FileInfo) error {
	mode := fi.Mode()
	if mode.Perm()&0o022 != 0 && !(mode.IsDir() && mode&os.ModeSticky != 0) {
		return fmt.Errorf("%s is writable by its group or others (%s): whoever can write it can replace the adapter; refusing to start it (chmod go-w %s)", name, mode, name)
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok && st.Uid != 0 && int(st.Uid) != os.Geteuid() {
		return fmt.Errorf("%s is owned by uid %d, neither root nor the gateway's user (uid %d), who could replace the adapter; refusing to start it", name, st.Uid, os.Geteuid())
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
//
// The executable is exe, opened and checked by openExecutable: the
// process gets it as descriptor 3 and executes /proc/self/fd/3 (a script
// too: its interpreter opens that path), with argv[0] the configured
// path.
func launch(spec Spec, exe *os.File, env []string, logger *slogLogger) (*process, error) {
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
		cmd := &exec.Cmd{
			Path:       fmt.Sprintf("/proc/self/fd/%d", execFD),
			Args:       []string{spec.Path},
			ExtraFiles: []*os.File{exe},
		}
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
		if err == nil {
			err = limitProcess(p.pid, spec)
		}
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

// limitProcess sets the OS limits of spec on the process pid.
func limitProcess(pid int, spec Spec) error {
	for _, l := range []struct {
		resource int
		value    int64
		what     string
	}{
		{unix.RLIMIT_AS, spec.MaxAddressSpace, "address space (limits.max_address_space)"},
		{unix.RLIMIT_NOFILE, int64(spec.MaxOpenFiles), "open files (limits.max_open_files)"},
	} {
		if l.value <= 0 {
			continue
		}
		r := unix.Rlimit{Cur: uint64(l.value), Max: uint64(l.value)}
		if err := unix.Prlimit(pid, l.resource, &r, nil); err != nil {
			return fmt.Errorf("set the %s of process %d to %d: %w", l.what, pid, l.value, err)
		}
	}
	return nil
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
