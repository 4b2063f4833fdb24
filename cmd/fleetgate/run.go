package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/fleetgate/fleetgate/internal/statefile"
	"github.com/fleetgate/fleetgate/store/embedded"

	"github.com/coreos/go-systemd/v22/daemon"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"golang.org/x/sync/errgroup"

	"github.com/fleetgate/fleetgate/admin"
	"github.com/fleetgate/fleetgate/auth"
	"github.com/fleetgate/fleetgate/canary"
	"github.com/fleetgate/fleetgate/configs"
	"github.com/fleetgate/fleetgate/events/mqttpub"
	"github.com/fleetgate/fleetgate/gateway"
	"github.com/fleetgate/fleetgate/internal/identity"
	"github.com/fleetgate/fleetgate/internal/refusal"
	"github.com/fleetgate/fleetgate/protocols/adapter"
	"github.com/fleetgate/fleetgate/protocols/mqtt"
	"github.com/fleetgate/fleetgate/runner"
	"github.com/fleetgate/fleetgate/uplink"
)

// stateFile is the gateway's bbolt file in gateway.state_dir: epoch,
// outbox and (with store.backend: embedded) the presence store.
const stateFile = "fleetgate.db"

// stateMigrations is every change of the state file's format, oldest
// first, from the owners of its buckets (internal/statefile).
var stateMigrations = slices.Concat(uplink.Migrations, embedded.Migrations)

// shutdownGrace bounds the final flush at SIGTERM.
const shutdownGrace = 10 * time.Second

// sweepEvery is how often the session table drops sessions whose local
// lease ran out.
const sweepEvery = 5 * time.Second

func cmdRun(ctx context.Context, args []string, _, stderr io.Writer) error {
	fs, path := newFlags("run", "run [-c FILE]")
	cfg, err := parseAndLoad(fs, args, path)
	if err != nil {
		return err
	}
	log, level := newLogger(cfg.Log, stderr)
	g := &gatewayProcess{path: *path, cfg: cfg, log: log, level: level}
	return g.run(ctx)
}

// gatewayProcess is one `fleetgate run`: its parts, and the order in which
// they start and stop.
type gatewayProcess struct {
	path  string
	log   *slog.Logger
	level *slog.LevelVar

	mu  sync.Mutex
	cfg configs.Config

	epoch    uint64
	started  time.Time
	store    gateway.Store
	fatal    chan error // a part that cannot go on (a late shard mismatch)
	up       *uplink.Uplink
	table    *gateway.Table
	runner   *runner.Runner
	pub      *mqttpub.Publisher // nil without events.mqtt.url
	fronts   []frontEnd
	adapters *adapter.Host    // also in fronts
	creds    *auth.Reloadable // nil without auth.devices_file
	data     *dataPath
	mqtt     *mqtt.Server     // nil without an MQTT listener (also in fronts)
	clients  *auth.Reloadable // auth.clients' passwords; nil without any
	cert     *certificate     // nil without listen.mqtt.tls
	admin    *admin.Server
	// canary is nil with canary.enabled off; canaryID is its device,
	// canaryKey its PSK when it speaks DTLS (else nil).
	canary    *canary.Canary
	canaryKey []byte
	canaryID  gateway.DeviceID
	reloads   *reloads // fleetgate_reloads_total, fleetgate_reload_last_success
	refusals  *refusal.Reporter

	refused atomic.Pointer[string] // why the last reload was refused; nil after one that was not
	// unread is adapters for the uplink's coverage, which runs (a full
	// queue flushes from Enqueue) before openAdapters sets it
	unread atomic.Pointer[adapter.Host]
}

func (g *gatewayProcess) config() configs.Config {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.cfg
}

