package redispool

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/spillway-dev/spillway/internal/testkit/redistest"
	"github.com/spillway-dev/spillway/internal/testkit/testutil"
)

// newTestPool returns a Pool on its own client, as a separate process
// would have, closed when the test ends. The client dials as the app's
// does (ClientOptions): with go-redis's defaults a refused dial is retried
// five times 100 ms apart and again per command retry, so a call made as
// Redis went down could outlive a short outage and run on the restarted
// server. CI once found the only slot taken just after
// TestFallbackWhileRedisDown's return; such a call (the dispatcher's
// re-check granting a waiter that had already moved to the fallback pool)
// is the one way found to take it.
func newTestPool(tb testing.TB, addr string, cfg Config, log *slog.Logger, onFallback func(bool)) *Pool {
	tb.Helper()
	c := redis.NewClient(ClientOptions(&redis.Options{Addr: addr}))
	if log == nil {
		log = testutil.DiscardLogger()
	}
	p, err := New(cfg, c, log, onFallback)
	if err != nil {
		tb.Fatal(err)
	}
	// Cleanups run last-in first-out: the pool closes before its client.
	tb.Cleanup(func() { _ = c.Close() })
	tb.Cleanup(p.Close)
	return p
}

// target is a real Redis deployment a test runs against: one
// redis-server, or a 3-node Redis Cluster on which every script of the
// pool must find its keys in one slot.
type target struct {
	name   string
	client func(testing.TB) redis.UniversalClient
}

// forTargets runs fn as a subtest against a redis-server and then against
// a Redis Cluster, each started for it. One after the other: the pool's
// call timeouts are short, and a loaded machine would push it into its
// local fallback.
func forTargets(t *testing.T, fn func(*testing.T, target)) {
	t.Helper()
	for _, name := range []string{"single", "cluster"} {
		t.Run(name, func(t *testing.T) {
			var tg target
			if name == "single" {
				s := redistest.Start(t)
				tg = target{name, func(tb testing.TB) redis.UniversalClient { return s.Client(tb) }}
			} else {
				c := redistest.StartCluster(t, 3)
				tg = target{name, func(tb testing.TB) redis.UniversalClient { return c.Client(tb) }}
			}
			fn(t, tg)
		})
	}
}

// newTestPoolOn returns a Pool on its own client of tg, as a separate
// process would have, closed when the test ends.
func newTestPoolOn(tb testing.TB, tg target, cfg Config, log *slog.Logger, onFallback func(bool)) *Pool {
	tb.Helper()
	c := tg.client(tb) // closed by its own cleanup, after the pool's
	// A new cluster client loads the slot map and dials every node on its
	// first commands; done here, so the pool's short call timeouts are not
	// spent on it.
	if cc, ok := c.(*redis.ClusterClient); ok {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := cc.ForEachMaster(ctx, func(ctx context.Context, n *redis.Client) error { return n.Ping(ctx).Err() }); err != nil {
			tb.Fatalf("warm up cluster client: %v", err)
		}
	}
	if log == nil {
		log = testutil.DiscardLogger()
	}
	p, err := New(cfg, c, log, onFallback)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(p.Close)
	return p
}
