package yamlpos

import (
	"errors"
	"testing"
)

func TestSyntaxError(t *testing.T) {
	for in, want := range map[string]string{
		"yaml: line 3: mapping values are not allowed in this context": "f.yaml:3: invalid YAML: mapping values are not allowed in this context",
		"yaml: unknown anchor 'x' referenced":                          "f.yaml: invalid YAML: unknown anchor 'x' referenced",
	} {
		if got := SyntaxError("f.yaml", errors.New(in)).Error(); got != want {
			t.Errorf("SyntaxError(%q) = %q, want %q", in, got, want)
		}
	}
}
