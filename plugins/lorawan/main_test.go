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
		{"chirpstack up", cs("up", "chirpstack_up.json"), Message{DevEUI: "0101010101010101", At: time.Date(2022, 7, 18, 9, 34, 15, 775023242, time.UTC),
			FPort: 1, FCnt: 4, Payload: []byte{4}, Profile: "Test device-profile"}, nil},
		{"chirpstack up decoded", cs("up", "chirpstack_up_decoded.json"), Message{DevEUI: "0101010101010101", At: time.Date(2022, 7, 18, 9, 40, 2, 100000000, time.UTC),
			FPort: 2, FCnt: 7, Payload: []byte{1, 2, 3}, Object: json.RawMessage(`{"temperature":22.5,"humidity":61}`)}, nil},
		{"chirpstack up bad data", func() (Message, error) {
			return ParseChirpStack("up", []byte(`{"deviceInfo":{"devEui":"0101010101010101"},"fPort":1,"data":"!!"}`))
		}, Message{}, errBadRequest},
		{"chirpstack up object not an object", func() (Message, error) {
			return ParseChirpStack("up", []byte(`{"deviceInfo":{"devEui":"0101010101010101"},"fPort":1,"object":[1]}`))
		}, Message{}, errBadRequest},
		{"chirpstack join", cs("join", "chirpstack_join.json"), Message{DevEUI: "0101010101010101", Join: true, At: time.Date(2022, 7, 18, 9, 33, 28, 823500726, time.UTC), Profile: "Test device-profile"}, nil},
		{"chirpstack status", cs("status", "chirpstack_status.json"), Message{}, errIgnored},
		{"chirpstack up without deviceInfo", func() (Message, error) { return ParseChirpStack("up", []byte(`{"time":"x"}`)) }, Message{}, errBadRequest},
		{"chirpstack bad json", func() (Message, error) { return ParseChirpStack("up", []byte(`{"deviceInfo":`)) }, Message{}, errBadRequest},
		{"tts uplink", tts("tts_uplink.json"), Message{DevEUI: "0004a30b001c0530", At: time.Date(2020, 2, 12, 15, 15, 49, 567434000, time.UTC),
			FPort: 1, FCnt: 45, Payload: []byte{0x82, 0x41, 0xde}, Object: json.RawMessage(`{"temperature":22.5}`), AppID: "app1", DevID: "dev1", Profile: "app1"}, nil},
		{"tts join", tts("tts_join.json"), Message{DevEUI: "0004a30b001c0530", Join: true, At: time.Date(2020, 2, 12, 15, 15, 49, 567434000, time.UTC),
			AppID: "app1", DevID: "dev1", Profile: "app1"}, nil},
		{"tts port beyond 223", func() (Message, error) {
			return ParseTTS([]byte(`{"end_device_ids":{"dev_eui":"0004A30B001C0530"},"uplink_message":{"f_port":224}}`))
		}, Message{}, errBadRequest},
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
		if err != nil || got.DevEUI != tc.want.DevEUI || got.Join != tc.want.Join || !got.At.Equal(tc.want.At) ||
			got.FPort != tc.want.FPort || got.FCnt != tc.want.FCnt || !bytes.Equal(got.Payload, tc.want.Payload) ||
			string(got.Object) != string(tc.want.Object) || got.AppID != tc.want.AppID || got.DevID != tc.want.DevID ||
			got.Profile != tc.want.Profile || got.Interval != tc.want.Interval {
			t.Errorf("%s: %+v, %v; want %+v", tc.name, got, err, tc.want)
		}
	}
}

// recSink is an sdk.Sink for handler tests: it records evidence and data,
// and answers Data with dataErr.
type recSink struct {
	mu      sync.Mutex
	evs     []sdk.Evidence
	data    []sdk.Data
	dataErr error
}

func (r *recSink) Ready() {}

