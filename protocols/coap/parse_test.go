package coap

import (
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/plgd-dev/go-coap/v3/message/codes"

	"github.com/fleetgate/fleetgate/gateway"
)

// segments splits a path written "/a/b" into its Uri-Path options; ""
// is none.
func segments(path string) []string {
	if path == "" {
		return nil
	}
	return strings.Split(strings.TrimPrefix(path, "/"), "/")
}

func TestParseRequest(t *testing.T) {
	cases := []struct {
		name      string
		method    codes.Code
		path      string // Uri-Path options joined by "/" after a leading "/"
		queries   []string
		identity  string
		allowAnon bool
		up, down  bool // DataSink, Commands
		want      intent
		code      codes.Code // 0: accepted
	}{
		{name: "anonymous renew", method: codes.POST, path: "/hb", queries: []string{"d=a"}, allowAnon: true,
			want: intent{device: "a", session: "coap/default", kind: gateway.Renew}},
		{name: "anonymous leave with instance", method: codes.DELETE, path: "/hb", queries: []string{"s=r2", "d=a"}, allowAnon: true,
			want: intent{device: "a", session: "coap/r2", kind: gateway.Leave}},
		{name: "equals sign in device", method: codes.POST, path: "/hb", queries: []string{"d=a=b"}, allowAnon: true,
			code: codes.BadRequest},
		{name: "anonymous off", method: codes.POST, path: "/hb", queries: []string{"d=a"}, code: codes.Unauthorized},
		{name: "anonymous off, nothing given", method: codes.POST, path: "/hb", code: codes.Unauthorized},
		{name: "identity", method: codes.POST, path: "/hb", identity: "psk-dev",
			want: intent{device: "psk-dev", session: "coap/default", kind: gateway.Renew}},
		{name: "identity wins over anonymous", method: codes.POST, path: "/hb", identity: "psk-dev", allowAnon: true,
			want: intent{device: "psk-dev", session: "coap/default", kind: gateway.Renew}},
		{name: "identity repeated in d=", method: codes.DELETE, path: "/hb", queries: []string{"d=psk-dev", "s=x"}, identity: "psk-dev",
			want: intent{device: "psk-dev", session: "coap/x", kind: gateway.Leave}},
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
			want: intent{device: "a", session: "coap/default", kind: gateway.Renew, lease: time.Hour}},
		{name: "lease of one second", method: codes.POST, path: "/hb", queries: []string{"l=1", "d=a"}, allowAnon: true,
			want: intent{device: "a", session: "coap/default", kind: gateway.Renew, lease: time.Second}},
		{name: "lease on a leave is ignored", method: codes.DELETE, path: "/hb", queries: []string{"d=a", "l=3600"}, allowAnon: true,
			want: intent{device: "a", session: "coap/default", kind: gateway.Leave}},
		{name: "lease largest", method: codes.POST, path: "/hb", queries: []string{"d=a", "l=999999999"}, allowAnon: true,
			want: intent{device: "a", session: "coap/default", kind: gateway.Renew, lease: 999999999 * time.Second}},
		{name: "lease too many digits", method: codes.POST, path: "/hb", queries: []string{"d=a", "l=0000000001"}, allowAnon: true,
			code: codes.BadRequest},
		{name: "lease zero", method: codes.POST, path: "/hb", queries: []string{"d=a", "l=0"}, allowAnon: true, code: codes.BadRequest},
		{name: "lease empty", method: codes.POST, path: "/hb", queries: []string{"d=a", "l="}, allowAnon: true, code: codes.BadRequest},
		{name: "lease negative", method: codes.POST, path: "/hb", queries: []string{"d=a", "l=-5"}, allowAnon: true, code: codes.BadRequest},
		{name: "lease with unit", method: codes.POST, path: "/hb", queries: []string{"d=a", "l=60s"}, allowAnon: true, code: codes.BadRequest},
		{name: "lease with sign", method: codes.POST, path: "/hb", queries: []string{"d=a", "l=+60"}, allowAnon: true, code: codes.BadRequest},
		{name: "lease twice", method: codes.POST, path: "/hb", queries: []string{"d=a", "l=60", "l=60"}, allowAnon: true,
			code: codes.BadRequest},

		// The data path.
		{name: "no /d without a sink", method: codes.POST, path: "/d/t", queries: []string{"d=a"}, allowAnon: true, down: true,
			code: codes.NotFound},
		{name: "data to the root", method: codes.POST, path: "/d", queries: []string{"d=a"}, allowAnon: true, up: true,
			want: intent{device: "a", session: "coap/default", kind: gateway.Renew, data: true}},
		{name: "data with levels", method: codes.POST, path: "/d/telemetry/temp", queries: []string{"d=a", "s=r", "l=60"}, allowAnon: true, up: true,
			want: intent{device: "a", session: "coap/r", kind: gateway.Renew, lease: time.Minute, data: true, topic: "telemetry/temp"}},
		{name: "data under DTLS", method: codes.POST, path: "/d/x", identity: "psk-dev", up: true,
			want: intent{device: "psk-dev", session: "coap/default", kind: gateway.Renew, data: true, topic: "x"}},
		{name: "data of another device under DTLS", method: codes.POST, path: "/d/x", queries: []string{"d=b"}, identity: "psk-dev", up: true,
			code: codes.Forbidden},
		{name: "data anonymous off", method: codes.POST, path: "/d/x", queries: []string{"d=a"}, up: true, code: codes.Unauthorized},
		{name: "data DELETE", method: codes.DELETE, path: "/d/x", queries: []string{"d=a"}, allowAnon: true, up: true, code: codes.MethodNotAllowed},
		{name: "data GET", method: codes.GET, path: "/d", queries: []string{"d=a"}, allowAnon: true, up: true, code: codes.MethodNotAllowed},
		{name: "data empty level", method: codes.POST, path: "/d/a//b", queries: []string{"d=a"}, allowAnon: true, up: true, code: codes.BadRequest},
		{name: "data trailing empty level", method: codes.POST, path: "/d/a/", queries: []string{"d=a"}, allowAnon: true, up: true, code: codes.BadRequest},
		{name: "data plus", method: codes.POST, path: "/d/a/+", queries: []string{"d=a"}, allowAnon: true, up: true, code: codes.BadRequest},
		{name: "data hash", method: codes.POST, path: "/d/#", queries: []string{"d=a"}, allowAnon: true, up: true, code: codes.BadRequest},
		{name: "data NUL", method: codes.POST, path: "/d/a\x00b", queries: []string{"d=a"}, allowAnon: true, up: true, code: codes.BadRequest},
		{name: "data dollar", method: codes.POST, path: "/d/$SYS", queries: []string{"d=a"}, allowAnon: true, up: true, code: codes.BadRequest},
		{name: "data dollar below the first level", method: codes.POST, path: "/d/a/$b", queries: []string{"d=a"}, allowAnon: true, up: true,
			want: intent{device: "a", session: "coap/default", kind: gateway.Renew, data: true, topic: "a/$b"}},
		{name: "data topic too long", method: codes.POST, path: "/d/" + strings.Repeat("t/", 512) + "t", queries: []string{"d=a"}, allowAnon: true, up: true,
			code: codes.BadRequest},
		{name: "data topic longest", method: codes.POST, path: "/d/" + strings.Repeat("t/", 511) + "tt", queries: []string{"d=a"}, allowAnon: true, up: true,
			want: intent{device: "a", session: "coap/default", kind: gateway.Renew, data: true, topic: strings.Repeat("t/", 511) + "tt"}},
		{name: "hb is not a topic", method: codes.POST, path: "/hb/x", queries: []string{"d=a"}, allowAnon: true, up: true, code: codes.NotFound},
		{name: "d is not a device's resource", method: codes.POST, path: "/dd", queries: []string{"d=a"}, allowAnon: true, up: true, code: codes.NotFound},

		// Acknowledgements.
		{name: "ack on a heartbeat", method: codes.POST, path: "/hb", queries: []string{"d=a", "a=17"}, allowAnon: true, down: true,
			want: intent{device: "a", session: "coap/default", kind: gateway.Renew, ack: 17}},
		{name: "ack on a leave", method: codes.DELETE, path: "/hb", queries: []string{"a=1", "d=a"}, allowAnon: true, down: true,
			want: intent{device: "a", session: "coap/default", kind: gateway.Leave, ack: 1}},
		{name: "ack on data", method: codes.POST, path: "/d/t", queries: []string{"d=a", "a=18446744073709551615"}, allowAnon: true, up: true, down: true,
			want: intent{device: "a", session: "coap/default", kind: gateway.Renew, data: true, topic: "t", ack: 1<<64 - 1}},
		{name: "ack ignored without commands", method: codes.POST, path: "/hb", queries: []string{"d=a", "a=x"}, allowAnon: true, up: true,
			want: intent{device: "a", session: "coap/default", kind: gateway.Renew}},
		{name: "ack overflow", method: codes.POST, path: "/hb", queries: []string{"d=a", "a=18446744073709551616"}, allowAnon: true, down: true,
			code: codes.BadRequest},
		{name: "ack zero", method: codes.POST, path: "/hb", queries: []string{"d=a", "a=0"}, allowAnon: true, down: true, code: codes.BadRequest},
		{name: "ack empty", method: codes.POST, path: "/hb", queries: []string{"d=a", "a="}, allowAnon: true, down: true, code: codes.BadRequest},
		{name: "ack signed", method: codes.POST, path: "/hb", queries: []string{"d=a", "a=+5"}, allowAnon: true, down: true, code: codes.BadRequest},
		{name: "ack not a number", method: codes.POST, path: "/hb", queries: []string{"d=a", "a=c17"}, allowAnon: true, down: true, code: codes.BadRequest},
		{name: "ack twice", method: codes.POST, path: "/hb", queries: []string{"d=a", "a=1", "a=2"}, allowAnon: true, down: true, code: codes.BadRequest},
		{name: "ack too many digits", method: codes.POST, path: "/hb", queries: []string{"d=a", "a=000000000000000000001"}, allowAnon: true, down: true,
			code: codes.BadRequest},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, err := parseRequest(tc.method, segments(tc.path), tc.queries, tc.identity, tc.allowAnon, tc.up, tc.down)
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

// FuzzParseRequest checks that any request either becomes well-formed
// evidence (and, on the data path, a valid topic or acknowledgement) or a
// refusal with a 4.xx code and a short UTF-8 diagnostic. Uri-Path options
// are joined by '/' after a leading '/' and queries by '&' in the fuzz
// input; data turns on the DataSink and the Commands.
func FuzzParseRequest(f *testing.F) {
	f.Add(uint8(codes.POST), "/hb", "d=dev-1", "", true, false)
	f.Add(uint8(codes.DELETE), "/hb", "d=dev-1&s=radio2", "", true, false)
	f.Add(uint8(codes.POST), "/hb", "d=bad id", "", true, false)
	f.Add(uint8(codes.POST), "/hb", "", "psk-dev", false, false)
	f.Add(uint8(codes.GET), "/hb/x", "s=", "", true, false)
	f.Add(uint8(codes.POST), "/hb", "d=dev-1&l=3600", "", true, false)
	f.Add(uint8(codes.DELETE), "/hb", "l=60&d=dev-1", "", true, false)
	f.Add(uint8(codes.POST), "/hb", "d=dev-1&l=0", "", true, false)
	f.Add(uint8(codes.POST), "/hb", "l=4294967296", "psk-dev", false, false)
	f.Add(uint8(codes.POST), "/hb", "d=dev-1&l=1&l=2", "", true, false)
	f.Add(uint8(codes.POST), "/d/telemetry/temp", "d=dev-1&a=42", "", true, true)
	f.Add(uint8(codes.POST), "/d", "a=18446744073709551616", "psk-dev", false, true)
	f.Add(uint8(codes.POST), "/d/a//b/+/#", "d=dev-1", "", true, true)
	f.Add(uint8(codes.DELETE), "/hb", "d=dev-1&a=1&a=1", "", true, true)
	f.Fuzz(func(t *testing.T, method uint8, path, query, identity string, allowAnon, data bool) {
		var queries []string
		if query != "" {
			queries = strings.Split(query, "&")
		}
		segs := segments(path)
		rq, err := parseRequest(codes.Code(method), segs, queries, identity, allowAnon, data, data)
		again, err2 := parseRequest(codes.Code(method), segs, queries, identity, allowAnon, data, data)
		if rq != again || (err == nil) != (err2 == nil) {
			t.Fatalf("not deterministic: %+v %v, then %+v %v", rq, err, again, err2)
		}
		if err != nil {
			if rq != (intent{}) {
				t.Fatalf("refusal %v came with %+v", err, rq)
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
		switch {
		case len(segs) == 1 && segs[0] == "hb" && !rq.data:
		case data && len(segs) >= 1 && segs[0] == "d" && rq.data && codes.Code(method) == codes.POST:
			if rq.topic != strings.Join(segs[1:], "/") || !gateway.ValidTopicRest(rq.topic) {
				t.Fatalf("path %q became topic %q", path, rq.topic)
			}
		default:
			t.Fatalf("accepted path %q as %+v", path, rq)
		}
		switch {
		case codes.Code(method) == codes.POST && rq.kind == gateway.Renew:
		case codes.Code(method) == codes.DELETE && rq.kind == gateway.Leave:
		default:
			t.Fatalf("method %v became %v", codes.Code(method), rq.kind)
		}
		if _, err := gateway.ParseDeviceID(string(rq.device)); err != nil {
			t.Fatalf("accepted device %q: %v", rq.device, err)
		}
		if _, err := gateway.ParseSessionID(string(rq.session)); err != nil || !strings.HasPrefix(string(rq.session), "coap/") {
			t.Fatalf("accepted session %q: %v", rq.session, err)
		}
		if rq.lease < 0 || rq.lease%time.Second != 0 || rq.lease > 999999999*time.Second || (rq.lease != 0 && rq.kind != gateway.Renew) {
			t.Fatalf("accepted lease %v of a %v", rq.lease, rq.kind)
		}
		// The number of the query key=, as written (leading zeros too).
		given := func(key string, want uint64) bool {
			return slices.ContainsFunc(queries, func(q string) bool {
				v, found := strings.CutPrefix(q, key+"=")
				n, err := strconv.ParseUint(v, 10, 64)
				return found && err == nil && n == want
			})
		}
		if rq.lease != 0 && !given("l", uint64(rq.lease/time.Second)) {
			t.Fatalf("lease %v is not the l= of %q", rq.lease, query)
		}
		if rq.ack != 0 && (!data || !given("a", rq.ack)) {
			t.Fatalf("acknowledgement %d is not the a= of %q (data path %v)", rq.ack, query, data)
		}
		if identity != "" {
			if string(rq.device) != identity {
				t.Fatalf("identity %q became device %q", identity, rq.device)
			}
			return
		}
		if !allowAnon {
			t.Fatalf("anonymous device %q accepted with anonymous devices off", rq.device)
		}
		if !strings.Contains("&"+query+"&", "&d="+string(rq.device)+"&") {
			t.Fatalf("device %q is not the d= of %q", rq.device, query)
		}
	})
}

// A Uri-Path option is one topic level: one that holds a "/" is refused,
// not split.
func TestParseRequestSlashInOneOption(t *testing.T) {
	_, err := parseRequest(codes.POST, []string{"d", "a/b"}, []string{"d=a"}, "", true, true, false)
	if code, diag := errorResponse(err); code != codes.BadRequest || !strings.Contains(diag, "level 1") {
		t.Fatalf("one Uri-Path option a/b: %v %q (%v), want 4.00", code, diag, err)
	}
}
