package configs

import (
	"errors"
	"fmt"
	"os"
	"reflect"
	"strconv"
	"strings"

	"go.yaml.in/yaml/v3"

	"github.com/fleetgate/fleetgate/internal/yamlpos"
)

// Load reads the file at path and returns Parse(path, data, env) after
// Validate. env is os.Environ() in production. A decoding error returns a
// zero Config; a validation error returns the decoded Config with it, so
// that check-config can still show what it read.
func Load(path string, env []string) (Config, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return Config{}, fmt.Errorf("config: %w", err)
	}
	c, err := Parse(path, data, env)
	if err != nil {
		return Config{}, err
	}
	if err := c.Validate(); err != nil {
		return c, fmt.Errorf("%s: invalid configuration:\n%w", path, positioned(path, data, err))
	}
	return c, nil
}

// positioned prefixes each of Validate's problems that is keyed (addAt)
// with the position of its key in the file, "name:line:column: ", when
// the file sets that key (a problem of a default or of an environment
// variable has none).
func positioned(name string, data []byte, err error) error {
	joined, ok := err.(interface{ Unwrap() []error })
	root, derr := yamlpos.Document(name, data, "the configuration")
	if !ok || derr != nil || root == nil {
		return err
	}
	var out []error
	for _, e := range joined.Unwrap() {
		if k, ok := e.(keyed); ok {
			if n := keyNode(root, k.key); n != nil {
				e = fmt.Errorf("%s:%d:%d: %w", name, n.Line, n.Column, e)
			}
		}
		out = append(out, e)
	}
	return errors.Join(out...)
}

// keyNode is the key node of a dotted path of mapping keys, each maybe
// indexing a list ("listen.admin.token_file", "plugins.adapters[2].lease")
// in the document under n, or nil.
func keyNode(n *yaml.Node, path string) *yaml.Node {
	var key *yaml.Node
	for part := range strings.SplitSeq(path, ".") {
		name, index, indexed := strings.Cut(part, "[")
		if n.Kind == yaml.AliasNode {
			n = n.Alias
		}
		if n.Kind != yaml.MappingNode {
			return nil
		}
		next := (*yaml.Node)(nil)
		for i := 0; i+1 < len(n.Content); i += 2 {
			if n.Content[i].Value == name {
				key, next = n.Content[i], n.Content[i+1]
			}
		}
		if next == nil {
			return nil
		}
		if indexed {
			if next.Kind == yaml.AliasNode {
				next = next.Alias
			}
			i, err := strconv.Atoi(strings.TrimSuffix(index, "]"))
			if err != nil || next.Kind != yaml.SequenceNode || i < 0 || i >= len(next.Content) {
				return nil
			}
			next = next.Content[i]
		}
		n = next
	}
	return key
}

// Parse decodes data (named name in errors) over Default(), then applies
// the FLEETGATE_ variables of env, then replaces an empty gateway.id by
// HostID(). It does not validate. Errors in the file read
// "name:line:column: key: problem", one per line; errors in the
// environment name the variable.
func Parse(name string, data []byte, env []string) (Config, error) {
	c := Default()
	if err := decodeFile(name, data, &c); err != nil {
		return Config{}, err
	}
	if err := applyEnv(&c, env); err != nil {
		return Config{}, err
	}
	if err := readSecretFiles(name, data, env, &c); err != nil {
		return Config{}, err
	}
	if c.Gateway.ID == "" {
		c.Gateway.ID = HostID()
	}
	return c, nil
}

func decodeFile(name string, data []byte, c *Config) error {
	root, err := yamlpos.Document(name, data, "the configuration")
	if err != nil || root == nil {
		return err
	}
	d := &decoder{errs: yamlpos.NewErrors(name)}
	d.value(root, "", reflect.ValueOf(c).Elem())
	return d.errs.Err()
}

// decoder walks a yaml.Node tree alongside a Config, so that every error
// carries the node's position and the key's path.
type decoder struct {
	errs *yamlpos.Errors
}

var (
	durationType   = reflect.TypeFor[Duration]()
	byteSizeType   = reflect.TypeFor[ByteSize]()
	stringListType = reflect.TypeFor[[]string]()
)

// value decodes n into v, the field at path ("" for the whole Config).
func (d *decoder) value(n *yaml.Node, path string, v reflect.Value) {
	if n.Kind == yaml.AliasNode {
		n = n.Alias
	}
	switch v.Type() {
	case settingsType:
		d.settings(n, path, v)
		return
	case adapterListType:
		d.adapterList(n, path, v)
		return
	}
	if v.Kind() == reflect.Struct {
		d.mapping(n, path, v)
		return
	}
	if n.Kind == yaml.ScalarNode && n.ShortTag() == "!!null" {
		switch v.Kind() {
		case reflect.String:
			v.SetString("")
		case reflect.Slice:
			v.Set(reflect.ValueOf([]string{}))
		default:
			d.errs.Add(n, "%s: no value", path)
		}
		return
	}
	switch {
	case v.Type() == durationType:
		var dur Duration
		if err := dur.UnmarshalYAML(n); err != nil {
			d.errs.Add(n, "%s: %v", path, err)
			return
		}
		v.Set(reflect.ValueOf(dur))
	case v.Type() == byteSizeType:
		var b ByteSize
		if err := b.UnmarshalYAML(n); err != nil {
			d.errs.Add(n, "%s: %v", path, err)
			return
		}
		v.Set(reflect.ValueOf(b))
	case v.Type() == stringListType:
		d.stringList(n, path, v)
	case v.Kind() == reflect.Slice && v.Type().Elem().Kind() == reflect.Struct:
		d.structList(n, path, v)
	case v.Kind() == reflect.String:
		if n.Kind != yaml.ScalarNode {
			d.errs.Add(n, "%s: want a string, got %s", path, describe(n))
			return
		}
		v.SetString(n.Value)
	case v.Kind() == reflect.Int, v.Kind() == reflect.Int64:
		var i int64
		if n.Kind != yaml.ScalarNode || n.ShortTag() != "!!int" || n.Decode(&i) != nil {
			d.errs.Add(n, "%s: want an integer, got %s", path, describe(n))
			return
		}
		if v.OverflowInt(i) {
			d.errs.Add(n, "%s: %d is out of range", path, i)
			return
		}
		v.SetInt(i)
	case v.Kind() == reflect.Bool:
		var b bool
		if n.Kind != yaml.ScalarNode || n.ShortTag() != "!!bool" || n.Decode(&b) != nil {
			d.errs.Add(n, "%s: want true or false, got %s", path, describe(n))
			return
		}
		v.SetBool(b)
	default:
		panic(fmt.Sprintf("configs: field %s has unsupported type %s", path, v.Type()))
	}
}

