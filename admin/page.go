package admin

import (
	"crypto/hmac"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"errors"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// The page's login (docs/design.md §6.11): POST /login with the admin
// token in a form sets a cookie that GET requests may carry instead of
// the Authorization header. The cookie holds no token: it is an expiry
// and an HMAC of it keyed by the token, so it opens the API for reading
// only, for cookieLife, and stops working when the token changes.
const (
	cookieName = "fleetgate_admin"
	cookieLife = 12 * time.Hour
	// maxLoginBody bounds the form of POST /login.
	maxLoginBody = 4 << 10
)

// pageCookie is the value of the page's cookie for token, valid until
// expires (whole seconds).
func pageCookie(token string, expires time.Time) string {
	exp := strconv.FormatInt(expires.Unix(), 10)
	return exp + "." + base64.RawURLEncoding.EncodeToString(cookieMAC(token, exp))
}

func cookieMAC(token, exp string) []byte {
	m := hmac.New(sha256.New, []byte(token))
	m.Write([]byte("fleetgate admin page " + exp))
	return m.Sum(nil)
}

var errBadCookie = errors.New("malformed page cookie")

// parsePageCookie splits a cookie value into its expiry (Unix seconds)
// and its MAC.
func parsePageCookie(v string) (exp int64, mac []byte, err error) {
	e, m, ok := strings.Cut(v, ".")
	if !ok || e == "" || len(e) > 19 || strings.TrimLeft(e, "0123456789") != "" {
		return 0, nil, errBadCookie
	}
	exp, err = strconv.ParseInt(e, 10, 64)
	if err != nil {
		return 0, nil, errBadCookie
	}
	mac, err = base64.RawURLEncoding.DecodeString(m)
	if err != nil || len(mac) != sha256.Size {
		return 0, nil, errBadCookie
	}
	return exp, mac, nil
}

// pageCookieValid reports whether v is a cookie minted for token that has
// not expired at now.
func pageCookieValid(v, token string, now time.Time) bool {
	exp, mac, err := parsePageCookie(v)
	if err != nil || now.Unix() >= exp {
		return false
	}
	return hmac.Equal(mac, cookieMAC(token, strconv.FormatInt(exp, 10)))
}

// loginResult is the body of a successful POST /login.
type loginResult struct {
	// Expires is when the cookie stops working; omitted when the API has
	// no token (then no cookie is needed, and none is set).
	Expires *time.Time `json:"expires,omitempty"`
}

// login checks the form's token and sets the page's cookie: HttpOnly,
// SameSite=Strict, Secure when served over TLS.
func (s *Server) login(w http.ResponseWriter, r *http.Request) {
	r.Body = http.MaxBytesReader(w, r.Body, maxLoginBody)
	if err := r.ParseForm(); err != nil {
		writeError(w, http.StatusBadRequest, errors.New("login: want a form (application/x-www-form-urlencoded) with the field token"))
		return
	}
	if s.o.Token == "" {
		writeJSON(w, http.StatusOK, loginResult{})
		return
	}
	got, want := sha256.Sum256([]byte(r.PostForm.Get("token"))), sha256.Sum256([]byte(s.o.Token))
	if subtle.ConstantTimeCompare(got[:], want[:]) != 1 {
		writeError(w, http.StatusUnauthorized, errors.New("wrong token"))
		return
	}
	exp := s.o.now().Add(cookieLife).Truncate(time.Second)
	http.SetCookie(w, &http.Cookie{
		Name: cookieName, Value: pageCookie(s.o.Token, exp), Path: "/",
		MaxAge: int(cookieLife / time.Second), HttpOnly: true, Secure: r.TLS != nil, SameSite: http.SameSiteStrictMode,
	})
	writeJSON(w, http.StatusOK, loginResult{Expires: &exp})
}

// logout clears the page's cookie.
func (s *Server) logout(w http.ResponseWriter, r *http.Request) {
	http.SetCookie(w, &http.Cookie{
		Name: cookieName, Value: "", Path: "/",
		MaxAge: -1, HttpOnly: true, Secure: r.TLS != nil, SameSite: http.SameSiteStrictMode,
	})
	writeJSON(w, http.StatusOK, loginResult{})
}

// now is the clock of the page's cookies.
func (o Options) now() time.Time {
	if o.Now != nil {
		return o.Now()
	}
	return time.Now()
}
