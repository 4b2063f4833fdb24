package main

import (
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"
)

// benchDocEnv names the Markdown file a benchmark writes its table into
// (`make bench` sets docs/benchmarks.md). A relative path is taken from the
// module root, not from the package directory the test binary runs in.
// The name has no FLEETGATE_ prefix: the gateways the benchmarks start
// inherit the environment and refuse FLEETGATE_ names that are no
// configuration key.
const benchDocEnv = "BENCH_DOC"

// The marker lines around BenchmarkSimulateSideBySide's block in
// docs/benchmarks.md.
// sideBySideMarkers are the marker lines a side-by-side fleet's table
// goes between (sideFleet.marker: "side-by-side", ...).
func sideBySideMarkers(marker string) (begin, end string) {
	return "<!-- " + marker + ":begin -->", "<!-- " + marker + ":end -->"
}

// replaceMarked returns doc with what lies between the line begin and the
// line end replaced by block. The marker lines and everything outside them
// are kept byte for byte. A marker that is missing, repeated, not alone on
// its line, or out of order is an error, and so is a block holding a
// marker (the next run could not find its place again): never an append.
func replaceMarked(doc, begin, end, block string) (string, error) {
	for _, m := range []string{begin, end} {
		switch n := strings.Count(doc, m); n {
		case 0:
			return "", fmt.Errorf("marker %q not found", m)
		case 1:
		default:
			return "", fmt.Errorf("marker %q found %d times, want once", m, n)
		}
		if strings.Contains(block, m) {
			return "", fmt.Errorf("the block holds the marker %q", m)
		}
	}
	i, j := strings.Index(doc, begin), strings.Index(doc, end)
	for _, at := range []struct {
		m   string
		pos int
	}{{begin, i}, {end, j}} {
		startsLine := at.pos == 0 || doc[at.pos-1] == '\n'
		rest := doc[at.pos+len(at.m):]
		endsLine := rest == "" || rest[0] == '\n'
		if !startsLine || !endsLine {
			return "", fmt.Errorf("marker %q is not alone on its line", at.m)
		}
	}
	if j < i {
		return "", fmt.Errorf("marker %q comes before %q", end, begin)
	}
	if block != "" && !strings.HasSuffix(block, "\n") {
		block += "\n"
	}
	return doc[:i+len(begin)] + "\n" + block + doc[j:], nil
}

// sideBySideBlock is the generated part of the side-by-side section: when
// and from which commit it was measured, the machine's load, the command,
// and the table.
func sideBySideBlock(at time.Time, commit, load, command, table string) string {
	var s strings.Builder
	fmt.Fprintf(&s, "Written by the benchmark itself on %s, commit %s, load average %s:\n\n",
		at.UTC().Format("2006-01-02 15:04 UTC"), commit, load)
	fmt.Fprintf(&s, "```\n%s\n```\n\n", command)
	s.WriteString(table)
	return s.String()
}

// benchCommand is the go test command equivalent to the running one for
// this package, from the test binary's own flags.
func benchCommand(doc string) string {
	get := func(name string) string {
		if f := flag.Lookup(name); f != nil {
			return f.Value.String()
		}
		return ""
	}
	cmd := fmt.Sprintf("%s=%s go test -run %s -bench %s -benchtime %s", benchDocEnv, shellWord(doc),
		shellWord(get("test.run")), shellWord(get("test.bench")), shellWord(get("test.benchtime")))
	if c := get("test.count"); c != "" && c != "1" {
		cmd += " -count " + c
	}
	if f := os.Getenv(sideFleetEnv); f != "" {
		cmd = sideFleetEnv + "=" + shellWord(f) + " " + cmd
	}
	return cmd + " ./cmd/fleetgate"
}

var plainWord = regexp.MustCompile(`^[A-Za-z0-9_./=:-]+$`)

