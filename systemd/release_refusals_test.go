package systemd

import (
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// make release refuses a version that is not x.y.z[-pre], and one that
// CHANGELOG.md has no section for (the release notes), before it builds
// anything; the whole release is TestPackageRelease (make test-packages).
func TestReleaseRefuses(t *testing.T) {
	for _, c := range []struct{ version, want string }{
		{"1.2", "make release: VERSION=1.2 is not x.y.z[-pre]"},
		{"v1.2.3", "make release: VERSION=v1.2.3 is not x.y.z[-pre]"},
		{"9.9.9", "make release: CHANGELOG.md has no section '## 9.9.9': write the release notes first"},
	} {
		dist := filepath.Join(t.TempDir(), "dist")
		out, err := exec.Command("make", "-s", "-C", "..", "release", "VERSION="+c.version, "DIST="+dist).CombinedOutput()
		if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 2 || !strings.Contains(string(out), c.want) {
			t.Errorf("make release VERSION=%s: %v\n%s\nwant exit 2 and %q", c.version, err, out, c.want)
		}
	}
}
