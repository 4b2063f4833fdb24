// Package admin is the gateway's admin HTTP API (docs/design.md §6.11): /healthz,
// /readyz, /metrics, /v1/status, /v1/devices, /v1/devices/{id},
// /v1/gateways, /v1/sessions, /v1/events, /v1/snapshot and /v1/watch, the
// page at / (package ui, with its login), plus the client the query commands
// (fleetgate status, devices, events) use. It listens on loopback by
// default and never opens the gateway's bbolt file itself.
package admin

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/fleetgate/fleetgate/admin/ui"
	"github.com/fleetgate/fleetgate/gateway"
)

// Sessions is the part of the session table the API reads.
type Sessions interface {
	Sessions(device gateway.DeviceID) []gateway.SessionView
	Range(fn func(gateway.SessionView) bool)
	Len() int
}

// Status is the body of /v1/status. The parts owned by other packages
// (uplink, runner, adapters) are their own status values, marshalled as
// they are.
type Status struct {
	Gateway   string    `json:"gateway"`
	Epoch     uint64    `json:"epoch"`
	Version   string    `json:"version"`
	StartedAt time.Time `json:"started_at"`
	Store     string    `json:"store"`
	Shards    int       `json:"shards"`
	Sessions  int       `json:"sessions"`
	Uplink    any       `json:"uplink,omitempty"`
	Runner    any       `json:"runner,omitempty"`
	Publisher any       `json:"publisher,omitempty"`
	Bridge    any       `json:"bridge,omitempty"`
	Canary    any       `json:"canary,omitempty"`
	Adapters  []any     `json:"adapters"`
	Bounds    any       `json:"bounds"`
	// Certificates: when each certificate the configuration names expires.
	Certificates any `json:"certificates,omitempty"`
	// Fleet is filled in by the API: the store's counts, read for each
	// request (at most storeReadTimeout).
	Fleet *Fleet `json:"fleet,omitempty"`
}

// Fleet is the fleet's devices by stored state (gateway.Reader.Counts),
// or the reason the store did not tell.
type Fleet struct {
	*gateway.Counts
	Error string `json:"error,omitempty"`
}

// storeReadTimeout bounds the store read of /v1/status.
const storeReadTimeout = 2 * time.Second

// Refusals is where the API finds a device's last refusal by a front
// end (internal/refusal's Reporter).
type Refusals interface {
	Last(device gateway.DeviceID) (gateway.Refusal, bool)
}

// Timing is what deriving suspect needs; a func so a config reload shows.
type Timing func() (lease, suspectAfter time.Duration)

// Options configures the server. It serves `fleetgate run` and
// `fleetgate runner` alike; a runner has no session table (Sessions nil:
// /v1/sessions answers 404 and devices show no local sessions).
type Options struct {
	Addr     string // "127.0.0.1:9180"; ":0" ports are fine in tests
	Store    gateway.Reader
	Sessions Sessions // nil in a runner-only process
	Status   func() Status
	Timing   Timing
	Gatherer prometheus.Gatherer
	Logger   *slog.Logger
	// Refusals, when set, gives /v1/devices/{id} the device's last
	// refusal (nil in a runner-only process: it has no front ends).
	Refusals Refusals
	// Token, when set, is the bearer token every request but the probes
	// must carry (listen.admin.token_file); TLS, when set, serves HTTPS
	// (listen.admin.cert_file, key_file). security.go.
	Token string
	TLS   *tls.Config
	// Now is the clock of the page's login cookies (nil: time.Now).
	Now func() time.Time
	// WriteTimeout bounds the write of a whole answer, and each write of
	// a stream (0: 30 s). security.go.
	WriteTimeout time.Duration
	// Forget, when set, serves DELETE /v1/devices/{id}; GatewayID names
	// this gateway in the removed event. Credentials, when set, serves
	// POST and DELETE /v1/credentials/{id} (provision.go). Both change
	// state: they are refused without Token.
	Forget      gateway.Forgetter
	GatewayID   string
	Credentials Credentials
	// Profiling serves Go's runtime profiles (net/http/pprof) under
	// /debug/pprof/, with the same token as the API.
	Profiling bool
}

// Server serves the admin API.
type Server struct {
	o     Options
	ln    net.Listener
	srv   *http.Server
	ready atomic.Bool

	closing   chan struct{} // closed by Shutdown: ends the watch streams
	closeOnce sync.Once
	routes    []string
}

