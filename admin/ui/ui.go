// Package ui is the page of the admin listener (docs/design.md §6.11): one
// HTML document, its script, its style sheet and its icon, embedded in the
// binary and served with a strict Content-Security-Policy. The page reads
// only the public /v1 API, as any client would; it has no route of its
// own beyond the files.
package ui

import (
	"embed"
	"io/fs"
	"net/http"
	"path"
)

//go:embed static
var static embed.FS

// CSP is the Content-Security-Policy of every file served: scripts, styles,
// images and connections from the admin listener itself only, no inline
// script or style, no framing, forms posting only to the listener.
const CSP = "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; " +
	"base-uri 'none'; form-action 'self'; frame-ancestors 'none'; object-src 'none'"

// Handler serves the page: / is index.html, /ui/<file> the other files
// (404 for a name it does not hold). Mount it at the patterns "GET /{$}"
// and "GET /ui/{file}".
func Handler() http.Handler {
	files, err := fs.Sub(static, "static")
	if err != nil {
		panic(err) // the embedded tree always holds static
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		name := "index.html"
		if r.URL.Path != "/" {
			name = path.Base(r.URL.Path)
		}
		b, err := fs.ReadFile(files, name)
		if err != nil || (name == "index.html" && r.URL.Path != "/") {
			http.NotFound(w, r)
			return
		}
		h := w.Header()
		h.Set("Content-Security-Policy", CSP)
		h.Set("X-Content-Type-Options", "nosniff")
		h.Set("Referrer-Policy", "no-referrer")
		h.Set("Cache-Control", "no-cache")
		h.Set("Content-Type", contentType(name))
		_, _ = w.Write(b)
	})
}

// contentType is the media type of an embedded file, by its extension.
func contentType(name string) string {
	switch path.Ext(name) {
	case ".html":
		return "text/html; charset=utf-8"
	case ".js":
		return "text/javascript; charset=utf-8"
	case ".css":
		return "text/css; charset=utf-8"
	case ".svg":
		return "image/svg+xml"
	}
	return "application/octet-stream"
}
