package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/fleetgate/fleetgate/plugins/sdk"
)

// request is what a network server API got, checked: err says what was
// not as documented.
type request struct {
	err error
}

// apiServer is a network server API on loopback that checks each request
// against the one its documentation gives: method, path, headers and the
// JSON body. It answers status with answer.
type apiServer struct {
	srv    *httptest.Server
	got    chan request
	want   func() (path string, headers map[string]string, body string)
	status int
	answer string
}

func newAPIServer(t *testing.T, status int, answer string) *apiServer {
	s := &apiServer{got: make(chan request, 8), status: status, answer: answer}
	s.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.got <- request{err: s.check(r)}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(s.status)
		_, _ = io.WriteString(w, s.answer)
	}))
	t.Cleanup(s.srv.Close)
	return s
}

func (s *apiServer) check(r *http.Request) error {
	path, headers, body := s.want()
	if r.Method != http.MethodPost || r.URL.Path != path || r.URL.RawQuery != "" {
		return fmt.Errorf("%s %s, want POST %s", r.Method, r.URL, path)
	}
	for k, v := range headers {
		if got := r.Header.Get(k); got != v {
			return fmt.Errorf("header %s: %q, want %q", k, got, v)
		}
	}
	b, err := io.ReadAll(r.Body)
	if err != nil {
		return err
	}
	var got, want any
	if err := json.Unmarshal(b, &got); err != nil {
		return fmt.Errorf("body %q: %v", b, err)
	}
	if err := json.Unmarshal([]byte(body), &want); err != nil {
		return err
	}
	if !reflect.DeepEqual(got, want) {
		return fmt.Errorf("body %s, want %s", b, body)
	}
	return nil
}

// next waits for the next request's check.
func (s *apiServer) next(t *testing.T) error {
	t.Helper()
	select {
	case r := <-s.got:
		return r.err
	case <-time.After(5 * time.Second):
		t.Fatal("the API got no request")
	}
	return nil
}

// newChirpStack is ChirpStack's REST API (chirpstack-rest-api) expecting
// one enqueue of [1 2 3] on port 10 for 0101010101010101 with token tok.
func newChirpStack(t *testing.T) *apiServer {
	s := newAPIServer(t, http.StatusOK, `{"id":"8d6a1ba1-7e5c-4c0b-9a2f-0d7e5b2a6c11"}`)
	s.want = func() (string, map[string]string, string) {
		return "/api/devices/0101010101010101/queue",
			map[string]string{"Grpc-Metadata-Authorization": "Bearer tok", "Content-Type": "application/json"},
			`{"queueItem": {"confirmed": false, "fPort": 10, "data": "AQID"}}`
	}
	return s
}

func configured(t *testing.T, cfg map[string]any) *adapter {
	t.Helper()
	cfg["secret"] = "s"
	cfg["prefix"] = "lw-"
	raw, err := json.Marshal(cfg)
	if err != nil {
		t.Fatal(err)
	}
	a := &adapter{}
	if err := a.Configure(t.Context(), raw); err != nil {
		t.Fatal(err)
	}
	return a
}

// TestDownlinkToChirpStack: a command becomes an enqueue at ChirpStack's
// REST API as its documentation gives it (POST /api/devices/{devEui}/queue,
// Grpc-Metadata-Authorization: Bearer <token>, a queueItem with fPort and
// base64 data, or an object for the codec, confirmed, expiresAt); an
// error answer refuses the command with ChirpStack's words.
func TestDownlinkToChirpStack(t *testing.T) {
	cs := newChirpStack(t)
	a := configured(t, map[string]any{"chirpstack_api": cs.srv.URL + "/", "chirpstack_api_token": "tok"})
	if err := a.Command(t.Context(), sdk.Command{ID: 1, Device: "lw-0101010101010101", Topic: "cmd/10", Payload: []byte{1, 2, 3}}); err != nil {
		t.Fatal(err)
	}
	if err := cs.next(t); err != nil {
		t.Fatal(err)
	}

	expires := time.Date(2026, 12, 2, 1, 0, 0, 500_000_000, time.FixedZone("CET", 3600))
	cs.want = func() (string, map[string]string, string) {
		return "/api/devices/0101010101010101/queue", map[string]string{"Grpc-Metadata-Authorization": "Bearer tok"},
			`{"queueItem": {"confirmed": true, "fPort": 2, "object": {"led": "on"}, "expiresAt": "2026-12-02T00:00:00.5Z"}}`
	}
	if err := a.Command(t.Context(), sdk.Command{ID: 2, Device: "lw-0101010101010101", Topic: "cmd/2/confirmed",
		ContentType: "application/json; charset=utf-8", Payload: []byte(` {"led": "on"} `), Expires: expires}); err != nil {
		t.Fatal(err)
	}
	if err := cs.next(t); err != nil {
		t.Fatal(err)
	}

	cs.status, cs.answer = http.StatusUnauthorized, `{"code":16,"message":"not authenticated"}`
	err := a.Command(t.Context(), sdk.Command{ID: 3, Device: "lw-0101010101010101", Topic: "cmd/2/confirmed",
		ContentType: "application/json", Payload: []byte(`{"led": "on"}`), Expires: expires})
	if err == nil || !strings.Contains(err.Error(), "401 Unauthorized") || !strings.Contains(err.Error(), "not authenticated") {
		t.Fatalf("Command = %v, want ChirpStack's 401 and its message", err)
	}
	_ = cs.next(t)
}

