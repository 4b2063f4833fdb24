package sim

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/fleetgate/fleetgate/gateway"
	"github.com/fleetgate/fleetgate/sim/check"
)

// Source is where the presence events come from, and what the store
// spent: a Redis store read directly, a gateway's admin API, or (in the
// benchmarks) another design.
type Source interface {
	// Events returns every event written at or after since.
	Events(ctx context.Context, since time.Time) ([]check.Event, error)
	// Counters reads the store's command and CPU counters; ok is false
	// when the source cannot tell.
	Counters(ctx context.Context) (c Counters, ok bool, err error)
	Close() error
}

// Counters are a store's cumulative work.
type Counters struct {
	// Calls are the commands executed (INFO commandstats, the commands
	// scripts run included), summed over every master.
	Calls int64
	// CPU is the store's CPU time (used_cpu_user + used_cpu_sys).
	CPU time.Duration
}

// RedisSource reads the `{P:s}:events` streams of every shard of a
// Redis store, standalone or Cluster.
type RedisSource struct {
	c      redis.UniversalClient
	prefix string
	shards int
}

// DialRedis connects to addrs; one address is a standalone server
// unless it says cluster_enabled:1, several are a Cluster. The shard
// count is read from `P:meta`.
func DialRedis(ctx context.Context, addrs []string, prefix string) (*RedisSource, error) {
	var c redis.UniversalClient
	if len(addrs) == 1 {
		single := redis.NewClient(&redis.Options{Addr: addrs[0]})
		info, err := single.Info(ctx, "cluster").Result()
		if err != nil {
			single.Close()
			return nil, fmt.Errorf("redis %s: %w", addrs[0], err)
		}
		c = single
		if strings.Contains(info, "cluster_enabled:1") {
			single.Close()
			c = redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs})
		}
	} else {
		c = redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs})
	}
	shards, err := c.HGet(ctx, prefix+":meta", "shards").Int()
	if err != nil {
		c.Close()
		return nil, fmt.Errorf("redis: read %s:meta shards (has a gateway with key prefix %q started?): %w", prefix, prefix, err)
	}
	return &RedisSource{c: c, prefix: prefix, shards: shards}, nil
}

// Client is the source's Redis client.
func (r *RedisSource) Client() redis.UniversalClient { return r.c }

func (r *RedisSource) Close() error { return r.c.Close() }

// Events reads every shard's stream from since, in pages: the devices'
// events (a gateway event has no device).
func (r *RedisSource) Events(ctx context.Context, since time.Time) ([]check.Event, error) {
	var out []check.Event
	for s := range r.shards {
		key := fmt.Sprintf("{%s:%d}:events", r.prefix, s)
		from := strconv.FormatInt(since.UnixMilli(), 10) + "-0"
		for {
			msgs, err := r.c.XRangeN(ctx, key, from, "+", 10000).Result()
			if err != nil {
				return nil, fmt.Errorf("xrange %s: %w", key, err)
			}
			for _, m := range msgs {
				if m.Values["device"] != nil {
					out = append(out, streamEvent(m.Values))
				}
			}
			if len(msgs) < 10000 {
				break
			}
			from = "(" + msgs[len(msgs)-1].ID
		}
	}
	return out, nil
}

// streamEvent decodes one stream entry's fields (docs/design.md §3.4).
func streamEvent(v map[string]any) check.Event {
	str := func(k string) string { s, _ := v[k].(string); return s }
	msTime := func(k string) time.Time {
		ms, err := strconv.ParseInt(str(k), 10, 64)
		if err != nil {
			return time.Time{}
		}
		return time.UnixMilli(ms)
	}
	ver, _ := strconv.ParseUint(str("ver"), 10, 64)
	return check.Event{Device: str("device"), State: str("state"), Ver: ver, At: msTime("at"), Reason: str("reason"),
		Gateway: str("gw"), Session: str("session"), Deadline: msTime("deadline")}
}

