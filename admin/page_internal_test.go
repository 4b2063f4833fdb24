package admin

import (
	"strings"
	"testing"
	"time"
)

// A page cookie is good for its token until its expiry, and for nothing
// else: another token, a changed expiry or MAC, or any malformed value
// is refused.
func TestPageCookieValid(t *testing.T) {
	const token = "0123456789abcdef-token"
	t0 := time.Unix(1_893_456_000, 0)
	v := pageCookie(token, t0.Add(cookieLife))
	if !pageCookieValid(v, token, t0) || !pageCookieValid(v, token, t0.Add(cookieLife-time.Second)) {
		t.Fatalf("cookie %q refused before its expiry", v)
	}
	exp, mac, _ := strings.Cut(v, ".")
	for name, c := range map[string]struct {
		v, token string
		at       time.Time
	}{
		"at its expiry":      {v, token, t0.Add(cookieLife)},
		"after its expiry":   {v, token, t0.Add(48 * time.Hour)},
		"another token":      {v, token + "x", t0},
		"a later expiry":     {"9" + v, token, t0},
		"a changed MAC":      {exp + "." + strings.Repeat("A", len(mac)), token, t0},
		"no MAC":             {exp + ".", token, t0},
		"no dot":             {exp, token, t0},
		"empty":              {"", token, t0},
		"a signed expiry":    {"+" + v, token, t0},
		"a negative expiry":  {"-" + v, token, t0},
		"an expiry too long": {strings.Repeat("9", 20) + "." + mac, token, t0},
		"the token itself":   {token, token, t0},
	} {
		if pageCookieValid(c.v, c.token, c.at) {
			t.Errorf("%s: cookie %q accepted", name, c.v)
		}
	}
}

// The parser of a cookie value, which comes from any client, never
// panics and accepts only what pageCookie makes: an expiry of digits and
// a MAC of the right size.
func FuzzParsePageCookie(f *testing.F) {
	for _, s := range []string{pageCookie("0123456789abcdef-token", time.Unix(1_893_499_200, 0)), "", ".", "1.", "x.y", "1893499200.!!!"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, v string) {
		exp, mac, err := parsePageCookie(v)
		if err != nil {
			return
		}
		if exp < 0 || len(mac) != 32 {
			t.Fatalf("%q: accepted expiry %d, MAC of %d bytes", v, exp, len(mac))
		}
		if pageCookieValid(v, "some-other-token-0123", time.Unix(0, 0)) && v != pageCookie("some-other-token-0123", time.Unix(exp, 0)) {
			t.Fatalf("%q: accepted without being minted", v)
		}
	})
}
