// Command lorawan is a fleetgate adapter plugin that takes LoRaWAN
// network-server uplinks over HTTP: every uplink (and join) of a device is
// presence evidence for it, and an uplink's application payload is its
// data; commands for its devices become downlinks queued at the network
// server.
//
//   - ChirpStack v4 HTTP integration: POST /chirpstack?event=up (and
//     event=join), protobuf JSON with deviceInfo.devEui and time. Set the
//     integration's endpoint to http://<listen>/chirpstack and add the
//     secret header under "Headers".
//   - The Things Stack v3 webhooks: POST /tts with end_device_ids.dev_eui
//     and received_at; enable "Uplink message" and "Join accept" and add
//     the secret header under "Additional headers".
//
// The device ID is prefix + the DevEUI in lower-case hex. Data: an
// uplink with a payload sends it as QoS 1 data on topic "up/<fPort>" —
// the decoded object (ChirpStack `object`, The Things Stack
// `decoded_payload`) as application/json when the network server's codec
// gave one, else the raw bytes (`data`, `frm_payload`) as
// application/octet-stream —, with the frame counter as the user property
// f_cnt; the request is answered once the gateway holds the data
// durably. Answers: 204 taken (or an event type that carries no presence,
// ignored; or the gateway keeps no data), 400 bad JSON, no usable DevEUI,
// a bad payload or data the gateway refuses, 401 a wrong or missing
// secret, 405 not a POST, 413 a body beyond max_body, 503 data the gateway
// could not take now (the network server may send it again: at least
// once). It serves plain HTTP: the secret and the uplinks cross the
// network in clear unless a TLS-terminating proxy on the same host
// forwards to it. So it listens on loopback unless told otherwise, and
// warns at start when it listens on another address.
//
// Commands (topic "cmd/<fPort>" or "cmd/<fPort>/confirmed"; an
// application/json payload is a JSON object for the network server's
// codec, any other the downlink's bytes) are queued through the API of
// the network server the device's last uplink came through: ChirpStack's
// REST API (POST /api/devices/{devEui}/queue) or The Things Stack's
// webhook downlink push (POST /api/v3/as/applications/{app}/webhooks/
// {webhook}/devices/{device}/down/push, with the IDs its uplinks carry).
// A device not heard since the adapter started goes to ChirpStack when it
// is configured; without either API, commands are refused.
//
// Leases: a device that sends every 15 minutes or every hour would be
// reported offline between its uplinks under the gateway's lease, so its
// evidence carries three of its uplink intervals as its lease (the
// gateway grants it within presence.lease and presence.max_lease): the
// interval of the ChirpStack tag uplink_interval in deviceInfo.tags (the
// device's or its device profile's: "15m", or seconds, "900"; one that
// does not parse is ignored), else of its class in uplink_intervals (a
// ChirpStack device profile's name, a The Things Stack application's ID).
// Without either, none: the adapter's lease, else the gateway's. Config
// (the adapter's `config` subtree):
//
//	listen: "127.0.0.1:8090"             # HTTP address
//	secret: "..."                        # required: the shared secret
//	secret_header: "X-Fleetgate-Secret"  # the header that carries it
//	prefix: ""                           # prepended to the DevEUI
//	max_body: 65536                      # bytes
//	chirpstack_api: ""                   # ChirpStack REST API base URL
//	chirpstack_api_token: ""             # its API token
//	tts_api: ""                          # The Things Stack base URL
//	tts_api_key: ""                      # API key with traffic write rights
//	tts_webhook_id: ""                   # the webhook whose push path to use
//	uplink_intervals: {}                 # device profile or application → interval
package main

import (
	"bytes"
	"context"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/fleetgate/fleetgate/plugins/sdk"
)

// version is set by the Makefile's -ldflags.
var version = "dev"

func main() {
	sdk.Serve(sdk.Info{Name: "lorawan", Version: version, Protocols: []string{"chirpstack-v4-http", "tts-v3-webhook"}}, &adapter{})
}

type config struct {
	Listen             string `json:"listen"`
	Secret             string `json:"secret"`
	SecretHeader       string `json:"secret_header"`
	Prefix             string `json:"prefix"`
	MaxBody            int64  `json:"max_body"`
	ChirpStackAPI      string `json:"chirpstack_api"`
	ChirpStackAPIToken string `json:"chirpstack_api_token"`
	TTSAPI             string `json:"tts_api"`
	TTSAPIKey          string `json:"tts_api_key"`
	TTSWebhookID       string `json:"tts_webhook_id"`
	// UplinkIntervals are the uplink intervals of classes of devices: a
	// ChirpStack device profile's name, or a The Things Stack
	// application's ID, to a duration or seconds (ParseInterval).
	UplinkIntervals map[string]string `json:"uplink_intervals"`
}

