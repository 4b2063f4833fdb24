package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	pb "github.com/fleetgate/fleetgate/plugins/proto"
	"github.com/fleetgate/fleetgate/plugins/sdk"
	"github.com/fleetgate/fleetgate/plugins/sdk/sdktest"
)

func fixture(t testing.TB, name string) []byte {
	t.Helper()
	b, err := os.ReadFile("testdata/" + name)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestParseFixtures(t *testing.T) {
	cs := func(event, file string) func() (Message, error) {
		return func() (Message, error) { return ParseChirpStack(event, fixture(t, file)) }
	}
	tts := func(file string) func() (Message, error) {
		return func() (Message, error) { return ParseTTS(fixture(t, file)) }
	}
	for _, tc := range []struct {
		name  string
		parse func() (Message, error)
		want  Message
		err   error
	}{
		{"chirpstack up", cs("up", "chirpstack_up.json"), Message{DevEUI: "0101010101010101", At: time.Date(2022, 7, 18, 9, 34, 15, 775023242, time.UTC)}, nil},
		{"chirpstack join", cs("join", "chirpstack_join.json"), Message{DevEUI: "0101010101010101", Join: true, At: time.Date(2022, 7, 18, 9, 33, 28, 823500726, time.UTC)}, nil},
		{"chirpstack status", cs("status", "chirpstack_status.json"), Message{}, errIgnored},
		{"chirpstack up without deviceInfo", func() (Message, error) { return ParseChirpStack("up", []byte(`{"time":"x"}`)) }, Message{}, errBadRequest},
		{"chirpstack bad json", func() (Message, error) { return ParseChirpStack("up", []byte(`{"deviceInfo":`)) }, Message{}, errBadRequest},
		{"tts uplink", tts("tts_uplink.json"), Message{DevEUI: "0004a30b001c0530", At: time.Date(2020, 2, 12, 15, 15, 49, 567434000, time.UTC)}, nil},
		{"tts join", tts("tts_join.json"), Message{DevEUI: "0004a30b001c0530", Join: true, At: time.Date(2020, 2, 12, 15, 15, 49, 567434000, time.UTC)}, nil},
		{"tts downlink queued", tts("tts_downlink_queued.json"), Message{}, errIgnored},
		{"tts bad eui", func() (Message, error) {
			return ParseTTS([]byte(`{"end_device_ids":{"dev_eui":"XYZ"},"uplink_message":{}}`))
		}, Message{}, errBadRequest},
	} {
		got, err := tc.parse()
		if tc.err != nil {
			if !errors.Is(err, tc.err) {
				t.Errorf("%s: err = %v, want %v", tc.name, err, tc.err)
			}
			continue
		}
		if err != nil || got.DevEUI != tc.want.DevEUI || got.Join != tc.want.Join || !got.At.Equal(tc.want.At) {
			t.Errorf("%s: %+v, %v; want %+v", tc.name, got, err, tc.want)
		}
	}
}

// recSink is an sdk.Sink for handler tests.
type recSink struct {
	mu  sync.Mutex
	evs []sdk.Evidence
}

func (r *recSink) Ready() {}

func (r *recSink) Data(context.Context, sdk.Data) error { return nil }
func (r *recSink) Send(_ context.Context, ev sdk.Evidence) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.evs = append(r.evs, ev)
	return nil
}

func TestHandlerAnswers(t *testing.T) {
	a := &adapter{}
	if err := a.Configure(t.Context(), []byte(`{"listen":"127.0.0.1:0","secret":"s3cret","prefix":"lw-","max_body":4096}`)); err != nil {
		t.Fatal(err)
	}
	sink := &recSink{}
	h := a.handler(t.Context(), sink)
	do := func(method, target, secret string, body []byte) int {
		r := httptest.NewRequest(method, target, bytes.NewReader(body))
		if secret != "" {
			r.Header.Set("X-Fleetgate-Secret", secret)
		}
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		return w.Code
	}
	for _, tc := range []struct {
		name, method, target, secret string
		body                         []byte
		code                         int
	}{
		{"chirpstack up", "POST", "/chirpstack?event=up", "s3cret", fixture(t, "chirpstack_up.json"), 204},
		{"chirpstack join", "POST", "/chirpstack?event=join", "s3cret", fixture(t, "chirpstack_join.json"), 204},
		{"tts uplink", "POST", "/tts", "s3cret", fixture(t, "tts_uplink.json"), 204},
		{"unknown event", "POST", "/chirpstack?event=txack", "s3cret", []byte(`{}`), 204},
		{"tts other message", "POST", "/tts", "s3cret", fixture(t, "tts_downlink_queued.json"), 204},
		{"bad json", "POST", "/tts", "s3cret", []byte(`{"end_device_ids":`), 400},
		{"wrong secret", "POST", "/tts", "nope", fixture(t, "tts_uplink.json"), 401},
		{"no secret", "POST", "/chirpstack?event=up", "", fixture(t, "chirpstack_up.json"), 401},
		{"too big", "POST", "/tts", "s3cret", []byte(`{"x":"` + strings.Repeat("a", 5000) + `"}`), 413},
		{"GET", "GET", "/tts", "s3cret", nil, 405},
	} {
		if got := do(tc.method, tc.target, tc.secret, tc.body); got != tc.code {
			t.Errorf("%s: %d, want %d", tc.name, got, tc.code)
		}
	}
	sink.mu.Lock()
	defer sink.mu.Unlock()
	want := []struct {
		kind sdk.Kind
		dev  string
	}{{sdk.Renew, "lw-0101010101010101"}, {sdk.Connect, "lw-0101010101010101"}, {sdk.Renew, "lw-0004a30b001c0530"}}
	if len(sink.evs) != len(want) {
		t.Fatalf("evidence %+v, want %+v", sink.evs, want)
	}
	for i, w := range want {
		if ev := sink.evs[i]; ev.Kind != w.kind || ev.Device != w.dev || time.Since(ev.At) > time.Minute {
			t.Errorf("evidence %d = %+v, want %+v at about now (the fixtures' times are years old)", i, ev, w)
		}
	}
}

