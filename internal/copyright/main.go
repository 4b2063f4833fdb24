// Command copyright writes the copyright file of the fleetgate packages,
// /usr/share/doc/fleetgate/copyright, in the Debian machine-readable
// format 1.0: the project's own paragraphs, copied from the file given
// with -header, then one Files paragraph for the Go standard library and
// one for each module that the given main packages compile in, each with
// the copyright lines and the license, patents and notice files of that
// module as the module cache holds them.
//
//	go run ./internal/copyright -header systemd/copyright -o build/pkg/arm64/copyright \
//		-env 'CGO_ENABLED=0 GOOS=linux GOARCH=arm64' ./cmd/fleetgate ./plugins/udpline
//
// The modules are those that `go list -deps` reports with the variables
// given with -env added to the command's environment: give it those of
// the shipped build (GOOS, GOARCH, CGO_ENABLED, GOFLAGS). A module without
// a license file, or with a license file in which
// github.com/google/licensecheck finds none of the accepted licenses, or
// finds them in less than 75% of the text, is an error, and nothing is
// written.
//
// A license file that is the Apache License 2.0 is not copied (lintian
// rejects a copyright file that holds that text): its paragraph names
// Apache-2.0, and the header's stand-alone Apache-2.0 paragraph says where
// the full text is.
package main

import (
	"bytes"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"

	"github.com/google/licensecheck"
)

func main() {
	header := flag.String("header", "", "the project's own paragraphs: the header and its Files and License paragraphs")
	out := flag.String("o", "", "the copyright file to write")
	env := flag.String("env", "", "the build's environment variables, `NAME=VALUE ...`")
	flag.Parse()
	if *header == "" || *out == "" || flag.NArg() == 0 {
		fmt.Fprintln(os.Stderr, "usage: copyright -header FILE -o FILE [-env 'NAME=VALUE ...'] PACKAGE...")
		os.Exit(2)
	}
	b, err := generate(*header, append(os.Environ(), strings.Fields(*env)...), flag.Args())
	if err == nil {
		err = os.WriteFile(*out, b, 0o644)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "copyright:", err)
		os.Exit(1)
	}
}

// generate returns the copyright file: the header file, then the
// paragraphs of the standard library and of the modules that pkgs compile
// in under env.
func generate(header string, env, pkgs []string) ([]byte, error) {
	h, err := os.ReadFile(header)
	if err != nil {
		return nil, err
	}
	std, err := stdlib(env)
	if err != nil {
		return nil, err
	}
	mods, err := listModules(env, pkgs)
	if err != nil {
		return nil, err
	}
	var b bytes.Buffer
	b.Write(bytes.TrimRight(h, "\n"))
	b.WriteString("\n")
	for _, m := range append([]module{std}, mods...) {
		p, err := describe(m)
		if err != nil {
			return nil, err
		}
		b.WriteString("\n")
		p.format(&b)
	}
	return b.Bytes(), nil
}

// module is a Go module compiled into the shipped binaries: Dir holds its
// files. The standard library is the module named std, with GOROOT as Dir
// (which holds its license files) and the Go version as Version.
type module struct {
	Path, Version, Dir string
}

// listModules returns the modules that pkgs compile in under env, sorted
// by path, without the main module and the standard library.
func listModules(env, pkgs []string) ([]module, error) {
	args := append([]string{"list", "-deps", "-f", "{{with .Module}}{{if not .Main}}{{.Path}} {{.Version}} {{.Dir}}{{end}}{{end}}"}, pkgs...)
	out, err := goCmd(env, args...)
	if err != nil {
		return nil, err
	}
	var mods []module
	for _, l := range strings.Split(out, "\n") {
		f := strings.SplitN(l, " ", 3)
		if len(f) != 3 {
			continue
		}
		if f[2] == "" {
			return nil, fmt.Errorf("module %s %s is not in the module cache", f[0], f[1])
		}
		mods = append(mods, module{Path: f[0], Version: f[1], Dir: f[2]})
	}
	slices.SortFunc(mods, func(a, b module) int { return strings.Compare(a.Path, b.Path) })
	return slices.Compact(mods), nil
}

