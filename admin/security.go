package admin

import (
	"crypto/sha256"
	"crypto/subtle"
	"crypto/tls"
	"net/http"
	"strings"
	"time"
)

// Timeouts of the admin server: a client that sends its request slowly,
// or reads the answer slowly, or keeps an idle connection, is cut off.
// The write timeout bounds a whole answer, except a watch stream's: there
// it bounds each write (deadlineWriter), so a stream lives as long as its
// client reads.
const (
	readHeaderTimeout   = 5 * time.Second
	readTimeout         = 10 * time.Second
	defaultWriteTimeout = 30 * time.Second
	idleTimeout         = 60 * time.Second
)

// secure wraps h so that every path except /healthz and /readyz (the
// probes of a service manager, which tell nothing) needs
// "Authorization: Bearer <token>" when token is set; a request without it
// gets 401. The comparison takes the same time wherever the tokens
// differ.
func secure(h http.Handler, token string) http.Handler {
	if token == "" {
		return h
	}
	want := sha256.Sum256([]byte(token))
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/healthz" || r.URL.Path == "/readyz" {
			h.ServeHTTP(w, r)
			return
		}
		got, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
		sum := sha256.Sum256([]byte(got))
		if !ok || subtle.ConstantTimeCompare(sum[:], want[:]) != 1 {
			w.Header().Set("WWW-Authenticate", `Bearer realm="fleetgate"`)
			writeError(w, http.StatusUnauthorized, errUnauthorized)
			return
		}
		h.ServeHTTP(w, r)
	})
}

type adminError string

func (e adminError) Error() string { return string(e) }

const errUnauthorized = adminError("a bearer token is required (listen.admin.token_file)")

// newHTTPServer is the admin http.Server with its timeouts.
func newHTTPServer(h http.Handler, o Options) *http.Server {
	return &http.Server{
		Handler:           secure(h, o.Token),
		ReadHeaderTimeout: readHeaderTimeout,
		ReadTimeout:       readTimeout,
		WriteTimeout:      o.WriteTimeout,
		IdleTimeout:       idleTimeout,
		TLSConfig:         o.TLS,
	}
}

// WithAuth makes c send token (when set) and, with tc, speak HTTPS
// verified by tc.
func (c *Client) WithAuth(token string, tc *tls.Config) *Client {
	c.token = token
	if tc != nil {
		c.Base = "https://" + strings.TrimPrefix(c.Base, "http://")
		c.HTTP.Transport = &http.Transport{TLSClientConfig: tc}
	}
	return c
}
