package redistest

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// StartCluster starts a throwaway one-node Redis Cluster (cluster mode, every slot on the one
// node) on a free loopback port, waits until it reports cluster_state:ok, and returns its
// REDIS_URL (cluster=true). One node is enough to exercise what Cluster changes for the gate:
// the cluster client, its per-node pipelines, and scripts whose keys must share a slot
// (a cross-slot script is refused even on one node). It is killed when t ends.
func StartCluster(t testing.TB) string {
	t.Helper()
	dir := t.TempDir()
	srv := startServer(t, func(port int) []string {
		return append(plainArgs(port), "--cluster-enabled", "yes",
			"--cluster-config-file", filepath.Join(dir, "nodes-"+strconv.Itoa(port)+".conf"), "--dir", dir)
	})
	client := redis.NewClient(&redis.Options{Addr: srv.addr()})
	defer client.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := client.ClusterAddSlotsRange(ctx, 0, 16383).Err(); err != nil {
		t.Fatalf("redistest: CLUSTER ADDSLOTSRANGE: %v", err)
	}
	waitUntil(ctx, t, "the cluster to report cluster_state:ok", func() (bool, error) {
		info, err := client.ClusterInfo(ctx).Result()
		return strings.Contains(info, "cluster_state:ok"), err
	})
	return fmt.Sprintf("redis://%s?cluster=true", srv.addr())
}

// StartSentinel starts a throwaway redis-server and a Sentinel (redis-server --sentinel)
// monitoring it as primary "fluxhook", each on a free loopback port, waits until the Sentinel
// names the primary, and returns the REDIS_URL that reaches the primary through the Sentinel
// (master_name=). Both are killed when t ends.
func StartSentinel(t testing.TB) string {
	t.Helper()
	const name = "fluxhook"
	primary := StartServer(t)
	dir := t.TempDir()
	sentinel := startServer(t, func(port int) []string {
		// Sentinel rewrites its configuration file, so it must be a file of its own.
		conf := filepath.Join(dir, "sentinel-"+strconv.Itoa(port)+".conf")
		body := fmt.Sprintf("port %d\nbind 127.0.0.1\nprotected-mode no\ndir %s\nsentinel monitor %s %s 1\n",
			port, dir, name, strings.Replace(primary.addr(), ":", " ", 1))
		if err := os.WriteFile(conf, []byte(body), 0o600); err != nil {
			t.Fatalf("redistest: writing the Sentinel configuration: %v", err)
		}
		return []string{conf, "--sentinel", "--loglevel", "warning"}
	})
	client := redis.NewSentinelClient(&redis.Options{Addr: sentinel.addr()})
	defer client.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	waitUntil(ctx, t, "the Sentinel to name the primary", func() (bool, error) {
		addr, err := client.GetMasterAddrByName(ctx, name).Result()
		return err == nil && len(addr) == 2 && addr[1] == strconv.Itoa(primary.Port), err
	})
	return fmt.Sprintf("redis://%s/0?master_name=%s", sentinel.addr(), name)
}

func (s *Server) addr() string { return "127.0.0.1:" + strconv.Itoa(s.Port) }

// waitUntil polls cond until it holds, failing t with the last error when ctx ends.
func waitUntil(ctx context.Context, t testing.TB, what string, cond func() (bool, error)) {
	t.Helper()
	for {
		ok, err := cond()
		if ok {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("redistest: timed out waiting for %s: %v", what, err)
		case <-time.After(20 * time.Millisecond):
		}
	}
}