// leaseIntervals is how many uplink intervals a device's lease spans: it
// may miss two uplinks in a row (LoRaWAN loses some) and stay online.
const leaseIntervals = 3

// maxRoutes bounds the devices whose network server (and The Things
// Stack IDs) the adapter remembers; beyond it, one it remembers is
// forgotten for each new one.
const maxRoutes = 100_000

// route is where a device's last uplink came from: The Things Stack
// (with its IDs) or ChirpStack.
type route struct {
	tts          bool
	appID, devID string
}

type adapter struct {
	cfg       config
	client    *http.Client
	intervals map[string]time.Duration // cfg.UplinkIntervals parsed

	mu     sync.Mutex
	routes map[string]route // device ID → its network server
}

var (
	_ sdk.Adapter   = (*adapter)(nil)
	_ sdk.Commander = (*adapter)(nil)
)

// apiURL checks a network server API's base URL.
func apiURL(key, raw string) error {
	u, err := url.Parse(raw)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.RawQuery != "" || u.Fragment != "" {
		return fmt.Errorf("%s: %q: want an http or https base URL", key, raw)
	}
	return nil
}

func (a *adapter) Configure(_ context.Context, raw []byte) error {
	c := config{Listen: "127.0.0.1:8090", SecretHeader: "X-Fleetgate-Secret", MaxBody: 64 << 10}
	if err := sdk.DecodeConfig(raw, &c); err != nil {
		return err
	}
	switch {
	case c.Secret == "":
		return errors.New("secret: must be set (the network server sends it in secret_header)")
	case c.SecretHeader == "":
		return errors.New("secret_header: must be set")
	case c.MaxBody < 512 || c.MaxBody > 16<<20:
		return fmt.Errorf("max_body: must be between 512 and %d, got %d", 16<<20, c.MaxBody)
	case len(c.Prefix) > 100:
		return fmt.Errorf("prefix: %d bytes, longest allowed is 100", len(c.Prefix))
	}
	if _, err := net.ResolveTCPAddr("tcp", c.Listen); err != nil {
		return fmt.Errorf("listen: %q: %w", c.Listen, err)
	}
	if c.ChirpStackAPI != "" || c.ChirpStackAPIToken != "" {
		if err := apiURL("chirpstack_api", c.ChirpStackAPI); err != nil {
			return err
		}
		if c.ChirpStackAPIToken == "" {
			return errors.New("chirpstack_api_token: must be set with chirpstack_api (an API token of ChirpStack)")
		}
	}
	if c.TTSAPI != "" || c.TTSAPIKey != "" || c.TTSWebhookID != "" {
		if err := apiURL("tts_api", c.TTSAPI); err != nil {
			return err
		}
		if c.TTSAPIKey == "" {
			return errors.New("tts_api_key: must be set with tts_api (an API key with traffic write rights)")
		}
		if !ttsID.MatchString(c.TTSWebhookID) {
			return fmt.Errorf("tts_webhook_id: %q: want the webhook's ID (2 to 36 of a-z 0-9 -)", c.TTSWebhookID)
		}
	}
	intervals := make(map[string]time.Duration, len(c.UplinkIntervals))
	for class, v := range c.UplinkIntervals {
		d, err := ParseInterval(v)
		if err != nil {
			return fmt.Errorf("uplink_intervals: %q: %w", class, err)
		}
		intervals[class] = d
	}
	c.ChirpStackAPI = strings.TrimRight(c.ChirpStackAPI, "/")
	c.TTSAPI = strings.TrimRight(c.TTSAPI, "/")
	a.cfg, a.intervals = c, intervals
	a.client = &http.Client{Timeout: 10 * time.Second}
	return nil
}

func (a *adapter) Run(ctx context.Context, sink sdk.Sink) error {
	var lc net.ListenConfig
	ln, err := lc.Listen(ctx, "tcp", a.cfg.Listen)
	if err != nil {
		return fmt.Errorf("listen: %w", err)
	}
	srv := &http.Server{
		Handler:           a.handler(ctx, sink),
		ReadHeaderTimeout: 10 * time.Second,
		ReadTimeout:       30 * time.Second,
		IdleTimeout:       2 * time.Minute,
	}
	log := sdk.Logger(ctx)
	log.Info("listening", "http", ln.Addr().String())
	if sdk.Exposed(ln.Addr()) {
		log.Warn("listening beyond loopback on plain HTTP: the shared secret and the uplinks cross the network in clear; listen on 127.0.0.1 behind a TLS-terminating proxy",
			"http", ln.Addr().String())
	}
	for _, api := range []string{a.cfg.ChirpStackAPI, a.cfg.TTSAPI} {
		if u, err := url.Parse(api); err == nil && u.Scheme == "http" && !loopbackHost(u.Hostname()) {
			log.Warn("the network server's API is plain HTTP beyond loopback: its token crosses the network in clear", "api", api)
		}
	}
	sink.Ready()
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case err := <-errc:
		return fmt.Errorf("serve: %w", err)
	case <-ctx.Done():
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
		return nil
	}
}

