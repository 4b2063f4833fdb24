package redisstore

import (
	"cmp"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/fleetgate/fleetgate/gateway"
)

// Defaults of DialConfig.
const (
	// DefaultFirstAttempt bounds Dial's first attempt when Background is
	// set.
	DefaultFirstAttempt = 5 * time.Second
	// retryMin and DefaultRetryMax bound the jittered backoff between
	// attempts.
	retryMin        = 100 * time.Millisecond
	DefaultRetryMax = 10 * time.Second
	// callTimeout bounds every command: a flush that cannot reach Redis
	// should fail within a couple of seconds and go to the outbox, and a
	// hung Cluster node should not hold the runner's other shards long.
	callTimeout = 2 * time.Second
	// probeTimeout bounds the INFO cluster probe of a single address.
	probeTimeout = 3 * time.Second
)

// DialConfig is what Dial needs: where Redis is, how to log in, and the
// store's Options.
type DialConfig struct {
	// Addrs: one address is a standalone server or a Cluster node (Dial
	// asks it with INFO cluster); several are Cluster seed nodes.
	Addrs              []string
	Username, Password string
	// TLS, when set, turns TLS on for every connection (TLSConfig builds
	// it; a file that cannot be used is an error of Dial's, naming its
	// store.redis key).
	TLS *TLSOptions
	// tls is what TLSConfig built from TLS.
	tls *tls.Config

	Options

	// Background: when Redis does not answer within FirstAttempt, Dial
	// returns the store at once instead of waiting. Until a background
	// retry opens it, every call fails with gateway.ErrUnavailable, which
	// the uplink answers by buffering in the outbox and the runner by
	// retrying. A shard-count mismatch found then goes to OnFatal.
	Background   bool
	FirstAttempt time.Duration
	OnFatal      func(error)
	// RetryMax caps the backoff between attempts (default
	// DefaultRetryMax): a gateway started during an outage reaches the
	// store at most about that long after it answers again, so it must
	// be well inside lease + gateway grace (the uplink's probe bound).
	RetryMax time.Duration
}

// Dial connects to Redis and opens the store, which owns its client:
// Close closes it. It retries with jittered backoff (100 ms to RetryMax)
// until Redis answers once (the P:meta check needs the server), the shard
// layout mismatches (gateway.ErrShardMismatch, final), or ctx ends; with
// Background it returns after the first attempt (see DialConfig).
func Dial(ctx context.Context, cfg DialConfig) (*Store, error) {
	if len(cfg.Addrs) == 0 {
		return nil, errors.New("redisstore: dial: no address")
	}
	if cfg.TLS != nil {
		var err error
		if cfg.tls, err = TLSConfig(*cfg.TLS); err != nil {
			return nil, err
		}
	}
	s, err := newStore(cfg.Options)
	if err != nil {
		return nil, err
	}
	if !cfg.Background {
		c, err := s.retry(ctx, cfg)
		if err != nil {
			return nil, err
		}
		s.closeFn = c.Close
		return s, nil
	}
	first, cancel := context.WithTimeout(ctx, cmp.Or(cfg.FirstAttempt, DefaultFirstAttempt))
	c, err := s.attempt(first, cfg)
	cancel()
	switch {
	case err == nil:
		s.closeFn = c.Close
		return s, nil
	case errors.Is(err, gateway.ErrShardMismatch):
		return nil, err
	}
	s.log.Warn("redis not reachable at start; serving devices into the outbox and retrying", "addrs", strings.Join(cfg.Addrs, ","), "err", err)
	bctx, stop := context.WithCancel(context.WithoutCancel(ctx))
	var (
		done   = make(chan struct{})
		mu     sync.Mutex
		client redis.UniversalClient
	)
	go func() {
		defer close(done)
		c, err := s.retry(bctx, cfg)
		switch {
		case err == nil:
			mu.Lock()
			client = c
			mu.Unlock()
			s.log.Info("redis reachable; store opened")
		case errors.Is(err, gateway.ErrShardMismatch) && cfg.OnFatal != nil:
			cfg.OnFatal(err)
		}
	}()
	s.closeFn = func() error {
		stop()
		<-done
		mu.Lock()
		defer mu.Unlock()
		if client != nil {
			return client.Close()
		}
		return nil
	}
	return s, nil
}

