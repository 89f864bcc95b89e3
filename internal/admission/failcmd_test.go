package admission

import (
	"context"
	"testing"
	"time"

	"github.com/spillway-dev/spillway/internal/testkit/redistest"
	"github.com/spillway-dev/spillway/internal/testkit/testutil"
)

// TestEveryRedisCommandFailing fails each Redis command of admission's
// paths in turn (an error reply, or a pipeline refused as a whole, issue
// 29): none panics; the queue quota's reserve and release and the
// degradation window's flush and read return an error; the rate limiter,
// which returns none, limits locally instead.
func TestEveryRedisCommandFailing(t *testing.T) {
	t.Parallel()
	env := redistest.StartFail(t)
	srv, prefix, hook, rdb := env.Server, env.Prefix, env.Hook, env.Client
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()

	q, err := NewQuota(QuotaConfig{Prefix: prefix, MaxPerIdentity: 1000, MaxBytes: 1 << 30}, rdb)
	if err != nil {
		t.Fatal(err)
	}
	plain, err := NewQuota(QuotaConfig{Prefix: prefix, MaxPerIdentity: 1000, MaxBytes: 1 << 30}, srv.Client(t))
	if err != nil {
		t.Fatal(err)
	}
	reserved := func(tb testing.TB) {
		tb.Helper()
		if p, err := plain.Reserve(ctx, "user:alice", "held", 10, time.Minute); p != nil || err != nil {
			tb.Fatalf("reserve: %v %v", p, err)
		}
	}
	rl, _, _ := newTestLimiter(t, RateLimitConfig{RPS: 1000, Burst: 1000, KeyPrefix: prefix, Timeout: 5 * time.Second}, rdb)
	// Each run starts on Redis, not in the fallback the last run left.
	onRedis := func(testing.TB) { rl.degraded.Store(false); rl.nextProbe.Store(0) }
	r, err := NewRecent(RecentConfig{Prefix: prefix}, rdb, testutil.DiscardLogger())
	if err != nil {
		t.Fatal(err)
	}
	observed := func(testing.TB) { r.ObserveWait(time.Second); r.ObserveRequest(nil) }

	redistest.FailEachCommand(t, hook,
		redistest.FailPath{Name: "Quota.Reserve", Run: func() error {
			_, err := q.Reserve(ctx, "user:alice", "req-1", 10, time.Minute)
			return err
		}},
		redistest.FailPath{Name: "Quota.Release", Setup: reserved, Run: func() error { return q.Release(ctx, "user:alice", "held") }},
		redistest.FailPath{Name: "RateLimiter.Allow", Absorbs: true, Setup: onRedis, Run: func() error {
			if p := rl.Allow(ctx, "user:alice"); p != nil {
				t.Errorf("a request refused under a limit of 1000 a second: %+v", p)
			}
			return nil
		}},
		redistest.FailPath{Name: "Recent.flush", Setup: observed, Run: func() error { return r.flush(ctx) }},
		redistest.FailPath{Name: "Recent.read", Run: func() error { return r.read(ctx, time.Now()) }},
	)
}
