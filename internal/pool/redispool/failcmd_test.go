package redispool

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/spillway-dev/spillway/internal/pool"
	"github.com/spillway-dev/spillway/internal/testkit/redistest"
	"github.com/spillway-dev/spillway/internal/testkit/testutil"
)

// TestEveryRedisCommandFailing fails each Redis command of the pool's
// acquire and release paths in turn: no path panics; an acquire either
// returns an error or hands out a lease (from the local fallback, when
// the failure says Redis is gone), and every lease it hands out can be
// released; a release, which returns nothing, leaves its slot to expire.
func TestEveryRedisCommandFailing(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	hook := &redistest.FailHook{}
	client := redis.NewClient(&redis.Options{Addr: srv.Addr, MaxRetries: -1})
	client.AddHook(hook)
	t.Cleanup(func() { _ = client.Close() })
	// A long lease: the background renewal sends no command in a run.
	p, err := New(Config{Prefix: redistest.Prefix(t), Size: 1000, PerUser: 1000, LeaseTTL: time.Hour}, client, testutil.DiscardLogger(), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	var held pool.Lease
	acquired := func(tb testing.TB) {
		tb.Helper()
		l, err := p.TryAcquire(ctx, "alice")
		if err != nil {
			tb.Fatal(err)
		}
		held = l
	}
	// acquire runs an acquire; a lease it got is released unhooked.
	acquire := func(f func() (pool.Lease, error)) func() error {
		return func() error {
			l, err := f()
			if err == nil {
				defer l.Release()
				if l == nil {
					return errors.New("no lease and no error")
				}
			}
			return err
		}
	}
	redistest.FailEachCommand(t, hook,
		redistest.FailPath{Name: "TryAcquire", Absorbs: true, Run: acquire(func() (pool.Lease, error) { return p.TryAcquire(ctx, "alice") })},
		redistest.FailPath{Name: "AcquireSince", Absorbs: true, Run: acquire(func() (pool.Lease, error) {
			actx, cancel := context.WithTimeout(ctx, 2*time.Second)
			defer cancel()
			return p.AcquireSince(actx, "alice", time.Now())
		})},
		redistest.FailPath{Name: "Release", Absorbs: true, Setup: acquired, Run: func() error { held.Release(); return nil }},
	)
	if p.Fallback() {
		t.Log("the pool is in its local fallback after the failures")
	}
}
