package yamlpos

import (
	"bytes"
	"errors"
	"fmt"
	"io"

	"go.yaml.in/yaml/v3"
)

// MaxErrors bounds how many problems Errors keeps for one file.
const MaxErrors = 20

// Errors collects the problems of one file, each positioned at its node:
// "name:line:column: problem". Past MaxErrors it keeps one more,
// "name: too many errors", and drops the rest.
type Errors struct {
	name string
	errs []error
}

// NewErrors collects the problems of the file called name.
func NewErrors(name string) *Errors { return &Errors{name: name} }

// Add records a problem at n, the message formatted as by fmt.Sprintf.
func (e *Errors) Add(n *yaml.Node, format string, args ...any) {
	if len(e.errs) == MaxErrors {
		e.errs = append(e.errs, fmt.Errorf("%s: too many errors", e.name))
	}
	if len(e.errs) > MaxErrors {
		return
	}
	e.errs = append(e.errs, fmt.Errorf("%s:%d:%d: %s", e.name, n.Line, n.Column, fmt.Sprintf(format, args...)))
}

// Len is the number of problems recorded (at most MaxErrors + 1).
func (e *Errors) Len() int { return len(e.errs) }

// Err joins the problems, one a line; nil when there are none.
func (e *Errors) Err() error { return errors.Join(e.errs...) }

// Document parses data, the file called name, as one YAML document and
// returns its top node (the document's content). An empty file returns
// nil and no error. A syntax error is positioned by SyntaxError; a second
// document is an error that says the file, described by what ("the
// configuration"), is one document.
func Document(name string, data []byte, what string) (*yaml.Node, error) {
	dec := yaml.NewDecoder(bytes.NewReader(data))
	var doc yaml.Node
	if err := dec.Decode(&doc); err != nil {
		if errors.Is(err, io.EOF) {
			return nil, nil
		}
		return nil, SyntaxError(name, err)
	}
	var extra yaml.Node
	switch err := dec.Decode(&extra); {
	case err == nil:
		return nil, fmt.Errorf("%s:%d:%d: a second YAML document; %s is one document", name, extra.Line, extra.Column, what)
	case !errors.Is(err, io.EOF):
		return nil, SyntaxError(name, err)
	}
	root := &doc
	if root.Kind == yaml.DocumentNode && len(root.Content) == 1 {
		root = root.Content[0]
	}
	return root, nil
}
