// Package docs holds fleetgate's documents. Its test keeps docs/design.md,
// the design and external contract, current with the code: it fails when
// the document does not name a configuration key, a metric, a Redis key
// or an admin endpoint that the code defines; and it keeps README.md's
// walk through a heartbeat and an offline on functions that exist.
package docs

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"

	"github.com/fleetgate/fleetgate/configs"
)

// design is docs/design.md, read once per test.
func design(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile("design.md")
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// repoRoot is the module's root: the test runs in docs/.
func repoRoot(t *testing.T) string {
	t.Helper()
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(root, "go.mod")); err != nil {
		t.Fatalf("repository root %s: %v", root, err)
	}
	return root
}

// missing reports, sorted and once each, the names for which has is false.
func missing(names []string, has func(string) bool) []string {
	var out []string
	for _, n := range names {
		if !has(n) {
			out = append(out, n)
		}
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// TestDesignNamesConfigKeys: every key of the shipped configs/fleetgate.yaml
// (every dotted path, sections and the keys of list items, the latter as
// "list[].key"), every key the loader knows (configs.Keys) and every key
// of an adapter entry (configs.AdapterConfig, which the shipped file only
// shows in a comment) is in the document, in backquotes.
func TestDesignNamesConfigKeys(t *testing.T) {
	doc := design(t)
	data, err := os.ReadFile(filepath.Join(repoRoot(t), "configs", "fleetgate.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var root yaml.Node
	if err := yaml.Unmarshal(data, &root); err != nil {
		t.Fatal(err)
	}
	var sections, leaves []string
	var walk func(n *yaml.Node, path string)
	walk = func(n *yaml.Node, path string) {
		switch n.Kind {
		case yaml.DocumentNode:
			for _, c := range n.Content {
				walk(c, path)
			}
		case yaml.MappingNode:
			if path != "" {
				sections = append(sections, path)
			}
			for i := 0; i+1 < len(n.Content); i += 2 {
				p := n.Content[i].Value
				if path != "" {
					p = path + "." + p
				}
				walk(n.Content[i+1], p)
			}
		case yaml.SequenceNode:
			leaves = append(leaves, path)
			for _, c := range n.Content {
				if c.Kind == yaml.MappingNode {
					walk(c, path+"[]")
				}
			}
		default:
			leaves = append(leaves, path)
		}
	}
	walk(&root, "")
	if len(leaves) < 50 {
		t.Fatalf("found %d keys in configs/fleetgate.yaml; the walk is broken", len(leaves))
	}
	leaves = append(leaves, configs.Keys()...)
	leaves = append(leaves, structKeys(reflect.TypeFor[configs.AdapterConfig](), "plugins.adapters[]")...)
	if m := missing(leaves, func(k string) bool { return strings.Contains(doc, "`"+k+"`") }); len(m) > 0 {
		t.Errorf("docs/design.md does not name these configuration keys (as `key`):\n%s", strings.Join(m, "\n"))
	}
	if m := missing(sections, func(k string) bool { return strings.Contains(doc, "`"+k) }); len(m) > 0 {
		t.Errorf("docs/design.md does not name these configuration sections:\n%s", strings.Join(m, "\n"))
	}
}

// structKeys lists the yaml keys of the leaves of struct type t under
// path.
func structKeys(t reflect.Type, path string) []string {
	var out []string
	for i := range t.NumField() {
		f := t.Field(i)
		name, _, _ := strings.Cut(f.Tag.Get("yaml"), ",")
		if name == "" || name == "-" {
			continue
		}
		if f.Type.Kind() == reflect.Struct {
			out = append(out, structKeys(f.Type, path+"."+name)...)
			continue
		}
		out = append(out, path+"."+name)
	}
	return out
}

// goFiles calls fn with the syntax tree of every non-test Go file under
// dir (testdata and hidden directories left out).
func goFiles(t *testing.T, dir string, fn func(f *ast.File)) {
	t.Helper()
	fset := token.NewFileSet()
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if path != dir && (d.Name() == "testdata" || strings.HasPrefix(d.Name(), ".")) {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		fn(f)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// stringLit is the value of e when it is a string literal.
func stringLit(e ast.Expr) (string, bool) {
	lit, ok := e.(*ast.BasicLit)
	if !ok || lit.Kind != token.STRING {
		return "", false
	}
	s, err := strconv.Unquote(lit.Value)
	return s, err == nil
}

// TestDesignNamesMetrics: every metric the code registers is in the
// document. The metrics are enumerated from the source rather than from
// a registry, because most collectors are made inside the packages that
// own them (some only with a front end, an adapter or a runner running):
// every composite literal with a Name field (prometheus.CounterOpts,
// GaugeOpts, HistogramOpts, ... ; Namespace and Subsystem joined in when
// given), every prometheus.NewDesc and prometheus.BuildFQName with
// literal arguments, keeping the names that start with fleetgate_.
func TestDesignNamesMetrics(t *testing.T) {
	doc := design(t)
	var names []string
	add := func(parts ...string) {
		var kept []string
		for _, p := range parts {
			if p != "" {
				kept = append(kept, p)
			}
		}
		if n := strings.Join(kept, "_"); strings.HasPrefix(n, "fleetgate_") {
			names = append(names, n)
		}
	}
	goFiles(t, repoRoot(t), func(f *ast.File) {
		ast.Inspect(f, func(n ast.Node) bool {
			switch x := n.(type) {
			case *ast.CompositeLit:
				field := map[string]string{}
				for _, e := range x.Elts {
					kv, ok := e.(*ast.KeyValueExpr)
					if !ok {
						continue
					}
					key, ok := kv.Key.(*ast.Ident)
					if !ok {
						continue
					}
					if v, ok := stringLit(kv.Value); ok {
						field[key.Name] = v
					}
				}
				if name, ok := field["Name"]; ok {
					add(field["Namespace"], field["Subsystem"], name)
				}
			case *ast.CallExpr:
				sel, ok := x.Fun.(*ast.SelectorExpr)
				if !ok {
					return true
				}
				switch sel.Sel.Name {
				case "NewDesc":
					if len(x.Args) > 0 {
						if v, ok := stringLit(x.Args[0]); ok {
							add(v)
						}
					}
				case "BuildFQName":
					var parts []string
					for _, a := range x.Args {
						if v, ok := stringLit(a); ok {
							parts = append(parts, v)
						}
					}
					if len(parts) == len(x.Args) {
						add(parts...)
					}
				}
			}
			return true
		})
	})
	if len(names) < 30 {
		t.Fatalf("found %d metrics in the source; the scan is broken", len(names))
	}
	if m := missing(names, func(n string) bool { return strings.Contains(doc, "`"+n+"`") }); len(m) > 0 {
		t.Errorf("docs/design.md does not name these metrics (as `name`):\n%s", strings.Join(m, "\n"))
	}
}

// redisKey matches the key suffixes of store/redisstore: the string
// literals ":name" that follow a shard's hash tag or the prefix, and
// "{%s:%d}:name" format strings.
var redisKey = regexp.MustCompile(`^(?:\{%s:%d\})?:([a-z]+)$`)

// TestDesignNamesRedisKeys: every Redis key the Redis store forms is in
// the document, as `{P:s}:name` (a shard's key), `{P:0}:name` (one written
// on shard 0 only) or `P:name` (a key outside the shards). The keys are
// read from the string literals of store/redisstore's Go files, where
// every key is built (the Lua scripts get them as KEYS).
func TestDesignNamesRedisKeys(t *testing.T) {
	doc := design(t)
	var names []string
	goFiles(t, filepath.Join(repoRoot(t), "store", "redisstore"), func(f *ast.File) {
		ast.Inspect(f, func(n ast.Node) bool {
			if v, ok := stringLit(asExpr(n)); ok {
				if m := redisKey.FindStringSubmatch(v); m != nil {
					names = append(names, m[1])
				}
			}
			return true
		})
	})
	if len(names) < 8 {
		t.Fatalf("found %d Redis keys in store/redisstore; the scan is broken", len(names))
	}
	has := func(n string) bool {
		for _, form := range []string{"`{P:s}:", "`{P:0}:", "`P:"} {
			if strings.Contains(doc, form+n+"`") {
				return true
			}
		}
		return false
	}
	if m := missing(names, has); len(m) > 0 {
		t.Errorf("docs/design.md does not name these Redis keys (as `{P:s}:name`, `{P:0}:name` or `P:name`):\n%s", strings.Join(m, "\n"))
	}
}

func asExpr(n ast.Node) ast.Expr {
	e, _ := n.(ast.Expr)
	return e
}

// TestDesignNamesAdminEndpoints: every route the admin server registers
// (mux.Handle, HandleFunc and handle patterns "METHOD /path" in package
// admin) is in the document as `METHOD /path`.
func TestDesignNamesAdminEndpoints(t *testing.T) {
	doc := design(t)
	var routes []string
	goFiles(t, filepath.Join(repoRoot(t), "admin"), func(f *ast.File) {
		ast.Inspect(f, func(n ast.Node) bool {
			call, ok := n.(*ast.CallExpr)
			if !ok || len(call.Args) == 0 {
				return true
			}
			var name string
			switch fn := call.Fun.(type) {
			case *ast.SelectorExpr:
				name = fn.Sel.Name
			case *ast.Ident: // admin.Listen's handle, which also records the route
				name = fn.Name
			}
			if name != "Handle" && name != "HandleFunc" && name != "handle" {
				return true
			}
			if v, ok := stringLit(call.Args[0]); ok {
				routes = append(routes, v)
			}
			return true
		})
	})
	if len(routes) < 10 {
		t.Fatalf("found %d admin routes; the scan is broken", len(routes))
	}
	for _, r := range routes {
		if !strings.Contains(r, " ") {
			t.Errorf("admin route %q has no method: the document names routes as `METHOD /path`", r)
		}
	}
	if m := missing(routes, func(r string) bool { return strings.Contains(doc, "`"+r+"`") }); len(m) > 0 {
		t.Errorf("docs/design.md does not name these admin endpoints (as `METHOD /path`):\n%s", strings.Join(m, "\n"))
	}
}

// TestReadmeStopsExist: every `file.go:Type.function` or `file.go:function`
// stop that README.md's walk through a heartbeat and an offline names is
// a function or method declared in that file, and every Lua stop is a
// file; so a rename or a move that the walk does not follow fails here.
func TestReadmeStopsExist(t *testing.T) {
	root := repoRoot(t)
	b, err := os.ReadFile(filepath.Join(root, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	walk, ok := strings.CutPrefix(string(b)[strings.Index(string(b), "## Life of a heartbeat"):], "## ")
	if !ok {
		t.Fatal("README.md has no section 'Life of a heartbeat'")
	}
	walk, _, _ = strings.Cut(walk, "\n## ")
	// `path/file.go:Recv.name`, then optionally "`Recv.name`" of the same file
	stop := regexp.MustCompile("`([a-z0-9_/]+\\.go):([A-Za-z_][A-Za-z0-9_.]*)`(?:, then `([A-Za-z_][A-Za-z0-9_.]*)`)?")
	lua := regexp.MustCompile("`([a-z0-9_/]+\\.lua)`")
	n := 0
	for _, m := range stop.FindAllStringSubmatch(walk, -1) {
		funcs := declared(t, filepath.Join(root, m[1]))
		for _, name := range m[2:] {
			if name == "" {
				continue
			}
			n++
			if !funcs[name] {
				t.Errorf("README.md names %s:%s, which %s does not declare", m[1], name, m[1])
			}
		}
	}
	for _, m := range lua.FindAllStringSubmatch(walk, -1) {
		n++
		if _, err := os.Stat(filepath.Join(root, m[1])); err != nil {
			t.Errorf("README.md names %s: %v", m[1], err)
		}
	}
	if n < 15 {
		t.Fatalf("found %d stops in README.md's walk, want the whole walk (15 or more)", n)
	}
}

// declared is the functions ("name") and methods ("Recv.name") a Go file
// declares.
func declared(t *testing.T, path string) map[string]bool {
	t.Helper()
	f, err := parser.ParseFile(token.NewFileSet(), path, nil, parser.SkipObjectResolution)
	if err != nil {
		t.Fatalf("README.md names %s: %v", path, err)
	}
	out := map[string]bool{}
	for _, d := range f.Decls {
		fd, ok := d.(*ast.FuncDecl)
		if !ok {
			continue
		}
		name := fd.Name.Name
		if fd.Recv != nil && len(fd.Recv.List) == 1 {
			typ := fd.Recv.List[0].Type
			if s, ok := typ.(*ast.StarExpr); ok {
				typ = s.X
			}
			if g, ok := typ.(*ast.IndexExpr); ok {
				typ = g.X
			}
			if id, ok := typ.(*ast.Ident); ok {
				name = id.Name + "." + name
			}
		}
		out[name] = true
	}
	return out
}

// TestSecurityTableNamesRealTests: every test, benchmark and fuzz target
// that docs/security.md's table of attacks names is declared in a test
// file of the repository.
func TestSecurityTableNamesRealTests(t *testing.T) {
	b, err := os.ReadFile("security.md")
	if err != nil {
		t.Fatal(err)
	}
	_, table, ok := strings.Cut(string(b), "## Attacks, bounds and tests")
	if !ok {
		t.Fatal("security.md has no section 'Attacks, bounds and tests'")
	}
	named := regexp.MustCompile("`((?:Test|Benchmark|Fuzz)[A-Za-z0-9_]+)`").FindAllStringSubmatch(table, -1)
	if len(named) < 40 {
		t.Fatalf("the table names %d tests, want every defence's (40 or more)", len(named))
	}
	declared := map[string]bool{}
	decl := regexp.MustCompile(`(?m)^func ((?:Test|Benchmark|Fuzz)[A-Za-z0-9_]+)\(`)
	err = filepath.WalkDir(repoRoot(t), func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (d.Name() == ".git" || d.Name() == "build") {
			return filepath.SkipDir
		}
		if !d.IsDir() && strings.HasSuffix(path, "_test.go") {
			src, err := os.ReadFile(path)
			if err != nil {
				return err
			}
			for _, m := range decl.FindAllStringSubmatch(string(src), -1) {
				declared[m[1]] = true
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range missing(func() []string {
		var out []string
		for _, m := range named {
			out = append(out, m[1])
		}
		return out
	}(), func(n string) bool { return declared[n] }) {
		t.Errorf("security.md's table names %s, which no test file declares", n)
	}
}
