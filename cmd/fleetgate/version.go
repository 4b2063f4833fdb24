package main

import (
	"context"
	"fmt"
	"io"
	"runtime"
	"runtime/debug"
	"strings"

	"github.com/fleetgate/fleetgate/internal/statefile"
	"github.com/fleetgate/fleetgate/store/redisstore"
)

// version is set by the linker (-X main.version=...), and so are
// buildDate (-X main.buildDate=2025-03-01T12:00:00Z) and commit (the
// revision, for builds without Go's VCS stamp: -buildvcs=false); the
// Makefile sets them.
var (
	version   = "dev"
	buildDate = ""
	commit    = ""
)

// buildInfo is what `fleetgate version --json` prints.
type buildInfo struct {
	Version string `json:"version"`
	// Commit is the VCS revision the binary was built from ("" when
	// unknown), with "+dirty" when the tree had changes.
	Commit string `json:"commit"`
	Go     string `json:"go"`
	// Built is the build date (RFC 3339), "" when the build did not set
	// it.
	Built string `json:"built"`
	// StoreSchema is the Redis store's layout and record format
	// (redisstore.Schema): gateways and runners of two releases may share
	// one store when theirs are equal. StateFormat is the state file's
	// format this binary writes and the newest it reads.
	StoreSchema string `json:"store_schema"`
	StateFormat uint64 `json:"state_format"`
}

// currentBuild reads the build from the linker's variables and the Go
// toolchain's build information.
func currentBuild() buildInfo {
	bi, _ := debug.ReadBuildInfo()
	b := buildFrom(version, commit, buildDate, bi)
	b.StoreSchema, b.StateFormat = redisstore.Schema, statefile.Version(stateMigrations)
	return b
}

// buildFrom is the build that the linker's variables (version, commit,
// built: what a release stamps) and the toolchain's build information bi
// (nil: none) describe. A binary whose version the linker did not set
// ("dev") takes its module's version when the toolchain recorded one:
// `go install github.com/fleetgate/fleetgate/cmd/fleetgate@v1.2.3`
// gives 1.2.3, a build in a git checkout a pseudo-version
// (0.0.0-<commit time>-<hash>, +dirty with changes). The VCS revision
// that the toolchain recorded wins over the linker's commit, with
// "+dirty" when the tree had changes.
func buildFrom(version, commit, built string, bi *debug.BuildInfo) buildInfo {
	b := buildInfo{Version: version, Go: runtime.Version(), Built: built, Commit: commit}
	if bi == nil {
		return b
	}
	if v := bi.Main.Version; version == "dev" && v != "" && v != "(devel)" {
		b.Version = strings.TrimPrefix(v, "v")
	}
	dirty := false
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			b.Commit = s.Value
		case "vcs.modified":
			dirty = s.Value == "true"
		}
	}
	if dirty && b.Commit != "" {
		b.Commit += "+dirty"
	}
	return b
}

func cmdVersion(_ context.Context, args []string, stdout, _ io.Writer) error {
	fs := newBareFlags("version", "version [--json]")
	asJSON := fs.Bool("json", false, "print version, commit, Go version, build date, store schema and state format as JSON")
	if err := parse(fs, args); err != nil {
		return err
	}
	if err := noArgs(fs); err != nil {
		return err
	}
	b := currentBuild()
	if *asJSON {
		return printJSON(stdout, b)
	}
	fmt.Fprintf(stdout, "fleetgate %s\n", b.Version)
	if b.Commit != "" {
		fmt.Fprintf(stdout, "commit  %s\n", b.Commit)
	}
	fmt.Fprintf(stdout, "go      %s\n", b.Go)
	if b.Built != "" {
		fmt.Fprintf(stdout, "built   %s\n", b.Built)
	}
	fmt.Fprintf(stdout, "store   schema %s\n", b.StoreSchema)
	fmt.Fprintf(stdout, "state   format %d\n", b.StateFormat)
	return nil
}