// loopbackHost reports whether host names this machine.
func loopbackHost(host string) bool {
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// handler serves /chirpstack and /tts.
func (a *adapter) handler(ctx context.Context, sink sdk.Sink) http.Handler {
	log := sdk.Logger(ctx)
	mux := http.NewServeMux()
	handle := func(parse func(r *http.Request, body []byte) (Message, error)) http.HandlerFunc {
		return func(w http.ResponseWriter, r *http.Request) {
			if r.Method != http.MethodPost {
				w.Header().Set("Allow", http.MethodPost)
				http.Error(w, "POST only", http.StatusMethodNotAllowed)
				return
			}
			if subtle.ConstantTimeCompare([]byte(r.Header.Get(a.cfg.SecretHeader)), []byte(a.cfg.Secret)) != 1 {
				http.Error(w, "wrong or missing secret", http.StatusUnauthorized)
				return
			}
			body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, a.cfg.MaxBody))
			if err != nil {
				var tooBig *http.MaxBytesError
				if errors.As(err, &tooBig) {
					http.Error(w, fmt.Sprintf("body beyond %d bytes", a.cfg.MaxBody), http.StatusRequestEntityTooLarge)
					return
				}
				http.Error(w, "read body", http.StatusBadRequest)
				return
			}
			m, err := parse(r, body)
			switch {
			case errors.Is(err, errIgnored):
				w.WriteHeader(http.StatusNoContent)
				return
			case err != nil:
				log.Debug("bad request", "path", r.URL.Path, "error", err)
				http.Error(w, err.Error(), http.StatusBadRequest)
				return
			}
			device := a.cfg.Prefix + m.DevEUI
			a.remember(device, m)
			at := m.At
			if now := time.Now(); at.After(now) || now.Sub(at) > time.Hour {
				at = now // a clock we cannot trust: the time of arrival
			}
			lease := a.lease(m)
			if m.Join || !m.HasData() {
				ev := sdk.Evidence{Kind: sdk.Renew, Device: device, At: at, Lease: lease}
				if m.Join {
					ev.Kind = sdk.Connect
				}
				if err := sink.Send(r.Context(), ev); err != nil {
					http.Error(w, "stopping", http.StatusServiceUnavailable)
					return
				}
				w.WriteHeader(http.StatusNoContent)
				return
			}
			payload, contentType := m.Data()
			err = sink.Data(r.Context(), sdk.Data{Device: device, Topic: m.Topic(), Payload: payload, ContentType: contentType,
				QoS: 1, Properties: []sdk.Property{{Key: "f_cnt", Value: strconv.FormatUint(uint64(m.FCnt), 10)}}, At: at, Lease: lease})
			switch {
			case err == nil, errors.Is(err, sdk.ErrNoDataPath):
				w.WriteHeader(http.StatusNoContent)
			case errors.Is(err, sdk.ErrRejected):
				log.Warn("uplink data refused by the gateway", "device", device, "error", err)
				http.Error(w, err.Error(), http.StatusBadRequest)
			default:
				log.Debug("uplink data not taken now", "device", device, "error", err)
				http.Error(w, "not taken now: "+err.Error(), http.StatusServiceUnavailable)
			}
		}
	}
	mux.Handle("/chirpstack", handle(func(r *http.Request, body []byte) (Message, error) {
		return ParseChirpStack(r.URL.Query().Get("event"), body)
	}))
	mux.Handle("/tts", handle(func(_ *http.Request, body []byte) (Message, error) { return ParseTTS(body) }))
	return mux
}

// lease is the lease of m's evidence: leaseIntervals uplink intervals of
// its device (its tag, else its class's in uplink_intervals); 0 when
// neither is known (the gateway's lease for the adapter).
func (a *adapter) lease(m Message) time.Duration {
	interval := m.Interval
	if interval == 0 {
		interval = a.intervals[m.Profile]
	}
	return leaseIntervals * interval
}

// remember records the network server device's uplink m came through.
func (a *adapter) remember(device string, m Message) {
	r := route{tts: m.AppID != "", appID: m.AppID, devID: m.DevID}
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.routes == nil {
		a.routes = make(map[string]route)
	}
	if _, ok := a.routes[device]; !ok && len(a.routes) >= maxRoutes {
		for d := range a.routes {
			delete(a.routes, d)
			break
		}
	}
	a.routes[device] = r
}