// shellWord quotes s for a POSIX shell when it needs it.
func shellWord(s string) string {
	if plainWord.MatchString(s) {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

// gitCommit is the short hash of HEAD, with -dirty when tracked files
// differ from it; "unknown" outside a git checkout.
func gitCommit() string {
	out, err := exec.Command("git", "rev-parse", "--short", "HEAD").Output()
	if err != nil {
		return "unknown"
	}
	c := strings.TrimSpace(string(out))
	if st, err := exec.Command("git", "status", "--porcelain", "--untracked-files=no").Output(); err == nil && len(st) > 0 {
		c += "-dirty"
	}
	return c
}

// loadAverage is the 1-minute load average, or "unknown".
func loadAverage() string {
	b, err := os.ReadFile("/proc/loadavg")
	if f := strings.Fields(string(b)); err == nil && len(f) > 0 {
		return f[0]
	}
	return "unknown"
}

// sideBySideDoc is the file named by BENCH_DOC ("" without the
// variable), as given and as a path from the package directory. It fails
// the benchmark at once, not after the run, when the file cannot take the
// block.
func sideBySideDoc(b *testing.B, marker string) (doc, path string) {
	b.Helper()
	doc = os.Getenv(benchDocEnv)
	if doc == "" {
		return "", ""
	}
	path = doc
	if !filepath.IsAbs(path) {
		path = filepath.Join("..", "..", path) // the package directory is cmd/fleetgate
	}
	old, err := os.ReadFile(path)
	if err != nil {
		b.Fatalf("%s: %v", benchDocEnv, err)
	}
	begin, end := sideBySideMarkers(marker)
	if _, err := replaceMarked(string(old), begin, end, ""); err != nil {
		b.Fatalf("%s=%s: %v", benchDocEnv, doc, err)
	}
	return doc, path
}

// writeSideBySide replaces the side-by-side block of the file from
// sideBySideDoc with table (nothing when doc is ""). loadStart is the load
// average when the run began.
func writeSideBySide(b *testing.B, doc, path, marker string, started time.Time, loadStart, table string) {
	b.Helper()
	if doc == "" {
		return
	}
	old, err := os.ReadFile(path)
	if err != nil {
		b.Fatalf("%s: %v", benchDocEnv, err)
	}
	load := fmt.Sprintf("%s at the start, %s at the end", loadStart, loadAverage())
	begin, end := sideBySideMarkers(marker)
	out, err := replaceMarked(string(old), begin, end, sideBySideBlock(started, gitCommit(), load, benchCommand(doc), table))
	if err != nil {
		b.Fatalf("%s=%s: %v", benchDocEnv, doc, err)
	}
	if err := os.WriteFile(path, []byte(out), 0o644); err != nil {
		b.Fatal(err)
	}
	b.Logf("side-by-side table written to %s", path)
}

// TestBenchmarksDocTakesSideBySide: docs/benchmarks.md holds the markers
// BenchmarkSimulateSideBySide writes between, once each and in order, for
// every fleet.
func TestBenchmarksDocTakesSideBySide(t *testing.T) {
	doc, err := os.ReadFile(filepath.Join("..", "..", "docs", "benchmarks.md"))
	if err != nil {
		t.Fatal(err)
	}
	for name, f := range sideFleets {
		begin, end := sideBySideMarkers(f.marker)
		if _, err := replaceMarked(string(doc), begin, end, "| table |\n"); err != nil {
			t.Fatalf("docs/benchmarks.md, fleet %q: %v", name, err)
		}
	}
}

func TestReplaceMarked(t *testing.T) {
	const b, e = "<!-- x:begin -->", "<!-- x:end -->"
	before := "# Title\n\ntext before\n" + b + "\n"
	after := e + "\ntext after, kept\n"
	for _, c := range []struct {
		name, old, block string
	}{
		{"old block replaced", before + "old table\nold line\n" + after, "new\n"},
		{"empty between the markers", before + after, "new\n"},
		{"block without a final newline", before + "old\n" + after, "new"},
		{"at the very start and end", b + "\nold\n" + e, "new\n"},
	} {
		t.Run(c.name, func(t *testing.T) {
			got, err := replaceMarked(c.old, b, e, c.block)
			if err != nil {
				t.Fatal(err)
			}
			i, j := strings.Index(c.old, b)+len(b), strings.Index(c.old, e)
			want := c.old[:i] + "\nnew\n" + c.old[j:]
			if got != want {
				t.Fatalf("got\n%q\nwant\n%q", got, want)
			}
			again, err := replaceMarked(got, b, e, c.block)
			if err != nil || again != got {
				t.Fatalf("a second run with the same block changed the file: %v\n%q", err, again)
			}
		})
	}
	for _, c := range []struct {
		name, old, block, want string
	}{
		{"no markers", "# Title\n| a |\n", "new\n", `marker "<!-- x:begin -->" not found`},
		{"no end marker", before + "old\n", "new\n", `marker "<!-- x:end -->" not found`},
		{"no begin marker", "text\n" + after, "new\n", `marker "<!-- x:begin -->" not found`},
		{"begin twice", before + before + after, "new\n", `found 2 times`},
		{"end twice", before + after + after, "new\n", `found 2 times`},
		{"out of order", after + before, "new\n", `comes before`},
		{"begin inside a line", "see " + b + " here\n" + after, "new\n", `not alone on its line`},
		{"end followed by text", before + e + " tail\n", "new\n", `not alone on its line`},
		{"block holding a marker", before + after, "new\n" + e + "\n", `the block holds`},
	} {
		t.Run(c.name, func(t *testing.T) {
			got, err := replaceMarked(c.old, b, e, c.block)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("err = %v, want one containing %q (result %q)", err, c.want, got)
			}
			if got != "" {
				t.Fatalf("a failed replace returned text: %q", got)
			}
		})
	}
}

func TestSideBySideBlock(t *testing.T) {
	at := time.Date(2026, 12, 1, 5, 7, 0, 0, time.FixedZone("X", 3600))
	got := sideBySideBlock(at, "abc1234", "1.5 at the start, 2.0 at the end", "go test -bench X", "| a |\n|---|\n")
	want := "Written by the benchmark itself on 2026-12-01 04:07 UTC, commit abc1234, load average 1.5 at the start, 2.0 at the end:\n\n" +
		"```\ngo test -bench X\n```\n\n| a |\n|---|\n"
	if got != want {
		t.Fatalf("got\n%q\nwant\n%q", got, want)
	}
}

func TestShellWord(t *testing.T) {
	for in, want := range map[string]string{
		"docs/benchmarks.md": "docs/benchmarks.md",
		".":                  ".",
		"^$":                 `'^$'`,
		"it's":               `'it'\''s'`,
		"":                   "''",
	} {
		if got := shellWord(in); got != want {
			t.Errorf("shellWord(%q) = %q, want %q", in, got, want)
		}
	}
}