func (g *gatewayProcess) run(ctx context.Context) (err error) {
	cfg := g.cfg
	g.started = time.Now()
	if err := os.MkdirAll(cfg.Gateway.StateDir, 0o750); err != nil {
		return fmt.Errorf("state dir: %w", err)
	}
	db, err := statefile.Open(filepath.Join(cfg.Gateway.StateDir, stateFile), g.log, stateMigrations)
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, statefile.Close(db)) }()
	if g.epoch, err = identity.NextEpoch(db, time.Now()); err != nil {
		return err
	}
	log := g.log.With("gateway", cfg.Gateway.ID)
	log.Info("starting", "version", version, "epoch", g.epoch, "store", cfg.Store.Backend, "shards", cfg.Presence.Shards)
	for _, w := range securityWarnings(cfg) {
		log.Warn(w)
	}

	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	registerProcessMetrics(reg, g.config, g.servedCert)
	g.reloads = newReloads(reg)

	if g.refusals, err = refusal.New(log, reg); err != nil {
		return err
	}
	g.fatal = make(chan error, 1)
	if g.store, err = openStore(ctx, cfg, db, log, true, g.fatal); err != nil {
		return err
	}
	defer func() { err = errors.Join(err, g.store.Close()) }()

	boot, err := uplink.NewSystemBoot(configs.TestBootID(os.Environ()))
	if err != nil {
		return err
	}
	outbox, err := uplink.OpenOutbox(db, uplink.OutboxOptions{
		Shards: cfg.Presence.Shards, MaxSessions: cfg.Uplink.OutboxMaxSessions, Logger: log,
		Clock: gateway.SystemClock{}, Boot: boot,
	})
	if err != nil {
		return err
	}
	keepLapsed := 2 * (cfg.Presence.Lease.Std() + cfg.Presence.GatewayGrace.Std())
	ledger, damaged, err := uplink.OpenLedger(filepath.Join(cfg.Gateway.StateDir, uplink.LedgerFile), time.Now(), keepLapsed)
	if err != nil {
		return err
	}
	if damaged {
		log.Warn("session ledger damaged: the sessions recorded after the damage are lost", "path", filepath.Join(cfg.Gateway.StateDir, uplink.LedgerFile))
	}
	if n := ledger.Inherited(); n > 0 {
		log.Info("session ledger read: the previous process's sessions are restored if the store loses its state", "sessions", n)
	}
	g.up = uplink.New(g.store, outbox, uplink.Options{
		Gateway: cfg.Gateway.ID, Epoch: g.epoch,
		Lease: cfg.Presence.Lease.Std(), FlushInterval: cfg.Uplink.FlushInterval.Std(), MaxBatch: cfg.Uplink.MaxBatch,
		KeepAlive: cfg.GatewayKeepAlive(), ProbeMax: cfg.UplinkProbeMax(), GatewayGrace: cfg.Presence.GatewayGrace.Std(),
		Sessions: func(fn func(gateway.SessionView) bool) { g.table.Restorable(fn) },
		Ledger:   ledger,
		Unread: func() time.Time {
			if h := g.unread.Load(); h != nil {
				return h.Unread()
			}
			return time.Time{}
		},
		Clock: gateway.SystemClock{}, Logger: log, Registerer: reg,
	})
	g.table = gateway.NewTable(g.up, gateway.TableOptions{
		Lease: cfg.Presence.Lease.Std(), RenewEvery: cfg.Presence.RenewEvery.Std(),
		MaxSessions: cfg.Presence.MaxSessions, MaxSessionsPerDevice: cfg.Limits.MaxSessionsPerDevice,
		MaxAnonymousDevices: cfg.Limits.AnonymousMaxDevices,
		LearnLease:          cfg.Presence.LearnLease,
		MaxLease:            cfg.Presence.MaxLease.Std(),
		KeepLapsed:          keepLapsed,
		Clock:               gateway.SystemClock{},
	})
	reg.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{
		Name: "fleetgate_session_limit_refusals_total",
		Help: "New sessions refused because their device had limits.max_sessions_per_device sessions.",
	}, func() float64 { return float64(g.table.SessionLimitRefusals()) }))
	reg.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{
		Name: "fleetgate_anonymous_limit_refusals_total",
		Help: "New anonymous devices refused because limits.anonymous_max_devices anonymous devices had sessions.",
	}, func() float64 { return float64(g.table.AnonymousLimitRefusals()) }))
	reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "fleetgate_anonymous_devices",
		Help: "Anonymous devices with a session in the gateway's session table.",
	}, func() float64 { return float64(g.table.AnonymousDevices()) }))
	reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "fleetgate_sessions",
		Help: "Device sessions in the gateway's session table (live on this gateway).",
	}, func() float64 { return float64(g.table.Len()) }))
	reg.MustRegister(newDeviceStates(g.table, g.timing))
	reg.MustRegister(newRunnerCoverage(g.store), newFleetCounts(g.store, g.timing))
	if cfg.Runner.Enabled {
		g.runner = runner.New(g.store, runner.Options{
			Owner: fmt.Sprintf("%s/%d", cfg.Gateway.ID, g.epoch), Interval: cfg.Runner.Interval.Std(),
			Batch: cfg.Runner.Batch, LockTTL: cfg.Runner.LockTTL.Std(),
			Clock: gateway.SystemClock{}, Logger: log, Registerer: reg,
		})
	}
	if g.pub, err = newPublisher(cfg, g.store, fmt.Sprintf("%s/%d", cfg.Gateway.ID, g.epoch), g.published, log, reg); err != nil {
		return err
	}
	if g.data, err = openDataPath(ctx, cfg, log, reg); err != nil {
		return err
	}
	defer func() { err = errors.Join(err, g.data.close()) }()
	g.canaryKey, g.canaryID = canaryKey(cfg), gateway.DeviceID(cfg.CanaryDevice())
	if err := g.openFrontEnds(cfg, log, reg); err != nil {
		return err
	}
	defer cleanupAdapters()
	if err := g.openAdapters(ctx, cfg, log, reg); err != nil {
		g.closeFrontEnds()
		return err
	}
	if cfg.Listen.Admin.HTTP != "" {
		token, tlsConf, err := adminSecurity(cfg.Listen.Admin)
		if err != nil {
			g.closeFrontEnds()
			return configError{err}
		}
		o := admin.Options{
			Addr: cfg.Listen.Admin.HTTP, Store: g.store, Sessions: g.table,
			Status: g.status, Timing: g.timing, Gatherer: reg, Logger: log,
			Token: token, TLS: tlsConf, Refusals: g.refusals,
			Forget: g.store, GatewayID: cfg.Gateway.ID, Profiling: cfg.Listen.Admin.Pprof,
		}
		if cfg.Listen.Admin.CredentialsAPI {
			o.Credentials = &credentialsAPI{g: g, log: log}
		}
		g.admin, err = admin.Listen(o)
		if err != nil {
			g.closeFrontEnds()
			return err
		}
		log.Info("admin api listening", "addr", g.admin.Addr().String())
	}
	return g.serve(ctx, log)
}

