package main

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"strings"
	"sync/atomic"
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
	if cfg.Store.Backend == configs.BackendEmbedded {
		s, err := embedded.Open(db, embedded.Options{Shards: cfg.Presence.Shards, EventsMaxLen: eventsPerShard(cfg), Logger: log})
		return openedStore{Store: s}, err
	}
	return retryRedis(ctx, cfg, log)
}

func eventsPerShard(cfg configs.Config) int64 { return int64(cfg.Events.MaxLen / cfg.Presence.Shards) }

// openRedis makes one attempt at the Redis store.
func openRedis(ctx context.Context, cfg configs.Config, log *slog.Logger) (openedStore, error) {
	c, err := newRedisClient(ctx, cfg.Store.Redis)
	if err != nil {
		return openedStore{}, err
	}
	s, err := redisstore.Open(ctx, c, redisstore.Options{
		Prefix: cfg.Store.Redis.KeyPrefix, Shards: cfg.Presence.Shards, EventsMaxLen: eventsPerShard(cfg), Logger: log,
	})
	if err != nil {
		c.Close()
		return openedStore{}, err
	}
	return openedStore{Store: s, client: c}, nil
}

// retryRedis calls openRedis with jittered backoff (100 ms to 10 s) until
// it succeeds, the shard layout mismatches, or ctx ends.
func retryRedis(ctx context.Context, cfg configs.Config, log *slog.Logger) (openedStore, error) {
	backoff := 100 * time.Millisecond
	for attempt := 1; ; attempt++ {
		s, err := openRedis(ctx, cfg, log)
		if err == nil || errors.Is(err, gateway.ErrShardMismatch) {
			return s, err
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

// openGatewayStore is openStore for `run`: when Redis does not answer at
// start, the gateway starts all the same on a lateStore, serving devices
// into the outbox while Redis is retried in the background. A shard-count
// mismatch found then is sent to fatal.
func openGatewayStore(ctx context.Context, cfg configs.Config, db *bolt.DB, log *slog.Logger, fatal chan<- error) (gateway.Store, error) {
	if cfg.Store.Backend == configs.BackendEmbedded {
		return openStore(ctx, cfg, db, log)
	}
	first, cancel := context.WithTimeout(ctx, 5*time.Second)
	s, err := openRedis(first, cfg, log)
	cancel()
	if err == nil || errors.Is(err, gateway.ErrShardMismatch) {
		return s, err
	}
	log.Warn("redis store not reachable at start; serving devices into the outbox and retrying", "err", err)
	octx, cancelOpen := context.WithCancel(ctx)
	l := &lateStore{shards: cfg.Presence.Shards, done: make(chan struct{}), cancel: cancelOpen}
	go func() {
		defer close(l.done)
		s, err := retryRedis(octx, cfg, log)
		switch {
		case err == nil:
			l.cur.Store(&s)
			log.Info("redis store reachable; opened")
		case errors.Is(err, gateway.ErrShardMismatch):
			fatal <- err
		}
	}()
	return l, nil
}

// lateStore stands for the Redis store until Redis has answered once:
// until then every call fails with gateway.ErrUnavailable, which the
// uplink answers by buffering in the outbox, the runner by retrying.
type lateStore struct {
	shards int
	cur    atomic.Pointer[openedStore]
	done   chan struct{} // closed when the background opener has ended
	cancel func()        // ends the background opener
}

var (
	_ gateway.Store        = (*lateStore)(nil)
	_ gateway.MultiApplier = (*lateStore)(nil)
)

var errNotYet = fmt.Errorf("redis store not opened yet: %w", gateway.ErrUnavailable)

func (l *lateStore) store() (gateway.Store, error) {
	if s := l.cur.Load(); s != nil {
		return s.Store, nil
	}
	return nil, errNotYet
}

func (l *lateStore) Shards() int { return l.shards }

func (l *lateStore) Apply(ctx context.Context, shard int, b gateway.Batch) (gateway.ApplyResult, error) {
	s, err := l.store()
	if err != nil {
		return gateway.ApplyResult{}, err
	}
	return s.Apply(ctx, shard, b)
}

func (l *lateStore) ApplyShards(ctx context.Context, batches []gateway.ShardBatch) []gateway.ShardResult {
	s, err := l.store()
	if m, ok := s.(gateway.MultiApplier); ok && err == nil {
		return m.ApplyShards(ctx, batches)
	}
	out := make([]gateway.ShardResult, len(batches))
	for i, b := range batches {
		if err != nil {
			out[i].Err = err
			continue
		}
		out[i].Result, out[i].Err = s.Apply(ctx, b.Shard, b.Batch)
	}
	return out
}

func (l *lateStore) Reap(ctx context.Context, shard int, limit int) (gateway.ReapResult, error) {
	s, err := l.store()
	if err != nil {
		return gateway.ReapResult{}, err
	}
	return s.Reap(ctx, shard, limit)
}

func (l *lateStore) Device(ctx context.Context, id gateway.DeviceID) (gateway.DeviceInfo, error) {
	s, err := l.store()
	if err != nil {
		return gateway.DeviceInfo{}, err
	}
	return s.Device(ctx, id)
}

func (l *lateStore) List(ctx context.Context, q gateway.ListQuery) (gateway.ListPage, error) {
	s, err := l.store()
	if err != nil {
		return gateway.ListPage{}, err
	}
	return s.List(ctx, q)
}

func (l *lateStore) Events(ctx context.Context, shard int, after string, limit int) ([]gateway.Event, error) {
	s, err := l.store()
	if err != nil {
		return nil, err
	}
	return s.Events(ctx, shard, after, limit)
}

func (l *lateStore) AcquireShard(ctx context.Context, shard int, owner string, ttl time.Duration) (bool, error) {
	s, err := l.store()
	if err != nil {
		return false, err
	}
	return s.AcquireShard(ctx, shard, owner, ttl)
}

func (l *lateStore) ReleaseShard(ctx context.Context, shard int, owner string) error {
	s, err := l.store()
	if err != nil {
		return err
	}
	return s.ReleaseShard(ctx, shard, owner)
}

func (l *lateStore) Now(ctx context.Context) (time.Time, error) {
	s, err := l.store()
	if err != nil {
		return time.Time{}, err
	}
	return s.Now(ctx)
}

// Close ends the background opener and closes the store it opened, if any.
func (l *lateStore) Close() error {
	l.cancel()
	<-l.done
	if s := l.cur.Load(); s != nil {
		return s.Close()
	}
	return nil
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
