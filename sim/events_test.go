package sim

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/fleetgate/fleetgate/gateway"
	"github.com/fleetgate/fleetgate/internal/redistest"
)

// seedLog writes P:meta and one event per shard, as the gateways'
// scripts do (docs/design.md §3.4).
func seedLog(t *testing.T, c redis.Cmdable, shards int, at time.Time) {
	t.Helper()
	ctx := context.Background()
	if err := c.HSet(ctx, "fleetgate:meta", "shards", shards, "schema", 1).Err(); err != nil {
		t.Fatal(err)
	}
	for s := range shards {
		err := c.XAdd(ctx, &redis.XAddArgs{Stream: fmt.Sprintf("{fleetgate:%d}:events", s), Values: []any{
			"device", fmt.Sprintf("dev-%d", s), "state", "offline", "ver", "7", "at", at.UnixMilli(),
			"reason", "expired", "gw", "gw-a", "session", "coap/default", "deadline", at.Add(-time.Second).UnixMilli()}}).Err()
		if err != nil {
			t.Fatal(err)
		}
	}
}

func TestRedisSourceStandaloneAndCluster(t *testing.T) {
	ctx := context.Background()
	srv := redistest.Start(t)
	cl := redistest.StartCluster(t, 3)
	now := time.Now().Truncate(time.Millisecond)
	for name, tc := range map[string]struct {
		c     redis.Cmdable
		addrs []string
	}{
		"standalone":              {srv.Client(t), []string{srv.Addr}},
		"cluster, one node given": {cl.Client(t), cl.Addrs()[:1]},
		"cluster":                 {cl.Client(t), cl.Addrs()},
	} {
		t.Run(name, func(t *testing.T) {
			seedLog(t, tc.c, 8, now)
			src, err := DialRedis(ctx, tc.addrs, "fleetgate")
			if err != nil {
				t.Fatal(err)
			}
			defer src.Close()
			evs, err := src.Events(ctx, now.Add(-time.Minute))
			if err != nil {
				t.Fatal(err)
			}
			if len(evs) < 8 {
				t.Fatalf("%d events, want 8 (one per shard)", len(evs))
			}
			e := evs[0]
			if e.State != "offline" || e.Ver != 7 || !e.At.Equal(now) || e.Reason != "expired" || e.Gateway != "gw-a" ||
				e.Session != "coap/default" || !e.Deadline.Equal(now.Add(-time.Second)) || !strings.HasPrefix(e.Device, "dev-") {
				t.Fatalf("event %+v", e)
			}
			// since is a log position: the stream IDs are on the store clock
			if later, _ := src.Events(ctx, time.Now().Add(time.Second)); len(later) != 0 {
				t.Fatalf("events after since: %+v", later)
			}
			c, ok, err := src.Counters(ctx)
			if err != nil || !ok || c.Calls == 0 || c.CPU <= 0 {
				t.Fatalf("counters %+v %v %v", c, ok, err)
			}
		})
	}
	if _, err := DialRedis(ctx, []string{redistest.Start(t).Addr}, "fleetgate"); err == nil || !strings.Contains(err.Error(), "has a gateway") {
		t.Fatalf("a store no gateway wrote: %v", err)
	}
}

func TestParseInfo(t *testing.T) {
	c := ParseInfo("# Commandstats\r\ncmdstat_evalsha:calls=12,usec=5\r\ncmdstat_xadd:calls=3,usec=1\r\n# CPU\r\nused_cpu_sys:1.500000\r\nused_cpu_user:0.250000\r\nused_cpu_sys_children:9\r\n")
	if c.Calls != 15 || c.CPU != 1750*time.Millisecond {
		t.Fatalf("%+v", c)
	}
}

// The admin API's pages are followed by their cursor until one is empty.
func TestAdminSourcePages(t *testing.T) {
	now := time.Now().Truncate(time.Millisecond)
	pages := map[string][]gateway.Event{
		"":   {{Device: "a", State: gateway.Online, Ver: 1, At: now, Reason: "connect"}, {Device: "old", State: gateway.Online, Ver: 1, At: now.Add(-time.Hour)}},
		"c1": {{Device: "a", State: gateway.Offline, Ver: 2, At: now.Add(time.Second), Reason: "leave"}},
		"c2": nil,
	}
	next := map[string]string{"": "c1", "c1": "c2", "c2": "c2"}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		cur := r.URL.Query().Get("cursor")
		if r.URL.Path != "/v1/events" || cur == "" && r.URL.Query().Get("since") == "" {
			http.Error(w, "bad request", http.StatusBadRequest)
			return
		}
		_ = json.NewEncoder(w).Encode(map[string]any{"events": pages[cur], "cursor": next[cur]})
	}))
	defer srv.Close()
	evs, err := NewAdminSource(strings.TrimPrefix(srv.URL, "http://")).Events(context.Background(), now.Add(-time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	if len(evs) != 2 || evs[0].State != "online" || evs[1].State != "offline" || evs[1].Reason != "leave" {
		t.Fatalf("events %+v", evs)
	}
}
