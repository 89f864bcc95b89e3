package app

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/spillway-dev/spillway/internal/config"
	"github.com/spillway-dev/spillway/internal/rediserr"
	"github.com/spillway-dev/spillway/internal/testkit/redistest"
)

// TestNewRedisClient: each Redis mode gets its kind of client, and the
// client really works against that kind of deployment.
func TestNewRedisClient(t *testing.T) {
	t.Parallel()
	single := redistest.Start(t)
	cluster := redistest.StartCluster(t, 3)
	sentinel := redistest.StartSentinel(t)
	for _, tc := range []struct {
		name    string
		environ map[string]string
		check   func(redis.UniversalClient) bool
	}{
		{"single", map[string]string{"REDIS_URL": single.URL()}, func(c redis.UniversalClient) bool {
			rc, ok := c.(*redis.Client)
			return ok && rc.Options().Addr == single.Addr && rc.Options().ContextTimeoutEnabled && rc.Options().PoolSize >= minRedisPoolSize
		}},
		{"cluster", map[string]string{"REDIS_CLUSTER_ADDRS": strings.Join(cluster.Addrs, ",")}, func(c redis.UniversalClient) bool {
			cc, ok := c.(*redis.ClusterClient)
			return ok && cc.Options().ContextTimeoutEnabled
		}},
		{"sentinel", map[string]string{
			"REDIS_SENTINEL_ADDRS":  strings.Join(sentinel.SentinelAddrs, ","),
			"REDIS_SENTINEL_MASTER": sentinel.MasterName,
		}, func(c redis.UniversalClient) bool {
			rc, ok := c.(*redis.Client)
			return ok && rc.Options().ContextTimeoutEnabled
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg, err := config.Load("", tc.environ)
			if err != nil {
				t.Fatal(err)
			}
			c, err := NewRedisClient(cfg)
			if err != nil {
				t.Fatalf("NewRedisClient: %v", err)
			}
			defer c.Close()
			if !tc.check(c) {
				t.Fatalf("client %T with the wrong options for %s mode", c, tc.name)
			}
			ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
			defer cancel()
			// Keys on many slots: a cluster client must follow redirections.
			for _, k := range []string{"a", "b", "c", "d", "e", "f"} {
				key := redistest.Prefix(t) + k
				if err := c.Set(ctx, key, k, 0).Err(); err != nil {
					t.Fatalf("set %s: %v", key, err)
				}
				if got, err := c.Get(ctx, key).Result(); err != nil || got != k {
					t.Fatalf("get %s = %q, %v", key, got, err)
				}
			}
		})
	}
	t.Run("embedded", func(t *testing.T) {
		cfg, err := config.Load("", nil)
		if err != nil {
			t.Fatal(err)
		}
		if c, err := NewRedisClient(cfg); err == nil || c != nil {
			t.Fatalf("NewRedisClient in embedded mode = %v, %v; want an error", c, err)
		}
		if _, err := NewRedisClient(nil); err == nil {
			t.Fatal("NewRedisClient(nil) succeeded")
		}
	})
	t.Run("bad url is not echoed", func(t *testing.T) {
		cfg := &config.Config{RedisURL: "redis://u:s3cret@h:port"}
		_, err := NewRedisClient(cfg)
		if err == nil || strings.Contains(err.Error(), "s3cret") {
			t.Fatalf("NewRedisClient = %v; want an error without the password", err)
		}
	})
}