func (r *recSink) Data(_ context.Context, d sdk.Data) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.data = append(r.data, d)
	return r.dataErr
}

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
		{"chirpstack up without payload", "POST", "/chirpstack?event=up", "s3cret", []byte(`{"deviceInfo":{"devEui":"0101010101010102"},"fPort":1}`), 204},
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
	// The join and the uplink without payload are evidence; the uplinks
	// with payloads data, which is evidence too.
	want := []struct {
		kind sdk.Kind
		dev  string
	}{{sdk.Connect, "lw-0101010101010101"}, {sdk.Renew, "lw-0101010101010102"}}
	if len(sink.evs) != len(want) {
		t.Fatalf("evidence %+v, want %+v", sink.evs, want)
	}
	for i, w := range want {
		if ev := sink.evs[i]; ev.Kind != w.kind || ev.Device != w.dev || time.Since(ev.At) > time.Minute {
			t.Errorf("evidence %d = %+v, want %+v at about now (the fixtures' times are years old)", i, ev, w)
		}
	}
	wantData := []sdk.Data{
		{Device: "lw-0101010101010101", Topic: "up/1", Payload: []byte{4}, ContentType: "application/octet-stream", QoS: 1,
			Properties: []sdk.Property{{Key: "f_cnt", Value: "4"}}},
		{Device: "lw-0004a30b001c0530", Topic: "up/1", Payload: []byte(`{"temperature":22.5}`), ContentType: "application/json", QoS: 1,
			Properties: []sdk.Property{{Key: "f_cnt", Value: "45"}}},
	}
	if len(sink.data) != len(wantData) {
		t.Fatalf("data %+v, want %+v", sink.data, wantData)
	}
	for i, w := range wantData {
		d := sink.data[i]
		if d.Device != w.Device || d.Topic != w.Topic || !bytes.Equal(d.Payload, w.Payload) || d.ContentType != w.ContentType ||
			d.QoS != 1 || fmt.Sprint(d.Properties) != fmt.Sprint(w.Properties) || time.Since(d.At) > time.Minute {
			t.Errorf("data %d = %+v, want %+v at about now", i, d, w)
		}
	}
}

// TestUplinkAnsweredByTheDataOutcome: an uplink's answer follows what
// became of its data: taken (or no data path) 204, refused for good 400,
// not taken now 503 (the network server may send it again).
func TestUplinkAnsweredByTheDataOutcome(t *testing.T) {
	a := &adapter{}
	if err := a.Configure(t.Context(), []byte(`{"secret":"s"}`)); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		err  error
		code int
	}{
		{nil, 204},
		{fmt.Errorf("%w: no data path", sdk.ErrNoDataPath), 204},
		{fmt.Errorf("%w: refused", sdk.ErrRejected), 400},
		{fmt.Errorf("%w: disk full", sdk.ErrUnavailable), 503},
		{context.DeadlineExceeded, 503},
	} {
		h := a.handler(t.Context(), &recSink{dataErr: tc.err})
		r := httptest.NewRequest("POST", "/chirpstack?event=up", bytes.NewReader(fixture(t, "chirpstack_up.json")))
		r.Header.Set("X-Fleetgate-Secret", "s")
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		if w.Code != tc.code {
			t.Errorf("Data = %v: answered %d, want %d", tc.err, w.Code, tc.code)
		}
	}
}

