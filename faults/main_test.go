//go:build faults

package faults

import (
	"fmt"
	"os"
	"testing"

	"github.com/fleetgate/fleetgate/internal/buildtest"
)

// binary is the fleetgate binary, built once by TestMain.
var binary string

func TestMain(m *testing.M) {
	os.Exit(run(m))
}

func run(m *testing.M) int {
	dir, err := os.MkdirTemp("", "fleetgate-faults-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	if err := buildtest.Build(dir, map[string]*string{"../cmd/fleetgate": &binary}); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	if knownKeys, err = probeKeys(binary, dir, issue9Keys(fast)); err != nil {
		fmt.Fprintln(os.Stderr, "probe config keys:", err)
		return 1
	}
	bootIDKnown = probeBootID(binary, dir)
	fmt.Fprintf(os.Stderr, "faults: issue-9 config keys the binary accepts: %v; %s honoured: %v\n", knownKeys, bootIDEnv, bootIDKnown)
	return m.Run()
}
