// Package buildtest builds the executables a package's tests run as real
// processes (the fleetgate binary, an adapter plugin), once per test run.
package buildtest

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// Build builds each Go main package of bins (a path or import path, as
// `go build` takes it) into dir, in one `go build`, and sets its *string
// to the executable's path. The error carries go build's output.
func Build(dir string, bins map[string]*string) error {
	args := []string{"build", "-o", dir + string(filepath.Separator)}
	for pkg, path := range bins {
		abs, err := filepath.Abs(pkg)
		if err != nil {
			return err
		}
		// go build names an executable after its package path's last element.
		*path = filepath.Join(dir, filepath.Base(abs))
		args = append(args, pkg)
	}
	if out, err := exec.Command("go", args...).CombinedOutput(); err != nil {
		return fmt.Errorf("go %v: %w\n%s", args, err, out)
	}
	return nil
}

// Main is a TestMain: it builds bins (see Build) into a temporary
// directory, runs the tests, removes the directory and exits with the
// tests' code. A failed build exits 1 before any test runs.
func Main(m *testing.M, bins map[string]*string) {
	dir, err := os.MkdirTemp("", "fleetgate-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	if err := Build(dir, bins); err != nil {
		os.RemoveAll(dir)
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}
