package admin_test

import (
	"context"
	"net/http"
	"os"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"
)

// openAPI is the part of docs/openapi.yaml the test reads: per path, per
// method, the documented response codes.
type openAPI struct {
	OpenAPI string `yaml:"openapi"`
	Paths   map[string]map[string]struct {
		Responses map[string]any `yaml:"responses"`
	} `yaml:"paths"`
}

// docs/openapi.yaml documents exactly the routes the admin API serves,
// and each documented route answers its documented success (200) on a
// real server over a real store.
func TestOpenAPIDocumentsEveryRoute(t *testing.T) {
	b, err := os.ReadFile("../docs/openapi.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var doc openAPI
	if err := yaml.Unmarshal(b, &doc); err != nil {
		t.Fatalf("docs/openapi.yaml: %v", err)
	}
	if !strings.HasPrefix(doc.OpenAPI, "3.") {
		t.Fatalf("openapi %q, want 3.x", doc.OpenAPI)
	}
	var documented []string
	for path, methods := range doc.Paths {
		for m, op := range methods {
			if path == "/" {
				path = "/{$}" // the pattern that serves / alone
			}
			documented = append(documented, strings.ToUpper(m)+" "+path)
			if _, ok := op.Responses["200"]; !ok {
				t.Errorf("%s %s documents no 200 answer", m, path)
			}
		}
	}
	sort.Strings(documented)
	f := newFixture(t)
	served := f.srv.Routes()
	sort.Strings(served)
	if !slices.Equal(documented, served) {
		t.Fatalf("docs/openapi.yaml documents\n%s\nthe server serves\n%s", strings.Join(documented, "\n"), strings.Join(served, "\n"))
	}

	f.connect("dev-1")
	f.srv.SetReady(true)
	for _, route := range documented {
		method, path, _ := strings.Cut(route, " ")
		path = strings.NewReplacer("{id}", "dev-1", "{file}", "app.js", "{$}", "").Replace(path)
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		req, err := http.NewRequestWithContext(ctx, method, "http://"+f.srv.Addr().String()+path, nil)
		if err != nil {
			t.Fatal(err)
		}
		resp, err := http.DefaultClient.Do(req) // a stream (/v1/watch) answers its header at once
		if err != nil {
			t.Fatalf("%s: %v", route, err)
		}
		if resp.StatusCode != http.StatusOK {
			t.Errorf("%s: %d, want 200", route, resp.StatusCode)
		}
		resp.Body.Close()
		cancel()
	}
}
