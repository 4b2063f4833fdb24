package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"golang.org/x/sync/errgroup"

	"github.com/fleetgate/fleetgate/configs"
	"github.com/fleetgate/fleetgate/gateway"
	"github.com/fleetgate/fleetgate/runner"
)

// cmdRunner runs only the expiry runner, against the Redis store (the
// embedded store lives in a gateway's locked state file, whose own runner
// does the work). Several runner processes share the shards.
func cmdRunner(ctx context.Context, args []string, _, stderr io.Writer) (err error) {
	fs, path := newFlags("runner", "runner [-c FILE] [--owner NAME] [--metrics HOST:PORT]", stderr)
	owner := fs.String("owner", "", "lock owner name (default: <gateway.id>/runner/<pid>)")
	metricsAddr := fs.String("metrics", "", "serve /healthz, /metrics and /v1/status on this address (e.g. 127.0.0.1:9181)")
	cfg, err := parseAndLoad(fs, args, path)
	if err != nil {
		return err
	}
	if cfg.Store.Backend != configs.BackendRedis {
		return fmt.Errorf("store.backend is %q: the runner command works on the redis store only (with the embedded store, `fleetgate run` runs the runner itself)", cfg.Store.Backend)
	}
	log, _ := newLogger(cfg.Log, stderr)
	if *owner == "" {
		*owner = fmt.Sprintf("%s/runner/%d", cfg.Gateway.ID, os.Getpid())
	}
	log = log.With("gateway", cfg.Gateway.ID, "owner", *owner)
	store, err := openStore(ctx, cfg, nil, log)
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, store.Close()) }()
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	r := runner.New(store, runner.Options{
		Owner: *owner, Interval: cfg.Runner.Interval.Std(), Batch: cfg.Runner.Batch,
		LockTTL: cfg.Runner.LockTTL.Std(), Clock: gateway.SystemClock{}, Logger: log, Registerer: reg,
	})
	pub, err := newPublisher(cfg, store, *owner, log)
	if err != nil {
		return err
	}
	if addr := *metricsAddr; addr != "" {
		stop, err := serveRunnerMetrics(addr, reg, r, log)
		if err != nil {
			return err
		}
		defer stop()
	}
	if pub == nil {
		return r.Run(ctx)
	}
	var g errgroup.Group
	g.Go(func() error { return r.Run(ctx) })
	g.Go(func() error { return pub.Run(ctx) })
	return g.Wait()
}

// serveRunnerMetrics serves /healthz, /metrics and /v1/status (the
// runner's status) for a runner-only process.
func serveRunnerMetrics(addr string, reg *prometheus.Registry, r *runner.Runner, log *slog.Logger) (stop func(), err error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("runner metrics: listen %s: %w", addr, err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { fmt.Fprintln(w, "ok") })
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	mux.HandleFunc("GET /v1/status", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_ = printJSON(w, map[string]any{"runner": r.Status()})
	})
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := srv.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
			log.Error("runner metrics server stopped", "err", err)
		}
	}()
	log.Info("runner metrics listening", "addr", ln.Addr().String())
	return func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(ctx)
		<-done
	}, nil
}
