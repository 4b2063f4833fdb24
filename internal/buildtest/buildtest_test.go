package buildtest

import (
	"os/exec"
	"strings"
	"testing"
)

func TestBuildRunsTheExecutable(t *testing.T) {
	var hello string
	if err := Build(t.TempDir(), map[string]*string{"./testdata/hello": &hello}); err != nil {
		t.Fatal(err)
	}
	if !strings.HasSuffix(hello, "/hello") {
		t.Fatalf("executable path %q, want …/hello", hello)
	}
	out, err := exec.Command(hello).Output()
	if err != nil || string(out) != "hello\n" {
		t.Fatalf("%s: %q, %v", hello, out, err)
	}
}

func TestBuildReportsTheCompilerError(t *testing.T) {
	var p string
	err := Build(t.TempDir(), map[string]*string{"./testdata/missing": &p})
	if err == nil || !strings.Contains(err.Error(), "testdata/missing") {
		t.Fatalf("building a missing package: %v, want go build's error naming it", err)
	}
}