// Command queues c as a downlink at the network server of its device's
// last uplink (ChirpStack for a device not heard, when configured).
func (a *adapter) Command(ctx context.Context, c sdk.Command) error {
	eui, ok := strings.CutPrefix(c.Device, a.cfg.Prefix)
	if _, err := parseEUI(eui); !ok || err != nil || eui != strings.ToLower(eui) {
		return fmt.Errorf("device %q is not prefix %q + a DevEUI", c.Device, a.cfg.Prefix)
	}
	d, err := ParseDownlink(c.Topic, c.ContentType, c.Payload)
	if err != nil {
		return err
	}
	a.mu.Lock()
	r, heard := a.routes[c.Device]
	a.mu.Unlock()
	switch {
	case heard && r.tts:
		if a.cfg.TTSAPI == "" {
			return fmt.Errorf("%s is a device of The Things Stack, and tts_api is not set", c.Device)
		}
		return a.pushTTS(ctx, r, d)
	case a.cfg.ChirpStackAPI != "":
		return a.enqueueChirpStack(ctx, eui, d, c.Expires)
	case heard:
		return fmt.Errorf("%s is a device of ChirpStack, and chirpstack_api is not set", c.Device)
	case a.cfg.TTSAPI != "":
		return fmt.Errorf("no uplink from %s through The Things Stack since the adapter started: its application and device IDs are unknown", c.Device)
	}
	return errors.New("no network server API is set (chirpstack_api, tts_api)")
}

// chirpStackQueueItem is the body of ChirpStack's Enqueue (REST).
type chirpStackQueueItem struct {
	QueueItem struct {
		Confirmed bool            `json:"confirmed"`
		FPort     int             `json:"fPort"`
		Data      []byte          `json:"data,omitempty"`
		Object    json.RawMessage `json:"object,omitempty"`
		ExpiresAt string          `json:"expiresAt,omitempty"`
	} `json:"queueItem"`
}

// enqueueChirpStack adds d to the downlink queue of eui at ChirpStack.
func (a *adapter) enqueueChirpStack(ctx context.Context, eui string, d Downlink, expires time.Time) error {
	var body chirpStackQueueItem
	body.QueueItem.Confirmed, body.QueueItem.FPort = d.Confirmed, d.FPort
	body.QueueItem.Data, body.QueueItem.Object = d.Payload, d.Object
	if !expires.IsZero() {
		body.QueueItem.ExpiresAt = expires.UTC().Format(time.RFC3339Nano)
	}
	return a.post(ctx, "chirpstack", a.cfg.ChirpStackAPI+"/api/devices/"+eui+"/queue", body,
		"Grpc-Metadata-Authorization", "Bearer "+a.cfg.ChirpStackAPIToken)
}

// ttsDownlink is one downlink of The Things Stack's push body.
type ttsDownlink struct {
	FPort          int             `json:"f_port"`
	FRMPayload     []byte          `json:"frm_payload,omitempty"`
	DecodedPayload json.RawMessage `json:"decoded_payload,omitempty"`
	Priority       string          `json:"priority"`
	Confirmed      bool            `json:"confirmed,omitempty"`
}

// pushTTS pushes d to the device's downlink queue at The Things Stack.
func (a *adapter) pushTTS(ctx context.Context, r route, d Downlink) error {
	body := struct {
		Downlinks []ttsDownlink `json:"downlinks"`
	}{[]ttsDownlink{{FPort: d.FPort, FRMPayload: d.Payload, DecodedPayload: d.Object, Priority: "NORMAL", Confirmed: d.Confirmed}}}
	path := "/api/v3/as/applications/" + r.appID + "/webhooks/" + a.cfg.TTSWebhookID + "/devices/" + r.devID + "/down/push"
	return a.post(ctx, "the things stack", a.cfg.TTSAPI+path, body, "Authorization", "Bearer "+a.cfg.TTSAPIKey)
}

// post sends body as JSON to target with the header authKey: authValue,
// and wants a 2xx answer.
func (a *adapter) post(ctx context.Context, what, target string, body any, authKey, authValue string) error {
	b, err := json.Marshal(body)
	if err != nil {
		return err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, target, bytes.NewReader(b))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("User-Agent", "fleetgate-lorawan/"+version)
	req.Header.Set(authKey, authValue)
	resp, err := a.client.Do(req)
	if err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	defer resp.Body.Close()
	msg, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
	if resp.StatusCode/100 != 2 {
		return fmt.Errorf("%s answered %s: %s", what, resp.Status, bytes.TrimSpace(msg))
	}
	return nil
}
