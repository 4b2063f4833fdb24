package redistest

import (
	"context"
	"net"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// StartReplica starts a standalone redis-server that replicates the
// primary at primaryAddr (REPLICAOF; the address may be a proxy in front
// of the primary, to cut the replication link), persistence off, and
// waits (bounded) until its link is up and the first sync is done.
func StartReplica(t testing.TB, primaryAddr string) *Server {
	t.Helper()
	host, port, err := net.SplitHostPort(primaryAddr)
	if err != nil {
		t.Fatalf("replica of %s: %v", primaryAddr, err)
	}
	s := Start(t, "--replicaof", host, port)
	s.WaitReplicaLinkUp(t, 30*time.Second)
	return s
}

// WaitReplicaLinkUp waits until the server, a replica, reports
// master_link_status:up (the initial sync is done).
func (s *Server) WaitReplicaLinkUp(t testing.TB, limit time.Duration) {
	t.Helper()
	c := redis.NewClient(&redis.Options{Addr: s.Addr})
	defer c.Close()
	deadline := time.Now().Add(limit)
	for {
		info, err := c.Info(context.Background(), "replication").Result()
		if err == nil && strings.Contains(info, "master_link_status:up") {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("replica %s: link not up after %v: %v %q", s.Addr, limit, err, info)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// StartClusterWithReplicas starts a Redis Cluster of masters (≥ 3) with one
// replica each, joined by `redis-cli --cluster create --cluster-replicas 1`,
// and waits until every node reports cluster_state:ok and every replica's
// link to its master is up. Nodes lists all 2×masters servers; which are
// masters is the cluster's choice: ask Role.
func StartClusterWithReplicas(t testing.TB, masters int) *Cluster {
	t.Helper()
	if masters < 3 {
		t.Fatalf("a Redis Cluster needs at least 3 masters, got %d", masters)
	}
	cli, err := exec.LookPath("redis-cli")
	if err != nil {
		t.Fatalf("redis-cli not found (make test installs redis-server, which brings it): %v", err)
	}
	c := &Cluster{}
	for i := 0; i < 2*masters; i++ {
		dir := t.TempDir()
		c.Nodes = append(c.Nodes, startIn(t, dir, "--cluster-enabled", "yes",
			"--cluster-config-file", filepath.Join(dir, "nodes.conf"),
			"--cluster-node-timeout", "2000"))
	}
	args := append([]string{"--cluster", "create"}, c.Addrs()...)
	args = append(args, "--cluster-replicas", "1", "--cluster-yes")
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if out, err := exec.CommandContext(ctx, cli, args...).CombinedOutput(); err != nil {
		t.Fatalf("redis-cli --cluster create --cluster-replicas 1: %v\n%s", err, out)
	}
	deadline := time.Now().Add(30 * time.Second)
	for _, s := range c.Nodes {
		rc := redis.NewClient(&redis.Options{Addr: s.Addr})
		for {
			info, err := rc.ClusterInfo(context.Background()).Result()
			ok := err == nil && strings.Contains(info, "cluster_state:ok")
			if ok {
				repl, err := rc.Info(context.Background(), "replication").Result()
				ok = err == nil && (strings.Contains(repl, "role:master") || strings.Contains(repl, "master_link_status:up"))
			}
			if ok {
				break
			}
			if time.Now().After(deadline) {
				rc.Close()
				t.Fatalf("cluster node %s not ok after 30s: %v %q", s.Addr, err, info)
			}
			time.Sleep(50 * time.Millisecond)
		}
		rc.Close()
	}
	return c
}

// Role returns "master" or "slave" (INFO replication) for node i, or ""
// when the node does not answer.
func (c *Cluster) Role(i int) string {
	rc := redis.NewClient(&redis.Options{Addr: c.Nodes[i].Addr, MaxRetries: -1})
	defer rc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	info, err := rc.Info(ctx, "replication").Result()
	if err != nil {
		return ""
	}
	for _, line := range strings.Split(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "role:"); ok {
			return v
		}
	}
	return ""
}

// MasterOfKey returns the index in Nodes of the master that owns key's
// hash slot, as node 0 (or the first answering node) sees it.
func (c *Cluster) MasterOfKey(t testing.TB, key string) int {
	t.Helper()
	ctx := context.Background()
	for _, s := range c.Nodes {
		rc := redis.NewClient(&redis.Options{Addr: s.Addr, MaxRetries: -1})
		slot, err := rc.ClusterKeySlot(ctx, key).Result()
		if err != nil {
			rc.Close()
			continue
		}
		slots, err := rc.ClusterSlots(ctx).Result()
		rc.Close()
		if err != nil {
			continue
		}
		for _, r := range slots {
			if int64(r.Start) <= slot && slot <= int64(r.End) {
				for i, n := range c.Nodes {
					if n.Addr == r.Nodes[0].Addr {
						return i
					}
				}
			}
		}
	}
	t.Fatalf("no cluster node knows the master of %q", key)
	return -1
}
