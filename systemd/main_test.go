package systemd

import (
	"os/exec"
	"testing"

	"github.com/fleetgate/fleetgate/internal/buildtest"
)

// binary is the fleetgate binary and udpline the shipped UDP line
// adapter, built once by TestMain.
var binary, udpline string

func TestMain(m *testing.M) {
	buildtest.Main(m, map[string]*string{"../cmd/fleetgate": &binary, "../plugins/udpline": &udpline})
}

// run runs a command and returns its combined output; a failure to start
// it (a tool missing) fails the test: `make test` installs the tools.
func run(t *testing.T, name string, args ...string) (string, error) {
	t.Helper()
	if _, err := exec.LookPath(name); err != nil {
		t.Fatalf("%s not installed (make deps installs it): %v", name, err)
	}
	out, err := exec.Command(name, args...).CombinedOutput()
	return string(out), err
}
