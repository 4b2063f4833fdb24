package admin_test

import (
	"crypto/tls"
	"io"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fleetgate/fleetgate/admin"
	"github.com/fleetgate/fleetgate/admin/ui"
)

// pageClient does requests against the admin server at base, with the
// given cookie when not nil.
type pageClient struct {
	t    *testing.T
	base string
	hc   *http.Client
}

func (c pageClient) do(method, path string, body url.Values, cookie *http.Cookie) *http.Response {
	c.t.Helper()
	var r io.Reader
	if body != nil {
		r = strings.NewReader(body.Encode())
	}
	req, err := http.NewRequest(method, c.base+path, r)
	if err != nil {
		c.t.Fatal(err)
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	}
	if cookie != nil {
		req.AddCookie(cookie)
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		c.t.Fatalf("%s %s: %v", method, path, err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp
}

// loginCookie is the page cookie a response set, nil for none.
func loginCookie(resp *http.Response) *http.Cookie {
	for _, c := range resp.Cookies() {
		if c.Name == "fleetgate_admin" {
			return c
		}
	}
	return nil
}

// The page and its files are served, to anyone (they hold no data), with
// the strict Content-Security-Policy; a name the page does not have is 404.
func TestPageServed(t *testing.T) {
	srv := serveSecure(t, "0123456789abcdef-token", nil)
	c := pageClient{t, "http://" + srv.Addr().String(), &http.Client{Timeout: 5 * time.Second}}
	for path, ctype := range map[string]string{"/": "text/html", "/ui/app.js": "text/javascript", "/ui/style.css": "text/css", "/ui/favicon.svg": "image/svg+xml"} {
		resp := c.do(http.MethodGet, path, nil, nil)
		if resp.StatusCode != http.StatusOK || !strings.HasPrefix(resp.Header.Get("Content-Type"), ctype) {
			t.Errorf("GET %s: %d %s, want 200 %s", path, resp.StatusCode, resp.Header.Get("Content-Type"), ctype)
		}
		if got := resp.Header.Get("Content-Security-Policy"); got != ui.CSP {
			t.Errorf("GET %s: CSP %q", path, got)
		}
		if resp.Header.Get("X-Content-Type-Options") != "nosniff" {
			t.Errorf("GET %s: no nosniff", path)
		}
	}
	for path, want := range map[string]int{"/ui/index.html": 404, "/ui/nothing.js": 404, "/ui/": 404, "/index.html": 401, "/nothing": 401} {
		if got := c.do(http.MethodGet, path, nil, nil).StatusCode; got != want {
			t.Errorf("GET %s: %d, want %d", path, got, want)
		}
	}
}

// The login checks the token and sets a cookie (HttpOnly,
// SameSite=Strict, Secure under TLS) that opens the API to GET and HEAD
// requests until it expires, and to nothing else: a request that could
// change state needs the header. Logout clears it.
func TestPageLoginCookie(t *testing.T) {
	const token = "0123456789abcdef-token"
	var mu sync.Mutex
	at := time.Unix(1_893_456_000, 0)
	now := func() time.Time { mu.Lock(); defer mu.Unlock(); return at }
	for _, useTLS := range []bool{false, true} {
		var srvTLS, cliTLS *tls.Config
		scheme := "http://"
		if useTLS {
			srvTLS, cliTLS = selfSigned(t)
			scheme = "https://"
		}
		srv := serveAdminWith(t, admin.Options{Token: token, TLS: srvTLS, Now: now})
		c := pageClient{t, scheme + srv.Addr().String(), &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: cliTLS}}}

		if resp := c.do(http.MethodGet, "/v1/status", nil, nil); resp.StatusCode != http.StatusUnauthorized {
			t.Fatalf("status before login: %d", resp.StatusCode)
		}
		for _, bad := range []url.Values{{"token": {"wrong-token-0123456789"}}, {"token": {""}}, {}, {"token": {token + "x"}}} {
			resp := c.do(http.MethodPost, "/login", bad, nil)
			if resp.StatusCode != http.StatusUnauthorized || loginCookie(resp) != nil {
				t.Errorf("login with %v: %d, cookie %v", bad, resp.StatusCode, loginCookie(resp))
			}
		}
		resp := c.do(http.MethodPost, "/login", url.Values{"token": {token}}, nil)
		ck := loginCookie(resp)
		if resp.StatusCode != http.StatusOK || ck == nil {
			t.Fatalf("login: %d, cookie %v", resp.StatusCode, ck)
		}
		if !ck.HttpOnly || ck.SameSite != http.SameSiteStrictMode || ck.Secure != useTLS || ck.Path != "/" || ck.MaxAge != 12*3600 {
			t.Errorf("TLS %v: cookie %+v, want HttpOnly, SameSite=Strict, Secure only under TLS, Path /, 12 h", useTLS, ck)
		}
		if strings.Contains(ck.Value, token) {
			t.Errorf("the cookie holds the token: %q", ck.Value)
		}
		for _, path := range []string{"/v1/status", "/metrics"} {
			if got := c.do(http.MethodGet, path, nil, ck).StatusCode; got != http.StatusOK {
				t.Errorf("GET %s with the cookie: %d", path, got)
			}
		}
		if got := c.do(http.MethodHead, "/v1/status", nil, ck).StatusCode; got != http.StatusOK {
			t.Errorf("HEAD with the cookie: %d", got)
		}
		for _, m := range []string{http.MethodPost, http.MethodPut, http.MethodDelete, http.MethodPatch} {
			if got := c.do(m, "/v1/devices/dev-1", nil, ck).StatusCode; got != http.StatusUnauthorized {
				t.Errorf("%s with the cookie alone: %d, want 401", m, got)
			}
		}
		mu.Lock()
		at = at.Add(12 * time.Hour)
		mu.Unlock()
		if got := c.do(http.MethodGet, "/v1/status", nil, ck).StatusCode; got != http.StatusUnauthorized {
			t.Errorf("GET with an expired cookie: %d, want 401", got)
		}
		out := c.do(http.MethodPost, "/logout", nil, nil)
		if gone := loginCookie(out); out.StatusCode != http.StatusOK || gone == nil || gone.MaxAge >= 0 {
			t.Errorf("logout: %d, cookie %+v, want one that expires", out.StatusCode, gone)
		}
	}
}

// Without a token the login has nothing to check and sets no cookie.
func TestPageLoginWithoutToken(t *testing.T) {
	srv := serveSecure(t, "", nil)
	c := pageClient{t, "http://" + srv.Addr().String(), &http.Client{Timeout: 5 * time.Second}}
	resp := c.do(http.MethodPost, "/login", url.Values{"token": {"anything"}}, nil)
	if resp.StatusCode != http.StatusOK || loginCookie(resp) != nil {
		t.Fatalf("login without a token configured: %d, cookie %v", resp.StatusCode, loginCookie(resp))
	}
	if resp := c.do(http.MethodPost, "/login", nil, nil); resp.StatusCode != http.StatusOK {
		t.Fatalf("empty login: %d", resp.StatusCode)
	}
}
