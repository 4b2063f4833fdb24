// Package yamlpos positions YAML errors for the strict file readers
// (configs and the devices file): it reads a file's one document, and
// collects the problems found in it as "name:line:column: problem".
package yamlpos

import (
	"fmt"
	"regexp"
	"strings"
)

var lineRE = regexp.MustCompile(`^yaml: line (\d+): (.*)$`)

// SyntaxError positions a YAML syntax error of the file called name. The
// parser reports a line but no column, so these errors read
// "name:line: invalid YAML: problem" (or "name: invalid YAML: problem"
// when it gives no line).
func SyntaxError(name string, err error) error {
	msg := err.Error()
	if m := lineRE.FindStringSubmatch(msg); m != nil {
		return fmt.Errorf("%s:%s: invalid YAML: %s", name, m[1], m[2])
	}
	return fmt.Errorf("%s: invalid YAML: %s", name, strings.TrimPrefix(msg, "yaml: "))
}