// stdlib returns the standard library of the Go toolchain under env.
func stdlib(env []string) (module, error) {
	out, err := goCmd(env, "env", "GOROOT", "GOVERSION")
	if err != nil {
		return module{}, err
	}
	f := strings.Split(strings.TrimSpace(out), "\n")
	if len(f) != 2 {
		return module{}, fmt.Errorf("go env GOROOT GOVERSION: %q", out)
	}
	return module{Path: "std", Version: f[1], Dir: f[0]}, nil
}

// goCmd runs the go command with args and env and returns its output.
func goCmd(env []string, args ...string) (string, error) {
	cmd := exec.Command("go", args...)
	cmd.Env = env
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("go %s: %v: %s", strings.Join(args, " "), err, stderr.Bytes())
	}
	return string(out), nil
}

// The kinds of the files that licenseFiles finds, by name.
const (
	licenseKind = iota // a license's text: copied into the License field
	patentsKind        // a patent grant: copied after the license texts
	noticeKind         // a notice to keep with the code: copied into the Comment field
)

var fileKinds = []struct {
	kind int
	name *regexp.Regexp
}{
	{licenseKind, regexp.MustCompile(`(?i)^(licen[cs]e|copying|unlicense)`)},
	{patentsKind, regexp.MustCompile(`(?i)^patents`)},
	{noticeKind, regexp.MustCompile(`(?i)^notice`)},
}

// kindOf returns the kind of the file at path (relative to its module),
// or -1 for a file that is none of them.
func kindOf(path string) int {
	if strings.HasSuffix(path, ".go") {
		return -1
	}
	if dir, _ := filepath.Split(path); dir == "LICENSES/" {
		return licenseKind
	}
	for _, k := range fileKinds {
		if k.name.MatchString(path) {
			return k.kind
		}
	}
	return -1
}

// licenseFiles returns the license, patents and notice files at the root
// of dir and in its LICENSES directory (the REUSE layout), relative to
// dir, sorted.
func licenseFiles(dir string) ([]string, error) {
	var files []string
	for _, sub := range []string{"", "LICENSES"} {
		entries, err := os.ReadDir(filepath.Join(dir, sub))
		if err != nil && (sub == "" || !os.IsNotExist(err)) {
			return nil, err
		}
		for _, e := range entries {
			p := filepath.Join(sub, e.Name())
			if e.Type().IsRegular() && kindOf(p) >= 0 {
				files = append(files, p)
			}
		}
	}
	return files, nil
}

// accepted are the licenses, by SPDX identifier, that the packages may
// ship code under: a module under another one is an error until its
// license is reviewed and added here.
var accepted = []string{"0BSD", "Apache-2.0", "BSD-2-Clause", "BSD-3-Clause", "BSL-1.0", "CC0-1.0",
	"EPL-2.0", "ISC", "MIT", "MPL-2.0", "Unlicense", "Zlib"}

// minCoverage is the share of a license file, in percent, that the
// accepted licenses' texts must cover: a file with more text of its own
// may add terms, and is an error until reviewed.
const minCoverage = 75

// scanner recognizes the accepted licenses (made once: its patterns take
// a while to compile).
var scanner = sync.OnceValues(func() (*licensecheck.Scanner, error) {
	var ls []licensecheck.License
	for _, l := range licensecheck.BuiltinLicenses() {
		if slices.Contains(accepted, l.ID) {
			ls = append(ls, l)
		}
	}
	return licensecheck.NewScanner(ls)
})

// paragraph is one Files paragraph of the copyright file.
type paragraph struct {
	files     string   // the Files pattern
	copyright []string // the copyright lines of the license files
	license   []string // SPDX identifiers of the licenses, in order of their files
	texts     []string // license and patents texts, not the Apache License 2.0
	comment   string   // what the paragraph covers
	notices   []string // the notice files' texts
}