// Listen binds the admin address; Serve then serves on it.
func Listen(o Options) (*Server, error) {
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	if o.WriteTimeout <= 0 {
		o.WriteTimeout = defaultWriteTimeout
	}
	ln, err := net.Listen("tcp", o.Addr)
	if err != nil {
		return nil, fmt.Errorf("admin: listen %s: %w", o.Addr, err)
	}
	if o.TLS != nil {
		ln = tls.NewListener(ln, o.TLS)
	}
	s := &Server{o: o, ln: ln, closing: make(chan struct{})}
	mux := http.NewServeMux()
	handle := func(pattern string, h http.HandlerFunc) {
		mux.Handle(pattern, h)
		s.routes = append(s.routes, pattern)
	}
	handle("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { fmt.Fprintln(w, "ok") })
	handle("GET /readyz", s.readyz)
	handle("GET /metrics", promhttp.HandlerFor(o.Gatherer, promhttp.HandlerOpts{}).ServeHTTP)
	handle("GET /v1/status", s.status)
	handle("GET /v1/devices/{id}", s.device)
	handle("GET /v1/devices", s.devices)
	handle("GET /v1/gateways", s.gateways)
	if o.Forget != nil {
		handle("DELETE /v1/devices/{id}", s.mutating(s.forget))
	}
	if o.Credentials != nil {
		handle("POST /v1/credentials/{id}", s.mutating(s.putCredentials))
		handle("DELETE /v1/credentials/{id}", s.mutating(s.deleteCredentials))
	}
	if o.Sessions != nil {
		handle("GET /v1/sessions", s.sessions)
	}
	handle("GET /v1/events", s.events)
	handle("GET /v1/snapshot", s.snapshot)
	handle("GET /v1/watch", s.watch)
	page := ui.Handler()
	handle("GET /{$}", page.ServeHTTP)
	handle("GET /ui/{file}", page.ServeHTTP)
	handle("POST /login", s.login)
	handle("POST /logout", s.logout)
	if o.Profiling {
		handle("GET /debug/pprof/", pprof.Index)
		handle("GET /debug/pprof/cmdline", pprof.Cmdline)
		handle("GET /debug/pprof/profile", pprof.Profile)
		handle("GET /debug/pprof/symbol", pprof.Symbol)
		handle("GET /debug/pprof/trace", pprof.Trace)
	}
	s.srv = newHTTPServer(mux, o, s.ln.Addr())
	s.srv.ErrorLog = slog.NewLogLogger(o.Logger.Handler(), slog.LevelWarn)
	s.srv.RegisterOnShutdown(s.endStreams)
	return s, nil
}

// Routes are the patterns served ("GET /v1/devices/{id}"), in the order
// registered; docs/openapi.yaml documents each.
func (s *Server) Routes() []string { return slices.Clone(s.routes) }

// Addr is the bound address.
func (s *Server) Addr() net.Addr { return s.ln.Addr() }

// SetReady flips /readyz. The gateway is ready once its listeners are up;
// an unreachable central store does not make it unready (it keeps serving
// devices into the outbox).
func (s *Server) SetReady(v bool) { s.ready.Store(v) }

// Serve serves until Shutdown.
func (s *Server) Serve() error {
	if err := s.srv.Serve(s.ln); !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("admin: serve: %w", err)
	}
	return nil
}

// Shutdown stops the server, waiting for requests in flight until ctx ends.
func (s *Server) Shutdown(ctx context.Context) error { return s.srv.Shutdown(ctx) }

// status answers /v1/status: the process's status, and the fleet's counts
// from the store (an error in their place when the store does not answer
// in time: the rest of the status is still worth having; none from a
// server without a store).
func (s *Server) status(w http.ResponseWriter, r *http.Request) {
	st := s.o.Status()
	if s.o.Store != nil {
		ctx, cancel := context.WithTimeout(r.Context(), storeReadTimeout)
		defer cancel()
		if n, err := s.o.Store.Counts(ctx, gateway.SuspectWindow(s.o.Timing())); err != nil {
			st.Fleet = &Fleet{Error: err.Error()}
		} else {
			st.Fleet = &Fleet{Counts: &n}
		}
	}
	writeJSON(w, http.StatusOK, st)
}

func (s *Server) readyz(w http.ResponseWriter, _ *http.Request) {
	if !s.ready.Load() {
		http.Error(w, "not ready", http.StatusServiceUnavailable)
		return
	}
	fmt.Fprintln(w, "ready")
}

func (s *Server) device(w http.ResponseWriter, r *http.Request) {
	id, err := gateway.ParseDeviceID(r.PathValue("id"))
	if err != nil {
		writeError(w, http.StatusBadRequest, err)
		return
	}
	info, err := s.o.Store.Device(r.Context(), id)
	last := s.lastRefusal(id)
	switch {
	case errors.Is(err, gateway.ErrNotFound):
		// Said once, whatever the store's wrapping: "device X: not found";
		// with its last refusal, the likely reason why.
		writeJSON(w, http.StatusNotFound, apiError{Error: fmt.Errorf("device %s: %w", id, gateway.ErrNotFound).Error(), LastRefusal: last})
		return
	case err != nil:
		writeError(w, http.StatusBadGateway, err)
		return
	}
	now, err := s.o.Store.Now(r.Context())
	if err != nil {
		writeError(w, http.StatusBadGateway, err)
		return
	}
	d := s.view(now, info)
	if s.o.Sessions != nil {
		d.Local = s.o.Sessions.Sessions(id)
	}
	d.LastRefusal = last
	writeJSON(w, http.StatusOK, d)
}

// lastRefusal is the last refusal of device, nil for none.
func (s *Server) lastRefusal(device gateway.DeviceID) *gateway.Refusal {
	if s.o.Refusals == nil {
		return nil
	}
	if r, ok := s.o.Refusals.Last(device); ok {
		return &r
	}
	return nil
}

