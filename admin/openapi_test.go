package admin_test

import (
	"context"
	"io"
	"net/http"
	"os"
	"slices"
	"sort"
	"strconv"
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
	f := newFixture(t, withCredentials(t, testToken))
	served := f.srv.Routes()
	sort.Strings(served)
	if !slices.Equal(documented, served) {
		t.Fatalf("docs/openapi.yaml documents\n%s\nthe server serves\n%s", strings.Join(documented, "\n"), strings.Join(served, "\n"))
	}

	f.connect("dev-1")
	f.srv.SetReady(true)
	// the reads first, then the changes: a POST before the DELETEs
	order := map[string]int{"GET": 0, "POST": 1, "DELETE": 2}
	sort.SliceStable(documented, func(i, j int) bool {
		mi, _, _ := strings.Cut(documented[i], " ")
		mj, _, _ := strings.Cut(documented[j], " ")
		return order[mi] < order[mj]
	})
	for _, route := range documented {
		method, pattern, _ := strings.Cut(route, " ")
		docPath := strings.Replace(pattern, "/{$}", "/", 1)
		path := strings.NewReplacer("{id}", "dev-1", "{file}", "app.js", "{$}", "").Replace(pattern)
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		var body io.Reader
		contentType := ""
		switch route {
		case "POST /v1/credentials/{id}":
			body, contentType = strings.NewReader(`{"psk": "generate"}`), "application/json"
		case "POST /login":
			body, contentType = strings.NewReader("token="+testToken), "application/x-www-form-urlencoded"
		}
		req, err := http.NewRequestWithContext(ctx, method, "http://"+f.srv.Addr().String()+path, body)
		if err != nil {
			t.Fatal(err)
		}
		if contentType != "" {
			req.Header.Set("Content-Type", contentType)
		}
		req.Header.Set("Authorization", "Bearer "+testToken)
		resp, err := http.DefaultClient.Do(req) // a stream (/v1/watch) answers its header at once
		if err != nil {
			t.Fatalf("%s: %v", route, err)
		}
		if _, ok := doc.Paths[docPath][strings.ToLower(method)].Responses[strconv.Itoa(resp.StatusCode)]; !ok || resp.StatusCode/100 != 2 {
			t.Errorf("%s: %d, want a success it documents", route, resp.StatusCode)
		}
		resp.Body.Close()
		cancel()
	}
}
