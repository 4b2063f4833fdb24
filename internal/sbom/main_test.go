package main

import (
	"bytes"
	"debug/buildinfo"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sort"
	"strings"
	"testing"

	cdx "github.com/CycloneDX/cyclonedx-go"

	"github.com/fleetgate/fleetgate/internal/buildtest"
)

// The SBOM of two adapters is a valid CycloneDX document that names,
// with their versions, exactly the modules that the executables' build
// information records, the first executable as its component and the
// other as a component of its own; a second run writes the same bytes.
func TestSBOM(t *testing.T) {
	dir := t.TempDir()
	var udpline, modbus string
	if err := buildtest.Build(dir, map[string]*string{"../../plugins/udpline": &udpline}); err != nil {
		t.Fatal(err)
	}
	// The second executable for another arch: the package URLs name each
	// executable's own.
	modbus = filepath.Join(dir, "modbus")
	cmd := exec.Command("go", "build", "-o", modbus, "../../plugins/modbus")
	cmd.Env = append(os.Environ(), "GOARCH=arm", "GOARM=7", "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build GOARCH=arm: %v\n%s", err, out)
	}
	out := filepath.Join(dir, "sbom.json")
	if err := run("1.2.3", "1700000000", out, []string{udpline, modbus}); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	var bom cdx.BOM
	if err := cdx.NewBOMDecoder(bytes.NewReader(b), cdx.BOMFileFormatJSON).Decode(&bom); err != nil {
		t.Fatal(err)
	}
	if bom.BOMFormat != "CycloneDX" || bom.SpecVersion != cdx.SpecVersion1_6 || bom.SerialNumber != "" ||
		bom.Metadata == nil || bom.Metadata.Timestamp != "2023-11-14T22:13:20Z" {
		t.Fatalf("document: format %q spec %v serial %q metadata %+v", bom.BOMFormat, bom.SpecVersion, bom.SerialNumber, bom.Metadata)
	}
	main := bom.Metadata.Component
	if main == nil || main.Name != "github.com/fleetgate/fleetgate" || main.Version != "v1.2.3" || !strings.HasSuffix(main.BOMRef, "#plugins/udpline") ||
		!strings.Contains(main.PackageURL, "goarch="+runtime.GOARCH+"&") {
		t.Fatalf("the document's component: %+v", main)
	}

	want := map[string]string{"std": "", "github.com/fleetgate/fleetgate": "v1.2.3"}
	for _, bin := range []string{udpline, modbus} {
		info, err := buildinfo.ReadFile(bin)
		if err != nil {
			t.Fatal(err)
		}
		want["std"] = info.GoVersion
		for _, d := range info.Deps {
			want[d.Path] = d.Version
		}
	}
	got := map[string]string{}
	adapter := false
	for _, c := range *bom.Components {
		if c.Name == "github.com/fleetgate/fleetgate" {
			adapter = strings.HasSuffix(c.BOMRef, "#plugins/modbus") && c.Type == cdx.ComponentTypeApplication &&
				strings.Contains(c.PackageURL, "goarch=arm&")
		}
		if c.Version != "" {
			got[c.Name] = c.Version
		}
	}
	if !adapter {
		t.Error("the second executable is not a component")
	}
	if !equalMaps(got, want) {
		t.Errorf("components\n%v\nwant the modules of the build information\n%v", sorted(got), sorted(want))
	}
	if _, ok := got["github.com/simonvetter/modbus"]; !ok {
		t.Error("the module only modbus compiles in is missing")
	}
	refs := map[string]bool{main.BOMRef: true}
	for _, c := range *bom.Components {
		refs[c.BOMRef] = true
	}
	for _, d := range *bom.Dependencies {
		if !refs[d.Ref] {
			t.Errorf("dependency of an unknown component %s", d.Ref)
		}
	}

	again := filepath.Join(dir, "again.json")
	if err := run("1.2.3", "1700000000", again, []string{udpline, modbus}); err != nil {
		t.Fatal(err)
	}
	if b2, _ := os.ReadFile(again); !bytes.Equal(b, b2) {
		t.Error("two runs over the same executables differ")
	}
	if err := run("1.2.3", "soon", again, []string{udpline}); err == nil || !strings.Contains(err.Error(), `"soon" is not Unix seconds`) {
		t.Errorf("a bad epoch: %v", err)
	}
}

func equalMaps(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}

func sorted(m map[string]string) []string {
	var l []string
	for k, v := range m {
		l = append(l, k+"@"+v)
	}
	sort.Strings(l)
	return l
}
