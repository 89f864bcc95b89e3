package upstream

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/spillway-dev/spillway/internal/testkit/redistest"
)

// TestEveryRedisCommandFailing fails each Redis command of the shared
// caps', health's and quotas' paths in turn (an error reply, or a
// pipeline refused as a whole, issue 29): none panics; recording a
// failure or a success returns an error; what returns none (an acquire
// or a quota that falls back to the local count, a release or renewal
// that leaves its lease to expire, the health refresh that keeps its last
// copy) goes on without a reply.
func TestEveryRedisCommandFailing(t *testing.T) {
	t.Parallel()
	env := redistest.StartFail(t)
	prefix, hook, rdb := env.Prefix, env.Hook, env.Client
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	log := slog.New(slog.DiscardHandler)
	specs := []Spec{{Name: "gpu", MaxConcurrency: 1000, RPM: 100000, TPM: 1000000}}

	// Their background loops are stopped at once: the paths are called
	// directly, so that every command the hook counts is the path's own.
	caps, err := NewRedisCaps(rdb, specs, RedisConfig{Prefix: prefix}, log)
	if err != nil {
		t.Fatal(err)
	}
	_ = caps.Close()
	health, err := NewRedisHealth(rdb, specs, prefix, HealthConfig{MaxFails: 1000}, log)
	if err != nil {
		t.Fatal(err)
	}
	_ = health.Close()
	quota, err := NewRedisQuota(rdb, specs, prefix, log)
	if err != nil {
		t.Fatal(err)
	}

	// capsOnRedis starts a run on Redis, not in the fallback the last left.
	capsOnRedis := func(testing.TB) { caps.degraded.Store(false); caps.nextProbe.Store(0) }
	var held Slot
	acquired := func(tb testing.TB) {
		tb.Helper()
		capsOnRedis(tb)
		s, err := caps.TryAcquire(ctx, 0)
		if err != nil || s.id == "" {
			tb.Fatalf("acquire on Redis: %+v %v", s, err)
		}
		held = s
	}
	quotaOnRedis := func(testing.TB) { quota.degraded.Store(false); quota.nextProbe.Store(0) }
	redistest.FailEachCommand(t, hook,
		redistest.FailPath{Name: "RedisCaps.TryAcquire", Absorbs: true, Setup: capsOnRedis, Run: func() error {
			s, err := caps.TryAcquire(ctx, 0)
			if err == nil {
				caps.Release(s)
			}
			return err
		}},
		redistest.FailPath{Name: "RedisCaps.Release", Absorbs: true, Setup: acquired, Run: func() error { caps.Release(held); return nil }},
		redistest.FailPath{Name: "RedisCaps.renew", Absorbs: true, Setup: acquired, Run: func() error {
			caps.renew(ctx)
			caps.mu.Lock()
			delete(caps.held, held.id) // the lease expires by itself
			caps.mu.Unlock()
			return nil
		}},
		redistest.FailPath{Name: "RedisHealth.Failed", Run: func() error {
			_, err := health.Failed(ctx, 0, Failure{Reason: "test"})
			return err
		}},
		redistest.FailPath{Name: "RedisHealth.Succeeded", Setup: func(testing.TB) { health.ups[0].fails.Store(1) }, Run: func() error {
			_, err := health.Succeeded(ctx, 0)
			return err
		}},
		redistest.FailPath{Name: "RedisHealth.refresh", Absorbs: true, Run: func() error { health.refresh(ctx); return nil }},
		redistest.FailPath{Name: "RedisHealth.TryProbeLock", Absorbs: true, Run: func() error {
			_ = health.TryProbeLock(ctx, time.Millisecond)
			return nil
		}},
		redistest.FailPath{Name: "RedisQuota.Reserve", Absorbs: true, Setup: quotaOnRedis, Run: func() error {
			_, _, err := quota.Reserve(ctx, 0, 10)
			return err
		}},
		redistest.FailPath{Name: "RedisQuota.Charge", Absorbs: true, Setup: quotaOnRedis, Run: func() error {
			quota.Charge(ctx, 0, 10)
			return nil
		}},
	)
}
