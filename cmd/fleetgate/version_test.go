package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"runtime/debug"
	"strings"
	"testing"

	"github.com/fleetgate/fleetgate/internal/statefile"
	"github.com/fleetgate/fleetgate/store/redisstore"
)

// What `fleetgate version` reports: the release's stamps, else what the Go
// toolchain recorded.
func TestBuildFrom(t *testing.T) {
	tagged, err := debug.ParseBuildInfo("path\tgithub.com/fleetgate/fleetgate/cmd/fleetgate\n" +
		"mod\tgithub.com/fleetgate/fleetgate\tv1.2.3\th1:abc=\n")
	if err != nil {
		t.Fatal(err)
	}
	checkout, err := debug.ParseBuildInfo("path\tgithub.com/fleetgate/fleetgate/cmd/fleetgate\n" +
		"mod\tgithub.com/fleetgate/fleetgate\tv0.0.0-20261202115046-9236808bc8ad+dirty\t\n" +
		"build\tvcs=git\nbuild\tvcs.revision=9236808bc8ad7a48aa8fc3ca25a1116caaff1ab9\nbuild\tvcs.modified=true\n")
	if err != nil {
		t.Fatal(err)
	}
	plain, err := debug.ParseBuildInfo("path\tgithub.com/fleetgate/fleetgate/cmd/fleetgate\n" +
		"mod\tgithub.com/fleetgate/fleetgate\t(devel)\t\n")
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name                  string
		version, commit, date string
		bi                    *debug.BuildInfo
		want                  buildInfo
	}{
		{"release", "1.4.0", "0123abc", "2026-12-02T11:50:46Z", plain,
			buildInfo{Version: "1.4.0", Commit: "0123abc", Built: "2026-12-02T11:50:46Z"}},
		{"release stamps win over the module version", "1.4.0", "0123abc", "2026-12-02T11:50:46Z", tagged,
			buildInfo{Version: "1.4.0", Commit: "0123abc", Built: "2026-12-02T11:50:46Z"}},
		{"go install @v1.2.3", "dev", "", "", tagged, buildInfo{Version: "1.2.3"}},
		{"go build in a changed checkout", "dev", "", "", checkout,
			buildInfo{Version: "0.0.0-20261202115046-9236808bc8ad+dirty", Commit: "9236808bc8ad7a48aa8fc3ca25a1116caaff1ab9+dirty"}},
		{"go build without VCS stamps", "dev", "", "", plain, buildInfo{Version: "dev"}},
		{"no build information", "dev", "", "", nil, buildInfo{Version: "dev"}},
	} {
		got := buildFrom(c.version, c.commit, c.date, c.bi)
		got.Go = ""
		if got != c.want {
			t.Errorf("%s: %+v, want %+v", c.name, got, c.want)
		}
	}
}

// `fleetgate version` names the store schema and the state file format,
// which decide whether two releases may run side by side on one store
// (docs/operations.md, "Upgrade").
func TestVersionFormats(t *testing.T) {
	var out bytes.Buffer
	if err := cmdVersion(context.Background(), []string{"--json"}, &out, io.Discard); err != nil {
		t.Fatal(err)
	}
	var b buildInfo
	if err := json.Unmarshal(out.Bytes(), &b); err != nil {
		t.Fatal(err)
	}
	if b.StoreSchema != redisstore.Schema || b.StateFormat != statefile.Version(stateMigrations) || b.StateFormat < 6 {
		t.Errorf("version --json: %s", out.Bytes())
	}
	out.Reset()
	if err := cmdVersion(context.Background(), nil, &out, io.Discard); err != nil {
		t.Fatal(err)
	}
	want := fmt.Sprintf("store   schema %s\nstate   format %d\n", redisstore.Schema, statefile.Version(stateMigrations))
	if !strings.HasSuffix(out.String(), want) {
		t.Errorf("version:\n%s\nwant it to end with\n%s", out.String(), want)
	}
}
