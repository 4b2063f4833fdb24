// Command lorawan is a fleetgate adapter plugin that takes LoRaWAN
// network-server uplinks over HTTP: every uplink (and join) of a device is
// presence evidence for it.
//
//   - ChirpStack v4 HTTP integration: POST /chirpstack?event=up (and
//     event=join), protobuf JSON with deviceInfo.devEui and time. Set the
//     integration's endpoint to http://<listen>/chirpstack and add the
//     secret header under "Headers".
//   - The Things Stack v3 webhooks: POST /tts with end_device_ids.dev_eui
//     and received_at; enable "Uplink message" and "Join accept" and add
//     the secret header under "Additional headers".
//
// The device ID is prefix + the DevEUI in lower-case hex. Answers: 204
// taken (or an event type that carries no presence, ignored), 400 bad
// JSON or no usable DevEUI, 401 a wrong or missing secret, 405 not a POST,
// 413 a body beyond max_body. It serves plain HTTP: the secret and the
// uplinks cross the network in clear unless a TLS-terminating proxy on the
// same host forwards to it. So it listens on loopback unless told
// otherwise, and warns at start when it listens on another address.
// Config (the adapter's `config` subtree):
//
//	listen: "127.0.0.1:8090"             # HTTP address
//	secret: "..."                        # required: the shared secret
//	secret_header: "X-Fleetgate-Secret"  # the header that carries it
//	prefix: ""                           # prepended to the DevEUI
//	max_body: 65536                      # bytes
package main

import (
	"context"
	"crypto/subtle"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"time"

	"github.com/fleetgate/fleetgate/plugins/sdk"
)

// version is set by the Makefile's -ldflags.
var version = "dev"

func main() {
	sdk.Serve(sdk.Info{Name: "lorawan", Version: version, Protocols: []string{"chirpstack-v4-http", "tts-v3-webhook"}}, &adapter{})
}

type config struct {
	Listen       string `json:"listen"`
	Secret       string `json:"secret"`
	SecretHeader string `json:"secret_header"`
	Prefix       string `json:"prefix"`
	MaxBody      int64  `json:"max_body"`
}

type adapter struct {
	cfg config
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
	a.cfg = c
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
	sdk.Logger(ctx).Info("listening", "http", ln.Addr().String())
	if sdk.Exposed(ln.Addr()) {
		sdk.Logger(ctx).Warn("listening beyond loopback on plain HTTP: the shared secret and the uplinks cross the network in clear; listen on 127.0.0.1 behind a TLS-terminating proxy",
			"http", ln.Addr().String())
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
			ev := sdk.Evidence{Kind: sdk.Renew, Device: a.cfg.Prefix + m.DevEUI, At: m.At}
			if m.Join {
				ev.Kind = sdk.Connect
			}
			if now := time.Now(); ev.At.After(now) || now.Sub(ev.At) > time.Hour {
				ev.At = now // a clock we cannot trust: the time of arrival
			}
			if err := sink.Send(r.Context(), ev); err != nil {
				http.Error(w, "stopping", http.StatusServiceUnavailable)
				return
			}
			w.WriteHeader(http.StatusNoContent)
		}
	}
	mux.Handle("/chirpstack", handle(func(r *http.Request, body []byte) (Message, error) {
		return ParseChirpStack(r.URL.Query().Get("event"), body)
	}))
	mux.Handle("/tts", handle(func(_ *http.Request, body []byte) (Message, error) { return ParseTTS(body) }))
	return mux
}
