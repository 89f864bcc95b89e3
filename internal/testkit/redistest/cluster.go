package redistest

import (
	"context"
	"errors"
	"fmt"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// Cluster is a running Redis Cluster of primaries without replicas, owned
// by one test.
type Cluster struct {
	// Nodes are the primaries, in the order their slots were assigned.
	Nodes []*Server
	// Addrs are the nodes' host:port addresses, the seeds for a client.
	Addrs []string
}

// clusterReady bounds the wait for a new cluster to agree on its slots.
const clusterReady = 30 * time.Second

// StartCluster runs n (at least 3) cluster-enabled redis-servers on free
// ports, joins them with `redis-cli --cluster create` (no replicas) and
// waits until every node reports cluster_state:ok with all slots assigned
// and every node known. The processes are killed when the test ends. With
// -short the calling test is skipped.
func StartCluster(tb testing.TB, n int) *Cluster {
	tb.Helper()
	if testing.Short() {
		tb.Skip("redistest: integration test skipped with -short")
	}
	if n < 3 {
		tb.Fatalf("redistest: a Redis Cluster needs at least 3 primaries, asked for %d", n)
	}
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		tb.Fatalf("redistest: redis-server not found (make test installs it): %v", err)
	}
	cli, err := exec.LookPath("redis-cli")
	if err != nil {
		tb.Fatalf("redistest: redis-cli not found (make test installs it): %v", err)
	}
	c := &Cluster{}
	for range n {
		// The bus port is chosen apart from the client port: the default
		// (port+10000) may be taken or beyond 65535.
		bus := freePort(tb)
		s := startServer(tb, bin, func(dir string, port int) []string {
			return append(serverArgs(dir, port),
				"--cluster-enabled", "yes",
				"--cluster-config-file", dir+"/nodes.conf",
				"--cluster-port", strconv.Itoa(bus),
				"--cluster-node-timeout", "5000")
		})
		c.Nodes = append(c.Nodes, s)
		c.Addrs = append(c.Addrs, s.Addr)
	}
	ctx, cancel := context.WithTimeout(context.Background(), clusterReady)
	defer cancel()
	args := append([]string{"--cluster", "create"}, c.Addrs...)
	args = append(args, "--cluster-replicas", "0", "--cluster-yes")
	if out, err := exec.CommandContext(ctx, cli, args...).CombinedOutput(); err != nil {
		tb.Fatalf("redistest: redis-cli --cluster create: %v\n%s", err, out)
	}
	for _, s := range c.Nodes {
		node := redis.NewClient(&redis.Options{Addr: s.Addr, MaxRetries: -1})
		err := waitUntil(ctx, func(ctx context.Context) error { return clusterOK(ctx, node, n) })
		_ = node.Close()
		if err != nil {
			tb.Fatalf("redistest: cluster node %s not ready within %v: %v", s.Addr, clusterReady, err)
		}
	}
	return c
}

// clusterOK reports why node does not yet see a healthy cluster of n
// primaries, or nil.
func clusterOK(ctx context.Context, node *redis.Client, n int) error {
	info, err := node.ClusterInfo(ctx).Result()
	if err != nil {
		return err
	}
	want := []string{"cluster_state:ok", "cluster_slots_assigned:16384", "cluster_known_nodes:" + strconv.Itoa(n)}
	for _, w := range want {
		if !strings.Contains(info, w+"\r\n") {
			return fmt.Errorf("CLUSTER INFO lacks %s:\n%s", w, info)
		}
	}
	return nil
}

// Options returns client options for the cluster: its seeds, and no
// retries beyond go-redis's MOVED/ASK redirections' defaults.
func (c *Cluster) Options() *redis.ClusterOptions {
	return &redis.ClusterOptions{Addrs: append([]string(nil), c.Addrs...)}
}

// Client returns a new cluster client, closed when the test ends.
func (c *Cluster) Client(tb testing.TB) *redis.ClusterClient {
	tb.Helper()
	cc := redis.NewClusterClient(c.Options())
	tb.Cleanup(func() { _ = cc.Close() })
	return cc
}

// NodeFor returns the node serving key's slot, asked of the cluster itself.
func (c *Cluster) NodeFor(ctx context.Context, key string) (string, error) {
	cc := redis.NewClusterClient(c.Options())
	defer cc.Close()
	node, err := cc.MasterForKey(ctx, key)
	if err != nil {
		return "", fmt.Errorf("redistest: the primary of %s: %w", key, err)
	}
	return node.Options().Addr, nil
}

// waitUntil calls check every 20ms until it returns nil or ctx ends; then
// it returns check's last error.
func waitUntil(ctx context.Context, check func(ctx context.Context) error) error {
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		cctx, cancel := context.WithTimeout(ctx, time.Second)
		err := check(cctx)
		cancel()
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return errors.Join(ctx.Err(), err)
		case <-tick.C:
		}
	}
}
