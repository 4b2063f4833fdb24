// Command sbom writes the CycloneDX SBOM of a release's executables for
// one architecture: the modules compiled into each of them, as their
// build information records it (cyclonedx-gomod bin, pinned in go.mod),
// merged into one document whose component is the first executable
// (fleetgate) and whose other executables (the adapters) are components
// of their own.
//
//	go run ./internal/sbom -version 1.2.3 -epoch 1767225600 \
//		-o dist/fleetgate_1.2.3_linux_arm64.cdx.json build/pkg/arm64/fleetgate build/pkg/arm64/plugins/*
//
// The same executables, version and epoch give the same bytes: the
// document has no serial number, its time stamp is -epoch, and
// components and dependencies are sorted by reference.
package main

import (
	"bytes"
	"debug/buildinfo"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"sort"
	"strconv"
	"strings"
	"time"

	cdx "github.com/CycloneDX/cyclonedx-go"
)

func main() {
	version := flag.String("version", "", "the release's version (x.y.z)")
	epoch := flag.String("epoch", os.Getenv("SOURCE_DATE_EPOCH"), "the document's time stamp, Unix seconds (default $SOURCE_DATE_EPOCH)")
	out := flag.String("o", "", "the SBOM to write")
	flag.Parse()
	if *version == "" || *out == "" || flag.NArg() == 0 {
		fmt.Fprintln(os.Stderr, "usage: sbom -version X.Y.Z -o FILE [-epoch SECONDS] EXECUTABLE...")
		os.Exit(2)
	}
	if err := run(*version, *epoch, *out, flag.Args()); err != nil {
		fmt.Fprintln(os.Stderr, "sbom:", err)
		os.Exit(1)
	}
}

func run(version, epoch, out string, bins []string) error {
	secs, err := strconv.ParseInt(epoch, 10, 64)
	if err != nil || secs < 0 {
		return fmt.Errorf("-epoch (or SOURCE_DATE_EPOCH) %q is not Unix seconds", epoch)
	}
	tool, err := exec.Command("go", "tool", "-n", "cyclonedx-gomod").Output()
	if err != nil {
		return fmt.Errorf("go tool -n cyclonedx-gomod: %w", err)
	}
	var boms []*cdx.BOM
	for _, b := range bins {
		cmd := exec.Command(strings.TrimSpace(string(tool)), "bin", "-json", "-std", "-noserial", "-notimestamp",
			"-version", "v"+strings.TrimPrefix(version, "v"), b)
		// cyclonedx-gomod takes the package URLs' goos and goarch from
		// `go env`: give it the executable's.
		env, err := targetEnv(b)
		if err != nil {
			return err
		}
		cmd.Env = append(os.Environ(), env...)
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		js, err := cmd.Output()
		if err != nil {
			return fmt.Errorf("cyclonedx-gomod bin %s: %w\n%s", b, err, stderr.Bytes())
		}
		bom := new(cdx.BOM)
		if err := cdx.NewBOMDecoder(bytes.NewReader(js), cdx.BOMFileFormatJSON).Decode(bom); err != nil {
			return fmt.Errorf("cyclonedx-gomod bin %s: %w", b, err)
		}
		boms = append(boms, bom)
	}
	bom, err := merge(boms, time.Unix(secs, 0).UTC())
	if err != nil {
		return err
	}
	var buf bytes.Buffer
	if err := cdx.NewBOMEncoder(&buf, cdx.BOMFileFormatJSON).SetPretty(true).Encode(bom); err != nil {
		return err
	}
	return os.WriteFile(out, buf.Bytes(), 0o644)
}

// targetEnv is GOOS, GOARCH and GOARM (when set) as the executable's Go
// build information records them.
func targetEnv(bin string) ([]string, error) {
	info, err := buildinfo.ReadFile(bin)
	if err != nil {
		return nil, err
	}
	var env []string
	for _, s := range info.Settings {
		switch s.Key {
		case "GOOS", "GOARCH", "GOARM":
			env = append(env, s.Key+"="+s.Value)
		}
	}
	if len(env) < 2 {
		return nil, fmt.Errorf("%s: its build information names no GOOS and GOARCH", bin)
	}
	return env, nil
}

// merge makes one document of the executables' boms: the first one's
// metadata (its component the document's), the others' components
// added as components with their properties, the union of the modules
// and of the dependencies, and one complete composition of the
// executables and one of unknown aggregate for the modules (as
// cyclonedx-gomod writes for one).
func merge(boms []*cdx.BOM, at time.Time) (*cdx.BOM, error) {
	first := boms[0]
	if first.Metadata == nil || first.Metadata.Component == nil {
		return nil, fmt.Errorf("the first executable's SBOM has no component")
	}
	out := cdx.NewBOM()
	out.SpecVersion = first.SpecVersion
	out.JSONSchema = first.JSONSchema
	out.Metadata = first.Metadata
	out.Metadata.Timestamp = at.Format(time.RFC3339)
	comps := map[string]cdx.Component{}
	deps := map[string]map[string]bool{}
	var mains, modules []cdx.BOMReference
	for i, b := range boms {
		if b.Metadata == nil || b.Metadata.Component == nil {
			return nil, fmt.Errorf("SBOM %d has no component", i)
		}
		mains = append(mains, cdx.BOMReference(b.Metadata.Component.BOMRef))
		if i > 0 {
			c := *b.Metadata.Component
			c.Properties = b.Metadata.Properties
			comps[c.BOMRef] = c
		}
		if b.Components != nil {
			for _, c := range *b.Components {
				comps[c.BOMRef] = c
			}
		}
		if b.Dependencies != nil {
			for _, d := range *b.Dependencies {
				if deps[d.Ref] == nil {
					deps[d.Ref] = map[string]bool{}
				}
				if d.Dependencies != nil {
					for _, r := range *d.Dependencies {
						deps[d.Ref][r] = true
					}
				}
			}
		}
	}
	isMain := map[cdx.BOMReference]bool{}
	for _, m := range mains {
		isMain[m] = true
	}
	var cl []cdx.Component
	for _, c := range comps {
		cl = append(cl, c)
		if !isMain[cdx.BOMReference(c.BOMRef)] {
			modules = append(modules, cdx.BOMReference(c.BOMRef))
		}
	}
	sort.Slice(cl, func(i, j int) bool { return cl[i].BOMRef < cl[j].BOMRef })
	var dl []cdx.Dependency
	for ref, on := range deps {
		d := cdx.Dependency{Ref: ref}
		if len(on) > 0 {
			l := make([]string, 0, len(on))
			for r := range on {
				l = append(l, r)
			}
			sort.Strings(l)
			d.Dependencies = &l
		}
		dl = append(dl, d)
	}
	sort.Slice(dl, func(i, j int) bool { return dl[i].Ref < dl[j].Ref })
	sort.Slice(mains, func(i, j int) bool { return mains[i] < mains[j] })
	sort.Slice(modules, func(i, j int) bool { return modules[i] < modules[j] })
	out.Components, out.Dependencies = &cl, &dl
	out.Compositions = &[]cdx.Composition{
		{Aggregate: cdx.CompositionAggregateComplete, Dependencies: &mains},
		{Aggregate: cdx.CompositionAggregateUnknown, Dependencies: &modules},
	}
	return out, nil
}
