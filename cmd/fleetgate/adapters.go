package main

import (
	"context"
	"log/slog"
	"reflect"
	"time"

	plugin "github.com/hashicorp/go-plugin"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/fleetgate/fleetgate/configs"
	"github.com/fleetgate/fleetgate/gateway"
	"github.com/fleetgate/fleetgate/protocols/adapter"
)

var _ frontEnd = (*adapter.Host)(nil)

// adapterSpecs turns plugins.adapters into the host's specs.
func adapterSpecs(p configs.PluginsConfig) []adapter.Spec {
	out := make([]adapter.Spec, 0, len(p.Adapters))
	for _, a := range p.Adapters {
		out = append(out, adapter.Spec{
			Name:               a.Name,
			Path:               p.AdapterPath(a),
			SHA256:             a.SHA256,
			StartTimeout:       a.StartTimeout.Std(),
			Lease:              a.Lease.Std(),
			Devices:            a.Devices,
			MaxSessions:        a.Limits.MaxSessions,
			MaxDevices:         a.Limits.MaxDevices,
			MaxAddressSpace:    a.Limits.MaxAddressSpace,
			MaxOpenFiles:       a.Limits.MaxOpenFiles,
			EvidencePerSecond:  a.Limits.EvidencePerSecond,
			DataBytesPerSecond: a.Limits.DataBytesPerSecond,
			Config:             a.Config.JSON(),
		})
	}
	return out
}

// openAdapters creates the adapter host (always, so that a reload can add
// adapters), hands it the devices file (whose devices no adapter speaks
// for; a reload hands it over again with the front ends', revoke) and
// starts the configured adapters; it returns once each has completed its
// first attempt, so that their sessions exist before the gateway says it
// is ready. An adapter that fails to start does not stop the gateway: it
// is logged and retried with backoff.
func (g *gatewayProcess) openAdapters(ctx context.Context, cfg configs.Config, log *slog.Logger, reg prometheus.Registerer) error {
	h, err := adapter.New(g.table, adapter.Options{
		Lease: cfg.Presence.Lease.Std(), MaxLease: cfg.Presence.MaxLease.Std(), Data: g.data.bridge, Commands: g.data.bridge,
		Clock: gateway.SystemClock{}, Logger: log, Registerer: reg, Refusals: g.refusals,
		Tick: max(cfg.Uplink.FlushInterval.Std()/2, time.Millisecond),
	})
	if err != nil {
		return err
	}
	g.unread.Store(h)
	if g.creds != nil {
		h.SetCredentials(g.creds)
	}
	g.adapters = h
	g.fronts = append(g.fronts, h)
	if err := h.Apply(ctx, adapterSpecs(cfg.Plugins)); err != nil {
		log.Error("adapters not started; retrying with backoff", "err", err)
	}
	if n := len(cfg.Plugins.Adapters); n > 0 {
		log.Info("adapters started", "adapters", n)
	}
	return nil
}

// reloadAdapters applies a changed plugins section: new adapters start,
// removed ones stop, changed ones restart, the rest are untouched.
func (g *gatewayProcess) reloadAdapters(ctx context.Context, old, next configs.Config, log *slog.Logger) {
	if g.adapters == nil || reflect.DeepEqual(adapterSpecs(old.Plugins), adapterSpecs(next.Plugins)) {
		return
	}
	if err := g.adapters.Apply(ctx, adapterSpecs(next.Plugins)); err != nil {
		log.Error("adapters reloaded with errors; retrying with backoff", "err", err)
		return
	}
	log.Info("adapters reloaded", "adapters", len(next.Plugins.Adapters))
}

// cleanupAdapters kills any adapter process go-plugin still manages (a
// last resort behind Host.Close).
func cleanupAdapters() { plugin.CleanupClients() }

// adapterStatus lists the adapters for /v1/status.
func (g *gatewayProcess) adapterStatus() []any {
	out := []any{}
	if g.adapters == nil {
		return out
	}
	for _, s := range g.adapters.Status() {
		out = append(out, s)
	}
	return out
}