// TestRedisClientSettings: the REDIS_* client settings reach the client,
// the probe client has one connection and no retries, and a refused dial
// shows as refused (gone) well within the pool's 500 ms call timeout.
func TestRedisClientSettings(t *testing.T) {
	t.Parallel()
	s := redistest.Start(t)
	cfg, err := config.Load("", map[string]string{
		"REDIS_URL": s.URL(), "REDIS_POOL_SIZE": "33", "REDIS_MIN_IDLE_CONNS": "3",
		"REDIS_DIAL_TIMEOUT_MS": "700", "REDIS_TIMEOUT_MS": "900", "REDIS_POOL_TIMEOUT_MS": "400",
	})
	if err != nil {
		t.Fatal(err)
	}
	c, err := NewRedisClient(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	o := c.(*redis.Client).Options()
	if o.PoolSize != 33 || o.MinIdleConns != 3 || o.DialTimeout != 700*time.Millisecond ||
		o.ReadTimeout != 900*time.Millisecond || o.WriteTimeout != 900*time.Millisecond || o.PoolTimeout != 400*time.Millisecond {
		t.Fatalf("client options %+v do not follow the REDIS_* settings", o)
	}
	pc, err := NewRedisProbeClient(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer pc.Close()
	po := pc.(*redis.Client).Options()
	if po.PoolSize != 1 || po.MinIdleConns != 0 || po.MaxRetries > 0 || po.DialerRetries != 1 {
		t.Fatalf("probe client options %+v, want one connection and no retries", po)
	}
	if err := pc.Ping(t.Context()).Err(); err != nil {
		t.Fatalf("probe PING: %v", err)
	}
	s.Stop()
	for _, cl := range []redis.UniversalClient{c, pc} {
		// Within a deadline like the pool's calls have: a refused dial
		// retried into the deadline would read as busy, not gone.
		ctx, cancel := context.WithTimeout(t.Context(), time.Second)
		err := cl.Ping(ctx).Err()
		cancel()
		if rediserr.Classify(err) != rediserr.Gone {
			t.Errorf("PING on a stopped Redis: %v, classified %v, want gone", err, rediserr.Classify(err))
		}
	}
}

// TestRedisClientTrimsIdleAfterBurst: a burst of concurrent commands
// opens as many connections as it needs, and when it is over the pool
// keeps only a quarter of REDIS_POOL_SIZE open, or two per worker if more
// (docs/OPERATIONS.md, "Memory after a burst"); go-redis alone would keep
// all of them.
func TestRedisClientTrimsIdleAfterBurst(t *testing.T) {
	t.Parallel()
	s := redistest.Start(t)
	cfg, err := config.Load("", map[string]string{"REDIS_URL": s.URL(), "REDIS_POOL_SIZE": "64", "WORKER_CONCURRENCY": "4"})
	if err != nil {
		t.Fatal(err)
	}
	c, err := NewRedisClient(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	const burst = 40
	keep := maxIdleConns(64, 4, 0)
	if keep != 16 {
		t.Fatalf("maxIdleConns(64, 4, 0) = %d, want 16", keep)
	}
	// Each command holds its connection for 300 ms in Redis: all of them
	// are open at once.
	var wg sync.WaitGroup
	errs := make(chan error, burst)
	for i := range burst {
		wg.Go(func() {
			errs <- c.BLPop(t.Context(), 300*time.Millisecond, fmt.Sprintf("empty-%d", i)).Err()
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil && err != redis.Nil {
			t.Fatalf("BLPOP: %v", err)
		}
	}
	st := c.(*redis.Client).PoolStats()
	if st.Misses < burst/2 {
		t.Fatalf("the burst opened %d connections, want about %d: it did not make the pool grow", st.Misses, burst)
	}
	// go-redis checks its idle count before it takes its lock to add a
	// returned connection, so returns racing at the bound can leave a few
	// more than MaxIdleConns (17 of 16 seen once); without the bound all
	// 40 stay.
	const slack = 4
	if st.IdleConns > uint32(keep+slack) || st.TotalConns > uint32(keep+slack) {
		t.Fatalf("after the burst the pool keeps %d connections (%d idle), want at most %d (%d and go-redis's slack)",
			st.TotalConns, st.IdleConns, keep+slack, keep)
	}
	if keep := maxIdleConns(64, 4, 20); keep != 20 {
		t.Errorf("maxIdleConns(64, 4, 20) = %d, want REDIS_MIN_IDLE_CONNS (20)", keep)
	}
	if keep := maxIdleConns(64, 16, 0); keep != 32 {
		t.Errorf("maxIdleConns(64, 16, 0) = %d, want two per worker (32)", keep)
	}
}