// Counters sums INFO commandstats and INFO cpu over every master.
func (r *RedisSource) Counters(ctx context.Context) (Counters, bool, error) {
	var mu sync.Mutex
	var total Counters
	read := func(ctx context.Context, c *redis.Client) error {
		info, err := c.Info(ctx, "commandstats", "cpu").Result()
		if err != nil {
			return err
		}
		n := ParseInfo(info)
		mu.Lock()
		total.Calls += n.Calls
		total.CPU += n.CPU
		mu.Unlock()
		return nil
	}
	var err error
	switch c := r.c.(type) {
	case *redis.ClusterClient:
		err = c.ForEachMaster(ctx, read)
	case *redis.Client:
		err = read(ctx, c)
	}
	if err != nil {
		return Counters{}, false, fmt.Errorf("redis info: %w", err)
	}
	return total, true, nil
}

// ParseInfo sums calls= of the cmdstat_ lines and the CPU seconds of an
// INFO answer.
func ParseInfo(info string) Counters {
	var c Counters
	for _, line := range strings.Split(info, "\n") {
		line = strings.TrimSpace(line)
		if name, rest, ok := strings.Cut(line, ":calls="); ok && strings.HasPrefix(name, "cmdstat_") {
			n, err := strconv.ParseInt(strings.SplitN(rest, ",", 2)[0], 10, 64)
			if err == nil && n > 0 {
				c.Calls += min(n, math.MaxInt64-c.Calls) // saturates
			}
			continue
		}
		for _, k := range []string{"used_cpu_user:", "used_cpu_sys:"} {
			if v, ok := strings.CutPrefix(line, k); ok {
				f, _ := strconv.ParseFloat(v, 64)
				c.CPU += time.Duration(f * float64(time.Second))
			}
		}
	}
	return c
}

// AdminSource reads /v1/events of a gateway's admin API, for a gateway
// on the embedded store.
type AdminSource struct {
	base string
	http *http.Client
}

// NewAdminSource asks the admin API at addr (host:port).
func NewAdminSource(addr string) *AdminSource {
	return &AdminSource{base: "http://" + addr, http: &http.Client{Timeout: 10 * time.Second}}
}

func (a *AdminSource) Close() error { return nil }

// Counters: the embedded store has none to read.
func (a *AdminSource) Counters(context.Context) (Counters, bool, error) {
	return Counters{}, false, nil
}

// Events pages through /v1/events from since: the devices' events.
func (a *AdminSource) Events(ctx context.Context, since time.Time) ([]check.Event, error) {
	var out []check.Event
	q := url.Values{"limit": {"10000"}, "since": {(time.Since(since) + time.Second).Round(time.Millisecond).String()}}
	for range 100000 {
		var page struct {
			Events []gateway.Event `json:"events"`
			Cursor string          `json:"cursor"`
		}
		if err := a.get(ctx, q, &page); err != nil {
			return nil, err
		}
		for _, e := range page.Events {
			if e.At.Before(since) || e.IsGateway() {
				continue
			}
			out = append(out, check.Event{Device: string(e.Device), State: string(e.State), Ver: e.Ver, At: e.At,
				Reason: string(e.Reason), Gateway: e.Gateway, Session: string(e.Session), Deadline: e.Deadline})
		}
		if len(page.Events) == 0 {
			return out, nil
		}
		q = url.Values{"limit": {"10000"}, "cursor": {page.Cursor}}
	}
	return out, nil
}

func (a *AdminSource) get(ctx context.Context, q url.Values, v any) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, a.base+"/v1/events?"+q.Encode(), nil)
	if err != nil {
		return err
	}
	resp, err := a.http.Do(req)
	if err != nil {
		return fmt.Errorf("admin api: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("admin api: /v1/events: %s", resp.Status)
	}
	if err := json.NewDecoder(resp.Body).Decode(v); err != nil {
		return fmt.Errorf("admin api: /v1/events: %w", err)
	}
	return nil
}
