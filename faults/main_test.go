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
	return m.Run()
}
