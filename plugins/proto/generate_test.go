package proto_test

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"testing"
)

// protocLine is the generated header line that names protoc's version,
// which depends on the machine's package, not on the contract.
var protocLine = regexp.MustCompile(`(?m)^// \tprotoc +v.*\n|^// - protoc +v.*\n`)

// TestGeneratedCodeIsCurrent regenerates the Go code from adapter.proto
// with the generators pinned in go.mod and compares it with the committed
// files: run `make generate` when it fails. `make test` installs protoc.
func TestGeneratedCodeIsCurrent(t *testing.T) {
	protoc, err := exec.LookPath("protoc")
	if err != nil {
		t.Fatalf("protoc is not installed (make deps installs protobuf-compiler): %v", err)
	}
	out := t.TempDir()
	var plugins []string
	for _, tool := range []string{"protoc-gen-go", "protoc-gen-go-grpc"} {
		path, err := exec.Command("go", "tool", "-n", tool).Output()
		if err != nil {
			t.Fatalf("go tool -n %s: %v", tool, err)
		}
		plugins = append(plugins, "--plugin="+tool+"="+string(bytes.TrimSpace(path)))
	}
	args := append(plugins, "-I", ".",
		"--go_out="+out, "--go_opt=paths=source_relative",
		"--go-grpc_out="+out, "--go-grpc_opt=paths=source_relative",
		"adapter.proto")
	if b, err := exec.Command(protoc, args...).CombinedOutput(); err != nil {
		t.Fatalf("protoc: %v\n%s", err, b)
	}
	for _, name := range []string{"adapter.pb.go", "adapter_grpc.pb.go"} {
		fresh, err := os.ReadFile(filepath.Join(out, name))
		if err != nil {
			t.Fatal(err)
		}
		committed, err := os.ReadFile(name)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(protocLine.ReplaceAll(fresh, nil), protocLine.ReplaceAll(committed, nil)) {
			t.Errorf("%s is stale: run `make generate` and commit the result", name)
		}
	}
}
