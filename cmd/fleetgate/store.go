package main

import (
	"context"
	"log/slog"

	bolt "go.etcd.io/bbolt"

	"github.com/fleetgate/fleetgate/configs"
	"github.com/fleetgate/fleetgate/gateway"
	"github.com/fleetgate/fleetgate/store/embedded"
	"github.com/fleetgate/fleetgate/store/redisstore"
)

// openStore opens the configured store. The embedded store lives in db;
// the Redis store dials its own client. With background (run), a Redis
// that does not answer at start is retried behind the returned store,
// and a shard-count mismatch found then is sent to fatal; without it
// (runner), openStore waits until Redis answers or ctx ends.
func openStore(ctx context.Context, cfg configs.Config, db *bolt.DB, log *slog.Logger, background bool, fatal chan<- error) (gateway.Store, error) {
	if cfg.Store.Backend == configs.BackendEmbedded {
		s, err := embedded.Open(db, embedded.Options{
			Shards: cfg.Presence.Shards, EventsMaxLen: eventsPerShard(cfg), Logger: log,
			GatewayGrace: cfg.Presence.GatewayGrace.Std(), GatewayRecheck: cfg.Uplink.FlushInterval.Std(),
			GatewayHorizon: cfg.Presence.Lease.Std() + cfg.Presence.GatewayGrace.Std(), GatewayLost: cfg.Presence.Lease.Std(),
			ReapGap: cfg.ReapGap(),
		})
		if err != nil {
			return nil, err
		}
		return s, nil
	}
	rc := cfg.Store.Redis
	// go-redis has one process-wide logger: its lines go through ours.
	redisstore.UseLogger(log)
	var tlsOptions *redisstore.TLSOptions
	if rc.RedisTLS() {
		tlsOptions = &redisstore.TLSOptions{CAFile: rc.TLSCAFile, ServerName: rc.TLSServerName, CertFile: rc.TLSCertFile, KeyFile: rc.TLSKeyFile}
	}
	s, err := redisstore.Dial(ctx, redisstore.DialConfig{
		Addrs: rc.Addrs, Username: rc.Username, Password: rc.Password, TLS: tlsOptions,
		Options: redisstore.Options{
			Prefix: rc.KeyPrefix, Shards: cfg.Presence.Shards, EventsMaxLen: eventsPerShard(cfg), Logger: log,
			GatewayGrace: cfg.Presence.GatewayGrace.Std(), GatewaySilence: cfg.GatewaySilence(), GatewayLost: cfg.Presence.Lease.Std(),
			GatewayRecheck: cfg.Uplink.FlushInterval.Std(), GatewayHorizon: cfg.Presence.Lease.Std() + cfg.Presence.GatewayGrace.Std(),
			ReapGap: cfg.ReapGap(), WaitReplicas: rc.WaitReplicas,
		},
		Background: background,
		OnFatal:    func(err error) { fatal <- err },
		RetryMax:   cfg.UplinkProbeMax(),
	})
	if err != nil {
		return nil, err
	}
	return s, nil
}

func eventsPerShard(cfg configs.Config) int64 { return int64(cfg.Events.MaxLen / cfg.Presence.Shards) }