// serve runs the parts until ctx ends, then stops them in order: front
// ends first (no new evidence), then the uplink's final flush (to the
// store or the outbox, bounded by shutdownGrace), then the runner and the
// admin API. Live sessions get no leave: a deploy must not flap devices.
func (g *gatewayProcess) serve(ctx context.Context, log *slog.Logger) error {
	front, stopFront := context.WithCancel(context.WithoutCancel(ctx))
	back, stopBack := context.WithCancel(context.WithoutCancel(ctx))
	defer stopFront()
	defer stopBack()

	var fronts, backs errgroup.Group
	backs.Go(func() error { return g.up.Run(back) })
	if g.runner != nil {
		backs.Go(func() error { return g.runner.Run(back) })
	}
	if g.canary != nil {
		backs.Go(func() error { return g.canary.Run(back) })
	}
	if g.pub != nil {
		backs.Go(func() error { return g.pub.Run(back) })
	}
	backs.Go(func() error { return g.table.RunSweep(back, sweepEvery) })
	backs.Go(func() error { g.refusals.Run(back); return nil })
	if g.admin != nil {
		backs.Go(g.admin.Serve)
	}
	if w := newWatchdog(log, g.stalled, g.statusLine); w != nil {
		backs.Go(func() error { return w.run(back) })
	}
	for _, f := range g.fronts {
		fronts.Go(func() error { return f.Serve(front) })
	}
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)

	if g.admin != nil {
		g.admin.SetReady(true)
	}
	sdNotify(log, daemon.SdNotifyReady+"\nSTATUS="+g.statusLine())
	log.Info("ready")

	failed := make(chan error, 1)
	go func() { failed <- fronts.Wait() }()
	var runErr error
loop:
	for {
		select {
		case <-ctx.Done():
			log.Info("stopping", "cause", context.Cause(ctx))
			break loop
		case err := <-failed:
			runErr = fmt.Errorf("front end stopped: %w", err)
			failed <- nil
			break loop
		case err := <-g.fatal:
			runErr = err
			break loop
		case <-hup:
			sdNotify(log, daemon.SdNotifyReloading+"\n"+daemon.SdNotifyMonotonicUsec()+"\nSTATUS=reloading "+g.path)
			g.reload(ctx, log)
			sdNotify(log, daemon.SdNotifyReady+"\nSTATUS="+g.statusLine())
		}
	}
	sdNotify(log, daemon.SdNotifyStopping+"\nSTATUS=stopping: final flush")
	if g.admin != nil {
		g.admin.SetReady(false)
	}
	stopFront()
	g.closeFrontEnds()
	runErr = errors.Join(runErr, <-failed)

	flushCtx, cancel := context.WithTimeout(context.Background(), shutdownGrace)
	defer cancel()
	if err := g.up.Flush(flushCtx); err != nil {
		log.Warn("final flush incomplete; pending writes are in the outbox", "err", err)
	}
	stopBack()
	if g.admin != nil {
		_ = g.admin.Shutdown(flushCtx)
	}
	runErr = errors.Join(runErr, backs.Wait())
	log.Info("stopped", "sessions", g.table.Len())
	return runErr
}