func TestConfigureRefuses(t *testing.T) {
	for _, cfg := range []string{`{}`, `{"secret":"x","max_body":1}`, `{"secret":"x","listen":"nope"}`, `{"secret":"x","sekret":"y"}`} {
		if err := (&adapter{}).Configure(t.Context(), []byte(cfg)); err == nil {
			t.Errorf("Configure(%s) = nil, want an error", cfg)
		}
	}
}

func freeTCP(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

func TestConformance(t *testing.T) {
	sdktest.Conformance(t, sdktest.Suite{
		Info: sdk.Info{Name: "lorawan", Version: "test"},
		New:  func(*testing.T) sdk.Adapter { return &adapter{} },
		Setup: func(t *testing.T) ([]byte, func(context.Context) (sdktest.Expect, error)) {
			addr := freeTCP(t)
			n := 0
			cfg, _ := json.Marshal(map[string]any{"listen": addr, "secret": "k"})
			return cfg, func(ctx context.Context) (sdktest.Expect, error) {
				n++
				eui := fmt.Sprintf("00000000000000%02x", n)
				body := fmt.Sprintf(`{"end_device_ids":{"dev_eui":%q},"uplink_message":{"f_cnt":%d}}`, strings.ToUpper(eui), n)
				req, err := http.NewRequestWithContext(ctx, "POST", "http://"+addr+"/tts", strings.NewReader(body))
				if err != nil {
					return sdktest.Expect{}, err
				}
				req.Header.Set("X-Fleetgate-Secret", "k")
				resp, err := http.DefaultClient.Do(req)
				if err != nil {
					return sdktest.Expect{}, err
				}
				resp.Body.Close()
				if resp.StatusCode != 204 {
					return sdktest.Expect{}, fmt.Errorf("status %d", resp.StatusCode)
				}
				return sdktest.Expect{Kind: pb.Kind_KIND_RENEW, Device: eui}, nil
			}
		},
		BadConfig: []byte(`{"listen": ":8090"}`),
	})
}

func FuzzParseChirpStack(f *testing.F) {
	f.Add("up", fixture(f, "chirpstack_up.json"))
	f.Add("join", fixture(f, "chirpstack_join.json"))
	f.Add("status", fixture(f, "chirpstack_status.json"))
	f.Fuzz(func(t *testing.T, event string, body []byte) {
		m, err := ParseChirpStack(event, body)
		if err == nil && (len(m.DevEUI) != 16 || strings.ToLower(m.DevEUI) != m.DevEUI) {
			t.Fatalf("accepted DevEUI %q", m.DevEUI)
		}
	})
}

func FuzzParseTTS(f *testing.F) {
	f.Add(fixture(f, "tts_uplink.json"))
	f.Add(fixture(f, "tts_join.json"))
	f.Add(fixture(f, "tts_downlink_queued.json"))
	f.Fuzz(func(t *testing.T, body []byte) {
		m, err := ParseTTS(body)
		if err == nil && (len(m.DevEUI) != 16 || strings.ToLower(m.DevEUI) != m.DevEUI) {
			t.Fatalf("accepted DevEUI %q", m.DevEUI)
		}
	})
}

// The secret travels in clear over plain HTTP: by default lorawan listens
// on loopback only (behind a TLS-terminating proxy).
func TestDefaultListenIsLoopback(t *testing.T) {
	a := &adapter{}
	if err := a.Configure(t.Context(), []byte(`{"secret":"s3cret"}`)); err != nil {
		t.Fatal(err)
	}
	addr, err := net.ResolveTCPAddr("tcp", a.cfg.Listen)
	if err != nil {
		t.Fatal(err)
	}
	if sdk.Exposed(addr) {
		t.Fatalf("default listen %q is reachable from other hosts, want loopback", a.cfg.Listen)
	}
}
