package admin_test

import (
	"bytes"
	"compress/gzip"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/fleetgate/fleetgate/admin"
)

// The runtime profiles are served only when asked for, and behind the
// API's token: a heap profile is a gzipped protobuf, the index lists the
// profiles, and without the token the answer is 401.
func TestProfiling(t *testing.T) {
	off := newFixture(t)
	if code, _ := off.get("/debug/pprof/heap"); code != http.StatusNotFound {
		t.Fatalf("without profiling: /debug/pprof/heap %d, want 404", code)
	}

	f := newFixture(t, func(o *admin.Options) { o.Profiling, o.Token = true, testToken })
	if code, _ := f.call(http.MethodGet, "/debug/pprof/heap", "", ""); code != http.StatusUnauthorized {
		t.Fatalf("no token: /debug/pprof/heap %d, want 401", code)
	}
	code, body := f.call(http.MethodGet, "/debug/pprof/heap", "", testToken)
	if code != http.StatusOK {
		t.Fatalf("/debug/pprof/heap %d: %s", code, body)
	}
	zr, err := gzip.NewReader(bytes.NewReader([]byte(body)))
	if err != nil {
		t.Fatalf("heap profile is not gzip: %v", err)
	}
	if raw, err := io.ReadAll(zr); err != nil || len(raw) == 0 {
		t.Fatalf("heap profile: %d bytes, %v", len(raw), err)
	}
	code, body = f.call(http.MethodGet, "/debug/pprof/", "", testToken)
	if code != http.StatusOK || !strings.Contains(body, "goroutine") || !strings.Contains(body, "heap") {
		t.Fatalf("/debug/pprof/: %d %.200s", code, body)
	}
	if code, body := f.call(http.MethodGet, "/debug/pprof/goroutine?debug=1", "", testToken); code != http.StatusOK ||
		!strings.Contains(body, "goroutine profile:") {
		t.Fatalf("/debug/pprof/goroutine: %d %.200s", code, body)
	}
}
