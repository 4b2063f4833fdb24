package yamlpos

import (
	"fmt"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"
)

func TestErrors(t *testing.T) {
	e := NewErrors("f.yaml")
	if e.Len() != 0 || e.Err() != nil {
		t.Fatalf("new collector: %d problems, %v", e.Len(), e.Err())
	}
	for i := range MaxErrors + 5 {
		e.Add(&yaml.Node{Line: i + 1, Column: 3}, "key %d: wrong", i)
	}
	if e.Len() != MaxErrors+1 {
		t.Fatalf("%d problems kept, want %d", e.Len(), MaxErrors+1)
	}
	lines := strings.Split(e.Err().Error(), "\n")
	if len(lines) != MaxErrors+1 {
		t.Fatalf("%d lines, want %d:\n%v", len(lines), MaxErrors+1, e.Err())
	}
	for i, l := range lines[:MaxErrors] {
		if want := fmt.Sprintf("f.yaml:%d:3: key %d: wrong", i+1, i); l != want {
			t.Errorf("line %d = %q, want %q", i, l, want)
		}
	}
	if last := lines[MaxErrors]; last != "f.yaml: too many errors" {
		t.Errorf("last line %q", last)
	}
}

func TestDocument(t *testing.T) {
	root, err := Document("f.yaml", []byte("a: 1\n"), "the file")
	if err != nil || root == nil || root.Kind != yaml.MappingNode {
		t.Fatalf("one document: %v, %v", root, err)
	}
	if root, err := Document("f.yaml", nil, "the file"); root != nil || err != nil {
		t.Fatalf("empty file: %v, %v", root, err)
	}
	for in, want := range map[string]string{
		"a: 1\n---\nb: 2\n": "f.yaml:2:1: a second YAML document; the file is one document",
		"a: 1\nb: c: d\n":   "f.yaml:2: invalid YAML: mapping values are not allowed in this context",
		"a: 1\n---\n[\n":    "f.yaml:3: invalid YAML: did not find expected node content",
	} {
		if _, err := Document("f.yaml", []byte(in), "the file"); err == nil || err.Error() != want {
			t.Errorf("Document(%q) = %v, want %q", in, err, want)
		}
	}
}
