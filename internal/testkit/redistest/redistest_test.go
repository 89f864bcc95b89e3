package redistest

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

func TestStartServesAndStops(t *testing.T) {
	s := Start(t)
	c := s.Client(t)
	ctx := context.Background()
	if err := c.Set(ctx, Prefix(t)+"k", "v", 0).Err(); err != nil {
		t.Fatalf("set: %v", err)
	}
	s.Stop()
	if err := c.Ping(ctx).Err(); err == nil {
		t.Fatal("ping succeeded after Stop")
	}
	s.Restart(t)
	if err := c.Ping(ctx).Err(); err != nil {
		t.Fatalf("ping after Restart: %v", err)
	}
}

// A server started with AOF keeps its keys across a crash and Restart;
// one started without loses them.
func TestStartWithAOFKeepsKeys(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		srv  func(testing.TB) *Server
		kept bool
	}{
		{"aof", func(tb testing.TB) *Server { return StartWith(tb, "--appendonly", "yes", "--appendfsync", "always") }, true},
		{"default", Start, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s := tc.srv(t)
			c := s.Client(t)
			ctx := context.Background()
			if err := c.Set(ctx, "k", "v", 0).Err(); err != nil {
				t.Fatal(err)
			}
			s.Stop()
			s.Restart(t)
			n, err := c.Exists(ctx, "k").Result()
			if err != nil {
				t.Fatal(err)
			}
			if (n == 1) != tc.kept {
				t.Fatalf("key exists after a crash and restart: %v, want %v", n == 1, tc.kept)
			}
		})
	}
}

func TestClusterSpreadsKeysOverNodes(t *testing.T) {
	t.Parallel()
	c := StartCluster(t, 3)
	cc := c.Client(t)
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	// Keys on different slots land on different nodes, and the client
	// follows the redirections to read each back.
	nodes := map[string]bool{}
	prefix := Prefix(t)
	for i := range 30 {
		key := fmt.Sprintf("%sk%d", prefix, i)
		if err := cc.Set(ctx, key, i, 0).Err(); err != nil {
			t.Fatalf("set %s: %v", key, err)
		}
		if got, err := cc.Get(ctx, key).Int(); err != nil || got != i {
			t.Fatalf("get %s = %d, %v; want %d", key, got, err, i)
		}
		node, err := c.NodeFor(ctx, key)
		if err != nil {
			t.Fatal(err)
		}
		nodes[node] = true
	}
	if len(nodes) != 3 {
		t.Fatalf("30 keys landed on %d nodes %v, want all 3", len(nodes), nodes)
	}
	// A plain client on one node is redirected for a key it does not serve:
	// proof that this is a real cluster, not three lone servers.
	single := redis.NewClient(&redis.Options{Addr: c.Addrs[0]})
	defer single.Close()
	moved := 0
	for i := range 30 {
		if err := single.Get(ctx, fmt.Sprintf("%sk%d", prefix, i)).Err(); err != nil && strings.HasPrefix(err.Error(), "MOVED ") {
			moved++
		}
	}
	if moved == 0 {
		t.Fatal("node 0 answered every key itself: no MOVED redirection")
	}
	// Keys sharing a hash tag may be used together; others may not.
	if err := cc.MSet(ctx, prefix+"{tag}a", 1, prefix+"{tag}b", 2).Err(); err != nil {
		t.Fatalf("mset with one hash tag: %v", err)
	}
	if err := single.MSet(ctx, prefix+"k1", 1, prefix+"k2", 2).Err(); err == nil || !strings.Contains(err.Error(), "CROSSSLOT") && !strings.HasPrefix(err.Error(), "MOVED") {
		t.Fatalf("mset across slots = %v, want CROSSSLOT", err)
	}
}

func TestSentinelFailoverSwitchesPrimary(t *testing.T) {
	t.Parallel()
	s := StartSentinel(t)
	c := s.Client(t)
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	before, err := s.PrimaryAddr(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if before != s.Data[0].Addr {
		t.Fatalf("primary %s, want the first data node %s", before, s.Data[0].Addr)
	}
	key := Prefix(t) + "k"
	if err := c.Set(ctx, key, "before", 0).Err(); err != nil {
		t.Fatalf("set before failover: %v", err)
	}
	after := s.Failover(t)
	if after == before || after != s.Data[1].Addr {
		t.Fatalf("failover moved the primary from %s to %s, want %s", before, after, s.Data[1].Addr)
	}
	// The same client, made before the failover, reads the write made
	// before it and writes to the new primary.
	err = waitFor(ctx, func() error { return c.Set(ctx, key+"2", "after", 0).Err() })
	if err != nil {
		t.Fatalf("write after failover: %v", err)
	}
	if got, err := c.Get(ctx, key).Result(); err != nil || got != "before" {
		t.Fatalf("get after failover = %q, %v; want before", got, err)
	}
	direct := redis.NewClient(&redis.Options{Addr: after})
	defer direct.Close()
	if got, err := direct.Get(ctx, key+"2").Result(); err != nil || got != "after" {
		t.Fatalf("new primary %s holds %q, %v; want after", after, got, err)
	}
	old := redis.NewClient(&redis.Options{Addr: before})
	defer old.Close()
	if err := old.Set(ctx, key+"3", "x", 0).Err(); err == nil || !strings.HasPrefix(err.Error(), "READONLY") {
		t.Fatalf("write to the old primary = %v, want READONLY (it is a replica now)", err)
	}
}

// waitFor retries f every 20ms until it succeeds or ctx ends.
func waitFor(ctx context.Context, f func() error) error {
	return waitUntil(ctx, func(context.Context) error { return f() })
}