// reload re-reads the configuration on SIGHUP. An invalid file keeps the
// old configuration; timings and the log level apply at once, anything
// else (listeners, store, shards, identity) needs a restart and says so.
// A refusal (of the file, the devices file or the certificate) stays in
// the STATUS= line until a reload without one.
func (g *gatewayProcess) reload(ctx context.Context, log *slog.Logger) {
	var why string // of a refusal
	defer func() {
		if why == "" {
			g.refused.Store(nil)
			return
		}
		line := time.Now().Format(time.TimeOnly) + ": " + why
		g.refused.Store(&line)
	}()
	next, err := configs.Load(g.path, os.Environ())
	if err != nil {
		why = err.Error()
		log.Error("reload refused; keeping the running configuration", "err", err)
		g.reloads.done(false)
		return
	}
	ok := true
	g.mu.Lock()
	old := g.cfg
	g.cfg = next
	g.mu.Unlock()
	setLevel(g.level, next.Log.Level)
	p := next.Presence
	g.table.SetTiming(p.Lease.Std(), p.RenewEvery.Std())
	g.table.SetLearning(p.LearnLease, p.MaxLease.Std())
	g.up.SetTiming(p.Lease.Std(), next.Uplink.FlushInterval.Std(), next.Uplink.MaxBatch)
	for _, f := range g.fronts {
		f.SetTiming(next.Timing())
	}
	if g.creds != nil && next.Auth.DevicesFile != "" {
		if err := g.creds.Reload(next.Auth.DevicesFile, leaseBounds(next)); err != nil {
			why = "devices file: " + err.Error()
			log.Error("devices file not reloaded; keeping the devices in use", "err", err)
			ok = false
		} else {
			log.Info("devices file reloaded", "path", next.Auth.DevicesFile, "devices", g.creds.Current().Len())
			g.revoke()
		}
	}
	if g.mqtt != nil {
		g.reloadClients(next, log)
	}
	if g.cert != nil {
		if err := g.cert.load(next.Listen.MQTT.CertFile, next.Listen.MQTT.KeyFile); err != nil {
			why = err.Error()
			log.Error("TLS certificate not reloaded; keeping the one in use", "err", err)
			ok = false
		}
	}
	g.reloadAdapters(ctx, old, next, log)
	if restartOnly(old) != restartOnly(next) {
		log.Warn("reloaded; changes to listeners, store, shards, gateway, runner, limits or anonymous access take effect at the next restart")
	}
	g.reloads.done(ok)
	log.Info("configuration reloaded", "lease", p.Lease, "renew_every", p.RenewEvery, "heartbeat_interval", p.HeartbeatInterval, "max_lease", p.MaxLease, "learn_lease", p.LearnLease)
}

// restartOnly is the part of the configuration a reload cannot apply.
func restartOnly(c configs.Config) string {
	c.Presence.Lease, c.Presence.RenewEvery, c.Presence.HeartbeatInterval, c.Presence.SuspectAfter = 0, 0, 0, 0
	c.Presence.MaxLease, c.Presence.LearnLease = 0, false
	c.Uplink.FlushInterval, c.Uplink.MaxBatch = 0, 0
	c.Log.Level = ""
	c.Plugins = configs.PluginsConfig{}
	c.Auth.DevicesFile = ""
	c.Auth.Clients = nil
	c.Listen.MQTT.CertFile, c.Listen.MQTT.KeyFile = "", ""
	out, _ := c.YAML()
	return string(out)
}

func (g *gatewayProcess) timing() (time.Duration, time.Duration) {
	p := g.config().Presence
	return p.Lease.Std(), p.SuspectAfter.Std()
}

func (g *gatewayProcess) status() admin.Status {
	cfg := g.config()
	st := admin.Status{
		Gateway: cfg.Gateway.ID, Epoch: g.epoch, Version: version, StartedAt: g.started,
		Store: cfg.Store.Backend, Shards: cfg.Presence.Shards, Sessions: g.table.Len(),
		Uplink: g.up.Status(), Adapters: g.adapterStatus(), Bounds: cfg.Bounds(),
	}
	if g.runner != nil {
		st.Runner = g.runner.Status()
	}
	if g.pub != nil {
		st.Publisher = g.pub.Stats()
	}
	if g.data != nil {
		st.Bridge = g.data.bridge.Status()
	}
	if g.canary != nil {
		st.Canary = g.canary.Status()
	}
	if certs := certificateExpiries(cfg, g.servedCert()); len(certs) > 0 {
		st.Certificates = certs
	}
	return st
}
