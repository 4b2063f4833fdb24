package coap

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/plgd-dev/go-coap/v3/message/codes"

	"github.com/fleetgate/fleetgate/gateway"
)

func TestParseHeartbeat(t *testing.T) {
	cases := []struct {
		name      string
		method    codes.Code
		path      string
		queries   []string
		identity  string
		allowAnon bool
		want      heartbeat
		code      codes.Code // 0: accepted
	}{
		{name: "anonymous renew", method: codes.POST, path: "/hb", queries: []string{"d=a"}, allowAnon: true,
			want: heartbeat{device: "a", session: "coap/default", kind: gateway.Renew}},
		{name: "anonymous leave with instance", method: codes.DELETE, path: "/hb", queries: []string{"s=r2", "d=a"}, allowAnon: true,
			want: heartbeat{device: "a", session: "coap/r2", kind: gateway.Leave}},
		{name: "equals sign in device", method: codes.POST, path: "/hb", queries: []string{"d=a=b"}, allowAnon: true,
			code: codes.BadRequest},
		{name: "anonymous off", method: codes.POST, path: "/hb", queries: []string{"d=a"}, code: codes.Unauthorized},
		{name: "anonymous off, nothing given", method: codes.POST, path: "/hb", code: codes.Unauthorized},
		{name: "identity", method: codes.POST, path: "/hb", identity: "psk-dev",
			want: heartbeat{device: "psk-dev", session: "coap/default", kind: gateway.Renew}},
		{name: "identity wins over anonymous", method: codes.POST, path: "/hb", identity: "psk-dev", allowAnon: true,
			want: heartbeat{device: "psk-dev", session: "coap/default", kind: gateway.Renew}},
		{name: "identity repeated in d=", method: codes.DELETE, path: "/hb", queries: []string{"d=psk-dev", "s=x"}, identity: "psk-dev",
			want: heartbeat{device: "psk-dev", session: "coap/x", kind: gateway.Leave}},
		{name: "identity contradicted by d=", method: codes.POST, path: "/hb", queries: []string{"d=other"}, identity: "psk-dev",
			code: codes.Forbidden},
		{name: "bad identity", method: codes.POST, path: "/hb", identity: "psk dev", code: codes.BadRequest},
		{name: "path checked first", method: codes.GET, path: "/x", code: codes.NotFound},
		{name: "method checked before auth", method: codes.FETCH, path: "/hb", code: codes.MethodNotAllowed},
		{name: "no path", method: codes.POST, path: "", queries: []string{"d=a"}, allowAnon: true, code: codes.NotFound},
		{name: "instance too long", method: codes.POST, path: "/hb",
			queries: []string{"d=a", "s=" + strings.Repeat("i", 129)}, allowAnon: true, code: codes.BadRequest},
		{name: "instance twice", method: codes.POST, path: "/hb", queries: []string{"d=a", "s=1", "s=1"}, allowAnon: true,
			code: codes.BadRequest},
		{name: "key without value", method: codes.POST, path: "/hb", queries: []string{"d"}, allowAnon: true, code: codes.BadRequest},
		{name: "lease asked", method: codes.POST, path: "/hb", queries: []string{"d=a", "l=3600"}, allowAnon: true,
			want: heartbeat{device: "a", session: "coap/default", kind: gateway.Renew, lease: time.Hour}},
		{name: "lease of one second", method: codes.POST, path: "/hb", queries: []string{"l=1", "d=a"}, allowAnon: true,
			want: heartbeat{device: "a", session: "coap/default", kind: gateway.Renew, lease: time.Second}},
		{name: "lease on a leave is ignored", method: codes.DELETE, path: "/hb", queries: []string{"d=a", "l=3600"}, allowAnon: true,
			want: heartbeat{device: "a", session: "coap/default", kind: gateway.Leave}},
		{name: "lease largest", method: codes.POST, path: "/hb", queries: []string{"d=a", "l=999999999"}, allowAnon: true,
			want: heartbeat{device: "a", session: "coap/default", kind: gateway.Renew, lease: 999999999 * time.Second}},
		{name: "lease too many digits", method: codes.POST, path: "/hb", queries: []string{"d=a", "l=0000000001"}, allowAnon: true,
			code: codes.BadRequest},
		{name: "lease zero", method: codes.POST, path: "/hb", queries: []string{"d=a", "l=0"}, allowAnon: true, code: codes.BadRequest},
		{name: "lease empty", method: codes.POST, path: "/hb", queries: []string{"d=a", "l="}, allowAnon: true, code: codes.BadRequest},
		{name: "lease negative", method: codes.POST, path: "/hb", queries: []string{"d=a", "l=-5"}, allowAnon: true, code: codes.BadRequest},
		{name: "lease with unit", method: codes.POST, path: "/hb", queries: []string{"d=a", "l=60s"}, allowAnon: true, code: codes.BadRequest},
		{name: "lease with sign", method: codes.POST, path: "/hb", queries: []string{"d=a", "l=+60"}, allowAnon: true, code: codes.BadRequest},
		{name: "lease twice", method: codes.POST, path: "/hb", queries: []string{"d=a", "l=60", "l=60"}, allowAnon: true,
			code: codes.BadRequest},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, err := parseHeartbeat(tc.method, tc.path, tc.queries, tc.identity, tc.allowAnon)
			if tc.code == 0 {
				if err != nil || got != tc.want {
					t.Fatalf("got %+v, %v; want %+v", got, err, tc.want)
				}
				return
			}
			if err == nil {
				t.Fatalf("accepted as %+v, want %v", got, tc.code)
			}
			if code, diag := errorResponse(err); code != tc.code || diag == "" {
				t.Fatalf("refused with %v %q (%v), want %v", code, diag, err, tc.code)
			}
		})
	}
}