// retry calls attempt with jittered backoff until it succeeds, the shard
// layout mismatches, or ctx ends.
func (s *Store) retry(ctx context.Context, cfg DialConfig) (redis.UniversalClient, error) {
	backoff, most := retryMin, cfg.RetryMax
	if most <= 0 {
		most = DefaultRetryMax
	}
	backoff = min(backoff, most)
	for n := 1; ; n++ {
		c, err := s.attempt(ctx, cfg)
		if err == nil || errors.Is(err, gateway.ErrShardMismatch) {
			return c, err
		}
		s.log.Warn("redis not reachable yet; retrying", "addrs", strings.Join(cfg.Addrs, ","), "attempt", n, "err", err)
		t := time.NewTimer(backoff/2 + rand.N(backoff/2+1))
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, fmt.Errorf("redisstore: dial: %w (last error: %v)", ctx.Err(), err)
		case <-t.C:
		}
		backoff = min(2*backoff, most)
	}
}

// attempt makes one client and opens the store with it; on failure the
// client is closed.
func (s *Store) attempt(ctx context.Context, cfg DialConfig) (redis.UniversalClient, error) {
	c, err := newClient(ctx, cfg)
	if err != nil {
		return nil, err
	}
	if err := s.open(ctx, c); err != nil {
		c.Close()
		return nil, err
	}
	return c, nil
}

// newClient returns a Cluster client when there are several addresses or
// the single one is a Cluster node (INFO cluster says cluster_enabled:1),
// else a standalone client.
func newClient(ctx context.Context, cfg DialConfig) (redis.UniversalClient, error) {
	// One dial per attempt: go-redis dials 5 times, 100 ms apart, before
	// a command fails, and a Cluster pipeline tries a node up to 4 times.
	// A killed master then held every flush for 3.3 s, the healthy
	// shards' writes with it (their commands ran, the call did not
	// return), and the evidence queued behind it outlived its lease. The
	// uplink retries on its own (probe, outbox); refused dials must fail
	// fast.
	opts := &redis.UniversalOptions{
		Addrs: cfg.Addrs, Username: cfg.Username, Password: cfg.Password, TLSConfig: cfg.tls,
		DialTimeout: callTimeout, ReadTimeout: callTimeout, WriteTimeout: callTimeout, MaxRetries: 1,
		DialerRetries: 1, ContextTimeoutEnabled: true,
	}
	if len(cfg.Addrs) == 1 {
		probe := redis.NewClient(opts.Simple())
		pctx, cancel := context.WithTimeout(ctx, probeTimeout)
		info, err := probe.Info(pctx, "cluster").Result()
		cancel()
		probe.Close()
		if err != nil {
			return nil, fmt.Errorf("redisstore: dial %s: %w: %w", cfg.Addrs[0], gateway.ErrUnavailable, err)
		}
		opts.IsClusterMode = strings.Contains(info, "cluster_enabled:1")
	}
	if !opts.IsClusterMode && len(opts.Addrs) == 1 {
		return redis.NewClient(opts.Simple()), nil
	}
	// go-redis reloads a Cluster's slot map on MOVED, but not when a
	// master stops answering, and otherwise only every 60 s: after a
	// master is killed and its replica promoted, every call to its shards
	// would fail for up to a minute (seen in the fault suite). The map is
	// one CLUSTER SLOTS, so ask for it at most every clusterReload.
	co := opts.Cluster()
	co.ClusterStateReloadInterval = clusterReload
	return redis.NewClusterClient(co), nil
}

// clusterReload is how often a Cluster client refreshes its slot map
// while it is used.
const clusterReload = time.Second