func (d *decoder) mapping(n *yaml.Node, path string, v reflect.Value) {
	if n.Kind == yaml.ScalarNode && n.ShortTag() == "!!null" {
		return // an empty section keeps its defaults
	}
	if n.Kind != yaml.MappingNode {
		d.errs.Add(n, "%s: want a mapping of keys, got %s", where(path), describe(n))
		return
	}
	fields := fieldNames(v.Type())
	seen := make(map[string]int, len(n.Content)/2)
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, val := n.Content[i], n.Content[i+1]
		if k.Kind != yaml.ScalarNode {
			d.errs.Add(k, "%s: keys must be plain names, got %s", where(path), describe(k))
			continue
		}
		if k.ShortTag() == "!!merge" {
			d.errs.Add(k, "%s: merge keys (<<) are not supported", where(path))
			continue
		}
		if line, dup := seen[k.Value]; dup {
			d.errs.Add(k, "key %q %s is already set at line %d", k.Value, in(path), line)
			continue
		}
		seen[k.Value] = k.Line
		idx, ok := fields[k.Value]
		if !ok {
			d.errs.Add(k, "unknown key %q %s%s", k.Value, in(path), suggest(k.Value, keys(fields)))
			continue
		}
		d.value(val, join(path, k.Value), v.Field(idx))
	}
}

// structList decodes a list of mappings (auth.clients), each element
// from its type's zero value.
func (d *decoder) structList(n *yaml.Node, path string, v reflect.Value) {
	if n.Kind != yaml.SequenceNode {
		d.errs.Add(n, "%s: want a list, got %s", path, describe(n))
		return
	}
	list := reflect.MakeSlice(v.Type(), len(n.Content), len(n.Content))
	for i, e := range n.Content {
		if e.Kind == yaml.AliasNode {
			e = e.Alias
		}
		d.mapping(e, fmt.Sprintf("%s[%d]", path, i), list.Index(i))
	}
	v.Set(list)
}

func (d *decoder) stringList(n *yaml.Node, path string, v reflect.Value) {
	if n.Kind != yaml.SequenceNode {
		d.errs.Add(n, "%s: want a list of strings, got %s", path, describe(n))
		return
	}
	list := make([]string, 0, len(n.Content))
	for i, e := range n.Content {
		if e.Kind == yaml.AliasNode {
			e = e.Alias
		}
		if e.Kind != yaml.ScalarNode || e.ShortTag() == "!!null" {
			d.errs.Add(e, "%s[%d]: want a string, got %s", path, i, describe(e))
			continue
		}
		list = append(list, e.Value)
	}
	v.Set(reflect.ValueOf(list))
}

// fieldNames maps the yaml names of struct type t to field indexes.
func fieldNames(t reflect.Type) map[string]int {
	m := make(map[string]int, t.NumField())
	for i := range t.NumField() {
		m[yamlName(t.Field(i))] = i
	}
	return m
}

func yamlName(f reflect.StructField) string {
	name, _, _ := strings.Cut(f.Tag.Get("yaml"), ",")
	if name == "" {
		panic("configs: field " + f.Name + " has no yaml name")
	}
	return name
}

func keys(m map[string]int) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	return out
}

func join(path, key string) string {
	if path == "" {
		return key
	}
	return path + "." + key
}

// where names a mapping at the start of a message.
func where(path string) string {
	if path == "" {
		return "top level"
	}
	return path
}

// in places a key in its mapping: "in presence", "at the top level".
func in(path string) string {
	if path == "" {
		return "at the top level"
	}
	return "in " + path
}

// describe names what a node holds, for "want X, got Y" messages.
func describe(n *yaml.Node) string {
	switch n.Kind {
	case yaml.MappingNode:
		return "a mapping"
	case yaml.SequenceNode:
		return "a list"
	case yaml.ScalarNode:
		if n.ShortTag() == "!!null" {
			return "no value"
		}
		return fmt.Sprintf("%q", n.Value)
	case yaml.AliasNode:
		return "an alias"
	}
	return "a document"
}

// suggest returns ` (did you mean "x"?)` for the candidate within edit
// distance 2 of name, or "".
func suggest(name string, candidates []string) string {
	best, bestDist := "", 3
	for _, c := range candidates {
		if dist := editDistance(name, c); dist < bestDist || (dist == bestDist && c < best) {
			best, bestDist = c, dist
		}
	}
	if best == "" {
		return ""
	}
	return fmt.Sprintf(" (did you mean %q?)", best)
}

// editDistance is the Levenshtein distance between a and b, in bytes.
func editDistance(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}