// Device is the API's view of one device: the store's record, the state
// derived at the store's now (online, suspect or offline), and the
// sessions this gateway holds for it.
type Device struct {
	gateway.DeviceInfo
	State gateway.State         `json:"state"`
	Local []gateway.SessionView `json:"local_sessions,omitempty"`
	// LastRefusal is the last time a front end of this gateway refused
	// the device, and why (GET /v1/devices/{id} only).
	LastRefusal *gateway.Refusal `json:"last_refusal,omitempty"`
}

func (s *Server) view(now time.Time, info gateway.DeviceInfo) Device {
	lease, suspect := s.o.Timing()
	return Device{DeviceInfo: info, State: gateway.DeriveState(now, info.Deadline, lease, suspect)}
}

// DevicePage is the body of GET /v1/devices.
type DevicePage struct {
	Devices []Device `json:"devices"`
	Next    string   `json:"next"`
}

func (s *Server) devices(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	want := gateway.State(q.Get("state"))
	storeState := want
	switch want {
	case "", gateway.Online, gateway.Offline:
	case gateway.Suspect:
		storeState = gateway.Online
	default:
		writeError(w, http.StatusBadRequest, fmt.Errorf("state %q: want online, suspect or offline", want))
		return
	}
	limit, err := intParam(q.Get("limit"), 100, 1, 1000)
	if err != nil {
		writeError(w, http.StatusBadRequest, err)
		return
	}
	proto := q.Get("protocol")
	if _, err := gateway.ParseDeviceID(proto); proto != "" && err != nil {
		writeError(w, http.StatusBadRequest, fmt.Errorf("protocol %q: want coap, mqtt or an adapter's name", proto))
		return
	}
	page, err := s.o.Store.List(r.Context(), gateway.ListQuery{State: storeState, Prefix: q.Get("prefix"),
		Order: gateway.ListOrder(q.Get("order")), Cursor: q.Get("cursor"), Limit: limit})
	if errors.Is(err, gateway.ErrBadQuery) {
		writeError(w, http.StatusBadRequest, err)
		return
	}
	if err != nil {
		writeError(w, http.StatusBadGateway, err)
		return
	}
	now, err := s.o.Store.Now(r.Context())
	if err != nil {
		writeError(w, http.StatusBadGateway, err)
		return
	}
	out := DevicePage{Devices: []Device{}, Next: page.Next}
	for _, info := range page.Devices {
		d := s.view(now, info)
		if (want == "" || d.State == want || (want == gateway.Online && d.State == gateway.Suspect)) &&
			(proto == "" || gateway.SessionProtocol(info.Session) == proto) {
			out.Devices = append(out.Devices, d)
		}
	}
	writeJSON(w, http.StatusOK, out)
}

// GatewayList is the body of GET /v1/gateways: every gateway the store
// has heard, by ID, and the store's now (the clock of their contacts).
type GatewayList struct {
	Now      time.Time             `json:"now"`
	Gateways []gateway.GatewayInfo `json:"gateways"`
}

func (s *Server) gateways(w http.ResponseWriter, r *http.Request) {
	gws, err := s.o.Store.Gateways(r.Context())
	if err != nil {
		writeError(w, http.StatusBadGateway, err)
		return
	}
	now, err := s.o.Store.Now(r.Context())
	if err != nil {
		writeError(w, http.StatusBadGateway, err)
		return
	}
	if gws == nil {
		gws = []gateway.GatewayInfo{}
	}
	writeJSON(w, http.StatusOK, GatewayList{Now: now, Gateways: gws})
}

// SessionPage is the body of GET /v1/sessions.
type SessionPage struct {
	Total    int                   `json:"total"`
	Sessions []gateway.SessionView `json:"sessions"`
}

func (s *Server) sessions(w http.ResponseWriter, r *http.Request) {
	limit, err := intParam(r.URL.Query().Get("limit"), 1000, 1, 100000)
	if err != nil {
		writeError(w, http.StatusBadRequest, err)
		return
	}
	out := SessionPage{Total: s.o.Sessions.Len(), Sessions: make([]gateway.SessionView, 0, min(limit, 1024))}
	s.o.Sessions.Range(func(v gateway.SessionView) bool {
		out.Sessions = append(out.Sessions, v)
		return len(out.Sessions) < limit
	})
	writeJSON(w, http.StatusOK, out)
}

func intParam(s string, def, lo, hi int) (int, error) {
	if s == "" {
		return def, nil
	}
	n, err := strconv.Atoi(s)
	if err != nil || n < lo || n > hi {
		return 0, fmt.Errorf("limit %q: want a whole number from %d to %d", s, lo, hi)
	}
	return n, nil
}

type apiError struct {
	Error string `json:"error"`
	// LastRefusal: the last refusal of a device not found.
	LastRefusal *gateway.Refusal `json:"last_refusal,omitempty"`
}

func writeError(w http.ResponseWriter, code int, err error) {
	writeJSON(w, code, apiError{Error: err.Error()})
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(v)
}