// TestDownlinkToTheThingsStack: a command for a device heard through The
// Things Stack becomes a push to its webhook's downlink queue as the
// documentation gives it (POST /api/v3/as/applications/{app}/webhooks/
// {webhook}/devices/{device}/down/push, Authorization: Bearer <key>,
// downlinks with f_port, frm_payload or decoded_payload, priority); a
// device not heard since the start is refused, as the IDs are unknown.
func TestDownlinkToTheThingsStack(t *testing.T) {
	tts := newAPIServer(t, http.StatusOK, `{}`)
	tts.want = func() (string, map[string]string, string) {
		return "/api/v3/as/applications/app1/webhooks/wh1/devices/dev1/down/push",
			map[string]string{"Authorization": "Bearer NNSXS.KEY", "Content-Type": "application/json"},
			`{"downlinks": [{"frm_payload": "vu8=", "f_port": 15, "priority": "NORMAL"}]}`
	}
	a := configured(t, map[string]any{"tts_api": tts.srv.URL, "tts_api_key": "NNSXS.KEY", "tts_webhook_id": "wh1"})
	cmd := sdk.Command{ID: 1, Device: "lw-0004a30b001c0530", Topic: "cmd/15", Payload: []byte{0xbe, 0xef}}
	if err := a.Command(t.Context(), cmd); err == nil || !strings.Contains(err.Error(), "no uplink from lw-0004a30b001c0530 through The Things Stack") {
		t.Fatalf("Command before an uplink = %v, want a refusal: the IDs are unknown", err)
	}
	uplink(t, a, "/tts", fixture(t, "tts_uplink.json"))
	if err := a.Command(t.Context(), cmd); err != nil {
		t.Fatal(err)
	}
	if err := tts.next(t); err != nil {
		t.Fatal(err)
	}
	tts.want = func() (string, map[string]string, string) {
		return "/api/v3/as/applications/app1/webhooks/wh1/devices/dev1/down/push", map[string]string{"Authorization": "Bearer NNSXS.KEY"},
			`{"downlinks": [{"decoded_payload": {"bytes": [1, 2, 3]}, "f_port": 1, "priority": "NORMAL", "confirmed": true}]}`
	}
	if err := a.Command(t.Context(), sdk.Command{ID: 2, Device: "lw-0004a30b001c0530", Topic: "cmd/1/confirmed",
		ContentType: "application/json", Payload: []byte(`{"bytes": [1, 2, 3]}`)}); err != nil {
		t.Fatal(err)
	}
	if err := tts.next(t); err != nil {
		t.Fatal(err)
	}
}

// uplink posts body to a's handler at path and wants a 204.
func uplink(t *testing.T, a *adapter, path string, body []byte) {
	t.Helper()
	r := httptest.NewRequest("POST", path, bytes.NewReader(body))
	r.Header.Set("X-Fleetgate-Secret", "s")
	w := httptest.NewRecorder()
	a.handler(t.Context(), &recSink{}).ServeHTTP(w, r)
	if w.Code != http.StatusNoContent {
		t.Fatalf("uplink to %s: %d %s", path, w.Code, w.Body)
	}
}

