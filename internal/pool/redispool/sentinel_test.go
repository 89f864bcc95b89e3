package redispool

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/spillway-dev/spillway/internal/testkit/redistest"
	"github.com/spillway-dev/spillway/internal/testkit/testutil"
)

// TestCarriesOnThroughSentinelFailover: a pool on a Sentinel-managed
// primary keeps granting slots through a forced failover (from its local
// fallback for a moment at most), and within a few seconds its leases
// live on the new primary again, counted against the shared limit.
func TestCarriesOnThroughSentinelFailover(t *testing.T) {
	t.Parallel()
	s := redistest.StartSentinel(t)
	cfg := Config{Prefix: redistest.Prefix(t), Size: 4, PerUser: 4, LeaseTTL: 5 * time.Second}
	var inFallback atomic.Bool
	p, err := New(cfg, s.Client(t), testutil.DiscardLogger(), func(on bool) { inFallback.Store(on) })
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()

	held, err := p.TryAcquire(ctx, "alice")
	if err != nil {
		t.Fatalf("acquire before the failover: %v", err)
	}
	newPrimary := s.Failover(t)
	switched := time.Now()

	direct := redis.NewClient(&redis.Options{Addr: newPrimary})
	defer direct.Close()
	// The lease taken before the failover was replicated: it still counts.
	if n := zcard(t, direct, LeasesKey(cfg.Prefix)); n != 1 {
		t.Fatalf("new primary holds %d leases, want the 1 taken before the failover", n)
	}
	// Slots are granted by Redis again, not by the fallback, within a few
	// seconds.
	testutil.Eventually(t, 10*time.Second, func() bool {
		l, err := p.TryAcquire(ctx, "bob")
		if err != nil {
			return false
		}
		defer l.Release()
		return !inFallback.Load() && zcard(t, direct, LeasesKey(cfg.Prefix)) == 2
	}, "a Redis lease on the new primary")
	if took := time.Since(switched); took > 5*time.Second {
		t.Errorf("pool back on Redis %s after the switch, want a few seconds at most", took)
	}
	held.Release()
	testutil.Eventually(t, 5*time.Second, func() bool { return zcard(t, direct, LeasesKey(cfg.Prefix)) == 0 }, "all leases released")
	// The shared limit is enforced on the new primary.
	var ls []interface{ Release() }
	for range cfg.Size {
		l, err := p.TryAcquire(ctx, "carol")
		if err != nil {
			t.Fatalf("acquire after the failover: %v", err)
		}
		ls = append(ls, l)
	}
	if _, err := p.TryAcquire(ctx, "dave"); err == nil {
		t.Fatal("a fifth slot of four granted after the failover")
	}
	for _, l := range ls {
		l.Release()
	}
}
