package systemd

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// make release refuses a version that is not x.y.z[-pre], one that
// CHANGELOG.md has no section for (the release notes), and a tree with
// uncommitted changes (its binaries would name a commit they are not),
// before it builds anything; the whole release is TestPackageRelease
// (make test-packages).
func TestReleaseRefuses(t *testing.T) {
	refused := func(dir, version, want string) {
		t.Helper()
		dist := filepath.Join(t.TempDir(), "dist")
		out, err := exec.Command("make", "-s", "-C", dir, "release", "VERSION="+version, "DIST="+dist).CombinedOutput()
		if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 2 || !strings.Contains(string(out), want) {
			t.Errorf("make release VERSION=%s in %s: %v\n%s\nwant exit 2 and %q", version, dir, err, out, want)
		}
	}
	refused("..", "1.2", "make release: VERSION=1.2 is not x.y.z[-pre]")
	refused("..", "v1.2.3", "make release: VERSION=v1.2.3 is not x.y.z[-pre]")
	refused("..", "9.9.9", "make release: CHANGELOG.md has no section '## 9.9.9': write the release notes first")

	// A clone of HEAD with one file changed, at a version CHANGELOG.md has.
	changelog, err := os.ReadFile("../CHANGELOG.md")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^## (\d+\.\d+\.\d+\S*)$`).FindSubmatch(changelog)
	if m == nil {
		t.Fatal("CHANGELOG.md has no section ## x.y.z")
	}
	dir := filepath.Join(t.TempDir(), "fleetgate")
	for _, args := range [][]string{{"clone", "-q", "--shared", "--no-checkout", "..", dir}, {"-C", dir, "checkout", "-q", "--detach", "HEAD"}} {
		if out, err := exec.Command("git", args...).CombinedOutput(); err != nil {
			t.Fatalf("git %v: %v\n%s", args, err, out)
		}
	}
	if err := os.WriteFile(filepath.Join(dir, "README.md"), []byte("changed\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	refused(dir, string(m[1]), "make release: the tree has changes that are not committed")
}
