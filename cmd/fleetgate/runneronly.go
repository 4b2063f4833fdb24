package main

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/coreos/go-systemd/v22/daemon"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"golang.org/x/sync/errgroup"

	"github.com/fleetgate/fleetgate/admin"
	"github.com/fleetgate/fleetgate/configs"
	"github.com/fleetgate/fleetgate/gateway"
	"github.com/fleetgate/fleetgate/runner"
)

// cmdRunner runs only the expiry runner, against the Redis store (the
// embedded store lives in a gateway's locked state file, whose own runner
// does the work). Several runner processes share the shards.
func cmdRunner(ctx context.Context, args []string, _, stderr io.Writer) (err error) {
	fs, path := newFlags("runner", "runner [-c FILE] [--owner NAME] [--metrics HOST:PORT]")
	owner := fs.String("owner", "", "lock owner name (default: <gateway.id>/runner/<pid>)")
	metricsAddr := fs.String("metrics", "", "serve the admin API (/healthz, /readyz, /metrics, /v1/...) on this address (e.g. 127.0.0.1:9181), with the token, TLS and insecure of listen.admin")
	cfg, err := parseAndLoad(fs, args, path)
	if err != nil {
		return err
	}
	if cfg.Store.Backend != configs.BackendRedis {
		return configError{fmt.Errorf("store.backend is %q: the runner command works on the redis store only (with the embedded store, `fleetgate run` runs the runner itself)", cfg.Store.Backend)}
	}
	// the same API as the gateway's, with the same protection
	var token string
	var tlsConf *tls.Config
	if *metricsAddr != "" {
		if err := cfg.Listen.Admin.CheckExposure(*metricsAddr); err != nil {
			return configError{fmt.Errorf("runner --metrics: %w", err)}
		}
		if token, tlsConf, err = adminSecurity(cfg.Listen.Admin); err != nil {
			return configError{err}
		}
	}
	log, _ := newLogger(cfg.Log, stderr)
	for _, w := range adminWarnings(cfg.Listen.Admin, "runner --metrics", *metricsAddr) {
		log.Warn(w)
	}
	if *owner == "" {
		*owner = fmt.Sprintf("%s/runner/%d", cfg.Gateway.ID, os.Getpid())
	}
	log = log.With("gateway", cfg.Gateway.ID)
	store, err := openStore(ctx, cfg, nil, log, false, nil)
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, store.Close()) }()
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	registerProcessMetrics(reg, func() configs.Config { return cfg }, nil)
	timing := func() (time.Duration, time.Duration) {
		return cfg.Presence.Lease.Std(), cfg.Presence.SuspectAfter.Std()
	}
	reg.MustRegister(newRunnerCoverage(store), newFleetCounts(store, timing))
	r := runner.New(store, runner.Options{
		Owner: *owner, Interval: cfg.Runner.Interval.Std(), Batch: cfg.Runner.Batch,
		LockTTL: cfg.Runner.LockTTL.Std(), Clock: gateway.SystemClock{}, Logger: log, Registerer: reg,
	})
	pub, err := newPublisher(cfg, store, *owner, nil, log, reg)
	if err != nil {
		return err
	}
	if addr := *metricsAddr; addr != "" {
		started := time.Now()
		srv, err := admin.Listen(admin.Options{
			Addr: addr, Store: store, Gatherer: reg, Logger: log, Token: token, TLS: tlsConf,
			Timing: timing,
			Status: func() admin.Status {
				st := admin.Status{
					Gateway: cfg.Gateway.ID, Version: version, StartedAt: started, Store: cfg.Store.Backend,
					Shards: cfg.Presence.Shards, Runner: r.Status(), Adapters: []any{}, Bounds: cfg.Bounds(),
				}
				if pub != nil {
					st.Publisher = pub.Stats()
				}
				return st
			},
		})
		if err != nil {
			return err
		}
		go func() {
			if err := srv.Serve(); err != nil {
				log.Error("admin api stopped", "err", err)
			}
		}()
		srv.SetReady(true)
		log.Info("admin api listening", "addr", srv.Addr().String())
		defer func() {
			sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
			defer cancel()
			_ = srv.Shutdown(sctx)
		}()
	}
	status := func() string { return runnerStatusLine(r.Status(), store.Shards()) }
	var g errgroup.Group
	g.Go(func() error { return r.Run(ctx) })
	if pub != nil {
		g.Go(func() error { return pub.Run(ctx) })
	}
	stalled := func(now time.Time, limit time.Duration) string { return runnerStalled(r, now, limit) }
	if w := newWatchdog(log, stalled, status); w != nil {
		g.Go(func() error { return w.run(ctx) })
	}
	sdNotify(log, daemon.SdNotifyReady+"\nSTATUS="+status())
	stopping := context.AfterFunc(ctx, func() {
		sdNotify(log, daemon.SdNotifyStopping+"\nSTATUS=stopping: releasing the shard leases")
	})
	defer stopping()
	return g.Wait()
}
