package admin

import (
	"crypto/sha256"
	"crypto/subtle"
	"crypto/tls"
	"fmt"
	"net"
	"net/http"
	"strconv"
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

// secure wraps h so that every path except the open ones (open) needs
// "Authorization: Bearer <token>" when token is set; a GET or HEAD may
// carry the page's cookie (page.go), valid at now(), instead. A request
// without either gets 401. The comparison takes the same time wherever
// the tokens differ.
func secure(h http.Handler, token string, now func() time.Time) http.Handler {
	if token == "" {
		return h
	}
	want := sha256.Sum256([]byte(token))
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if open(r.URL.Path) || bearerOK(r, want) || (readOnly(r.Method) && cookieOK(r, token, now())) {
			h.ServeHTTP(w, r)
			return
		}
		w.Header().Set("WWW-Authenticate", `Bearer realm="fleetgate"`)
		writeError(w, http.StatusUnauthorized, errUnauthorized)
	})
}

// open reports whether path is served without a token: the probes of a
// service manager and the page's files, which tell nothing, and the
// page's login and logout, which check what they need themselves.
func open(path string) bool {
	switch path {
	case "/healthz", "/readyz", "/", "/login", "/logout":
		return true
	}
	return strings.HasPrefix(path, "/ui/")
}

func bearerOK(r *http.Request, want [sha256.Size]byte) bool {
	got, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	sum := sha256.Sum256([]byte(got))
	return ok && subtle.ConstantTimeCompare(sum[:], want[:]) == 1
}

// readOnly: the methods the page's cookie may authorise. A request that
// changes state needs the header, which a page of another site cannot
// make a browser send (no CSRF).
func readOnly(method string) bool { return method == http.MethodGet || method == http.MethodHead }

func cookieOK(r *http.Request, token string, now time.Time) bool {
	c, err := r.Cookie(cookieName)
	return err == nil && pageCookieValid(c.Value, token, now)
}

// checkHost wraps h so that a request is answered only when its Host
// names a loopback address (localhost, 127.0.0.1, [::1], any other
// loopback IP) and, when it has one, the listener's port: a loopback
// listener is reachable from a web page on this host through a name
// whose DNS answer changes to 127.0.0.1 (DNS rebinding), and that
// page's requests carry its own name. Others get 421.
func checkHost(h http.Handler, port string) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !loopbackHost(r.Host, port) {
			writeError(w, http.StatusMisdirectedRequest, fmt.Errorf("host %.100q: this admin API listens on loopback and answers only localhost:%s, 127.0.0.1:%s or [::1]:%s", r.Host, port, port, port))
			return
		}
		h.ServeHTTP(w, r)
	})
}

// loopbackHost reports whether host, the Host of a request, names a
// loopback address with port (or no port); "" (an HTTP/1.0 request
// without Host, which no browser sends) is accepted.
func loopbackHost(host, port string) bool {
	if host == "" {
		return true
	}
	name, p, err := net.SplitHostPort(host)
	if err != nil {
		name, p = strings.TrimSuffix(strings.TrimPrefix(host, "["), "]"), ""
	}
	if p != "" && p != port {
		return false
	}
	name = strings.TrimSuffix(strings.ToLower(name), ".")
	if name == "localhost" {
		return true
	}
	ip := net.ParseIP(name)
	return ip != nil && ip.IsLoopback()
}

type adminError string

func (e adminError) Error() string { return string(e) }

const errUnauthorized = adminError("a bearer token is required (listen.admin.token_file)")

// newHTTPServer is the admin http.Server with its timeouts, serving h
// with the token of o and, when addr (the bound address) is loopback,
// the Host check.
func newHTTPServer(h http.Handler, o Options, addr net.Addr) *http.Server {
	h = secure(h, o.Token, o.now)
	if tcp, ok := addr.(*net.TCPAddr); ok && tcp.IP.IsLoopback() {
		h = checkHost(h, strconv.Itoa(tcp.Port))
	}
	return &http.Server{
		Handler:           h,
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