// TestLeaseFromUplinkInterval: a device's evidence holds it for three of
// its uplink intervals: its ChirpStack tag uplink_interval, else its
// class's in uplink_intervals (ChirpStack device profile, The Things
// Stack application); without either, the adapter's (0).
func TestLeaseFromUplinkInterval(t *testing.T) {
	a := &adapter{}
	if err := a.Configure(t.Context(), []byte(`{"secret":"s","uplink_intervals":{"Test device-profile":"20m","app1":"900"}}`)); err != nil {
		t.Fatal(err)
	}
	withTags := func(file, tags string) []byte {
		return bytes.Replace(fixture(t, file), []byte(`"tags": {}`), []byte(`"tags": `+tags), 1)
	}
	for _, tc := range []struct {
		name, target string
		body         []byte
		want         time.Duration
	}{
		{"the profile's interval", "/chirpstack?event=up", fixture(t, "chirpstack_up.json"), time.Hour},
		{"the device's tag", "/chirpstack?event=up", withTags("chirpstack_up.json", `{"uplink_interval":"1h"}`), 3 * time.Hour},
		{"a tag in seconds", "/chirpstack?event=join", withTags("chirpstack_join.json", `{"uplink_interval":"600"}`), 30 * time.Minute},
		{"a tag that does not parse", "/chirpstack?event=join", withTags("chirpstack_join.json", `{"uplink_interval":"often"}`), time.Hour},
		{"the application's interval", "/tts", fixture(t, "tts_uplink.json"), 45 * time.Minute},
		{"none", "/chirpstack?event=up", []byte(`{"deviceInfo":{"devEui":"0101010101010102","deviceProfileName":"other"},"fPort":1}`), 0},
	} {
		sink := &recSink{}
		r := httptest.NewRequest("POST", tc.target, bytes.NewReader(tc.body))
		r.Header.Set("X-Fleetgate-Secret", "s")
		w := httptest.NewRecorder()
		a.handler(t.Context(), sink).ServeHTTP(w, r)
		var got []time.Duration
		for _, ev := range sink.evs {
			got = append(got, ev.Lease)
		}
		for _, d := range sink.data {
			got = append(got, d.Lease)
		}
		if w.Code != 204 || len(got) != 1 || got[0] != tc.want {
			t.Errorf("%s: answered %d, leases %v; want 204 and [%v]", tc.name, w.Code, got, tc.want)
		}
	}
}

func TestParseInterval(t *testing.T) {
	for in, want := range map[string]time.Duration{"15m": 15 * time.Minute, "900": 15 * time.Minute, "1h30m": 90 * time.Minute, "168h": 168 * time.Hour,
		"": 0, "0": 0, "-5m": 0, "169h": 0, "often": 0, "99999999999": 0} {
		got, err := ParseInterval(in)
		if got != want || (err == nil) != (want > 0) {
			t.Errorf("ParseInterval(%q) = %v, %v; want %v", in, got, err, want)
		}
	}
}

func TestConfigureRefuses(t *testing.T) {
	for _, cfg := range []string{`{}`, `{"secret":"x","max_body":1}`, `{"secret":"x","listen":"nope"}`, `{"secret":"x","sekret":"y"}`,
		`{"secret":"x","chirpstack_api":"http://cs:8090"}`,
		`{"secret":"x","chirpstack_api":"cs:8090","chirpstack_api_token":"t"}`,
		`{"secret":"x","chirpstack_api_token":"t"}`,
		`{"secret":"x","tts_api":"https://eu1.cloud.thethings.network","tts_api_key":"k"}`,
		`{"secret":"x","tts_api":"https://eu1.cloud.thethings.network","tts_webhook_id":"wh1"}`,
		`{"secret":"x","tts_api":"https://eu1.cloud.thethings.network","tts_api_key":"k","tts_webhook_id":"Bad_ID"}`,
		`{"secret":"x","uplink_intervals":{"Test device-profile":"often"}}`,
		`{"secret":"x","uplink_intervals":{"p":"0s"}}`,
	} {
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
		SetupData: func(t *testing.T) ([]byte, sdktest.DataTrigger) {
			addr := freeTCP(t)
			n := 0
			cfg, _ := json.Marshal(map[string]any{"listen": addr, "secret": "k", "prefix": "lw-"})
			return cfg, func(ctx context.Context) (sdktest.ExpectData, <-chan error, error) {
				n++
				eui := fmt.Sprintf("00000000000000%02x", n)
				body := fmt.Sprintf(`{"end_device_ids":{"dev_eui":%q,"device_id":"d%d","application_ids":{"application_id":"app1"}},`+
					`"uplink_message":{"f_port":3,"f_cnt":%d,"frm_payload":"AQI=","decoded_payload":{"n": %d}}}`, eui, n, n, n)
				answer := make(chan error, 1)
				go func() { answer <- post(ctx, "http://"+addr+"/tts", "k", body) }()
				want := sdktest.ExpectData{Kind: pb.Kind_KIND_RENEW, Device: "lw-" + eui, Topic: "up/3",
					Payload: []byte(fmt.Sprintf(`{"n":%d}`, n)), ContentType: "application/json", QoS: 1}
				return want, answer, nil
			}
		},
		SetupCommands: func(t *testing.T) ([]byte, sdktest.CommandCase) {
			cs := newChirpStack(t)
			cfg, _ := json.Marshal(map[string]any{"listen": freeTCP(t), "secret": "k", "prefix": "lw-",
				"chirpstack_api": cs.srv.URL, "chirpstack_api_token": "tok"})
			return cfg, sdktest.CommandCase{
				Accept: &pb.Command{Id: 1, Device: "lw-0101010101010101", Topic: "cmd/10", Payload: []byte{1, 2, 3}},
				Received: func(ctx context.Context) error {
					select {
					case r := <-cs.got:
						return r.err
					case <-ctx.Done():
						return ctx.Err()
					}
				},
				Refuse: &pb.Command{Id: 2, Device: "lw-0101010101010101", Topic: "cmd/reboot", Payload: []byte{1}},
			}
		},
	})
}

