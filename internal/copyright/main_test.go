package main

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/google/licensecheck"
)

// shipped are the main packages whose binaries the packages ship: the
// gateway and the adapters (the Makefile's build/pkg/% and ADAPTERS).
var shipped = []string{"../../cmd/fleetgate", "../../plugins/udpline", "../../plugins/lorawan", "../../plugins/modbus"}

// paragraphs splits a copyright file into its paragraphs, keyed by their
// first line.
func paragraphs(b []byte) map[string]string {
	m := map[string]string{}
	for _, p := range strings.Split(string(b), "\n\n") {
		first, _, _ := strings.Cut(p, "\n")
		m[first] = p + "\n"
	}
	return m
}

// For each arch of the packages, every module that the shipped binaries
// compile in has a license file, and the copyright file has the module's
// paragraph with the text of each of its license, patents and notice
// files, but for copies of the Apache License 2.0, which it names; and the
// rpm's license field names fleetgate's and the modules' licenses.
func TestShippedModules(t *testing.T) {
	for _, arch := range []string{"amd64", "arm64"} {
		t.Run(arch, func(t *testing.T) {
			env := append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOARCH="+arch)
			mods, err := listModules(env, shipped)
			if err != nil {
				t.Fatal(err)
			}
			paths := make([]string, len(mods))
			for i, m := range mods {
				paths[i] = m.Path
			}
			for _, want := range []string{"github.com/redis/go-redis/v9", "go.etcd.io/bbolt", "github.com/hashicorp/go-plugin", "github.com/simonvetter/modbus"} {
				if !slices.Contains(paths, want) {
					t.Errorf("go list -deps lacks %s: %v", want, paths)
				}
			}
			out, err := generate("../../systemd/copyright", env, shipped)
			if err != nil {
				t.Fatal(err)
			}
			if strings.Contains(string(out), apacheTerms) {
				t.Error("the copyright file holds the Apache License 2.0's text (lintian: copyright-file-contains-full-apache-2-license)")
			}
			paras := paragraphs(out)
			if p := paras["Files: *"]; !strings.Contains(p, "\nLicense: Apache-2.0\n") {
				t.Errorf("fleetgate's paragraph:\n%s", p)
			}
			if p := paras["License: Apache-2.0"]; !strings.Contains(p, "/usr/share/common-licenses/Apache-2.0") {
				t.Errorf("the stand-alone Apache-2.0 paragraph:\n%s", p)
			}
			std, err := stdlib(env)
			if err != nil {
				t.Fatal(err)
			}
			licenses := []string{"Apache-2.0"} // fleetgate's
			for _, m := range append(mods, std) {
				if d, err := describe(m); err == nil {
					licenses = append(licenses, d.license...)
				}
				files, err := licenseFiles(m.Dir)
				if err != nil {
					t.Fatal(err)
				}
				if !slices.ContainsFunc(files, func(f string) bool { return kindOf(f) == licenseKind }) {
					t.Errorf("%s %s: no license file in %s (%v)", m.Path, m.Version, m.Dir, files)
				}
				key := "Files: " + m.Path + "/*"
				if m.Path == "std" {
					key = "Files: GOROOT/src/*"
				}
				p := paras[key]
				if !strings.Contains(p, " "+m.Version+",") {
					t.Errorf("%s %s: paragraph %q:\n%s", m.Path, m.Version, key, p)
					continue
				}
				for _, f := range files {
					b, err := os.ReadFile(filepath.Join(m.Dir, f))
					if err != nil {
						t.Fatal(err)
					}
					text := strings.TrimSpace(strings.ReplaceAll(string(b), "\r\n", "\n"))
					apache := strings.Contains(text, apacheTerms) && strings.Contains(p, "\nLicense: Apache-2.0\n")
					if !apache && !strings.Contains(p, continuation(text)) {
						t.Errorf("%s: the paragraph lacks %s:\n%s", m.Path, f, p)
					}
				}
			}
			slices.Sort(licenses)
			licenses = slices.Compact(licenses)
			if got := rpmLicense(t); !slices.Equal(got, licenses) {
				t.Errorf("systemd/nfpm.yaml's license: %v, want fleetgate's and the modules' %v", got, licenses)
			}
		})
	}
}

