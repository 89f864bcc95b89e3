package kafka

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/spillway-dev/spillway/internal/testkit/redistest"
)

// TestEveryRedisCommandFailing fails each Redis command of the claims'
// paths in turn (an error reply, or a pipeline refused as a whole, issue
// 29): none panics, and each returns an error.
func TestEveryRedisCommandFailing(t *testing.T) {
	t.Parallel()
	env := redistest.StartFail(t)
	srv, prefix, hook, rdb := env.Server, env.Prefix, env.Hook, env.Client
	c, err := NewRedisClaims(RedisClaimsConfig{Prefix: prefix}, rdb)
	if err != nil {
		t.Fatal(err)
	}
	plain, err := NewRedisClaims(RedisClaimsConfig{Prefix: prefix}, srv.Client(t))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	n := 0
	var id string
	// claimed claims a new job for member a, unhooked.
	claimed := func(tb testing.TB) {
		tb.Helper()
		n++
		id = fmt.Sprintf("held-%d", n)
		if _, err := plain.Claim(ctx, id, "a", time.Minute); err != nil {
			tb.Fatal(err)
		}
	}
	redistest.FailEachCommand(t, hook,
		redistest.FailPath{Name: "Claim", Setup: func(testing.TB) { n++; id = fmt.Sprintf("new-%d", n) },
			Run: func() error { _, err := c.Claim(ctx, id, "a", time.Minute); return err }},
		redistest.FailPath{Name: "Refresh", Setup: claimed, Run: func() error { return c.Refresh(ctx, id, "a", time.Minute) }},
		redistest.FailPath{Name: "Release", Setup: claimed, Run: func() error { return c.Release(ctx, id, "a") }},
	)
}