// The Apache License 2.0's section that a copy of the license holds.
const apacheTerms = "TERMS AND CONDITIONS FOR USE, REPRODUCTION, AND DISTRIBUTION"

// copyrightLine matches a copyright line of a license or notice file;
// templateLine one of the templates that license texts hold ("Copyright
// [yyyy] [name of copyright owner]", "Copyright (c) <year> <owner>").
var (
	copyrightLine = regexp.MustCompile(`^\s*(?:Copyright\b|©)\s*(?:\([cC]\)\s*|©\s*)?(.*\S)`)
	templateLine  = regexp.MustCompile(`(?i)yyyy|<year>`)
)

// describe reads m's license, patents and notice files and returns its
// paragraph.
func describe(m module) (paragraph, error) {
	files, err := licenseFiles(m.Dir)
	if err != nil {
		return paragraph{}, err
	}
	p := paragraph{files: m.Path + "/*", comment: "Go module " + m.Path + " " + m.Version}
	if m.Path == "std" {
		p.files = "GOROOT/src/*"
		p.comment = "The standard library of " + m.Version
	}
	p.comment += ", compiled into the binaries; from " + strings.Join(files, ", ") + "."
	for _, f := range files {
		b, err := os.ReadFile(filepath.Join(m.Dir, f))
		if err != nil {
			return paragraph{}, err
		}
		text := strings.TrimSpace(strings.ReplaceAll(string(b), "\r\n", "\n"))
		for _, l := range strings.Split(text, "\n") {
			if c := copyrightLine.FindStringSubmatch(l); c != nil && !templateLine.MatchString(c[1]) && !slices.Contains(p.copyright, c[1]) {
				p.copyright = append(p.copyright, c[1])
			}
		}
		switch kindOf(f) {
		case noticeKind:
			p.notices = append(p.notices, text)
			continue
		case patentsKind:
			p.texts = append(p.texts, text)
			continue
		}
		sc, err := scanner()
		if err != nil {
			return paragraph{}, err
		}
		cov := sc.Scan(b)
		if len(cov.Match) == 0 {
			return paragraph{}, fmt.Errorf("%s %s: %s names none of the accepted licenses %v", m.Path, m.Version, f, accepted)
		}
		if cov.Percent < minCoverage {
			return paragraph{}, fmt.Errorf("%s %s: %.0f%% of %s is text of the accepted licenses, under %d%%", m.Path, m.Version, cov.Percent, f, minCoverage)
		}
		for _, match := range cov.Match {
			if !slices.Contains(p.license, match.ID) {
				p.license = append(p.license, match.ID)
			}
		}
		if len(cov.Match) == 1 && cov.Match[0].ID == "Apache-2.0" && strings.Contains(text, apacheTerms) {
			continue
		}
		p.texts = append(p.texts, text)
	}
	if len(p.license) == 0 {
		return paragraph{}, fmt.Errorf("%s %s: no license file in %s", m.Path, m.Version, m.Dir)
	}
	if len(p.copyright) == 0 {
		p.copyright = []string{"the authors of " + m.Path}
	}
	return p, nil
}

// format writes p in the copyright file's syntax.
func (p paragraph) format(b *bytes.Buffer) {
	fmt.Fprintf(b, "Files: %s\n", p.files)
	fmt.Fprintf(b, "Copyright: %s\n", strings.Join(p.copyright, "\n "))
	fmt.Fprintf(b, "License: %s\n", strings.Join(p.license, " and "))
	b.WriteString(continuation(strings.Join(p.texts, "\n\n")))
	fmt.Fprintf(b, "Comment: %s\n", p.comment)
	for _, n := range p.notices {
		b.WriteString(continuation("\n" + n))
	}
}

// continuation returns text as continuation lines of a field: each line
// indented by a space, an empty line as " .".
func continuation(text string) string {
	if text == "" {
		return ""
	}
	var b strings.Builder
	for _, l := range strings.Split(text, "\n") {
		if l = strings.TrimRight(l, " \t"); l == "" {
			l = "."
		}
		b.WriteString(" " + l + "\n")
	}
	return b.String()
}
