//go:build faults

package faults

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// cgroupRoot is where the cgroup v1 cpu controller is mounted; a machine
// with the unified hierarchy (v2) has cpu.max under cgroupV2 instead.
const (
	cgroupRoot = "/sys/fs/cgroup/cpu"
	cgroupV2   = "/sys/fs/cgroup"
)

var cgroupSeq atomic.Int64

// starve puts process pid (every thread of it) into a cgroup of its own
// whose CPU time is capped at quota per period (cgroup v1 cfs quota, or
// v2 cpu.max), and returns release, which moves it back to the cgroup it
// came from and removes the new one (also done at the end of the test).
// The process runs, slowly: a starved part, unlike a stopped one, still
// answers some calls, late.
func starve(t testing.TB, pid int, quota, period time.Duration) (release func()) {
	t.Helper()
	name := fmt.Sprintf("fleetgate-faults-%d-%d", os.Getpid(), cgroupSeq.Add(1))
	var dir, from string
	switch {
	case exists(filepath.Join(cgroupRoot, "cpu.cfs_quota_us")):
		dir = filepath.Join(cgroupRoot, name)
		from = filepath.Join(cgroupRoot, cgroupOf(t, pid, "cpu"))
		mkdir(t, dir)
		write(t, filepath.Join(dir, "cpu.cfs_period_us"), strconv.FormatInt(period.Microseconds(), 10))
		write(t, filepath.Join(dir, "cpu.cfs_quota_us"), strconv.FormatInt(quota.Microseconds(), 10))
	case exists(filepath.Join(cgroupV2, "cgroup.controllers")):
		dir = filepath.Join(cgroupV2, name)
		from = filepath.Join(cgroupV2, cgroupOf(t, pid, ""))
		mkdir(t, dir)
		write(t, filepath.Join(dir, "cpu.max"), fmt.Sprintf("%d %d", quota.Microseconds(), period.Microseconds()))
	default:
		t.Fatalf("no cgroup cpu controller at %s or %s: the slow-part scenarios need one (and root)", cgroupRoot, cgroupV2)
	}
	write(t, filepath.Join(dir, "cgroup.procs"), strconv.Itoa(pid))
	var done atomic.Bool
	release = func() {
		if done.Swap(true) {
			return
		}
		// the process may have ended: nothing to move then
		_ = os.WriteFile(filepath.Join(from, "cgroup.procs"), []byte(strconv.Itoa(pid)), 0o644)
		for range 50 {
			if os.Remove(dir) == nil {
				return
			}
			time.Sleep(20 * time.Millisecond)
		}
		t.Errorf("remove cgroup %s: still busy", dir)
	}
	t.Cleanup(release)
	return release
}

// cgroupOf is the cgroup path of pid in the hierarchy of controller
// ("" for the unified one), from /proc/<pid>/cgroup.
func cgroupOf(t testing.TB, pid int, controller string) string {
	t.Helper()
	f, err := os.Open(fmt.Sprintf("/proc/%d/cgroup", pid))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		// hierarchy-ID:controller-list:path
		parts := strings.SplitN(sc.Text(), ":", 3)
		if len(parts) != 3 {
			continue
		}
		for _, c := range strings.Split(parts[1], ",") {
			if c == controller {
				return parts[2]
			}
		}
	}
	t.Fatalf("/proc/%d/cgroup has no %q hierarchy", pid, controller)
	return ""
}

func exists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}

func mkdir(t testing.TB, dir string) {
	t.Helper()
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatalf("cgroup: %v (the slow-part scenarios need root)", err)
	}
}

func write(t testing.TB, path, v string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(v), 0o644); err != nil {
		t.Fatalf("cgroup: write %s = %s: %v", path, v, err)
	}
}
