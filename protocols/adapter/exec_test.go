package adapter_test

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/fleetgate/fleetgate/gateway"
	"github.com/fleetgate/fleetgate/protocols/adapter"
)

// writeScript writes a script that records who it is in marker and exits,
// padded with zeros (a sparse file) to size bytes, which makes its
// checksum take a while.
func writeScript(t *testing.T, path, who, marker string, size int64) {
	t.Helper()
	if err := os.WriteFile(path, []byte("#!/bin/sh\necho "+who+" > "+marker+"\nexit 3\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	if size > 0 {
		if err := os.Truncate(path, size); err != nil {
			t.Fatal(err)
		}
	}
}

func fileSum(t *testing.T, path string) string {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(h.Sum(nil))
}

// openedHere reports whether this process has path open.
func openedHere(path string) bool {
	fds, _ := os.ReadDir("/proc/self/fd")
	for _, fd := range fds {
		if l, err := os.Readlink(filepath.Join("/proc/self/fd", fd.Name())); err == nil && l == path {
			return true
		}
	}
	return false
}

// TestSwapAfterTheChecksumRunsTheCheckedFile replaces the adapter
// executable (a rename over its path) while the host computes its
// checksum: the process that runs is the file whose checksum matched,
// not the one now at the path.
func TestSwapAfterTheChecksumRunsTheCheckedFile(t *testing.T) {
	dir := t.TempDir()
	path, marker := filepath.Join(dir, "adapter"), filepath.Join(dir, "ran")
	writeScript(t, path, "checked", marker, 128<<20)
	sum := fileSum(t, path)
	writeScript(t, path+".new", "swapped", marker, 0)

	e := newHost(t, nil)
	done := make(chan error, 1)
	go func() {
		done <- e.host.Apply(ctx(t), []adapter.Spec{{Name: "swap", Path: path, SHA256: sum, StartTimeout: 5 * time.Second}})
	}()
	// Swap as soon as the host has the file open (it is hashing it).
	deadline := time.Now().Add(10 * time.Second)
	for !openedHere(path) {
		if time.Now().After(deadline) {
			t.Fatal("the host never opened the executable")
		}
		runtime.Gosched()
	}
	if err := os.Rename(path+".new", path); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err == nil || !strings.Contains(err.Error(), "exited before the plugin handshake") {
		t.Fatalf("Apply = %v, want the script's exit", err)
	}
	var ran []byte
	waitFor(t, 5*time.Second, "the marker", func() bool {
		ran, _ = os.ReadFile(marker)
		return len(ran) > 0
	})
	if got := strings.TrimSpace(string(ran)); got != "checked" {
		t.Fatalf("the process that ran is %q, want the file whose checksum was checked", got)
	}
}

// copyFile copies src to dst with mode.
func copyFile(t *testing.T, src, dst string, mode os.FileMode) {
	t.Helper()
	b, err := os.ReadFile(src)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(dst, b, mode); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(dst, mode); err != nil { // beyond the umask
		t.Fatal(err)
	}
}

// TestWritableExecutableRefused: an adapter executable that someone
// besides root and the gateway's user could replace is not started: a
// group- or world-writable file or directory on its path (symbolic links
// followed), or a file of another user. A sticky world-writable directory
// (as /tmp) is no such directory.
func TestWritableExecutableRefused(t *testing.T) {
	mkdir := func(mode os.FileMode) string {
		d := filepath.Join(t.TempDir(), "plugins")
		if err := os.Mkdir(d, 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(d, mode); err != nil {
			t.Fatal(err)
		}
		return d
	}
	groupWritable := filepath.Join(mkdir(0o755), "udpline")
	copyFile(t, udpline, groupWritable, 0o775)
	openDir := mkdir(0o777)
	inOpenDir := filepath.Join(openDir, "udpline")
	copyFile(t, udpline, inOpenDir, 0o755)
	link := filepath.Join(mkdir(0o755), "udpline")
	if err := os.Symlink(inOpenDir, link); err != nil {
		t.Fatal(err)
	}
	sticky := filepath.Join(mkdir(os.ModeSticky|0o777), "udpline")
	copyFile(t, udpline, sticky, 0o755)
	cases := []struct{ path, want string }{
		{groupWritable, groupWritable + " is writable by its group or others (-rwxrwxr-x): whoever can write it can replace the adapter; refusing to start it (chmod go-w " + groupWritable + ")"},
		{inOpenDir, openDir + " is writable by its group or others (drwxrwxrwx)"},
		{link, openDir + " is writable by its group or others (drwxrwxrwx)"},
	}
	if os.Geteuid() == 0 {
		other := filepath.Join(mkdir(0o755), "udpline")
		copyFile(t, udpline, other, 0o755)
		if err := os.Chown(other, 65534, 65534); err != nil {
			t.Fatal(err)
		}
		cases = append(cases, struct{ path, want string }{other, other + " is owned by uid 65534, neither root nor the gateway's user (uid 0)"})
	}
	e := newHost(t, nil)
	for i, tc := range cases {
		spec := udpSpec(fmt.Sprintf("perm%d", i), freeUDP(t))
		spec.Path = tc.path
		err := e.host.Apply(ctx(t), []adapter.Spec{spec})
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: Apply = %v\nwant %s", tc.path, err, tc.want)
		}
		if st := e.status(t, spec.Name); st.PID != 0 || st.State != adapter.StateBackoff {
			t.Errorf("%s: status = %+v, want not started", tc.path, st)
		}
	}
	spec := udpSpec("sticky", freeUDP(t))
	spec.Path = sticky
	if err := e.host.Apply(ctx(t), []adapter.Spec{spec}); err != nil {
		t.Fatalf("in a sticky world-writable directory: %v", err)
	}
}

// TestOSLimitsOfTheProcess: the adapter process runs under the address
// space and open files limits of its spec; without them it keeps what it
// inherited.
func TestOSLimitsOfTheProcess(t *testing.T) {
	e := newHost(t, nil)
	addr := freeUDP(t)
	limited := udpSpec("limited", addr)
	limited.MaxAddressSpace, limited.MaxOpenFiles = 8<<30, 64
	if err := e.host.Apply(ctx(t), []adapter.Spec{limited, udpSpec("plain", freeUDP(t))}); err != nil {
		t.Fatal(err)
	}
	limits := func(name string) string {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/limits", e.status(t, name).PID))
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	got := limits("limited")
	for _, want := range []string{
		"Max address space         8589934592           8589934592           bytes",
		"Max open files            64                   64                   files",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("limits of the limited adapter lack %q:\n%s", want, got)
		}
	}
	if plain := limits("plain"); strings.Contains(plain, "8589934592") || strings.Contains(plain, "Max open files            64 ") {
		t.Errorf("the adapter without limits got them:\n%s", plain)
	}
	// The limits hold while it works.
	sendLine(t, addr, "hb limited-1\n")
	waitFor(t, 5*time.Second, "evidence through the limited adapter", func() bool { return e.count("limited-1", gateway.Renew) == 1 })
}