// post posts body to target with the secret and wants a 204.
func post(ctx context.Context, target, secret, body string) error {
	req, err := http.NewRequestWithContext(ctx, "POST", target, strings.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("X-Fleetgate-Secret", secret)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	resp.Body.Close()
	if resp.StatusCode != 204 {
		return fmt.Errorf("status %d", resp.StatusCode)
	}
	return nil
}

// checkMessage is what every message a parser accepts holds: a
// lower-case 16-digit DevEUI; for an uplink, an application port and its
// data well formed (a compact JSON object, if any); valid The Things
// Stack IDs, if any; no data on a join.
func checkMessage(t *testing.T, m Message) {
	t.Helper()
	if len(m.DevEUI) != 16 || strings.ToLower(m.DevEUI) != m.DevEUI {
		t.Fatalf("accepted DevEUI %q", m.DevEUI)
	}
	if m.FPort < 0 || m.FPort > maxFPort || (m.Join && m.HasData()) {
		t.Fatalf("port %d, join %v, data %v", m.FPort, m.Join, m.HasData())
	}
	if m.Object != nil {
		var compact bytes.Buffer
		if m.Object[0] != '{' || json.Compact(&compact, m.Object) != nil || compact.String() != string(m.Object) {
			t.Fatalf("decoded object %q", m.Object)
		}
	}
	if (m.AppID == "") != (m.DevID == "") || (m.AppID != "" && (!ttsID.MatchString(m.AppID) || !ttsID.MatchString(m.DevID))) {
		t.Fatalf("IDs %q %q", m.AppID, m.DevID)
	}
	if p, ct := m.Data(); m.HasData() && (len(p) == 0 || (ct != "application/json" && ct != "application/octet-stream")) {
		t.Fatalf("data %q of %q", p, ct)
	}
	if m.Interval < 0 || m.Interval > 7*24*time.Hour {
		t.Fatalf("uplink interval %v", m.Interval)
	}
}

func FuzzParseChirpStack(f *testing.F) {
	f.Add("up", fixture(f, "chirpstack_up.json"))
	f.Add("up", fixture(f, "chirpstack_up_decoded.json"))
	f.Add("join", fixture(f, "chirpstack_join.json"))
	f.Add("status", fixture(f, "chirpstack_status.json"))
	f.Fuzz(func(t *testing.T, event string, body []byte) {
		if m, err := ParseChirpStack(event, body); err == nil {
			checkMessage(t, m)
		}
	})
}

func FuzzParseTTS(f *testing.F) {
	f.Add(fixture(f, "tts_uplink.json"))
	f.Add(fixture(f, "tts_join.json"))
	f.Add(fixture(f, "tts_downlink_queued.json"))
	f.Fuzz(func(t *testing.T, body []byte) {
		if m, err := ParseTTS(body); err == nil {
			checkMessage(t, m)
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