// rpmLicense returns the SPDX identifiers of the license field of
// systemd/nfpm.yaml (the rpm's License), sorted.
func rpmLicense(t *testing.T) []string {
	t.Helper()
	b, err := os.ReadFile("../../systemd/nfpm.yaml")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^license: (.+)$`).FindSubmatch(b)
	if m == nil {
		t.Fatal("systemd/nfpm.yaml has no license field")
	}
	ids := strings.Split(string(m[1]), " AND ")
	slices.Sort(ids)
	return ids
}

func TestLicenseFiles(t *testing.T) {
	dir := t.TempDir()
	for _, f := range []string{"LICENSE.md", "COPYING", "NOTICE.txt", "PATENTS", "LICENSES/MIT.txt", "LICENSES/CC0-1.0.txt",
		"license.go", "README.md", "licensing/LICENSE", "AUTHORS"} {
		if err := os.MkdirAll(filepath.Join(dir, filepath.Dir(f)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, f), nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	got, err := licenseFiles(dir)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"COPYING", "LICENSE.md", "NOTICE.txt", "PATENTS", "LICENSES/CC0-1.0.txt", "LICENSES/MIT.txt"}
	if !slices.Equal(got, want) {
		t.Errorf("licenseFiles: %v, want %v", got, want)
	}
}

// writeModule makes a module directory with the given files.
func writeModule(t *testing.T, files map[string]string) module {
	t.Helper()
	dir := t.TempDir()
	for name, text := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return module{Path: "example.org/m", Version: "v1.0.0", Dir: dir}
}

const mitText = `Copyright (c) 2020 Example Authors

Permission is hereby granted, free of charge, to any person obtaining a copy
of this software and associated documentation files (the "Software"), to deal
in the Software without restriction, including without limitation the rights
to use, copy, modify, merge, publish, distribute, sublicense, and/or sell
copies of the Software, and to permit persons to whom the Software is
furnished to do so, subject to the following conditions:

The above copyright notice and this permission notice shall be included in all
copies or substantial portions of the Software.

THE SOFTWARE IS PROVIDED "AS IS", WITHOUT WARRANTY OF ANY KIND, EXPRESS OR
IMPLIED, INCLUDING BUT NOT LIMITED TO THE WARRANTIES OF MERCHANTABILITY,
FITNESS FOR A PARTICULAR PURPOSE AND NONINFRINGEMENT. IN NO EVENT SHALL THE
AUTHORS OR COPYRIGHT HOLDERS BE LIABLE FOR ANY CLAIM, DAMAGES OR OTHER
LIABILITY, WHETHER IN AN ACTION OF CONTRACT, TORT OR OTHERWISE, ARISING FROM,
OUT OF OR IN CONNECTION WITH THE SOFTWARE OR THE USE OR OTHER DEALINGS IN THE
SOFTWARE.
`

func TestDescribe(t *testing.T) {
	apache, err := os.ReadFile("../../LICENSE")
	if err != nil {
		t.Fatal(err)
	}
	t.Run("MIT", func(t *testing.T) {
		p, err := describe(writeModule(t, map[string]string{"LICENSE": mitText}))
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(p.license, []string{"MIT"}) || !slices.Equal(p.copyright, []string{"2020 Example Authors"}) ||
			len(p.texts) != 1 || p.texts[0] != strings.TrimSpace(mitText) {
			t.Errorf("%+v", p)
		}
	})
	t.Run("Apache-2.0 with a notice", func(t *testing.T) {
		p, err := describe(writeModule(t, map[string]string{"LICENSE": string(apache), "NOTICE": "Example\nCopyright 2021 Example Inc.\n"}))
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(p.license, []string{"Apache-2.0"}) || !slices.Equal(p.copyright, []string{"2021 Example Inc."}) ||
			len(p.texts) != 0 || !slices.Equal(p.notices, []string{"Example\nCopyright 2021 Example Inc."}) {
			t.Errorf("%+v", p)
		}
	})
	t.Run("no license file", func(t *testing.T) {
		if _, err := describe(writeModule(t, map[string]string{"NOTICE": "Copyright 2021 Example Inc.\n"})); err == nil || !strings.Contains(err.Error(), "no license file") {
			t.Errorf("describe: %v, want no license file", err)
		}
	})
	t.Run("terms of its own", func(t *testing.T) {
		own := mitText + "\nIn addition, " + strings.Repeat("whoever runs the Software in production pays the authors a fee, ", 6) + "yearly.\n"
		if _, err := describe(writeModule(t, map[string]string{"LICENSE": own})); err == nil || !strings.Contains(err.Error(), "is text of the accepted licenses") {
			t.Errorf("describe: %v, want is text of the accepted licenses", err)
		}
	})
	t.Run("unknown license", func(t *testing.T) {
		if _, err := describe(writeModule(t, map[string]string{"LICENSE": "Copyright 2021 Example Inc. All rights reserved.\n"})); err == nil || !strings.Contains(err.Error(), "names none of the accepted licenses") {
			t.Errorf("describe: %v, want names none of the accepted licenses", err)
		}
	})
}

// Every accepted license is one that licensecheck has a pattern for.
func TestAccepted(t *testing.T) {
	for _, id := range accepted {
		if !slices.ContainsFunc(licensecheck.BuiltinLicenses(), func(l licensecheck.License) bool { return l.ID == id && l.LRE != "" }) {
			t.Errorf("licensecheck has no pattern for %s", id)
		}
	}
}

func TestFormat(t *testing.T) {
	p := paragraph{files: "example.org/m/*", copyright: []string{"2020 A", "2021 B"}, license: []string{"MIT", "Apache-2.0"},
		texts: []string{"one\n\n  two  "}, comment: "Go module example.org/m v1.0.0.", notices: []string{"N"}}
	want := "Files: example.org/m/*\nCopyright: 2020 A\n 2021 B\nLicense: MIT and Apache-2.0\n one\n .\n   two\nComment: Go module example.org/m v1.0.0.\n .\n N\n"
	var b bytes.Buffer
	p.format(&b)
	if b.String() != want {
		t.Errorf("format:\n%s\nwant:\n%s", b.String(), want)
	}
}

// The root LICENSE is the Apache License 2.0 as the Apache Software
// Foundation publishes it (LICENSE-2.0.txt), byte for byte.
func TestLicenseIsApache20(t *testing.T) {
	b, err := os.ReadFile("../../LICENSE")
	if err != nil {
		t.Fatal(err)
	}
	const want = "cfc7749b96f63bd31c3c42b5c471bf756814053e847c10f3eb003417bc523d30"
	if sum := sha256.Sum256(b); hex.EncodeToString(sum[:]) != want {
		t.Errorf("LICENSE: sha256 %x, want %s (the Apache License 2.0)", sum, want)
	}
}