func TestErrorResponse(t *testing.T) {
	cases := []struct {
		err  error
		code codes.Code
	}{
		{fmt.Errorf("observe: %w", gateway.ErrOverloaded), codes.ServiceUnavailable},
		{fmt.Errorf("observe: %w", gateway.ErrInvalidDeviceID), codes.BadRequest},
		{fmt.Errorf("observe: %w", gateway.ErrInvalidSessionID), codes.BadRequest},
		{fmt.Errorf("observe: %w", refuse(codes.Forbidden, "no")), codes.Forbidden},
		{errors.New("boom"), codes.InternalServerError},
	}
	for _, tc := range cases {
		if code, diag := errorResponse(tc.err); code != tc.code || diag == "" {
			t.Errorf("%v: %v %q, want %v", tc.err, code, diag, tc.code)
		}
	}
	long := fmt.Errorf("%w: %s", gateway.ErrInvalidDeviceID, strings.Repeat("é", 100))
	if _, diag := errorResponse(long); len(diag) > maxDiagnosticLen || !utf8.ValidString(diag) {
		t.Fatalf("diagnostic of %d bytes, valid UTF-8 %v", len(diag), utf8.ValidString(diag))
	}
}

// FuzzParseHeartbeat checks that any request either becomes well-formed
// evidence or a refusal with a 4.xx code and a short UTF-8 diagnostic.
// Queries are joined by '&' in the fuzz input.
func FuzzParseHeartbeat(f *testing.F) {
	f.Add(uint8(codes.POST), "/hb", "d=dev-1", "", true)
	f.Add(uint8(codes.DELETE), "/hb", "d=dev-1&s=radio2", "", true)
	f.Add(uint8(codes.POST), "/hb", "d=bad id", "", true)
	f.Add(uint8(codes.POST), "/hb", "", "psk-dev", false)
	f.Add(uint8(codes.GET), "/hb/x", "s=", "", true)
	f.Add(uint8(codes.POST), "/hb", "d=dev-1&l=3600", "", true)
	f.Add(uint8(codes.DELETE), "/hb", "l=60&d=dev-1", "", true)
	f.Add(uint8(codes.POST), "/hb", "d=dev-1&l=0", "", true)
	f.Add(uint8(codes.POST), "/hb", "l=4294967296", "psk-dev", false)
	f.Add(uint8(codes.POST), "/hb", "d=dev-1&l=1&l=2", "", true)
	f.Fuzz(func(t *testing.T, method uint8, path, query, identity string, allowAnon bool) {
		var queries []string
		if query != "" {
			queries = strings.Split(query, "&")
		}
		hb, err := parseHeartbeat(codes.Code(method), path, queries, identity, allowAnon)
		again, err2 := parseHeartbeat(codes.Code(method), path, queries, identity, allowAnon)
		if hb != again || (err == nil) != (err2 == nil) {
			t.Fatalf("not deterministic: %+v %v, then %+v %v", hb, err, again, err2)
		}
		if err != nil {
			if hb != (heartbeat{}) {
				t.Fatalf("refusal %v came with %+v", err, hb)
			}
			code, diag := errorResponse(err)
			switch code {
			case codes.BadRequest, codes.Unauthorized, codes.Forbidden, codes.NotFound, codes.MethodNotAllowed:
			default:
				t.Fatalf("refused with %v (%v)", code, err)
			}
			if diag == "" || len(diag) > maxDiagnosticLen || !utf8.ValidString(diag) {
				t.Fatalf("diagnostic %q", diag)
			}
			return
		}
		if path != HeartbeatPath {
			t.Fatalf("accepted path %q", path)
		}
		switch {
		case codes.Code(method) == codes.POST && hb.kind == gateway.Renew:
		case codes.Code(method) == codes.DELETE && hb.kind == gateway.Leave:
		default:
			t.Fatalf("method %v became %v", codes.Code(method), hb.kind)
		}
		if _, err := gateway.ParseDeviceID(string(hb.device)); err != nil {
			t.Fatalf("accepted device %q: %v", hb.device, err)
		}
		if _, err := gateway.ParseSessionID(string(hb.session)); err != nil || !strings.HasPrefix(string(hb.session), "coap/") {
			t.Fatalf("accepted session %q: %v", hb.session, err)
		}
		if hb.lease < 0 || hb.lease%time.Second != 0 || hb.lease > 999999999*time.Second || (hb.lease != 0 && hb.kind != gateway.Renew) {
			t.Fatalf("accepted lease %v of a %v", hb.lease, hb.kind)
		}
		if hb.lease != 0 && !strings.Contains("&"+query+"&", fmt.Sprintf("&l=%d&", hb.lease/time.Second)) {
			t.Fatalf("lease %v is not the l= of %q", hb.lease, query)
		}
		if identity != "" {
			if string(hb.device) != identity {
				t.Fatalf("identity %q became device %q", identity, hb.device)
			}
			return
		}
		if !allowAnon {
			t.Fatalf("anonymous device %q accepted with anonymous devices off", hb.device)
		}
		if !strings.Contains("&"+query+"&", "&d="+string(hb.device)+"&") {
			t.Fatalf("device %q is not the d= of %q", hb.device, query)
		}
	})
}