// TestDownlinkRoutes: with both APIs, a device goes to the network
// server its last uplink came through, an unheard one to ChirpStack;
// commands the adapter cannot carry, or for devices not of its prefix,
// are refused before any request.
func TestDownlinkRoutes(t *testing.T) {
	cs := newChirpStack(t)
	tts := newAPIServer(t, http.StatusOK, `{}`)
	tts.want = func() (string, map[string]string, string) {
		return "/api/v3/as/applications/app1/webhooks/wh1/devices/dev1/down/push", nil,
			`{"downlinks": [{"frm_payload": "AQID", "f_port": 10, "priority": "NORMAL"}]}`
	}
	a := configured(t, map[string]any{"chirpstack_api": cs.srv.URL, "chirpstack_api_token": "tok",
		"tts_api": tts.srv.URL, "tts_api_key": "k", "tts_webhook_id": "wh1"})
	cmd := func(dev string) sdk.Command {
		return sdk.Command{Device: dev, Topic: "cmd/10", Payload: []byte{1, 2, 3}}
	}
	if err := a.Command(t.Context(), cmd("lw-0101010101010101")); err != nil {
		t.Fatal(err)
	}
	if err := cs.next(t); err != nil {
		t.Fatal(err)
	}
	uplink(t, a, "/tts", fixture(t, "tts_uplink.json"))
	if err := a.Command(t.Context(), cmd("lw-0004a30b001c0530")); err != nil {
		t.Fatal(err)
	}
	if err := tts.next(t); err != nil {
		t.Fatal(err)
	}
	for _, c := range []sdk.Command{
		cmd("0101010101010101"),    // no prefix
		cmd("lw-01010101010101ZZ"), // not an EUI
		{Device: "lw-0101010101010101", Topic: "cmd", Payload: []byte{1}},
		{Device: "lw-0101010101010101", Topic: "cmd/0", Payload: []byte{1}},
		{Device: "lw-0101010101010101", Topic: "cmd/10"},
		{Device: "lw-0101010101010101", Topic: "cmd/10", ContentType: "application/json", Payload: []byte(`[1]`)},
	} {
		if err := a.Command(t.Context(), c); err == nil {
			t.Errorf("Command(%+v) = nil, want a refusal", c)
		}
	}
	select {
	case r := <-cs.got:
		t.Fatalf("a refused command reached ChirpStack: %v", r.err)
	case r := <-tts.got:
		t.Fatalf("a refused command reached The Things Stack: %v", r.err)
	default:
	}
}

func TestParseDownlink(t *testing.T) {
	for _, tc := range []struct {
		topic, ct, payload string
		want               Downlink
		bad                bool
	}{
		{topic: "cmd/1", payload: "\x01", want: Downlink{FPort: 1, Payload: []byte{1}}},
		{topic: "cmd/223/confirmed", ct: "application/octet-stream", payload: "ab", want: Downlink{FPort: 223, Confirmed: true, Payload: []byte("ab")}},
		{topic: "cmd/5", ct: "application/json", payload: `{"a":1}`, want: Downlink{FPort: 5, Object: json.RawMessage(`{"a":1}`)}},
		{topic: "cmd/5", ct: "text/plain", payload: `{"a":1}`, want: Downlink{FPort: 5, Payload: []byte(`{"a":1}`)}},
		{topic: "cmd/224", payload: "x", bad: true},
		{topic: "cmd/05", payload: "x", bad: true},
		{topic: "cmd/+5", payload: "x", bad: true},
		{topic: "cmd/5/", payload: "x", bad: true},
		{topic: "cmd/5/unconfirmed", payload: "x", bad: true},
		{topic: "cmd", payload: "x", bad: true},
		{topic: "up/5", payload: "x", bad: true},
		{topic: "cmd/5", payload: "", bad: true},
		{topic: "cmd/5", payload: strings.Repeat("x", 4097), bad: true},
		{topic: "cmd/5", ct: "application/json", payload: `"a"`, bad: true},
		{topic: "cmd/5", ct: "application/json", payload: `{"a":`, bad: true},
	} {
		got, err := ParseDownlink(tc.topic, tc.ct, []byte(tc.payload))
		if tc.bad {
			if err == nil {
				t.Errorf("ParseDownlink(%q, %q, %q) = %+v, want an error", tc.topic, tc.ct, tc.payload, got)
			}
			continue
		}
		if err != nil || got.FPort != tc.want.FPort || got.Confirmed != tc.want.Confirmed || string(got.Object) != string(tc.want.Object) ||
			!bytes.Equal(got.Payload, tc.want.Payload) {
			t.Errorf("ParseDownlink(%q, %q, %q) = %+v, %v; want %+v", tc.topic, tc.ct, tc.payload, got, err, tc.want)
		}
	}
}

// FuzzParseDownlink: a command taken as a downlink has an application
// port, and either a JSON object (only for application/json) or 1 to
// 4096 bytes, never both.
func FuzzParseDownlink(f *testing.F) {
	f.Add("cmd/10", "", []byte{1, 2, 3})
	f.Add("cmd/2/confirmed", "application/json", []byte(`{"led":"on"}`))
	f.Add("cmd/223", "application/json; charset=utf-8", []byte(` {"a":[1,{"b":null}]} `))
	f.Add("cmd/0", "text/plain", []byte("x"))
	f.Fuzz(func(t *testing.T, topic, ct string, payload []byte) {
		d, err := ParseDownlink(topic, ct, payload)
		if err != nil {
			return
		}
		if d.FPort < 1 || d.FPort > maxFPort || !strings.HasPrefix(topic, "cmd/") {
			t.Fatalf("%q: port %d", topic, d.FPort)
		}
		switch {
		case d.Object != nil:
			if d.Payload != nil || !json.Valid(d.Object) || d.Object[0] != '{' || !strings.Contains(ct, "json") {
				t.Fatalf("object %q (payload %q) from %q", d.Object, d.Payload, ct)
			}
		case len(d.Payload) == 0 || len(d.Payload) > maxDownlink:
			t.Fatalf("payload of %d bytes", len(d.Payload))
		}
	})
}
