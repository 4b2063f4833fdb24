package main

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
	bolt "go.etcd.io/bbolt"

	"github.com/fleetgate/fleetgate/configs"
	"github.com/fleetgate/fleetgate/gateway"
	"github.com/fleetgate/fleetgate/uplink/embedded"
	redisstore "github.com/fleetgate/fleetgate/uplink/redis"
)

// openedStore is the store with what must be closed after it.
type openedStore struct {
	gateway.Store
	client redis.UniversalClient // nil for the embedded store
}

func (s openedStore) Close() error {
	err := s.Store.Close()
	if s.client != nil {
		err = errors.Join(err, s.client.Close())
	}
	return err
}

// openStore opens the configured store. The Redis store is retried with
// jittered backoff until it answers once (its P:meta shard check needs
// the server) or ctx ends; a shard-count mismatch is final.
func openStore(ctx context.Context, cfg configs.Config, db *bolt.DB, log *slog.Logger) (openedStore, error) {
	perShard := int64(cfg.Events.MaxLen / cfg.Presence.Shards)
	if cfg.Store.Backend == configs.BackendEmbedded {
		s, err := embedded.Open(db, embedded.Options{Shards: cfg.Presence.Shards, EventsMaxLen: perShard, Logger: log})
		return openedStore{Store: s}, err
	}
	backoff := 100 * time.Millisecond
	for attempt := 1; ; attempt++ {
		c, err := newRedisClient(ctx, cfg.Store.Redis)
		if err == nil {
			var s *redisstore.Store
			s, err = redisstore.Open(ctx, c, redisstore.Options{
				Prefix: cfg.Store.Redis.KeyPrefix, Shards: cfg.Presence.Shards, EventsMaxLen: perShard, Logger: log,
			})
			if err == nil {
				return openedStore{Store: s, client: c}, nil
			}
			c.Close()
			if errors.Is(err, gateway.ErrShardMismatch) {
				return openedStore{}, err
			}
		}
		log.Warn("redis store not reachable yet; retrying", "addrs", strings.Join(cfg.Store.Redis.Addrs, ","), "attempt", attempt, "err", err)
		t := time.NewTimer(backoff/2 + rand.N(backoff/2+1))
		select {
		case <-ctx.Done():
			t.Stop()
			return openedStore{}, fmt.Errorf("open redis store: %w (last error: %v)", ctx.Err(), err)
		case <-t.C:
		}
		backoff = min(2*backoff, 10*time.Second)
	}
}

// newRedisClient returns a cluster client when there are several
// addresses or the single one is a cluster node (INFO cluster says
// cluster_enabled:1), else a standalone client.
func newRedisClient(ctx context.Context, rc configs.RedisConfig) (redis.UniversalClient, error) {
	// Short timeouts and one retry: a flush that cannot reach Redis should
	// fail within a couple of seconds and go to the outbox, and a hung
	// Cluster node should not hold the runner's other shards for long.
	opts := &redis.UniversalOptions{
		Addrs: rc.Addrs, Username: rc.Username, Password: rc.Password,
		DialTimeout: 2 * time.Second, ReadTimeout: 2 * time.Second, WriteTimeout: 2 * time.Second, MaxRetries: 1,
		ContextTimeoutEnabled: true,
	}
	if rc.TLS {
		opts.TLSConfig = &tls.Config{MinVersion: tls.VersionTLS12}
	}
	if len(rc.Addrs) == 1 {
		probe := redis.NewClient(opts.Simple())
		pctx, cancel := context.WithTimeout(ctx, 3*time.Second)
		info, err := probe.Info(pctx, "cluster").Result()
		cancel()
		probe.Close()
		if err != nil {
			return nil, fmt.Errorf("redis %s: %w", rc.Addrs[0], err)
		}
		opts.IsClusterMode = strings.Contains(info, "cluster_enabled:1")
	}
	return redis.NewUniversalClient(opts), nil
}
